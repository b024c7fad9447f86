//! Unit tests of a division's flip: the new masters' leases come without a second ask, and
//! no cell owes another a re-replication of what it already holds.

use super::*;

/// `m` with `parent` divided: the map of the division's begin, that of its flip, and the
/// child's id.
fn divide(m: &ClusterMap, parent: &str) -> (ClusterMap, ClusterMap, CellId) {
    let dividing = apply(
        m,
        &Proposal {
            based_on_epoch: m.epoch(),
            change: Change::BeginDivision {
                parent: id(parent),
                child_address: addr(9),
            },
        },
    )
    .unwrap();
    let child = dividing
        .cells
        .iter()
        .find(|c| c.state == CellState::Joining)
        .map(|c| c.id.clone())
        .unwrap();
    let flipped = apply(
        &dividing,
        &Proposal {
            based_on_epoch: dividing.epoch(),
            change: Change::CompleteDivision {
                child: child.clone(),
            },
        },
    )
    .unwrap();
    (dividing, flipped, child)
}

/// A ring of two divides cell 2: its child takes the upper half of cell 2's range, whose
/// backup stays cell 1, and cell 1 may grant the child no lease there while its grant to
/// cell 2 (the range's master until the flip) runs. The child's heartbeat refused for that
/// grant is answered the moment cell 2 releases it, not at the child's next retry: clients
/// of the moved half wait one message less.
#[test]
fn a_heartbeat_refused_for_the_givers_grant_is_answered_at_its_release() {
    let cfg = RingConfig::default();
    let (dividing, done, child) = divide(&two_cells(), "2");
    let moved = done.cell(&child).unwrap().range.unwrap();
    assert_eq!(
        done.backup_ranges(&id("1")).len(),
        1,
        "cell 1 backs up the child only"
    );

    // Before the flip cell 1 granted cell 2 its whole range.
    let mut one = Ring::new(id("1"), dividing.clone(), cfg, 0);
    let mut parent = Ring::new(id("2"), dividing.clone(), cfg, 0);
    one.map_confirmed(dividing.epoch(), 0);
    parent.map_confirmed(dividing.epoch(), 0);
    parent.tick(0);
    exchange(&mut parent, &mut one, 0);
    assert!(
        parent.can_serve(moved.start, 1),
        "cell 2 holds cell 1's lease"
    );

    // The flip: cell 1 and the child have the map, the child asks cell 1 for a lease.
    one.install_map(done.clone(), 10);
    one.map_confirmed(done.epoch(), 10);
    one.drain_outputs();
    let mut c = Ring::new(child.clone(), done.clone(), cfg, 10);
    c.map_confirmed(done.epoch(), 10);
    c.tick(10);
    exchange(&mut c, &mut one, 10);
    assert!(
        !c.can_serve(moved.start, 11),
        "no lease while cell 2's grant runs"
    );

    // Cell 2 releases everything it held from cell 1 (its tail delivered).
    one.step(
        RingMessage::LeaseRelease {
            from: id("2"),
            epoch: done.epoch(),
            before_ms: Some(10),
            keep: None,
        },
        12,
    );
    let answers = sends(&one.drain_outputs());
    assert!(
        answers.iter().any(|(to, m)| *to == child
            && matches!(m, RingMessage::HeartbeatAck { grant: Some(g), .. } if g.covers(&moved))),
        "the child's heartbeat is answered with a grant at the release: {answers:?}"
    );
    for (_, m) in answers {
        c.step(m, 12);
    }
    assert!(
        c.can_serve(moved.start, 12),
        "the child serves before its next retry (lease_retry_ms {})",
        cfg.lease_retry_ms
    );
}

