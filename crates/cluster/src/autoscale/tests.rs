//! The policy, case by case: each case is a ring (fills, provisioned or not), a history of
//! samples and the decision expected at the end.

use super::*;

const MB: u64 = 1 << 20;

fn config() -> PolicyConfig {
    PolicyConfig {
        window_ms: 3_000,
        cooldown_ms: 10_000,
        division_lead_ms: 5_000,
        join_timeout_ms: 20_000,
        retry_backoff_ms: 1_000,
        retry_backoff_max_ms: 8_000,
        // The tables below are about dividing and absorbing; balancing has its own cases.
        balance_skew: 0.0,
        ..PolicyConfig::default()
    }
}

/// A cell of 100 MB at `fill`, mastering `1/r` of what it holds.
fn cell(n: u64, fill: f64, provisioned: bool) -> CellReport {
    let bytes = (fill * 100.0 * MB as f64) as u64;
    CellReport {
        id: CellId::whole(n),
        active: true,
        provisioned,
        figures: Some(Figures {
            bytes,
            limit: 100 * MB,
            master_bytes: bytes / 2,
            evictions: 0,
            requests: 0,
        }),
        share: 0.5,
    }
}

/// Feeds `ring` every second from `from` to `to` (inclusive); returns the decisions.
fn run(a: &mut Autoscaler, ring: &[CellReport], from: u64, to: u64) -> Vec<(u64, Decision)> {
    let mut out = Vec::new();
    for s in from..=to {
        for d in observe(a, ring, s * 1000, &BTreeSet::new()).decisions {
            out.push((s, d));
        }
    }
    out
}

fn observe(a: &mut Autoscaler, ring: &[CellReport], now_ms: u64, busy: &BTreeSet<CellId>) -> Step {
    a.observe(&Observation {
        now_ms,
        replication_factor: 2,
        busy,
        cells: ring,
    })
}

fn action(d: &Decision) -> (&'static str, u64) {
    match d {
        Decision::Divide { cell, .. } => ("divide", cell.whole_part()),
        Decision::Absorb { cell, .. } => ("absorb", cell.whole_part()),
        Decision::Balance { cell, .. } => ("balance", cell.whole_part()),
    }
}

