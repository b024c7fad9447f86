//! Unit tests of a shift (balancing) in the ring state machine: who may serve the moved part
//! while the two cells' maps and leases change, message by message.

use super::*;

/// Cell 1 gives the upper quarter of the ring's lower half (its top) to cell 2.
fn shift_down(map: &ClusterMap) -> (ClusterMap, ClusterMap, HashRange) {
    let given = map.cell(&id("1")).unwrap().range.unwrap();
    let (_, moved) = given.split_in_half().unwrap();
    let begun = applied(
        map,
        Change::BeginShift {
            from: id("1"),
            to: id("2"),
            range: moved,
        },
    );
    let done = applied(&begun, Change::CompleteShift { from: id("1") });
    (begun, done, moved)
}

#[test]
fn a_shift_moves_one_end_of_a_range_to_the_neighbour() {
    let (_, _, map) = two_serving(RingConfig::default());
    let (begun, done, moved) = shift_down(&map);
    // Two cells each hold everything: nothing to stream, the giver may complete at once.
    assert!(matches!(
        begun.migrations(),
        [Migration::Shift { targets, .. }] if targets.is_empty()
    ));
    assert_eq!(done.owner(moved.start).id, id("2"));
    assert_eq!(done.owner(moved.start - 1).id, id("1"));
    assert_eq!(done.owner(u64::MAX).id, id("2"));
    let (mut a, mut b, _) = two_serving(RingConfig::default());
    a.install_map(begun.clone(), 1);
    b.install_map(begun.clone(), 1);
    a.map_confirmed(begun.epoch(), 1);
    b.map_confirmed(begun.epoch(), 1);
    exchange(&mut a, &mut b, 1);
    a.drain_outputs();
    a.tick(2);
    let proposed: Vec<Change> = a
        .drain_outputs()
        .into_iter()
        .filter_map(|o| match o {
            Output::Propose(p) => Some(p.change),
            _ => None,
        })
        .collect();
    assert!(proposed.contains(&Change::CompleteShift { from: id("1") }));
}

/// The receiving master (2) serves the moved part only once the giver (1) can no longer: a
/// grant it made the giver under the old map keeps it out until the giver, with the new
/// map, released that grant's moved part — which it does at once, so the part is served
/// again within round trips, not after a lease's expiry.
#[test]
fn the_receiver_serves_the_moved_part_only_after_the_giver_released_it() {
    let cfg = RingConfig::default();
    let (mut a, mut b, map) = two_serving(cfg);
    let (_, done, moved) = shift_down(&map);
    let h = moved.start;
    assert!(a.can_serve(h, 5) && !b.can_serve(h, 5));
    // Cell 2 has the new map first.
    b.install_map(done.clone(), 10);
    b.map_confirmed(done.epoch(), 10);
    b.drain_outputs();
    assert!(
        a.can_serve(h, 11),
        "the giver, still on the old map, keeps its lease"
    );
    assert!(
        !b.can_serve(h, 11),
        "so the receiver must not serve the part yet"
    );
    // The giver heartbeats under its old map; the receiver answers with a grant of the
    // giver's new (smaller) range. Before that answer arrives, the giver still relies on
    // its old lease: the receiver must still keep out.
    a.tick(cfg.heartbeat_interval_ms);
    for (to, m) in sends(&a.drain_outputs()) {
        if to == id("2") {
            b.step(m, cfg.heartbeat_interval_ms);
        }
    }
    let answers = b.drain_outputs();
    assert!(a.can_serve(h, cfg.heartbeat_interval_ms + 1));
    assert!(
        !b.can_serve(h, cfg.heartbeat_interval_ms + 1),
        "a newer, smaller grant does not undo an older one the giver still holds"
    );
    // The answer arrives: the giver's lease shrinks, and it releases the rest at once.
    let t = cfg.heartbeat_interval_ms + 2;
    for (to, m) in sends(&answers) {
        if to == id("1") {
            a.step(m, t);
        }
    }
    assert!(
        !a.can_serve(h, t),
        "the giver's lease no longer covers the part"
    );
    for (to, m) in sends(&a.drain_outputs()) {
        if to == id("2") {
            b.step(m, t);
        }
    }
    // The giver installs the new map; leases are renewed under it once the giver's writes
    // in the part reached the receiver (the node reports its tail delivered).
    a.install_map(done.clone(), t);
    a.map_confirmed(done.epoch(), t);
    a.tail_delivered(moved, t);
    b.tick(t);
    a.tick(t);
    exchange(&mut a, &mut b, t);
    let soon = t + cfg.lease_retry_ms;
    assert!(
        soon < cfg.lease_ms,
        "the test must tell a release from an expiry"
    );
    assert!(b.can_serve(h, soon), "the receiver serves the moved part");
    assert!(!a.can_serve(h, soon));
    assert!(a.can_serve(0, soon), "the giver serves what it kept");
}