/// A division's parent heartbeats its new backup, the child, the moment it installs the
/// flip; that heartbeat may reach the child before the child has the flip itself. The child
/// answers it with a grant as soon as it installs the map, not at the parent's next retry.
#[test]
fn a_heartbeat_under_a_newer_map_is_granted_once_that_map_is_installed() {
    let cfg = RingConfig::default();
    let dividing = one_divides(&ClusterMap::bootstrap(id("1"), addr(0), 2).unwrap());
    let done = two_cells();
    let kept = done.cell(&id("1")).unwrap().range.unwrap();
    let mut parent = Ring::new(id("1"), dividing.clone(), cfg, 0);
    let mut child = Ring::new(id("2"), dividing.clone(), cfg, 0);
    parent.map_confirmed(dividing.epoch(), 0);
    child.map_confirmed(dividing.epoch(), 0);
    parent.drain_outputs();
    child.drain_outputs();

    parent.install_map(done.clone(), 10);
    parent.map_confirmed(done.epoch(), 10);
    for (to, m) in sends(&parent.drain_outputs()) {
        if to == id("2") {
            child.step(m, 10);
        }
    }
    let early = sends(&child.drain_outputs());
    assert!(
        !early
            .iter()
            .any(|(_, m)| matches!(m, RingMessage::HeartbeatAck { grant: Some(_), .. })),
        "no grant under the older map: {early:?}"
    );

    child.install_map(done.clone(), 11);
    child.map_confirmed(done.epoch(), 11);
    child.answer_deferred(11);
    for (to, m) in sends(&child.drain_outputs()) {
        if to == id("1") {
            parent.step(m, 11);
        }
    }
    assert!(
        parent.can_serve(kept.start, 11),
        "the parent holds the child's lease one message after the child's install, before \
         its next retry (lease_retry_ms {})",
        cfg.lease_retry_ms
    );
}

/// At a division's flip no cell owes another a re-replication: the child caught up with all
/// of the parent's old range before the flip (so, as the parent's new backup, it holds the
/// parent's new range), and the child's backups held its half as the parent's backups. A
/// ring of one (the parent is the child's backup) and of two (the parent's old backup is).
#[test]
fn a_division_flip_owes_no_re_replication() {
    let cfg = RingConfig::default();
    let resyncs = |ring: &mut Ring| -> Vec<CellId> {
        ring.drain_outputs()
            .into_iter()
            .filter_map(|o| match o {
                Output::Resync { to, .. } => Some(to),
                _ => None,
            })
            .collect()
    };

    let (dividing, flipped, child) =
        divide(&ClusterMap::bootstrap(id("1"), addr(0), 2).unwrap(), "1");
    let mut parent = Ring::new(id("1"), dividing.clone(), cfg, 0);
    let mut c = Ring::new(child.clone(), dividing, cfg, 0);
    parent.drain_outputs();
    c.drain_outputs();
    parent.install_map(flipped.clone(), 10);
    c.install_map(flipped, 10);
    assert_eq!(resyncs(&mut parent), Vec::<CellId>::new());
    assert_eq!(resyncs(&mut c), Vec::<CellId>::new());
    assert!(parent.resync_in.is_empty() && c.resync_in.is_empty());

    let (dividing, flipped, child) = divide(&two_cells(), "2");
    let mut rings: Vec<Ring> = [id("1"), id("2"), child]
        .into_iter()
        .map(|me| Ring::new(me, dividing.clone(), cfg, 0))
        .collect();
    for r in &mut rings {
        r.drain_outputs();
        r.install_map(flipped.clone(), 10);
        assert_eq!(resyncs(r), Vec::<CellId>::new(), "cell {}", r.id());
        assert!(r.resync_in.is_empty(), "cell {} waits for a resync", r.id());
    }

    // The parent's old backup that never installed the division's begin does not wait for
    // the child's resync either.
    let mut one = Ring::new(id("1"), two_cells(), cfg, 0);
    one.drain_outputs();
    one.install_map(flipped.clone(), 10);
    assert!(one.resync_in.is_empty(), "cell 1 waits for a resync");

    // A backup that did not hold the range before still gets it: cell 1 leaves a ring of
    // three, and its successor's new backup is re-sent the grown range.
    let three = divide(&two_cells(), "2").1;
    let leaving = apply(
        &three,
        &Proposal {
            based_on_epoch: three.epoch(),
            change: Change::BeginAbsorption {
                departed: id("2"),
                reason: AbsorptionReason::Leaving,
            },
        },
    )
    .unwrap();
    let successor = leaving
        .migrations()
        .iter()
        .find_map(|m| match m {
            Migration::Absorption { successor, .. } => Some(successor.clone()),
            _ => None,
        })
        .unwrap();
    let mut s = Ring::new(successor.clone(), three, cfg, 0);
    s.drain_outputs();
    s.install_map(leaving, 10);
    assert!(
        !resyncs(&mut s).is_empty(),
        "the successor of a leaving cell re-replicates its grown range"
    );
}