#[test]
fn table_of_steady_rings() {
    // (what, ring as (id, fill, provisioned), seconds observed, expected first decision)
    type Case = (
        &'static str,
        Vec<(u64, f64, bool)>,
        u64,
        Option<(&'static str, u64)>,
    );
    let cases: Vec<Case> = vec![
        (
            "all in the band",
            vec![(1, 0.5, false), (2, 0.5, true)],
            60,
            None,
        ),
        (
            "above for the window",
            vec![(1, 0.85, false)],
            60,
            Some(("divide", 1)),
        ),
        (
            "above, window not yet over",
            vec![(1, 0.85, false)],
            2,
            None,
        ),
        (
            "the fullest divides",
            vec![(1, 0.82, false), (2, 0.9, true), (3, 0.81, true)],
            60,
            Some(("divide", 2)),
        ),
        (
            "at max cells nothing divides",
            (1..=32).map(|i| (i, 0.95, true)).collect(),
            60,
            None,
        ),
        (
            "a provisioned idle cell is absorbed",
            vec![(1, 0.2, false), (2, 0.1, true), (3, 0.2, true)],
            60,
            Some(("absorb", 2)),
        ),
        (
            "an operator's cell is never absorbed",
            vec![(1, 0.1, false), (2, 0.1, false)],
            60,
            None,
        ),
        ("never below min cells", vec![(1, 0.1, true)], 60, None),
        // Absorbing 2 would put 3 at 0.29 + 0.29/2 (its new backup) = 0.44 < 0.55: allowed;
        // but here the successor would reach 0.5 + 0.25 = 0.75: refused.
        (
            "hysteresis: no absorption that sets up a division",
            vec![(1, 0.5, false), (2, 0.29, true), (3, 0.5, true)],
            60,
            None,
        ),
        (
            "below low but not for the window",
            vec![(1, 0.2, false), (2, 0.1, true)],
            2,
            None,
        ),
    ];
    for (what, ring, secs, want) in cases {
        let ring: Vec<CellReport> = ring.iter().map(|&(n, f, p)| cell(n, f, p)).collect();
        let mut a = Autoscaler::new(config());
        let got = run(&mut a, &ring, 0, secs);
        assert_eq!(got.first().map(|(_, d)| action(d)), want, "{what}: {got:?}");
    }
}

#[test]
fn a_division_racing_eviction_does_not_wait_for_its_window() {
    let mut a = Autoscaler::new(config());
    // Filling 4 MB/s from 78%: above 80% at t=1 with 20 MB left, a 5 s division away.
    let mut decided = None;
    for s in 0..20u64 {
        let ring = [cell(1, 0.78 + 0.04 * s as f64, false)];
        if let Some(d) = observe(&mut a, &ring, s * 1000, &BTreeSet::new())
            .decisions
            .pop()
        {
            decided = Some((s, d));
            break;
        }
    }
    let (s, d) = decided.expect("divided");
    assert!(s < 3, "divided at {s} s, after its window: {d:?}");
    assert!(d.reason().contains("would evict within"), "{}", d.reason());
}

#[test]
fn an_evicting_cell_divides_below_high_water() {
    let mut a = Autoscaler::new(config());
    let mut ring = [cell(1, 0.6, false)];
    run(&mut a, &ring, 0, 1);
    if let Some(f) = ring[0].figures.as_mut() {
        f.evictions = 10;
    }
    let got = run(&mut a, &ring, 2, 2);
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(got[0].1.reason().contains("evicting"));
}

#[test]
fn one_change_at_a_time_and_a_cooldown_after_it() {
    let mut a = Autoscaler::new(config());
    let ring = [cell(1, 0.9, false), cell(2, 0.9, true)];
    let first = run(&mut a, &ring, 0, 5);
    assert_eq!(
        first.len(),
        1,
        "only one decision while it is pending: {first:?}"
    );
    // The division of the fuller cell (2) runs for 4 s, then the map has three cells.
    let (_, d) = &first[0];
    let busy: BTreeSet<CellId> = [CellId::whole(1), CellId::whole(2)].into();
    for s in 6..10 {
        assert_eq!(observe(&mut a, &ring, s * 1000, &busy), Step::default());
    }
    assert_eq!(
        d.cell(),
        &CellId::whole(1),
        "equal fills: the first in ring order"
    );
    let three = [
        cell(1, 0.9, false),
        CellReport {
            id: CellId::between(&CellId::whole(1), Some(&CellId::whole(2))).unwrap(),
            ..cell(3, 0.5, true)
        },
        cell(2, 0.9, true),
    ];
    let done = observe(&mut a, &three, 10_000, &BTreeSet::new());
    assert_eq!(done.done.len(), 1, "the division is seen through: {done:?}");
    let after = run(&mut a, &three, 11, 40);
    let (at, _) = after.first().expect("divides again after the cooldown");
    assert!(
        *at >= 19,
        "next change at {at} s, inside the 10 s cooldown from 9 s"
    );
    assert!(a.division_lead_ms() > 0);
}

#[test]
fn a_failed_decision_is_retried_with_backoff() {
    let mut a = Autoscaler::new(config());
    let ring = [cell(1, 0.9, false)];
    let d = run(&mut a, &ring, 0, 3);
    assert_eq!(d.len(), 1);
    a.failed(d[0].1.cell(), 3_000);
    assert_eq!(a.failures(), 1);
    // Backoff 1 s: the next decision at 4 s; then 2 s, then 4 s.
    let again = run(&mut a, &ring, 4, 4);
    assert_eq!(again.len(), 1, "retried once the backoff passed");
    a.failed(again[0].1.cell(), 4_000);
    assert!(run(&mut a, &ring, 5, 5).is_empty(), "second backoff is 2 s");
    assert_eq!(run(&mut a, &ring, 6, 6).len(), 1);
    // A pending decision that never shows in the map fails by itself.
    assert!(run(&mut a, &ring, 7, 29).is_empty());
    assert_eq!(a.failures(), 3, "timed out after join_timeout_ms");
}

#[test]
fn hovering_at_the_watermark_changes_at_most_once_per_cooldown() {
    let cfg = config();
    let mut a = Autoscaler::new(cfg.clone());
    let mut cells = 1usize;
    let mut changes = Vec::new();
    for s in 0..600u64 {
        // Fill wobbles around 80% (±3 points), whatever the ring's size.
        let wobble = [0.0, 0.03, -0.02, 0.01, -0.03, 0.02][(s % 6) as usize];
        let ring: Vec<CellReport> = (1..=cells as u64)
            .map(|i| cell(i, 0.8 + wobble, i > 1))
            .collect();
        for d in observe(&mut a, &ring, s * 1000, &BTreeSet::new()).decisions {
            changes.push(s * 1000);
            match d {
                Decision::Divide { .. } => cells += 1,
                Decision::Absorb { .. } => cells -= 1,
                Decision::Balance { .. } => {}
            }
        }
    }
    for w in changes.windows(2) {
        assert!(w[1] - w[0] >= cfg.cooldown_ms, "changes at {changes:?}");
    }
}

#[test]
fn absorbing_estimates_what_the_successor_and_its_backup_hold() {
    // r = 2, four cells of 100 MB each mastering 10 MB (holding 20 MB).
    let ring: Vec<CellReport> = (1..=4).map(|i| cell(i, 0.2, true)).collect();
    // Absorbing cell 2: cell 3 masters 20 MB and backs up cell 1 (10): 30 MB; cell 4 backs
    // up cell 3's 20 MB: 30 MB.
    let f = fullest_after_absorbing(&ring, 1, 2);
    assert!((f - 0.3).abs() < 0.01, "{f}");
    // Two cells of r = 2 each hold everything already: nothing grows.
    let two: Vec<CellReport> = (1..=2).map(|i| cell(i, 0.5, true)).collect();
    assert_eq!(fullest_after_absorbing(&two, 0, 2), 0.0);
}

#[test]
fn bad_settings_are_refused() {
    let mut c = PolicyConfig::default();
    assert!(c.validate().is_ok());
    c.low_water = 0.9;
    assert!(c.validate().is_err());
    let c = PolicyConfig {
        min_cells: 0,
        ..PolicyConfig::default()
    };
    assert!(c.validate().is_err());
}

#[test]
fn cells_racing_eviction_divide_in_parallel_when_their_changes_do_not_touch() {
    let mut a = Autoscaler::new(config());
    let mut decisions = Vec::new();
    for s in 0..3u64 {
        let ring: Vec<CellReport> = (1..=6)
            .map(|i| cell(i, 0.80 + 0.04 * s as f64, i > 1))
            .collect();
        decisions.extend(observe(&mut a, &ring, s * 1000, &BTreeSet::new()).decisions);
    }
    // r = 2: a division involves the cell and its successor, so at most 3 of 6 at once.
    assert_eq!(decisions.len(), 3, "{decisions:?}");
    let ring: Vec<CellReport> = (1..=6).map(|i| cell(i, 0.9, true)).collect();
    let r = Ring::of(&ring);
    let mut seen = BTreeSet::new();
    for d in &decisions {
        assert!(d.reason().contains("would evict within"), "{}", d.reason());
        for c in r.involved(d, 2) {
            assert!(
                seen.insert(c.clone()),
                "cell {c} in two changes: {decisions:?}"
            );
        }
    }
    assert_eq!(a.pending().len(), 3);
}

#[test]
fn a_growing_ring_absorbs_nothing() {
    let mut a = Autoscaler::new(config());
    let mut got = Vec::new();
    for s in 0..30u64 {
        // Cell 2, just divided off, is nearly empty; cell 1 fills 1% a second.
        let ring = [cell(1, 0.4 + 0.01 * s as f64, false), cell(2, 0.1, true)];
        got.extend(observe(&mut a, &ring, s * 1000, &BTreeSet::new()).decisions);
    }
    assert!(got.is_empty(), "{got:?}");
}

#[test]
fn a_ring_that_stopped_growing_absorbs_though_its_smoothed_rate_stays_above_zero() {
    let mut a = Autoscaler::new(config());
    // Cell 1 grew by a hand-off once, then held still: its smoothed rate decays towards
    // zero without reaching it.
    let grown = [cell(1, 0.18, false), cell(2, 0.1, true)];
    assert!(run(&mut a, &grown, 0, 1).is_empty());
    let still = [cell(1, 0.2, false), cell(2, 0.1, true)];
    let got = run(&mut a, &still, 2, 60);
    assert_eq!(
        got.first().map(|(_, d)| action(d)),
        Some(("absorb", 2)),
        "{got:?}"
    );
}

/// A ring of `masters` (MB each, r = 2, cells of 100 MB), every cell Active and reporting.
fn mastering(masters: &[u64]) -> Vec<CellReport> {
    let n = masters.len();
    (0..n)
        .map(|i| {
            let held = masters[i] + masters[(i + n - 1) % n];
            CellReport {
                id: CellId::whole(i as u64 + 1),
                active: true,
                provisioned: false,
                figures: Some(Figures {
                    bytes: held * MB,
                    limit: 100 * MB,
                    master_bytes: masters[i] * MB,
                    evictions: 0,
                    requests: 0,
                }),
                // Even ranges: the bytes differ, the map changes only when a test says so.
                share: 1.0 / n as f64,
            }
        })
        .collect()
}

#[test]
fn skewed_neighbours_move_their_boundary_after_the_window() {
    let cfg = PolicyConfig {
        balance_skew: 0.5,
        balance_min_fill: 0.05,
        ..config()
    };
    // What divisions leave: a half next to two quarters.
    let ring = mastering(&[20, 10, 10]);
    let mut a = Autoscaler::new(cfg.clone());
    let before = run(&mut a, &ring, 0, cfg.window_ms / 1000 - 1);
    assert!(before.is_empty(), "not before the window: {before:?}");
    let d = run(&mut a, &ring, cfg.window_ms / 1000, cfg.window_ms / 1000);
    let [
        (
            _,
            Decision::Balance {
                cell, to, share, ..
            },
        ),
    ] = d.as_slice()
    else {
        panic!("expected one balance decision, got {d:?}");
    };
    assert_eq!((cell, to), (&CellId::whole(1), &CellId::whole(2)));
    assert!((share - 0.25).abs() < 1e-9, "evens 20 and 10 out: {share}");
    // One change at a time: nothing more while it is pending.
    let more = run(
        &mut a,
        &ring,
        cfg.window_ms / 1000 + 1,
        cfg.window_ms / 1000 + 5,
    );
    assert!(more.is_empty(), "{more:?}");
    // Seen through once the giver masters less of the ring.
    let mut after = mastering(&[15, 15, 10]);
    after[0].share = 1.0 / 3.0 - 0.01;
    let s = observe(&mut a, &after, 20_000, &BTreeSet::new());
    assert_eq!(s.done.len(), 1, "{s:?}");
}

#[test]
fn balancing_leaves_alone_what_is_even_small_or_would_overfill() {
    let cfg = PolicyConfig {
        balance_skew: 0.5,
        balance_min_fill: 0.05,
        ..config()
    };
    let quiet = |ring: &[CellReport], why: &str| {
        let mut a = Autoscaler::new(cfg.clone());
        let d = run(&mut a, ring, 0, 3 * cfg.window_ms / 1000);
        assert!(d.is_empty(), "{why}: {d:?}");
    };
    quiet(&mastering(&[14, 10, 10]), "within the skew");
    quiet(
        &mastering(&[4, 2, 2]),
        "a difference below balance_min_fill of memory",
    );
    quiet(
        &mastering(&[20, 10]),
        "two cells with two copies each hold everything",
    );
    // The cell after the receiver backs up the receiver's grown range: here 60 + 20 MB, at
    // high water and above the fullest cell now (75): that move is not made.
    let ring = mastering(&[30, 10, 60, 15]);
    let none = BTreeSet::new();
    let skews = skewed_pairs(
        &cfg,
        &Observation {
            now_ms: 0,
            replication_factor: 2,
            busy: &none,
            cells: &ring,
        },
        &BTreeMap::new(),
    );
    let first = skews
        .iter()
        .find(|s| s.at == 0)
        .expect("cells 1 and 2 are skewed");
    assert!((fullest_after_shift(&ring, first, 2) - 0.8).abs() < 1e-9);
    let mut a = Autoscaler::new(cfg.clone());
    let d = run(&mut a, &ring, 0, cfg.window_ms / 1000);
    assert!(
        d.iter().all(|(_, d)| d.cell() != &CellId::whole(1)),
        "cell 1 gives nothing to 2: {d:?}"
    );
    let off = PolicyConfig {
        balance_skew: 0.0,
        ..cfg.clone()
    };
    let mut a = Autoscaler::new(off);
    assert!(
        run(&mut a, &mastering(&[20, 10, 10]), 0, 30).is_empty(),
        "off"
    );
}

#[test]
fn a_growing_ring_is_not_balanced() {
    let cfg = PolicyConfig {
        balance_skew: 0.5,
        balance_min_fill: 0.05,
        ..config()
    };
    let mut a = Autoscaler::new(cfg.clone());
    // Skewed, and the ring gaining about 2 MB a second (past steady_fill, short of racing
    // eviction): divisions will reshape it, a move would only churn.
    let last = 3 * cfg.window_ms / 1000;
    for s in 0..=last {
        let ring = mastering(&[40 + s, 20, 20]);
        let d = observe(&mut a, &ring, s * 1000, &BTreeSet::new()).decisions;
        assert!(d.is_empty(), "second {s}: {d:?}");
    }
    // Once it holds still, the skew is evened out.
    let ring = mastering(&[40 + last, 20, 20]);
    let from = last + 1;
    let d = run(&mut a, &ring, from, from + 3 * cfg.window_ms / 1000);
    assert!(
        d.iter().any(|(_, d)| matches!(d, Decision::Balance { .. })),
        "{d:?}"
    );
}

/// `mastering(masters)` whose cells have executed `loads[i]` key requests a second for
/// `secs` seconds.
fn loaded(masters: &[u64], loads: &[u64], secs: u64) -> Vec<CellReport> {
    let mut ring = mastering(masters);
    for (c, load) in ring.iter_mut().zip(loads) {
        if let Some(f) = c.figures.as_mut() {
            f.requests = load * secs;
        }
    }
    ring
}

fn run_loaded(a: &mut Autoscaler, masters: &[u64], loads: &[u64], to: u64) -> Vec<Decision> {
    (0..=to)
        .flat_map(|s| {
            let ring = loaded(masters, loads, s);
            observe(a, &ring, s * 1000, &BTreeSet::new()).decisions
        })
        .collect()
}

/// The decisions of three windows of `masters` and `loads` under `cfg`.
fn moves(cfg: &PolicyConfig, masters: &[u64], loads: &[u64]) -> Vec<Decision> {
    let mut a = Autoscaler::new(cfg.clone());
    run_loaded(&mut a, masters, loads, 3 * cfg.window_ms / 1000)
}

/// Balancing by memory and by load on, as by default.
fn balancing() -> PolicyConfig {
    PolicyConfig {
        balance_skew: 0.5,
        ..config()
    }
}

#[test]
fn neighbours_even_in_memory_but_not_in_load_are_balanced_by_load() {
    let cfg = balancing();
    let d = moves(&cfg, &[20, 20, 20], &[5000, 1000, 1200]);
    let [
        Decision::Balance {
            cell,
            to,
            share,
            reason,
        },
    ] = d.as_slice()
    else {
        panic!("one move: {d:?}")
    };
    assert_eq!(
        (cell, to),
        (&CellId::whole(1), &CellId::whole(2)),
        "{reason}"
    );
    // 0.4 would even 5000 vs 1000 out, but would leave 20 MB vs 20 MB at 12 vs 28 MB: the
    // move stops where the bytes are 1 + balance_skew / 2 = 1.25 times apart, 1/9.
    assert!((share - 1.0 / 9.0).abs() < 1e-9, "{share}");
    assert!(reason.contains("key requests/s"), "{reason}");
    // Below the thresholds: nothing.
    for (loads, why) in [
        (&[1800, 1000, 1000], "within balance_load_skew"),
        (&[900, 100, 100], "less than balance_min_load apart"),
        (&[0, 0, 0], "idle"),
    ] {
        let d = moves(&cfg, &[20, 20, 20], loads);
        assert!(d.is_empty(), "{why}: {d:?}");
    }
    let off = PolicyConfig {
        balance_load_skew: 0.0,
        ..cfg
    };
    assert!(moves(&off, &[20, 20, 20], &[5000, 1000, 1000]).is_empty());
}

/// A busy cell next to cells that master more bytes: giving them the share that evens the
/// load would leave them skewed in memory the other way, and the next move would give it
/// back. Neither move is made; with room in memory, it is.
#[test]
fn no_move_is_made_that_the_other_measure_would_undo() {
    let cfg = balancing();
    let d = moves(&cfg, &[20, 28, 28], &[5000, 1000, 1000]);
    assert!(d.is_empty(), "{d:?}");
    let d = moves(&cfg, &[20, 20, 20], &[5000, 1000, 1000]);
    assert_eq!(d.len(), 1, "{d:?}");
}

/// A division halves its parent's bytes between two samples; that is not the ring's data
/// shrinking, so a ring that keeps growing is still not balanced after it (the 1 -> N -> 1
/// run moved boundaries while 500 keys a second were written).
#[test]
fn a_division_is_not_taken_for_shrinking_data() {
    let cfg = PolicyConfig {
        balance_skew: 0.5,
        balance_min_fill: 0.05,
        ..config()
    };
    let mut a = Autoscaler::new(cfg.clone());
    let divided_at = cfg.window_ms / 1000 + 2;
    let last = divided_at + 3 * cfg.window_ms / 1000;
    for s in 0..=last {
        // Cell 1 gains 1 MB a second as master (2 MB a second for the ring, with backups).
        let ring = if s < divided_at {
            mastering(&[50 + s, 10, 10])
        } else {
            // Cell 1.5 took the upper half of cell 1's range; both keep growing.
            let half = (50 + s) / 2;
            let mut ring = mastering(&[50 + s - half, half, 10, 10]);
            for (c, id) in ring.iter_mut().zip(["1", "1.5", "2", "3"]) {
                c.id = id.parse().unwrap();
            }
            ring
        };
        let d = observe(&mut a, &ring, s * 1000, &BTreeSet::new()).decisions;
        assert!(
            d.iter().all(|d| !matches!(d, Decision::Balance { .. })),
            "second {s}: {d:?}"
        );
    }
}
