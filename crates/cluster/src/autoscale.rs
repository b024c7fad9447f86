//! The autoscaling policy (SPEC E1): when the ring divides a cell short of memory and when it
//! absorbs an idle one. Pure: the driver (`cellcache_node::autoscale`, on the consensus
//! leader) samples every cell's memory, hands the samples to [`Autoscaler::observe`] with
//! the time, and carries out the [`Decision`] it gets back; nothing here reads a clock or
//! touches a socket, so the ring simulator and table-driven tests run it exactly.
//!
//! The rules, in the order they are checked:
//! 1. *Before eviction*: every cell above `low_water` whose fill rate would bring it to
//!    where evictions start (halfway from `high_water` to a full `-m`; measured at 87–92%)
//!    within the time the divisions that relieve it take (learned from the last divisions,
//!    `division_lead_ms` until one was seen; in a ring of no more cells than copies every
//!    cell holds everything, so it takes `r + 1 - cells` divisions) divides at once — without waiting for its
//!    window or the cooldown, and beside other changes, as long as its change involves no
//!    cell of a change in flight (the map's own rule, `ChangeError::Overlap`). So the ring
//!    never divides and absorbs overlapping cells at once, and a ring filling everywhere
//!    grows in parallel.
//! 2. Otherwise one change at a time: while the map has a migration in flight, or a
//!    decision has been handed out and not yet seen in the map, nothing else is decided.
//!    **Divide** the fullest cell whose fill (live bytes / memory limit) has stayed at or
//!    above `high_water` for `window_ms`, or that is evicting — after `cooldown_ms` since the
//!    last change, and while the ring has fewer than `max_cells`.
//! 3. **Absorb** the emptiest *provisioned* cell (cells the operator started stay) whose fill
//!    stayed below `low_water` for `window_ms`, after the cooldown, while the ring has more
//!    than `min_cells` and its data is not growing (the cells' smoothed fill rates add
//!    up to less than `steady_fill` of a cell's memory per window) — and only if every cell would stay below the middle of the two
//!    watermarks once its successor took the range over (hysteresis: an absorption never
//!    sets up the next division).
//! 4. **Balance** (SPEC E3), when nothing else is to do and the data is not growing (a
//!    growing ring is reshaped by its divisions, which a move would only churn): two Active
//!    neighbours whose master
//!    bytes have stayed skewed — the heavier holds more than `1 + balance_skew` times the
//!    lighter's, and at least `balance_min_fill` of its memory more — for `window_ms`, in a
//!    ring of more cells than copies (below that every cell holds everything), move the
//!    boundary between them: the heavier gives the end of its range next to the lighter,
//!    the share of it that evens their master bytes out (key hashes are uniform, so bytes
//!    spread evenly over a range). A move changes the holdings of the giver's and
//!    receiver's successors too, so it is made only if every cell whose holdings grow stays
//!    below `high_water`, or no fuller than the ring's fullest cell is now (so a move never
//!    sets up a division). `balance_skew = 0` turns it off.
//! 5. A decision whose change does not appear within `join_timeout_ms` has failed (the
//!    driver says so with [`Autoscaler::failed`], or the timeout does it): the next attempt
//!    waits `retry_backoff_ms`, doubled per consecutive failure up to `retry_backoff_max_ms`.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::id::CellId;

/// What one cell reported of its memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Figures {
    /// Bytes of live items (master and backup copies).
    pub bytes: u64,
    /// Its memory limit (`-m`).
    pub limit: u64,
    /// The part of `bytes` that is items it masters.
    pub master_bytes: u64,
    /// Items evicted since it started (a counter).
    pub evictions: u64,
    /// Key requests it executed as master since it started (a counter): its load.
    pub requests: u64,
}

/// One cell of the map, in ring order, as the decider sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct CellReport {
    pub id: CellId,
    /// Active (serving a range); joining and leaving cells are neither divided nor absorbed.
    pub active: bool,
    /// Started by a provisioner: only these are absorbed.
    pub provisioned: bool,
    /// `None`: it did not answer this round.
    pub figures: Option<Figures>,
    /// The fraction of the hash ring it masters (0 unless Active), from the map.
    pub share: f64,
}

/// One sample of the whole ring.
#[derive(Debug, Clone)]
pub struct Observation<'a> {
    pub now_ms: u64,
    /// Copies of each item (master + backups).
    pub replication_factor: usize,
    /// The cells of the divisions and absorptions in flight (their `involved` sets): no
    /// new change may touch them.
    pub busy: &'a BTreeSet<CellId>,
    /// Every cell of the map, in ring (id) order.
    pub cells: &'a [CellReport],
}

