//! Data-driven tests of map transitions: tables of (steps from a bootstrap map) → expected
//! layout or error, using the 0..127 example ring of the Cell Cycle proposal (the design
//! cellcache started from) scaled to 64 bits (one unit of that ring is 2^57 hashes), plus a
//! property test over random change sequences.

use super::*;
use crate::HashRange;
use proptest::prelude::*;

fn id(s: &str) -> CellId {
    s.parse().expect("valid id")
}

fn addr(n: u32) -> CellAddress {
    CellAddress {
        client: format!("127.0.0.1:{}", 20000 + n),
        peer: format!("127.0.0.1:{}", 30000 + n),
    }
}

/// Range `[a, b]` of the Cell Cycle proposal's 0..=127 example ring, scaled to u64.
fn seed(a: u64, b: u64) -> HashRange {
    HashRange::new(a << 57, ((b + 1) << 57).wrapping_sub(1))
}

#[derive(Clone, Copy, Debug)]
enum Step {
    /// Begin and complete a division of this parent.
    Divide(&'static str),
    BeginDivision(&'static str),
    CompleteDivision(&'static str),
    AbortDivision(&'static str),
    Absorb(&'static str),
    BeginAbsorption(&'static str, AbsorptionReason),
    CompleteAbsorption(&'static str),
    Fence(&'static str),
    /// Propose the next change against an old epoch.
    StaleBeginDivision(&'static str),
}

struct Run {
    map: ClusterMap,
    next_addr: u32,
}

impl Run {
    fn new(r: u8) -> Run {
        Run {
            map: ClusterMap::bootstrap(id("1"), addr(0), r).unwrap(),
            next_addr: 1,
        }
    }

    fn apply(&mut self, change: Change, based_on_epoch: u64) -> Result<(), ChangeError> {
        let before = self.map.epoch();
        let next = apply(
            &self.map,
            &Proposal {
                based_on_epoch,
                change,
            },
        )?;
        assert_eq!(
            next.epoch(),
            before + 1,
            "every change bumps the epoch by one"
        );
        self.map = next;
        Ok(())
    }

    fn begin_division(&mut self, parent: &str, epoch: u64) -> Result<(), ChangeError> {
        self.next_addr += 1;
        let child_address = addr(self.next_addr);
        self.apply(
            Change::BeginDivision {
                parent: id(parent),
                child_address,
            },
            epoch,
        )
    }

    fn step(&mut self, step: Step) -> Result<(), ChangeError> {
        let e = self.map.epoch();
        match step {
            Step::Divide(p) => {
                self.begin_division(p, e)?;
                let child = self
                    .map
                    .cells()
                    .iter()
                    .find(|c| c.state == CellState::Joining && c.id > id(p))
                    .map(|c| c.id.clone())
                    .expect("child present");
                self.apply(Change::CompleteDivision { child }, e + 1)
            }
            Step::BeginDivision(p) => self.begin_division(p, e),
            Step::StaleBeginDivision(p) => self.begin_division(p, e - 1),
            Step::CompleteDivision(c) => self.apply(Change::CompleteDivision { child: id(c) }, e),
            Step::AbortDivision(c) => self.apply(Change::AbortDivision { child: id(c) }, e),
            Step::Absorb(d) => {
                let reason = AbsorptionReason::Crashed;
                self.apply(
                    Change::BeginAbsorption {
                        departed: id(d),
                        reason,
                    },
                    e,
                )?;
                self.apply(Change::CompleteAbsorption { departed: id(d) }, e + 1)
            }
            Step::BeginAbsorption(d, reason) => self.apply(
                Change::BeginAbsorption {
                    departed: id(d),
                    reason,
                },
                e,
            ),
            Step::CompleteAbsorption(d) => {
                self.apply(Change::CompleteAbsorption { departed: id(d) }, e)
            }
            Step::Fence(c) => self.apply(Change::Fence { cell: id(c) }, e),
        }
    }

    fn layout(&self) -> Vec<(String, CellState, Option<HashRange>)> {
        self.map
            .cells()
            .iter()
            .map(|c| (c.id.to_string(), c.state, c.range))
            .collect()
    }
}

use CellState::{Active as A, Dead as D, Joining as J, Leaving as L};

/// The Cell Cycle proposal's "Adding a node" and "Deleting a node" examples, in order.
fn seed_ring() -> Vec<Step> {
    use Step::Divide;
    vec![
        Divide("1"),
        Divide("2"),
        Divide("2"),
        Divide("3"),
        Divide("1"),
        Divide("2"),
    ]
}

type Layout = Vec<(&'static str, CellState, Option<HashRange>)>;
type Expected = Result<Layout, fn(&ChangeError) -> bool>;
type Case = (&'static str, u8, Vec<Step>, Expected);

fn check(name: &str, r: u8, steps: &[Step], expected: Expected) {
    let mut run = Run::new(r);
    let mut outcome = Ok(());
    for (i, s) in steps.iter().enumerate() {
        outcome = run.step(*s);
        if outcome.is_err() {
            assert_eq!(
                i,
                steps.len() - 1,
                "{name}: step {i} ({s:?}) failed early: {outcome:?}"
            );
        }
    }
    match (expected, outcome) {
        (Ok(layout), Ok(())) => {
            let want: Vec<_> = layout
                .into_iter()
                .map(|(i, s, r)| (i.to_string(), s, r))
                .collect();
            assert_eq!(run.layout(), want, "{name}");
            // Every committed map survives the wire and places every boundary hash on the
            // Active cell whose range contains it.
            let back = ClusterMap::decode(&run.map.encode(), 1 << 20).unwrap();
            assert_eq!(back, run.map, "{name}: encode/decode");
            for c in run.map.active_cells() {
                let r = c.range.unwrap();
                for h in [
                    r.start,
                    r.end,
                    r.start.wrapping_add(r.end.wrapping_sub(r.start) / 2),
                ] {
                    assert_eq!(run.map.owner(h).id, c.id, "{name}: owner of {h:#x}");
                }
            }
        }
        (Err(matches), Err(e)) => assert!(matches(&e), "{name}: unexpected error {e:?}"),
        (want, got) => panic!("{name}: expected {:?}, got {got:?}", want.map(|_| ())),
    }
}

#[test]
fn proposals_division_and_absorption_examples() {
    let mut steps = seed_ring();
    check(
        "the proposal's division example",
        2,
        &steps,
        Ok(vec![
            ("1", A, Some(seed(0, 31))),
            ("1.5", A, Some(seed(32, 63))),
            ("2", A, Some(seed(64, 71))),
            ("2.25", A, Some(seed(72, 79))),
            ("2.5", A, Some(seed(80, 95))),
            ("3", A, Some(seed(96, 111))),
            ("4", A, Some(seed(112, 127))),
        ]),
    );
    steps.push(Step::BeginAbsorption("2", AbsorptionReason::Crashed));
    check(
        "the proposal's crash example: node 2 crashed, 2.25 takes [64,79]",
        2,
        &steps,
        Ok(vec![
            ("1", A, Some(seed(0, 31))),
            ("1.5", A, Some(seed(32, 63))),
            ("2", D, None),
            ("2.25", A, Some(seed(64, 79))),
            ("2.5", A, Some(seed(80, 95))),
            ("3", A, Some(seed(96, 111))),
            ("4", A, Some(seed(112, 127))),
        ]),
    );
}

#[test]
fn transition_table() {
    use AbsorptionReason::{Crashed, Leaving};
    use Step::*;
    let ring = seed_ring();
    let with = |extra: &[Step]| -> Vec<Step> { ring.iter().chain(extra).copied().collect() };
    let cases: Vec<Case> = vec![
        (
            "1 -> 2 cells",
            2,
            vec![Divide("1")],
            Ok(vec![
                ("1", A, Some(seed(0, 63))),
                ("2", A, Some(seed(64, 127))),
            ]),
        ),
        (
            "joining child masters nothing yet",
            2,
            vec![BeginDivision("1")],
            Ok(vec![("1", A, Some(seed(0, 127))), ("2", J, None)]),
        ),
        (
            "aborted child is fenced; its id is never reused",
            2,
            vec![
                Divide("1"),
                BeginDivision("2"),
                AbortDivision("3"),
                Divide("2"),
            ],
            Ok(vec![
                ("1", A, Some(seed(0, 63))),
                ("2", A, Some(seed(64, 95))),
                ("2.5", A, Some(seed(96, 127))),
            ]),
        ),
        (
            "absorb first cell: successor extends backwards",
            2,
            with(&[Absorb("1")]),
            Ok(vec![
                ("1.5", A, Some(seed(0, 63))),
                ("2", A, Some(seed(64, 71))),
                ("2.25", A, Some(seed(72, 79))),
                ("2.5", A, Some(seed(80, 95))),
                ("3", A, Some(seed(96, 111))),
                ("4", A, Some(seed(112, 127))),
            ]),
        ),
        (
            "absorb last cell: first cell's range wraps around",
            2,
            with(&[Absorb("4")]),
            Ok(vec![
                ("1", A, Some(HashRange::new(112 << 57, (32 << 57) - 1))),
                ("1.5", A, Some(seed(32, 63))),
                ("2", A, Some(seed(64, 71))),
                ("2.25", A, Some(seed(72, 79))),
                ("2.5", A, Some(seed(80, 95))),
                ("3", A, Some(seed(96, 111))),
            ]),
        ),
        (
            "divide a wrapping range",
            2,
            with(&[Absorb("4"), Divide("1")]),
            Ok(vec![
                ("1", A, Some(HashRange::new(112 << 57, (8 << 57) - 1))),
                ("1.25", A, Some(seed(8, 31))),
                ("1.5", A, Some(seed(32, 63))),
                ("2", A, Some(seed(64, 71))),
                ("2.25", A, Some(seed(72, 79))),
                ("2.5", A, Some(seed(80, 95))),
                ("3", A, Some(seed(96, 111))),
            ]),
        ),
        (
            "graceful leave of a middle cell",
            2,
            vec![Divide("1"), Divide("2"), BeginAbsorption("2", Leaving)],
            Ok(vec![
                ("1", A, Some(seed(0, 63))),
                ("2", L, None),
                ("3", A, Some(seed(64, 127))),
            ]),
        ),
        (
            "fence a leaving cell: it becomes dead, absorption goes on",
            2,
            vec![
                Divide("1"),
                Divide("2"),
                BeginAbsorption("2", Leaving),
                Fence("2"),
                CompleteAbsorption("2"),
            ],
            Ok(vec![
                ("1", A, Some(seed(0, 63))),
                ("3", A, Some(seed(64, 127))),
            ]),
        ),
        (
            "absorb down to one cell, then the last cannot go",
            2,
            vec![Divide("1"), Absorb("1"), Absorb("2")],
            Err(|e| matches!(e, ChangeError::LastCell)),
        ),
        (
            "stale epoch refused",
            2,
            vec![Divide("1"), StaleBeginDivision("2")],
            Err(|e| {
                matches!(
                    e,
                    ChangeError::StaleEpoch {
                        proposed: 2,
                        current: 3
                    }
                )
            }),
        ),
        (
            "absorption refused while the successor is in a division",
            2,
            with(&[BeginDivision("2.5"), BeginAbsorption("3", Crashed)]),
            Err(|e| matches!(e, ChangeError::Overlap(_))),
        ),
        (
            "division refused while its parent is being absorbed into",
            2,
            with(&[BeginAbsorption("2", Crashed), BeginDivision("2.25")]),
            Err(|e| matches!(e, ChangeError::Overlap(_))),
        ),
        (
            "non-overlapping changes may be in flight together (r=2)",
            2,
            with(&[
                BeginDivision("1"),
                BeginAbsorption("2.25", Crashed),
                CompleteDivision("1.25"),
            ]),
            Ok(vec![
                ("1", A, Some(seed(0, 15))),
                ("1.25", A, Some(seed(16, 31))),
                ("1.5", A, Some(seed(32, 63))),
                ("2", A, Some(seed(64, 71))),
                ("2.25", D, None),
                ("2.5", A, Some(seed(72, 95))),
                ("3", A, Some(seed(96, 111))),
                ("4", A, Some(seed(112, 127))),
            ]),
        ),
        (
            "r=3: the same pair overlaps (the predecessor of the absorbed cell is involved)",
            3,
            with(&[BeginDivision("1"), BeginAbsorption("2.25", Crashed)]),
            Err(|e| matches!(e, ChangeError::Overlap(_))),
        ),
        (
            "fencing a dividing parent aborts the division and absorbs the parent",
            2,
            with(&[BeginDivision("2.5"), Fence("2.5")]),
            Ok(vec![
                ("1", A, Some(seed(0, 31))),
                ("1.5", A, Some(seed(32, 63))),
                ("2", A, Some(seed(64, 71))),
                ("2.25", A, Some(seed(72, 79))),
                ("2.5", D, None),
                ("3", A, Some(seed(80, 111))),
                ("4", A, Some(seed(112, 127))),
            ]),
        ),
        (
            "fencing the successor of an absorption closes that absorption first",
            2,
            with(&[BeginAbsorption("2", Crashed), Fence("2.25")]),
            Ok(vec![
                ("1", A, Some(seed(0, 31))),
                ("1.5", A, Some(seed(32, 63))),
                ("2.25", D, None),
                ("2.5", A, Some(seed(64, 95))),
                ("3", A, Some(seed(96, 111))),
                ("4", A, Some(seed(112, 127))),
            ]),
        ),
        (
            "double fence refused",
            2,
            vec![Divide("1"), Fence("2"), Fence("2")],
            Err(|e| {
                matches!(
                    e,
                    ChangeError::WrongState {
                        state: CellState::Dead,
                        ..
                    }
                )
            }),
        ),
        (
            "complete without a migration refused",
            2,
            vec![Divide("1"), CompleteDivision("2")],
            Err(|e| matches!(e, ChangeError::WrongState { .. })),
        ),
        (
            "unknown cell refused",
            2,
            vec![Absorb("7")],
            Err(|e| matches!(e, ChangeError::UnknownCell(_))),
        ),
    ];
    for (name, r, steps, expected) in cases {
        check(name, r, &steps, expected);
    }
}

#[test]
fn involved_cells_follow_the_replication_factor() {
    for (r, expected) in [
        (2u8, vec!["2", "2.25", "2.5"]),
        (3, vec!["1.5", "2", "2.25", "2.5", "3"]),
    ] {
        let mut run = Run::new(r);
        for s in seed_ring().into_iter().take(5) {
            run.step(s).unwrap();
        }
        // Ring: 1, 1.5, 2, 2.5, 3, 4 — now 2 divides.
        run.step(Step::BeginDivision("2")).unwrap();
        let involved: Vec<String> = run.map.migrations()[0]
            .involved()
            .iter()
            .map(|i| i.to_string())
            .collect();
        assert_eq!(involved, expected, "r={r}");
    }
}

#[test]
fn placement_backups_and_backup_ranges() {
    let mut run = Run::new(3);
    for s in seed_ring() {
        run.step(s).unwrap();
    }
    let m = &run.map;
    let ids = |cells: Vec<&Cell>| cells.iter().map(|c| c.id.to_string()).collect::<Vec<_>>();
    assert_eq!(ids(m.backups(&id("2.5"))), ["3", "4"]);
    assert_eq!(
        ids(m.backups(&id("4"))),
        ["1", "1.5"],
        "backups wrap around"
    );
    let ranges: Vec<(String, HashRange)> = m
        .backup_ranges(&id("1"))
        .into_iter()
        .map(|(c, r)| (c.id.to_string(), r))
        .collect();
    assert_eq!(
        ranges,
        [
            ("4".to_string(), seed(112, 127)),
            ("3".to_string(), seed(96, 111))
        ]
    );
    assert_eq!(m.owner(0).id, id("1"));
    assert_eq!(m.owner(u64::MAX).id, id("4"));
    assert!(m.holds_copy(&id("1.5"), 0) && m.holds_copy(&id("2"), 0) && !m.holds_copy(&id("4"), 0));
    assert_eq!(m.successor(&id("4")).unwrap().id, id("1"));
    assert_eq!(m.predecessor(&id("1")).unwrap().id, id("4"));
    let single = ClusterMap::bootstrap(id("1"), addr(0), 2).unwrap();
    assert!(single.backups(&id("1")).is_empty() && single.successor(&id("1")).is_none());
}

#[derive(Clone, Debug)]
enum Op {
    Divide(usize),
    Absorb(usize, bool),
    Complete(usize),
    Fence(usize),
    /// Shift from cell i to its successor (up) or predecessor, `share` 1/256ths of its range.
    Shift(usize, bool, u8),
    Abort(usize),
}

fn arb_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0usize..64).prop_map(Op::Divide),
        1 => (0usize..64, any::<bool>()).prop_map(|(i, l)| Op::Absorb(i, l)),
        3 => (0usize..64).prop_map(Op::Complete),
        1 => (0usize..64).prop_map(Op::Fence),
        2 => (0usize..64, any::<bool>(), any::<u8>()).prop_map(|(i, up, s)| Op::Shift(i, up, s)),
        1 => (0usize..64).prop_map(Op::Abort),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]
    #[test]
    fn random_change_sequences_keep_one_owner_per_hash(
        r in 1u8..=4,
        ops in proptest::collection::vec(arb_op(), 1..60),
        probes in proptest::collection::vec(any::<u64>(), 8),
    ) {
        let mut map = ClusterMap::bootstrap(id("1"), addr(0), r).unwrap();
        for (n, op) in ops.into_iter().enumerate() {
            let pick = |i: usize| map.cells()[i % map.cells().len()].id.clone();
            let change = match op {
                Op::Divide(i) => Change::BeginDivision { parent: pick(i), child_address: addr(n as u32 + 1) },
                Op::Absorb(i, leaving) => Change::BeginAbsorption {
                    departed: pick(i),
                    reason: if leaving { AbsorptionReason::Leaving } else { AbsorptionReason::Crashed },
                },
                Op::Complete(i) => match map.migrations().get(i % map.migrations().len().max(1)) {
                    Some(Migration::Division { child, .. }) => Change::CompleteDivision { child: child.clone() },
                    Some(Migration::Absorption { departed, .. }) => Change::CompleteAbsorption { departed: departed.clone() },
                    Some(Migration::Shift { from, .. }) => Change::CompleteShift { from: from.clone() },
                    None => continue,
                },
                Op::Abort(i) => match map.migrations().get(i % map.migrations().len().max(1)) {
                    Some(Migration::Division { child, .. }) => Change::AbortDivision { child: child.clone() },
                    Some(Migration::Shift { from, .. }) => Change::AbortShift { from: from.clone() },
                    _ => continue,
                },
                Op::Shift(i, up, share) => {
                    let from = pick(i);
                    let (Some(given), Some(to)) = (
                        map.cell(&from).and_then(|c| c.range),
                        if up { map.successor(&from) } else { map.predecessor(&from) }.map(|c| c.id.clone()),
                    ) else { continue };
                    let part = ((given.len() * u128::from(share)) / 256).max(1) as u64;
                    let range = if up {
                        HashRange::new(given.end.wrapping_sub(part - 1), given.end)
                    } else {
                        HashRange::new(given.start, given.start.wrapping_add(part - 1))
                    };
                    Change::BeginShift { from, to, range }
                }
                Op::Fence(i) => Change::Fence { cell: pick(i) },
            };
            let proposal = Proposal { based_on_epoch: map.epoch(), change };
            if let Ok(next) = apply(&map, &proposal) {
                prop_assert_eq!(next.epoch(), map.epoch() + 1);
                // A stale replay of the same proposal is always refused.
                let stale = apply(&next, &proposal);
                prop_assert!(matches!(stale, Err(ChangeError::StaleEpoch { .. })), "stale replay accepted");
                map = next;
            }
            for &h in &probes {
                let owner = map.owner(h);
                prop_assert!(owner.range.unwrap().contains(h));
                prop_assert_eq!(map.active_cells().filter(|c| c.range.unwrap().contains(h)).count(), 1);
            }
        }
    }
}
