//! The autoscaling policy driving a simulated ring: virtual time, a seeded RNG, real map
//! changes (`change::apply`, what every Raft replica applies) and a memory model in which
//! each cell holds its range and its `r - 1` predecessors' (uniform key hashes). Each run
//! goes through phases — growth at a seeded rate, a plateau where the data wanders ±2%,
//! shrinking — while divisions take a seeded time, provisioners fail or start cells that
//! never join, and absorptions take a while to finish.
//!
//! Checked at every step:
//! - every decision applies: no change of the policy overlaps a migration in flight (the
//!   map refuses overlaps, `ChangeError::Overlap`), no division beyond `max_cells`, no
//!   absorption below `min_cells` or of a cell an operator started;
//! - no cell exceeds its memory while the write rate allows a division in time (growth of
//!   at most half a cell's memory per division time);
//! - on the plateau, at most one change per cooldown (no flapping);
//! - once the data is gone, the ring is back at `min_cells` (it cannot pass vacuously).
//!
//! Replay a seed with `CELLCACHE_SIM_SEED=<seed>`; `CELLCACHE_SIM_SEEDS=<n>` runs more.

use std::collections::{BTreeMap, BTreeSet};

use cellcache_cluster::autoscale::{
    Autoscaler, CellReport, Decision, Figures, Observation, PolicyConfig,
};
use cellcache_cluster::change::{self, Proposal};
use cellcache_cluster::{AbsorptionReason, CellAddress, CellId, Change, ClusterMap, Migration};

mod sim;
use sim::Rng;

const LIMIT: u64 = 100 << 20;
const STEP_MS: u64 = 250;
/// How long a division takes in the simulation.
const DIVISION_MS: u64 = 2_000;

fn addr(n: u64) -> CellAddress {
    CellAddress {
        client: format!("10.0.0.{n}:11211"),
        peer: format!("10.0.0.{n}:21211"),
    }
}

fn apply(map: &ClusterMap, change: Change) -> Result<ClusterMap, change::ChangeError> {
    change::apply(
        map,
        &Proposal {
            based_on_epoch: map.epoch(),
            change,
        },
    )
}

/// A change in flight and when it finishes.
enum Flight {
    Division { child: CellId, done_at: u64 },
    Absorption { departed: CellId, done_at: u64 },
    Shift { from: CellId, done_at: u64 },
}

struct Sim {
    rng: Rng,
    map: ClusterMap,
    policy: Autoscaler,
    config: PolicyConfig,
    /// Unique bytes stored ring-wide (each held by `r` cells).
    data: f64,
    provisioned: BTreeSet<CellId>,
    flights: Vec<Flight>,
    now: u64,
    next_address: u64,
    /// Changes committed (divisions and absorptions begun), with their times.
    changes: Vec<u64>,
    /// Shifts (balancing) made.
    shifts: usize,
    /// When a provisioner last failed.
    failed_at: Option<u64>,
}

impl Sim {
    fn new(seed: u64) -> Sim {
        let config = PolicyConfig {
            window_ms: 2_000,
            cooldown_ms: 5_000,
            division_lead_ms: 3_000,
            join_timeout_ms: 10_000,
            retry_backoff_ms: 1_000,
            retry_backoff_max_ms: 8_000,
            max_cells: 40,
            ..PolicyConfig::default()
        };
        Sim {
            rng: Rng(seed),
            map: ClusterMap::bootstrap(CellId::whole(1), addr(1), 2).unwrap(),
            policy: Autoscaler::new(config.clone()),
            config,
            data: 0.0,
            provisioned: BTreeSet::new(),
            flights: Vec::new(),
            now: 0,
            next_address: 2,
            changes: Vec::new(),
            shifts: 0,
            failed_at: None,
        }
    }

    /// Bytes each cell holds: its range's share of the data and its `r - 1` predecessors'.
    fn held(&self) -> BTreeMap<CellId, f64> {
        let active: Vec<_> = self.map.active_cells().collect();
        let r = usize::from(self.map.replication_factor())
            .min(active.len())
            .max(1);
        let share =
            |c: &cellcache_cluster::Cell| c.range.map_or(0.0, |g| g.len() as f64 / 2f64.powi(64));
        let mut out = BTreeMap::new();
        for (i, c) in active.iter().enumerate() {
            let n = active.len();
            let held: f64 = (0..r).map(|k| share(active[(i + n - k) % n])).sum();
            out.insert(c.id.clone(), held * self.data);
        }
        out
    }