/// What the decider asks its driver to do.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Decision {
    /// Provision a cell that divides `cell`'s range.
    Divide { cell: CellId, reason: String },
    /// Begin `cell`'s absorption by its successor; its provisioner stops it once it is gone.
    Absorb { cell: CellId, reason: String },
    /// Move `share` (0 to 1, exclusive) of `cell`'s range, the end next to its neighbour
    /// `to`, to `to` (a shift).
    Balance {
        cell: CellId,
        to: CellId,
        share: f64,
        reason: String,
    },
}

impl Decision {
    pub fn cell(&self) -> &CellId {
        match self {
            Decision::Divide { cell, .. }
            | Decision::Absorb { cell, .. }
            | Decision::Balance { cell, .. } => cell,
        }
    }
    pub fn reason(&self) -> &str {
        match self {
            Decision::Divide { reason, .. }
            | Decision::Absorb { reason, .. }
            | Decision::Balance { reason, .. } => reason,
        }
    }
}

/// What one sample brought: new decisions, and the fate of earlier ones.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Step {
    /// To carry out now.
    pub decisions: Vec<Decision>,
    /// Earlier decisions the map now shows done.
    pub done: Vec<Decision>,
    /// Earlier decisions not seen in the map within `join_timeout_ms`: failed.
    pub timed_out: Vec<Decision>,
}

/// A cell's watermark clocks and its fill rate.
#[derive(Debug, Clone, Default)]
struct Track {
    /// Since when it has been at or above `high_water` (continuously).
    above_since: Option<u64>,
    /// Since when it has been below `low_water` (continuously).
    below_since: Option<u64>,
    /// The previous sample: time, bytes, evictions, requests.
    last: Option<(u64, u64, u64, u64)>,
    /// Bytes per second, smoothed.
    rate: f64,
    /// Key requests per second, smoothed (`None` until two samples were seen).
    load: Option<f64>,
    /// Evicted since the previous sample.
    evicting: bool,
}

/// A decision handed out and not yet seen through.
#[derive(Debug, Clone)]
struct Pending {
    decision: Decision,
    at_ms: u64,
    /// The cells of the map when it was made, and those it involves.
    cells_then: Vec<CellId>,
    involved: BTreeSet<CellId>,
    /// The share of the ring the decision's cell mastered when it was made.
    share_then: f64,
}

impl Pending {
    /// Whether `obs` shows it done: a new Active cell right after the divided one, or the
    /// absorbed cell gone — and none of its cells busy any more.
    fn done(&self, obs: &Observation<'_>) -> bool {
        if self.involved.iter().any(|c| obs.busy.contains(c)) {
            return false;
        }
        match &self.decision {
            Decision::Divide { cell, .. } => {
                let next = self.cells_then.iter().find(|c| *c > cell);
                obs.cells.iter().any(|c| {
                    c.active
                        && !self.cells_then.contains(&c.id)
                        && c.id > *cell
                        && next.is_none_or(|n| c.id < *n)
                })
            }
            Decision::Absorb { cell, .. } => !obs.cells.iter().any(|c| &c.id == cell),
            // A shift is seen through once its giver masters less of the ring.
            Decision::Balance { cell, .. } => {
                let now = obs.cells.iter().find(|c| &c.id == cell).map(|c| c.share);
                now.is_some_and(|s| s < self.share_then)
            }
        }
    }
}

/// The decider's memory between samples: watermark clocks per cell, the last change, the
/// decisions in flight and the failures behind them.
#[derive(Debug, Clone)]
pub struct Autoscaler {
    config: PolicyConfig,
    tracks: BTreeMap<CellId, Track>,
    /// When the ring last changed (a migration seen in flight or ended).
    last_change_ms: Option<u64>,
    pending: Vec<Pending>,
    /// Consecutive failed decisions, and when the next may be made.
    failures: u32,
    retry_at_ms: u64,
    /// What a division took, smoothed over those seen through.
    division_ms: f64,
    /// Since when each pair of neighbours (giver, receiver) has been skewed (continuously).
    skewed_since: BTreeMap<(CellId, CellId), u64>,
    /// The active cells and their shares at the previous sample: bytes that moved with a
    /// change of shape (a division's halves, an absorption, a shift) are not a fill rate.
    shape: Vec<(CellId, u64)>,
}

