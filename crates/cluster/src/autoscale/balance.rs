//! Balancing (rule 4 of the policy, see [`super`]): which neighbours are skewed, by how much
//! a shift evens them out, and whether it would fill a cell too much.

use super::*;

/// Two neighbours whose master bytes are skewed (see the module docs, rule 4).
pub(super) struct Skew<'a> {
    pub(super) giver: &'a CellId,
    pub(super) receiver: &'a CellId,
    /// Of the giver's range: what evens the two out.
    pub(super) share: f64,
    /// Master bytes of both.
    pub(super) bytes: (u64, u64),
    /// Index of the giver in the sample, and whether the receiver is its successor.
    pub(super) at: usize,
    pub(super) up: bool,
}

/// The skewed pairs of neighbours in a sample (every cell reporting, and more cells than
/// copies).
pub(super) fn skewed_pairs<'a>(cfg: &PolicyConfig, obs: &Observation<'a>) -> Vec<Skew<'a>> {
    let cells = obs.cells;
    let n = cells.len();
    if cfg.balance_skew <= 0.0
        || n <= obs.replication_factor.max(1)
        || cells.iter().any(|c| !c.active || c.figures.is_none())
    {
        return Vec::new();
    }
    let mut out = Vec::new();
    for i in 0..n {
        let j = (i + 1) % n;
        let (Some(a), Some(b)) = (cells[i].figures, cells[j].figures) else {
            continue;
        };
        let (giver, receiver, up) = if a.master_bytes >= b.master_bytes {
            (i, j, true)
        } else {
            (j, i, false)
        };
        let (heavy, light) = (
            a.master_bytes.max(b.master_bytes),
            a.master_bytes.min(b.master_bytes),
        );
        let limit = cells[giver].figures.map_or(0, |f| f.limit);
        let skewed = heavy as f64 > (1.0 + cfg.balance_skew) * light as f64
            && (heavy - light) as f64 >= cfg.balance_min_fill * limit as f64;
        if skewed && heavy > 0 {
            out.push(Skew {
                giver: &cells[giver].id,
                receiver: &cells[receiver].id,
                share: (heavy - light) as f64 / (2.0 * heavy as f64),
                bytes: (heavy, light),
                at: giver,
                up,
            });
        }
    }
    out
}

pub(super) fn balance(cfg: &PolicyConfig, v: &View<'_>) -> Option<Decision> {
    if growing(cfg, v) {
        return None;
    }
    let now = v.obs.now_ms;
    let r = v.obs.replication_factor;
    let mut best: Option<(u64, Skew<'_>)> = None;
    for s in skewed_pairs(cfg, v.obs) {
        let since = v.skewed_since.get(&(s.giver.clone(), s.receiver.clone()));
        if since.is_none_or(|t| now.saturating_sub(*t) < cfg.window_ms) {
            continue;
        }
        // Never set up a division: the move keeps every cell whose holdings grow below high
        // water, or at least no fuller than the ring's fullest cell now.
        let fullest_now = v
            .obs
            .cells
            .iter()
            .filter_map(|c| c.figures.as_ref().map(fill))
            .fold(0.0, f64::max);
        let after = fullest_after_shift(v.obs.cells, &s, r);
        if after >= cfg.high_water && after > fullest_now {
            continue;
        }
        let gap = s.bytes.0 - s.bytes.1;
        if best.as_ref().is_none_or(|(g, _)| gap > *g) {
            best = Some((gap, s));
        }
    }
    best.map(|(_, s)| Decision::Balance {
        cell: s.giver.clone(),
        to: s.receiver.clone(),
        share: s.share,
        reason: format!(
            "masters {} kB vs its neighbour's {} kB for {}: moving {} of its range",
            s.bytes.0 / 1000,
            s.bytes.1 / 1000,
            secs(cfg.window_ms),
            pct(s.share)
        ),
    })
}

/// The highest fill among the cells whose holdings grow through shift `s`.
pub(super) fn fullest_after_shift(cells: &[CellReport], s: &Skew<'_>, r: usize) -> f64 {
    let n = cells.len();
    let master = |i: usize| cells[i].figures.map_or(0, |f| f.master_bytes);
    let moved = (master(s.at) as f64 * s.share) as u64;
    let receiver = if s.up {
        (s.at + 1) % n
    } else {
        (s.at + n - 1) % n
    };
    let before: Vec<u64> = (0..n).map(master).collect();
    let mut after = before.clone();
    after[s.at] -= moved.min(after[s.at]);
    after[receiver] += moved;
    let held =
        |m: &[u64], i: usize| -> u64 { (0..r.clamp(1, n)).map(|k| m[(i + n - k) % n]).sum() };
    (0..n)
        .filter(|&i| held(&after, i) > held(&before, i))
        .map(|i| {
            let limit = cells[i].figures.map_or(0, |f| f.limit);
            if limit == 0 {
                f64::INFINITY
            } else {
                held(&after, i) as f64 / limit as f64
            }
        })
        .fold(0.0, f64::max)
}