    fn reports(&self) -> Vec<CellReport> {
        let held = self.held();
        self.map
            .cells()
            .iter()
            .map(|c| {
                let bytes = held.get(&c.id).copied().unwrap_or(0.0);
                let share = c.range.map_or(0.0, |g| g.len() as f64 / 2f64.powi(64));
                CellReport {
                    id: c.id.clone(),
                    active: held.contains_key(&c.id),
                    provisioned: self.provisioned.contains(&c.id),
                    figures: Some(Figures {
                        bytes: bytes as u64,
                        limit: LIMIT,
                        master_bytes: (share * self.data) as u64,
                        evictions: 0,
                        requests: 0,
                    }),
                    share,
                }
            })
            .collect()
    }

    /// Finishes the flights that are due.
    fn land(&mut self) {
        let now = self.now;
        let mut keep = Vec::new();
        for f in std::mem::take(&mut self.flights) {
            match f {
                Flight::Division { child, done_at } if done_at <= now => {
                    self.map = apply(&self.map, Change::CompleteDivision { child }).unwrap();
                }
                Flight::Absorption { departed, done_at } if done_at <= now => {
                    self.map = apply(&self.map, Change::CompleteAbsorption { departed }).unwrap();
                }
                Flight::Shift { from, done_at } if done_at <= now => {
                    self.map = apply(&self.map, Change::CompleteShift { from }).unwrap();
                }
                f => keep.push(f),
            }
        }
        self.flights = keep;
    }

    fn carry_out(&mut self, d: Decision) {
        let active = self.map.active_cells().count();
        match d {
            Decision::Divide { cell, .. } => {
                assert!(active < self.config.max_cells, "divides beyond max_cells");
                // Provisioners fail now and then: nothing changes, the policy times it out
                // (and the cell may fill up meanwhile: it evicts, as memcached would).
                if self.rng.chance(100) {
                    self.failed_at = Some(self.now);
                    return;
                }
                let address = addr(self.next_address);
                self.next_address += 1;
                self.map = apply(
                    &self.map,
                    Change::BeginDivision {
                        parent: cell.clone(),
                        child_address: address.clone(),
                    },
                )
                .unwrap_or_else(|e| panic!("division of {cell} refused: {e}"));
                let child = self
                    .map
                    .cells()
                    .iter()
                    .find(|c| c.address == address)
                    .map(|c| c.id.clone())
                    .unwrap();
                self.provisioned.insert(child.clone());
                let done_at = self.now + DIVISION_MS / 2 + self.rng.below(DIVISION_MS);
                self.flights.push(Flight::Division { child, done_at });
                self.changes.push(self.now);
            }
            Decision::Absorb { cell, .. } => {
                assert!(active > self.config.min_cells, "absorbs below min_cells");
                assert!(
                    self.provisioned.contains(&cell),
                    "absorbs an operator's cell"
                );
                self.map = apply(
                    &self.map,
                    Change::BeginAbsorption {
                        departed: cell.clone(),
                        reason: AbsorptionReason::Leaving,
                    },
                )
                .unwrap_or_else(|e| panic!("absorption of {cell} refused: {e}"));
                let done_at = self.now + 500 + self.rng.below(2_000);
                self.flights.push(Flight::Absorption {
                    departed: cell,
                    done_at,
                });
                self.changes.push(self.now);
            }
            Decision::Balance {
                cell, to, share, ..
            } => {
                let range = self
                    .map
                    .shift_part(&cell, &to, share)
                    .unwrap_or_else(|| panic!("no part of {cell} to move to {to}"));
                self.map = apply(
                    &self.map,
                    Change::BeginShift {
                        from: cell.clone(),
                        to,
                        range,
                    },
                )
                .unwrap_or_else(|e| panic!("shift from {cell} refused: {e}"));
                let done_at = self.now + 500 + self.rng.below(2_000);
                self.flights.push(Flight::Shift {
                    from: cell,
                    done_at,
                });
                self.shifts += 1;
                self.changes.push(self.now);
            }
        }
    }

    fn step(&mut self) {
        self.now += STEP_MS;
        self.land();
        let busy: BTreeSet<CellId> = self
            .map
            .migrations()
            .iter()
            .flat_map(|m: &Migration| m.involved().iter().cloned())
            .collect();
        let reports = self.reports();
        let step = self.policy.observe(&Observation {
            now_ms: self.now,
            replication_factor: 2,
            busy: &busy,
            cells: &reports,
        });
        for d in step.decisions {
            self.carry_out(d);
        }
    }