impl Autoscaler {
    pub fn new(config: PolicyConfig) -> Autoscaler {
        let division_ms = config.division_lead_ms as f64;
        Autoscaler {
            config,
            tracks: BTreeMap::new(),
            last_change_ms: None,
            pending: Vec::new(),
            failures: 0,
            retry_at_ms: 0,
            division_ms,
            skewed_since: BTreeMap::new(),
            shape: Vec::new(),
        }
    }

    pub fn config(&self) -> &PolicyConfig {
        &self.config
    }

    /// What a division is expected to take now (ms).
    pub fn division_lead_ms(&self) -> u64 {
        self.division_ms as u64
    }

    /// The decisions in flight.
    pub fn pending(&self) -> Vec<Decision> {
        self.pending.iter().map(|p| p.decision.clone()).collect()
    }

    /// Consecutive failed decisions.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// Forget the watermark clocks and what is in flight (this cell stopped deciding: it
    /// lost the leadership, or autoscaling was turned off), keeping what was learned of
    /// divisions.
    pub fn reset(&mut self) {
        self.tracks.clear();
        self.pending.clear();
        self.skewed_since.clear();
    }

    /// The driver could not carry out the decision about `cell` (the provisioner failed,
    /// the cell died before joining, the proposal was refused): it is dropped, and the next
    /// decision waits for the backoff.
    pub fn failed(&mut self, cell: &CellId, now_ms: u64) {
        self.pending.retain(|p| p.decision.cell() != cell);
        self.note_failure(now_ms);
    }

    fn note_failure(&mut self, now_ms: u64) {
        self.failures = self.failures.saturating_add(1);
        let backoff = self
            .config
            .retry_backoff_ms
            .saturating_mul(1u64 << (self.failures - 1).min(20))
            .min(self.config.retry_backoff_max_ms);
        self.retry_at_ms = now_ms.saturating_add(backoff);
    }

    /// Takes one sample of the ring; returns what to do now and what became of earlier
    /// decisions. New decisions are remembered as pending until the map shows them done
    /// (or they fail).
    pub fn observe(&mut self, obs: &Observation<'_>) -> Step {
        let mut step = self.update(obs);
        let mut locked: BTreeSet<CellId> = obs.busy.clone();
        for p in &self.pending {
            locked.extend(p.involved.iter().cloned());
        }
        let decisions = decide(&self.config, self.view(obs), &mut locked);
        let ring = Ring::of(obs.cells);
        for d in &decisions {
            self.pending.push(Pending {
                decision: d.clone(),
                at_ms: obs.now_ms,
                cells_then: obs.cells.iter().map(|c| c.id.clone()).collect(),
                involved: ring.involved(d, obs.replication_factor),
                share_then: obs
                    .cells
                    .iter()
                    .find(|c| c.id == *d.cell())
                    .map_or(0.0, |c| c.share),
            });
        }
        step.decisions = decisions;
        step
    }