/// A giver that installs the new map before its backup (the receiver) cuts its lease at
/// once and tells the backup, which may then serve the part without waiting for expiry.
#[test]
fn a_giver_on_the_new_map_cuts_its_lease_and_releases_the_rest() {
    let cfg = RingConfig::default();
    let (mut a, mut b, map) = two_serving(cfg);
    let (_, done, moved) = shift_down(&map);
    let h = moved.start;
    a.install_map(done.clone(), 10);
    a.map_confirmed(done.epoch(), 10);
    assert!(!a.can_serve(h, 10));
    assert!(
        a.can_serve(0, 10),
        "the kept part stays served on the cut lease"
    );
    let releases: Vec<RingMessage> = sends(&a.drain_outputs())
        .into_iter()
        .filter(|(to, _)| *to == id("2"))
        .map(|(_, m)| m)
        .collect();
    assert!(releases.iter().any(|m| matches!(
        m,
        RingMessage::LeaseRelease { keep: Some(k), before_ms: Some(10), .. } if !k.contains(h)
    )));
    b.install_map(done.clone(), 11);
    b.map_confirmed(done.epoch(), 11);
    for m in releases {
        b.step(m, 11);
    }
    a.tail_delivered(moved, 11);
    b.tick(11);
    a.tick(11);
    exchange(&mut a, &mut b, 11);
    assert!(b.can_serve(h, 12), "no wait for the old grant's expiry");
    // An answer to a heartbeat sent before the release is not taken: it may carry the old
    // range, which the backup no longer keeps for this cell.
    a.step(
        RingMessage::HeartbeatAck {
            from: id("2"),
            epoch: map.epoch(),
            echo_sent_at_ms: 5,
            grant: map.cell(&id("1")).and_then(|c| c.range),
        },
        12,
    );
    assert!(!a.can_serve(h, 12));
}

/// Moving up: the predecessor takes the lower end of its successor's range; with three
/// cells and r = 2 it is the one cell that does not hold the part yet, so it is the target.
#[test]
fn a_shift_up_streams_the_part_to_the_new_master_first() {
    let m = two_cells();
    let three = applied(
        &applied(
            &m,
            Change::BeginDivision {
                parent: id("2"),
                child_address: addr(2),
            },
        ),
        Change::CompleteDivision { child: id("3") },
    );
    let given = three.cell(&id("3")).unwrap().range.unwrap();
    let (moved, _) = given.split_in_half().unwrap();
    let begun = applied(
        &three,
        Change::BeginShift {
            from: id("3"),
            to: id("2"),
            range: moved,
        },
    );
    let Some(Migration::Shift { targets, .. }) = begun.migrations().first() else {
        panic!("no shift in {begun:?}");
    };
    assert_eq!(targets, &[id("2")]);
    let mut giver = Ring::new(id("3"), three.clone(), RingConfig::default(), 0);
    giver.install_map(begun.clone(), 1);
    giver.map_confirmed(begun.epoch(), 1);
    let out = giver.drain_outputs();
    assert!(out.contains(&Output::StartHandOff {
        child: id("2"),
        range: moved
    }));
    giver.tick(2);
    assert!(
        !giver
            .drain_outputs()
            .iter()
            .any(|o| matches!(o, Output::Propose(_))),
        "nothing is proposed before the target caught up"
    );
    giver.handoff_caught_up(&id("2"));
    giver.step(
        RingMessage::HeartbeatAck {
            from: id("2"),
            epoch: begun.epoch(),
            echo_sent_at_ms: 2,
            grant: None,
        },
        3,
    );
    giver.tick(3);
    assert!(
        !giver
            .drain_outputs()
            .iter()
            .any(|o| matches!(o, Output::Propose(_))),
        "nor before it may serve the part itself (no lease from its backup yet)"
    );
    // Its backup (cell 1, after it on the ring) grants it its range.
    giver.step(
        RingMessage::HeartbeatAck {
            from: id("1"),
            epoch: begun.epoch(),
            echo_sent_at_ms: 3,
            grant: three.cell(&id("3")).and_then(|c| c.range),
        },
        4,
    );
    giver.tick(4);
    assert!(giver.drain_outputs().iter().any(|o| matches!(
        o,
        Output::Propose(Proposal {
            change: Change::CompleteShift { .. },
            ..
        })
    )));
    // The target keeps what it receives beside its backups until the flip.
    let mut target = Ring::new(id("2"), three, RingConfig::default(), 0);
    target.install_map(begun.clone(), 1);
    let holdings = target
        .drain_outputs()
        .into_iter()
        .filter_map(|o| match o {
            Output::Holdings { backups, .. } => Some(backups),
            _ => None,
        })
        .next_back();
    assert!(holdings.is_some_and(|b| b.contains(&moved)));
    // After the flip the new master serves at once (no departed cell's map lease to wait
    // out): its backup, the giver, grants the grown range only under the new map.
    let done = applied(&begun, Change::CompleteShift { from: id("3") });
    target.install_map(done.clone(), 5);
    assert!(target.acquired.is_empty());
    assert_eq!(done.owner(moved.start).id, id("2"));
}