    fn fullest(&self) -> f64 {
        self.held().values().fold(0.0_f64, |a, b| a.max(*b)) / LIMIT as f64
    }
}

fn run(seed: u64) {
    let mut sim = Sim::new(seed);
    // Growth at a rate divisions can keep up with — a tenth of a cell's memory per
    // division time, times 0.3..1 — to ten cells' worth of unique data (twenty cells'
    // with two copies).
    let per_step = LIMIT as f64 / 10.0 * STEP_MS as f64 / DIVISION_MS as f64
        * (0.3 + 0.7 * sim.rng.below(1000) as f64 / 1000.0);
    let target = 10.0 * LIMIT as f64;
    let mut steps = 0;
    while sim.data < target {
        sim.data += per_step;
        sim.step();
        steps += 1;
        assert!(steps < 20_000, "seed {seed}: growth never ended");
        let f = sim.fullest();
        // Within the time a failure costs (the join timeout, the backoff, a division), a
        // cell may fill up; the ring keeps serving.
        let excused = sim.failed_at.is_some_and(|t| sim.now < t + 30_000);
        assert!(
            excused || f < 1.0,
            "seed {seed}: a cell over its memory ({f:.2}) at {} ms, {} cells, {} in flight, \
             pending {:?}",
            sim.now,
            sim.map.cells().len(),
            sim.flights.len(),
            sim.policy.pending()
        );
    }
    // Plateau: the data hovers around the high watermark of the fullest cell.
    let plateau_from = sim.now;
    let base = sim.data;
    let period = 10_000 + sim.rng.below(50_000);
    for _ in 0..2_000u64 {
        let phase = (sim.now - plateau_from) as f64 / period as f64 * std::f64::consts::TAU;
        let noise = (sim.rng.below(2001) as f64 - 1000.0) / 1000.0 * 0.002;
        sim.data = base * (1.0 + 0.02 * phase.sin() + noise);
        sim.step();
    }
    let late: Vec<u64> = sim
        .changes
        .iter()
        .copied()
        .filter(|t| *t > plateau_from + 30_000)
        .collect();
    for w in late.windows(2) {
        assert!(
            w[1] - w[0] >= sim.config.cooldown_ms,
            "seed {seed}: changes at {late:?} while hovering"
        );
    }
    // By the plateau's end the balancing evened out the masters of neighbours (divisions
    // alone leave halves next to quarters).
    let shares: Vec<f64> = sim
        .map
        .active_cells()
        .map(|c| c.range.map_or(0.0, |r| r.len() as f64 / 2f64.powi(64)))
        .collect();
    let n = shares.len();
    let data = sim.data;
    for i in 0..n {
        let (a, b) = (shares[i], shares[(i + 1) % n]);
        let (heavy, light) = (a.max(b) * data, a.min(b) * data);
        let skewed = heavy > (1.0 + sim.config.balance_skew) * light
            && heavy - light >= sim.config.balance_min_fill * LIMIT as f64;
        assert!(
            n <= 2 || !skewed,
            "seed {seed}: neighbours still skewed at the plateau's end: shares {shares:?}"
        );
    }
    println!("  {n} cells, {} shifts, shares {shares:.3?}", sim.shifts);
    // Shrink to nothing: back to one cell.
    while sim.data > 0.0 {
        sim.data = (sim.data - per_step).max(0.0);
        sim.step();
    }
    for _ in 0..4_000 {
        sim.step();
        if sim.map.cells().len() == 1 && sim.flights.is_empty() {
            break;
        }
    }
    assert_eq!(
        sim.map.active_cells().count(),
        sim.config.min_cells,
        "seed {seed}: the ring did not shrink back ({} cells)",
        sim.map.cells().len()
    );
}

fn seeds() -> Vec<u64> {
    if let Ok(s) = std::env::var("CELLCACHE_SIM_SEED") {
        return vec![s.parse().expect("a seed")];
    }
    let n = std::env::var("CELLCACHE_SIM_SEEDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(8u64);
    (0..n).map(|i| 0x5EED_0000 + i).collect()
}

#[test]
fn the_policy_grows_holds_and_shrinks_a_simulated_ring() {
    for seed in seeds() {
        println!("seed {seed}");
        run(seed);
    }
}