    /// Book-keeping of one sample: the pending decisions' fate, the last change, each
    /// cell's clocks and rate.
    fn update(&mut self, obs: &Observation<'_>) -> Step {
        let now = obs.now_ms;
        let mut step = Step::default();
        if !obs.busy.is_empty() {
            self.last_change_ms = Some(now);
        }
        for p in std::mem::take(&mut self.pending) {
            if p.done(obs) {
                if matches!(p.decision, Decision::Divide { .. }) {
                    let took = now.saturating_sub(p.at_ms) as f64;
                    self.division_ms = (self.division_ms + took) / 2.0;
                }
                self.failures = 0;
                self.last_change_ms = Some(now);
                step.done.push(p.decision);
            } else if now.saturating_sub(p.at_ms) >= self.config.join_timeout_ms
                && !p.involved.iter().any(|c| obs.busy.contains(c))
            {
                self.note_failure(now);
                step.timed_out.push(p.decision);
            } else {
                self.pending.push(p);
            }
        }
        self.tracks
            .retain(|id, _| obs.cells.iter().any(|c| &c.id == id));
        // A parent that hands half its range to a child drops half its bytes: taken for a
        // trend, the ring would look as if it shrank for a window after every division
        // (the 1 -> N -> 1 run balanced while it grew). The samples around a change of shape
        // start new intervals; the smoothed rates carry on.
        let shape: Vec<(CellId, u64)> = obs
            .cells
            .iter()
            .filter(|c| c.active)
            .map(|c| (c.id.clone(), c.share.to_bits()))
            .collect();
        if shape != self.shape {
            for t in self.tracks.values_mut() {
                t.last = None;
            }
            self.shape = shape;
        }
        for c in obs.cells {
            let t = self.tracks.entry(c.id.clone()).or_default();
            // A joining cell fills with its hand-off, a leaving one empties: neither is a
            // trend. Clocks and rate start when it is Active.
            if !c.active {
                *t = Track::default();
                continue;
            }
            let Some(f) = c.figures else { continue };
            let fill = fill(&f);
            if fill >= self.config.high_water {
                t.above_since.get_or_insert(now);
            } else {
                t.above_since = None;
            }
            if fill < self.config.low_water {
                t.below_since.get_or_insert(now);
            } else {
                t.below_since = None;
            }
            if let Some((at, bytes, evictions, requests)) = t.last
                && now > at
            {
                let dt = (now - at) as f64;
                let rate = (f.bytes as f64 - bytes as f64) * 1000.0 / dt;
                // Smoothed over about a window, so noise is not taken for a trend.
                let weight = dt / (dt + self.config.window_ms as f64);
                t.rate = weight * rate + (1.0 - weight) * t.rate;
                t.evicting = f.evictions > evictions;
                let load = f.requests.saturating_sub(requests) as f64 * 1000.0 / dt;
                t.load = Some(t.load.map_or(load, |l| weight * load + (1.0 - weight) * l));
            }
            t.last = Some((now, f.bytes, f.evictions, f.requests));
        }
        let skewed: BTreeSet<(CellId, CellId)> = skewed_pairs(&self.config, obs, &self.tracks)
            .into_iter()
            .map(|s| (s.giver.clone(), s.receiver.clone()))
            .collect();
        self.skewed_since.retain(|pair, _| skewed.contains(pair));
        for pair in skewed {
            self.skewed_since.entry(pair).or_insert(now);
        }
        step
    }

    fn view<'a>(&'a self, obs: &'a Observation<'a>) -> View<'a> {
        View {
            obs,
            tracks: &self.tracks,
            quiet: obs.busy.is_empty() && self.pending.is_empty(),
            cooled: self
                .last_change_ms
                .is_none_or(|t| obs.now_ms >= t.saturating_add(self.config.cooldown_ms)),
            backing_off: obs.now_ms < self.retry_at_ms,
            division_ms: self.division_ms,
            planned: self.pending.iter().fold(0, |n, p| match p.decision {
                Decision::Divide { .. } => n + 1,
                Decision::Absorb { .. } => n - 1,
                Decision::Balance { .. } => n,
            }),
            skewed_since: &self.skewed_since,
        }
    }
}

/// Everything [`decide`] reads: the sample and the decider's clocks.
struct View<'a> {
    obs: &'a Observation<'a>,
    tracks: &'a BTreeMap<CellId, Track>,
    /// Nothing in flight, ours or not.
    quiet: bool,
    cooled: bool,
    backing_off: bool,
    division_ms: f64,
    /// Cells the pending decisions will add (negative: remove).
    planned: i64,
    skewed_since: &'a BTreeMap<(CellId, CellId), u64>,
}

/// The Active cells in ring order, to name the cells a change involves as the map does
/// (`change::begin_division`, `change::begin_absorption`).
struct Ring<'a> {
    active: Vec<&'a CellId>,
}

