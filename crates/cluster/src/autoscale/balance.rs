//! Balancing (rule 4 of the policy, see [`super`]): which neighbours are skewed — in the
//! bytes they master, or in the key requests they execute — by how much a shift evens them
//! out, and whether it would fill a cell too much or skew the other measure back.

use super::*;

/// What two neighbours are skewed in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum By {
    /// The bytes each masters.
    Bytes,
    /// The key requests each executes per second.
    Load,
}

/// Two neighbours skewed in one measure (see the module docs, rule 4).
pub(super) struct Skew<'a> {
    pub(super) giver: &'a CellId,
    pub(super) receiver: &'a CellId,
    /// Of the giver's range: what evens the two out.
    pub(super) share: f64,
    pub(super) by: By,
    /// The giver's and the receiver's amount of that measure.
    pub(super) amounts: (f64, f64),
    /// Index of the giver in the sample, and whether the receiver is its successor.
    pub(super) at: usize,
    pub(super) up: bool,
}

/// The two measures of a cell: master bytes, and key requests per second (`None` until its
/// rate is known).
fn measures(c: &CellReport, tracks: &BTreeMap<CellId, Track>) -> Option<(f64, Option<f64>)> {
    let f = c.figures?;
    Some((
        f.master_bytes as f64,
        tracks.get(&c.id).and_then(|t| t.load),
    ))
}

/// Whether `heavy` vs `light` is a skew worth a move in measure `by`; `limit` is the heavier
/// cell's memory.
fn skewed(cfg: &PolicyConfig, by: By, heavy: f64, light: f64, limit: u64) -> bool {
    let (skew, min) = match by {
        By::Bytes => (cfg.balance_skew, cfg.balance_min_fill * limit as f64),
        By::Load => (cfg.balance_load_skew, cfg.balance_min_load),
    };
    skew > 0.0 && heavy > 0.0 && heavy > (1.0 + skew) * light && heavy - light >= min
}

/// The skew threshold of the measure that is not `by`.
fn other_skew(cfg: &PolicyConfig, by: By) -> f64 {
    match by {
        By::Bytes => cfg.balance_load_skew,
        By::Load => cfg.balance_skew,
    }
}

/// The skewed pairs of neighbours in a sample (every cell reporting, and more cells than
/// copies). A pair skewed in bytes is listed as such; one even in bytes but skewed in load,
/// by load. Keys' bytes and requests taken as spread evenly over a range, the share moved
/// evens the pair out but leaves the other measure within half its threshold the other way
/// (so no later move undoes it: no flapping); a pair whose share would be below
/// `balance_min_share` is not listed.
pub(super) fn skewed_pairs<'a>(
    cfg: &PolicyConfig,
    obs: &Observation<'a>,
    tracks: &BTreeMap<CellId, Track>,
) -> Vec<Skew<'a>> {
    let cells = obs.cells;
    let n = cells.len();
    if n <= obs.replication_factor.max(1) || cells.iter().any(|c| !c.active) {
        return Vec::new();
    }
    let Some(m) = cells
        .iter()
        .map(|c| measures(c, tracks))
        .collect::<Option<Vec<_>>>()
    else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for i in 0..n {
        let j = (i + 1) % n;
        let ((bi, li), (bj, lj)) = (m[i], m[j]);
        let limit = |k: usize| cells[k].figures.map_or(0, |f| f.limit);
        let candidates = [
            (By::Bytes, Some((bi, bj)), li.zip(lj)),
            (By::Load, li.zip(lj), Some((bi, bj))),
        ];
        for (by, pair, other) in candidates {
            let Some((a, b)) = pair else { continue };
            let (giver, receiver, up) = if a >= b { (i, j, true) } else { (j, i, false) };
            let (heavy, light) = (a.max(b), a.min(b));
            if !skewed(cfg, by, heavy, light, limit(giver)) {
                continue;
            }
            // What evens the two out — unless that would leave the other measure skewed the
            // other way (the next move would undo it: flapping): then only as far as keeps
            // it within half its threshold.
            let even = (heavy - light) / (2.0 * heavy);
            let other_by = if by == By::Bytes { By::Load } else { By::Bytes };
            let share = match other {
                Some((oa, ob)) => {
                    let (og, or) = if up { (oa, ob) } else { (ob, oa) };
                    let backfires = og > 0.0
                        && skewed(
                            cfg,
                            other_by,
                            or + og * even,
                            og * (1.0 - even),
                            limit(receiver),
                        );
                    if backfires {
                        let k = 1.0 + other_skew(cfg, by) / 2.0;
                        (k * og - or) / (og * (1.0 + k))
                    } else {
                        even
                    }
                }
                None => even,
            };
            if share >= cfg.balance_min_share {
                out.push(Skew {
                    giver: &cells[giver].id,
                    receiver: &cells[receiver].id,
                    share,
                    by,
                    amounts: (heavy, light),
                    at: giver,
                    up,
                });
                // One move per pair: bytes first.
                break;
            }
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
    // Bytes before load (memory is what the ring is for), the widest gap first.
    let mut best: Option<((bool, f64), Skew<'_>)> = None;
    for s in skewed_pairs(cfg, v.obs, v.tracks) {
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
        let rank = (s.by == By::Bytes, s.amounts.0 - s.amounts.1);
        if best.as_ref().is_none_or(|(r, _)| rank > *r) {
            best = Some((rank, s));
        }
    }
    best.map(|(_, s)| Decision::Balance {
        cell: s.giver.clone(),
        to: s.receiver.clone(),
        share: s.share,
        reason: match s.by {
            By::Bytes => format!(
                "masters {} kB vs its neighbour's {} kB for {}: moving {} of its range",
                (s.amounts.0 / 1000.0) as u64,
                (s.amounts.1 / 1000.0) as u64,
                secs(cfg.window_ms),
                pct(s.share)
            ),
            By::Load => format!(
                "executes {} key requests/s vs its neighbour's {} for {}: moving {} of its range",
                s.amounts.0 as u64,
                s.amounts.1 as u64,
                secs(cfg.window_ms),
                pct(s.share)
            ),
        },
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
