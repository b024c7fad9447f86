//! Unit tests of the automatic policy's decider (`auto.rs`): measured workloads, windows,
//! cooldowns and resets, as sample sequences.

use super::*;

fn config() -> SwitchingConfig {
    SwitchingConfig {
        auto: true,
        sample_interval_ms: 1_000,
        window_ms: 10_000,
        cooldown_ms: 60_000,
        min_evictions: 100,
        to_s3fifo_unread: 0.7,
        to_lru_ghost_hits: 0.4,
        events_kept: 4,
    }
}

/// A workload seen one second at a time: per second, `evicted` items evicted of which
/// `unread` never read, `inserted` items stored of which `ghost` remembered by the ghost.
#[derive(Clone, Copy)]
struct Rate {
    evicted: u64,
    unread: u64,
    inserted: u64,
    ghost: u64,
}

/// Feeds `seconds` of `rate` under whatever policy the decider last chose (a switch takes
/// effect from the next sample, as in a cell); returns the switches made, with their time.
fn run(
    d: &mut Decider,
    at: &mut Sample,
    policy: &mut Eviction,
    rate: Rate,
    seconds: u64,
) -> Vec<(u64, Eviction)> {
    let mut switches = Vec::new();
    for _ in 0..seconds {
        at.at_ms += 1_000;
        at.policy = Some(*policy);
        at.evicted += rate.evicted;
        at.evicted_unread += rate.unread;
        at.inserted += rate.inserted;
        at.ghost_hits += rate.ghost;
        if let Some(to) = d.observe(*at).switch_to {
            switches.push((at.at_ms, to));
            *policy = to;
        }
    }
    switches
}

const SCAN: Rate = Rate {
    evicted: 1_000,
    unread: 900,
    inserted: 1_000,
    ghost: 50,
};
const WIDE_REUSE: Rate = Rate {
    evicted: 1_000,
    unread: 500,
    inserted: 1_000,
    ghost: 450,
};

#[test]
fn table_of_workloads_each_settles_on_the_policy_measured_best() {
    // (name, rate, start, where it must end): the shares measured in-process under each
    // policy (docs/benchmarks/switching.md, "The automatic policy"), as rates.
    let cases = [
        (
            "zipf 1.0 over 10x, under lru",
            SCAN,
            Eviction::Lru,
            Eviction::S3fifo,
        ),
        (
            "zipf 1.0 over 10x, under s3fifo",
            SCAN,
            Eviction::S3fifo,
            Eviction::S3fifo,
        ),
        (
            "uniform over 2x, under s3fifo",
            WIDE_REUSE,
            Eviction::S3fifo,
            Eviction::Lru,
        ),
        (
            "uniform over 2x, under lru",
            WIDE_REUSE,
            Eviction::Lru,
            Eviction::Lru,
        ),
        (
            "zipf 0.6 over 2x (lru 53% unread, s3fifo 37% ghost): stays either way",
            Rate {
                evicted: 1_000,
                unread: 530,
                inserted: 1_000,
                ghost: 370,
            },
            Eviction::S3fifo,
            Eviction::S3fifo,
        ),
        (
            "everything fits: no evictions, no decision",
            Rate {
                evicted: 0,
                unread: 0,
                inserted: 1_000,
                ghost: 0,
            },
            Eviction::Lru,
            Eviction::Lru,
        ),
        (
            "too few evictions to judge",
            Rate {
                evicted: 5,
                unread: 5,
                inserted: 1_000,
                ghost: 0,
            },
            Eviction::Lru,
            Eviction::Lru,
        ),
    ];
    for (name, rate, start, end) in cases {
        let mut d = Decider::new(config());
        let (mut at, mut policy) = (Sample::default(), start);
        let switches = run(&mut d, &mut at, &mut policy, rate, 600);
        assert_eq!(policy, end, "{name}: {switches:?}");
        assert!(switches.len() <= 1, "{name} flapped: {switches:?}");
    }
}