impl<'a> Ring<'a> {
    fn of(cells: &'a [CellReport]) -> Ring<'a> {
        Ring {
            active: cells.iter().filter(|c| c.active).map(|c| &c.id).collect(),
        }
    }

    /// `n` cells clockwise (`step` 1) or counter-clockwise (`step` -1) from `id`.
    fn around(&self, id: &CellId, n: usize, forward: bool) -> Vec<CellId> {
        let m = self.active.len();
        let Some(i) = self.active.iter().position(|c| *c == id) else {
            return Vec::new();
        };
        (1..=n.min(m.saturating_sub(1)))
            .map(|k| {
                let j = if forward {
                    (i + k) % m
                } else {
                    (i + m - k) % m
                };
                self.active[j].clone()
            })
            .collect()
    }

    /// The cells a decision's change will involve (no other change may touch them).
    fn involved(&self, d: &Decision, r: usize) -> BTreeSet<CellId> {
        let r = r.max(1);
        let mut out: BTreeSet<CellId> = [d.cell().clone()].into();
        match d {
            Decision::Divide { cell, .. } => {
                out.extend(self.around(cell, r.saturating_sub(2), false));
                out.extend(self.around(cell, r - 1, true));
            }
            Decision::Absorb { cell, .. } => {
                out.extend(self.around(cell, r - 1, false));
                out.extend(self.around(cell, r, true));
            }
            // As `change::begin_shift`: both cells and the `r - 1` cells after each.
            Decision::Balance { cell, to, .. } => {
                out.insert(to.clone());
                out.extend(self.around(cell, r - 1, true));
                out.extend(self.around(to, r - 1, true));
            }
        }
        out
    }
}

fn fill(f: &Figures) -> f64 {
    if f.limit == 0 {
        return 0.0;
    }
    f.bytes as f64 / f.limit as f64
}

fn pct(x: f64) -> String {
    format!("{:.0}%", x * 100.0)
}

fn secs(ms: u64) -> String {
    format!("{:.1} s", ms as f64 / 1000.0)
}

/// The policy itself: a pure function of the settings, the sample and the clocks. Cells in
/// `locked` (busy, or involved in a pending decision) are left alone; the cells of every
/// decision made are added to it.
fn decide(cfg: &PolicyConfig, v: View<'_>, locked: &mut BTreeSet<CellId>) -> Vec<Decision> {
    if v.backing_off {
        return Vec::new();
    }
    let ring = Ring::of(v.obs.cells);
    let r = v.obs.replication_factor;
    let active = ring.active.len() as i64 + v.planned;
    let mut room = (cfg.max_cells as i64 - active).max(0) as usize;
    // Cells racing eviction divide at once, each whose change touches nothing in flight.
    let mut out = Vec::new();
    for (c, reason) in divisions(cfg, &v, true) {
        if room == 0 {
            break;
        }
        let d = Decision::Divide {
            cell: c.clone(),
            reason,
        };
        let cells = ring.involved(&d, r);
        if cells.is_disjoint(locked) {
            locked.extend(cells);
            out.push(d);
            room -= 1;
        }
    }
    if !out.is_empty() || !v.quiet || !v.cooled {
        return out;
    }
    // Otherwise one change at a time, a cooldown apart.
    if room > 0
        && let Some((c, reason)) = divisions(cfg, &v, false).into_iter().next()
    {
        return vec![Decision::Divide {
            cell: c.clone(),
            reason,
        }];
    }
    if active > cfg.min_cells as i64
        && let Some(d) = absorption(cfg, &v)
    {
        return vec![d];
    }
    balance(cfg, &v).into_iter().collect()
}

/// Cells that should divide, fullest first: those racing eviction (`urgent`), or else
/// those above high water for the window or evicting.
fn divisions<'a>(cfg: &PolicyConfig, v: &View<'a>, urgent: bool) -> Vec<(&'a CellId, String)> {
    let now = v.obs.now_ms;
    // Evictions start near the middle between high water and a full memory limit
    // (measured: 87-92% of -m), so a division must be done before the fill gets there.
    let evicts_at = (cfg.high_water + 1.0) / 2.0;
    let mut found: Vec<(f64, &CellId, String)> = Vec::new();
    // In a ring of no more cells than copies, every cell holds everything: a division
    // relieves nobody until the ring has `r + 1` cells, so the lead counts those divisions.
    let active = v.obs.cells.iter().filter(|c| c.active).count();
    let needed = (v.obs.replication_factor + 1).saturating_sub(active).max(1);
    let lead_ms = v.division_ms * needed as f64;
    for c in v.obs.cells.iter().filter(|c| c.active) {
        let (Some(f), Some(t)) = (c.figures, v.tracks.get(&c.id)) else {
            continue;
        };
        let fill = fill(&f);
        let racing = fill >= cfg.low_water && t.rate > 0.0 && {
            let room = (evicts_at * f.limit as f64 - f.bytes as f64).max(0.0);
            room / t.rate * 1000.0 <= lead_ms
        };
        let reason = if urgent {
            if !racing {
                continue;
            }
            format!(
                "fill {} rising {:.0} kB/s: would evict within {} division(s) of {}",
                pct(fill),
                t.rate / 1000.0,
                needed,
                secs(v.division_ms as u64)
            )
        } else if t.evicting && fill >= cfg.low_water {
            format!("evicting at fill {}", pct(fill))
        } else if t
            .above_since
            .is_some_and(|s| now.saturating_sub(s) >= cfg.window_ms)
        {
            format!(
                "fill {} >= {} for {}",
                pct(fill),
                pct(cfg.high_water),
                secs(cfg.window_ms)
            )
        } else {
            continue;
        };
        found.push((fill, &c.id, reason));
    }
    found.sort_by(|a, b| b.0.total_cmp(&a.0));
    found.into_iter().map(|(_, c, r)| (c, r)).collect()
}

fn absorption(cfg: &PolicyConfig, v: &View<'_>) -> Option<Decision> {
    let now = v.obs.now_ms;
    let cells = v.obs.cells;
    // An estimate needs every cell's figures; a silent cell is no time to shrink.
    if cells.iter().any(|c| c.figures.is_none() || !c.active) {
        return None;
    }
    // Nor is a ring whose data grows: a cell just divided off is below low water while it
    // fills, and absorbing it would only set up the next division.
    if growing(cfg, v) {
        return None;
    }
    let mut best: Option<(f64, &CellReport, f64)> = None;
    for (i, c) in cells.iter().enumerate() {
        let (Some(f), Some(t)) = (c.figures, v.tracks.get(&c.id)) else {
            continue;
        };
        let long_enough = t
            .below_since
            .is_some_and(|s| now.saturating_sub(s) >= cfg.window_ms);
        if !c.provisioned || !long_enough {
            continue;
        }
        let after = fullest_after_absorbing(cells, i, v.obs.replication_factor);
        if after >= cfg.absorb_ceiling() {
            continue;
        }
        let fill = fill(&f);
        if best.as_ref().is_none_or(|(b, _, _)| fill < *b) {
            best = Some((fill, c, after));
        }
    }
    best.map(|(fill, c, after)| Decision::Absorb {
        cell: c.id.clone(),
        reason: format!(
            "fill {} < {} for {}; fullest cell after: {}",
            pct(fill),
            pct(cfg.low_water),
            secs(cfg.window_ms),
            pct(after)
        ),
    })
}

/// Whether the ring's data grows: the cells' smoothed fill rates add up to more than
/// `steady_fill` of the largest cell's memory per window.
fn growing(cfg: &PolicyConfig, v: &View<'_>) -> bool {
    let growth: f64 = v.tracks.values().map(|t| t.rate).sum();
    let largest = v
        .obs
        .cells
        .iter()
        .filter_map(|c| c.figures)
        .map(|f| f.limit)
        .max();
    let floor = cfg.steady_fill * largest.unwrap_or(0) as f64;
    growth * cfg.window_ms as f64 / 1000.0 > floor
}

/// The highest fill among the cells whose holdings grow once `cells[gone]` is absorbed by its
/// successor: each cell holds its own range and backs up its `r - 1` predecessors', and the
/// successor masters the departed cell's items as well as its own.
fn fullest_after_absorbing(cells: &[CellReport], gone: usize, r: usize) -> f64 {
    let n = cells.len();
    if n < 2 {
        return f64::INFINITY;
    }
    let master = |i: usize| cells[i].figures.map_or(0, |f| f.master_bytes);
    // Bytes cell `order[j]` holds when the ring is `order` (masters, in ring order).
    let held = |order: &[(usize, u64)], j: usize| -> u64 {
        let m = order.len();
        (0..r.clamp(1, m)).map(|k| order[(j + m - k) % m].1).sum()
    };
    let before: Vec<(usize, u64)> = (0..n).map(|i| (i, master(i))).collect();
    // The ring without `gone`, from its successor on: the successor takes its share.
    let after: Vec<(usize, u64)> = (1..n)
        .map(|k| (gone + k) % n)
        .map(|i| {
            let extra = if i == (gone + 1) % n { master(gone) } else { 0 };
            (i, master(i) + extra)
        })
        .collect();
    (0..after.len())
        .filter_map(|j| {
            let i = after[j].0;
            let now = held(&before, i);
            let then = held(&after, j);
            let limit = cells[i].figures.map_or(0, |f| f.limit);
            (then > now).then(|| {
                if limit == 0 {
                    f64::INFINITY
                } else {
                    then as f64 / limit as f64
                }
            })
        })
        .fold(0.0, f64::max)
}

mod balance;
mod config;
#[cfg(test)]
use balance::fullest_after_shift;
use balance::{balance, skewed_pairs};
pub use config::{PolicyConfig, PolicyConfigError};

#[cfg(test)]
mod tests;