#[test]
fn a_decision_needs_a_whole_window_under_the_running_policy() {
    let mut d = Decider::new(config());
    let (mut at, mut policy) = (Sample::default(), Eviction::Lru);
    // The first sample opens the window; ten seconds later it is whole.
    let switches = run(&mut d, &mut at, &mut policy, SCAN, 11);
    assert_eq!(switches, vec![(11_000, Eviction::S3fifo)]);
    let v = d.observe(Sample {
        at_ms: 12_000,
        policy: Some(Eviction::S3fifo),
        ..at
    });
    assert!(
        v.switch_to.is_none() && v.reason.starts_with("measuring s3fifo"),
        "{v:?}"
    );
    assert!(d.signal().is_none(), "a switch starts the measure over");
}

#[test]
fn a_workload_that_changes_back_and_forth_switches_at_most_once_per_cooldown() {
    let mut d = Decider::new(config());
    let (mut at, mut policy) = (Sample::default(), Eviction::Lru);
    let mut switches = Vec::new();
    // The pattern changes every 15 s, faster than the 60 s cooldown.
    for round in 0..40 {
        let rate = if round % 2 == 0 { SCAN } else { WIDE_REUSE };
        switches.extend(run(&mut d, &mut at, &mut policy, rate, 15));
    }
    assert!(
        switches.len() >= 2,
        "it follows the pattern at all: {switches:?}"
    );
    for pair in switches.windows(2) {
        assert!(pair[1].0 - pair[0].0 >= 60_000, "{switches:?}");
    }
}

#[test]
fn a_switch_by_hand_restarts_the_window_and_the_cooldown() {
    let mut d = Decider::new(config());
    let (mut at, mut policy) = (Sample::default(), Eviction::S3fifo);
    assert!(run(&mut d, &mut at, &mut policy, SCAN, 30).is_empty());
    // The operator switches to lru: the scan would make the policy switch back, but not
    // before the cooldown has passed since the operator's switch.
    policy = Eviction::Lru;
    let switches = run(&mut d, &mut at, &mut policy, SCAN, 120);
    assert_eq!(switches.len(), 1, "{switches:?}");
    assert!(switches[0].0 >= 31_000 + 60_000, "{switches:?}");
    let v = {
        let mut d = Decider::new(config());
        let (mut at, mut p) = (Sample::default(), Eviction::S3fifo);
        run(&mut d, &mut at, &mut p, SCAN, 30);
        p = Eviction::Lru;
        run(&mut d, &mut at, &mut p, SCAN, 20);
        at.at_ms += 1_000;
        d.observe(at)
    };
    assert!(v.reason.contains("cooldown"), "{v:?}");
}

#[test]
fn counters_reset_by_stats_reset_start_the_measure_over() {
    let mut d = Decider::new(config());
    let (mut at, mut policy) = (Sample::default(), Eviction::Lru);
    run(&mut d, &mut at, &mut policy, WIDE_REUSE, 20);
    assert!(d.signal().is_some());
    let reset = Sample {
        at_ms: at.at_ms + 1_000,
        policy: Some(Eviction::Lru),
        ..Sample::default()
    };
    let v = d.observe(reset);
    assert!(v.reason.starts_with("measuring"), "{v:?}");
    assert!(d.signal().is_none());
}

#[test]
fn another_policy_is_left_alone() {
    let mut d = Decider::new(config());
    for t in 1..100 {
        let v = d.observe(Sample {
            at_ms: t * 1_000,
            policy: None,
            evicted: t * 1_000,
            evicted_unread: t * 1_000,
            ..Sample::default()
        });
        assert!(v.switch_to.is_none());
    }
}

#[test]
fn the_signal_is_the_share_over_the_window_only() {
    let mut d = Decider::new(config());
    let (mut at, mut policy) = (Sample::default(), Eviction::S3fifo);
    // A long stretch of one pattern, then a window of another: only the window counts.
    run(&mut d, &mut at, &mut policy, SCAN, 100);
    run(
        &mut d,
        &mut at,
        &mut policy,
        Rate {
            evicted: 1_000,
            unread: 1_000,
            inserted: 2_000,
            ghost: 200,
        },
        11,
    );
    let s = d.signal().expect("a whole window was measured");
    assert!((s.ghost_hits - 0.1).abs() < 1e-9, "{s:?}");
    assert!((s.unread_evicted - 1.0).abs() < 1e-9, "{s:?}");
    assert!(s.window_ms >= 10_000 && s.window_ms <= 11_000, "{s:?}");
}
