//! Unit tests of what a cell waits for after another departed: every part of its range the
//! departed cell mastered in a map it remembers, unless it could serve that part itself.

use super::*;

/// A ring of one divides; the child installs the flip but never gets its lease (its
/// backup, the parent, never saw the flip); then the parent is fenced and the child is
/// alone. The parent may still serve everything on the map before the flip until that
/// map's confirmation lapses, so the child waits for the whole ring — its own half too.
#[test]
fn a_child_alone_waits_for_the_half_it_never_could_serve() {
    let cfg = RingConfig::default();
    let one = ClusterMap::bootstrap(id("1"), addr(0), 2).unwrap();
    let dividing = applied(
        &one,
        Change::BeginDivision {
            parent: id("1"),
            child_address: addr(1),
        },
    );
    let flipped = applied(&dividing, Change::CompleteDivision { child: id("2") });
    let alone = applied(&flipped, Change::Fence { cell: id("1") });
    let mut parent = Ring::new(id("1"), dividing.clone(), cfg, 0);
    parent.map_confirmed(dividing.epoch(), 0);
    let mut child = Ring::new(id("2"), dividing, cfg, 0);
    child.install_map(flipped.clone(), 10);
    child.map_confirmed(flipped.epoch(), 10);
    let upper = flipped.cell(&id("2")).unwrap().range.unwrap();
    assert!(
        !child.can_serve(upper.start, 11),
        "no lease from the parent"
    );
    child.install_map(alone.clone(), 20);
    child.map_confirmed(alone.epoch(), 20);
    assert!(
        parent.can_serve(upper.start, 21),
        "the parent, on its old map, still serves"
    );
    assert!(
        !child.can_serve(upper.start, 21),
        "so the child must not serve even its own half yet"
    );
    let wait_end = 20 + cfg.map_lease_ms + cfg.clock_drift_margin_ms;
    assert!(
        !parent.can_serve(upper.start, cfg.map_lease_ms),
        "its map lease lapsed"
    );
    child.map_confirmed(alone.epoch(), wait_end);
    assert!(
        child.can_serve(upper.start, wait_end),
        "then the child serves it"
    );
}

/// A cell that could serve its range when a neighbour departed keeps serving it at once:
/// only what it gains waits.
#[test]
fn what_a_cell_could_serve_does_not_wait_for_a_departed_cell() {
    let (_, mut b, map) = two_serving(RingConfig::default());
    let mine = map.cell(&id("2")).unwrap().range.unwrap();
    assert!(b.can_serve(mine.start, 5));
    let fenced = applied(&map, Change::Fence { cell: id("1") });
    b.install_map(fenced.clone(), 10);
    b.map_confirmed(fenced.epoch(), 10);
    assert!(
        b.can_serve(mine.start, 11),
        "its own range, served before, at once"
    );
    assert!(!b.can_serve(0, 11), "the departed cell's range waits");
}

/// The map in which cell 1 of `map` leaves (its absorption into cell 2 begins).
fn one_leaves(map: &ClusterMap) -> ClusterMap {
    applied(
        map,
        Change::BeginAbsorption {
            departed: id("1"),
            reason: AbsorptionReason::Leaving,
        },
    )
}

/// A cell that leaves alive releases its leases as soon as it sees itself leaving; that
/// release ends its successor's wait, a round trip after the map instead of the map lease
/// plus the drift margin later (two seconds of stalled clients per absorption before).
#[test]
fn a_leaving_cells_release_ends_its_successors_wait() {
    let cfg = RingConfig::default();
    let (mut a, mut b, map) = two_serving(cfg);
    let leaving = one_leaves(&map);
    b.install_map(leaving.clone(), 10);
    b.map_confirmed(leaving.epoch(), 10);
    assert!(!b.can_serve(0, 11), "the leaving cell may still serve");
    assert!(b.serve_wait(11).unwrap().departed);
    a.install_map(leaving, 20);
    assert!(!a.can_serve(0, 21), "a leaving cell masters nothing");
    exchange(&mut a, &mut b, 21);
    assert!(
        b.can_serve(0, 22),
        "its release ended the wait: {:?}",
        b.serve_wait(22)
    );
}

/// The release may come before the successor has the map in which the sender leaves: it
/// counts once that map is installed.
#[test]
fn a_release_that_overtakes_the_map_counts_once_the_map_is_installed() {
    let cfg = RingConfig::default();
    let (mut a, mut b, map) = two_serving(cfg);
    let leaving = one_leaves(&map);
    a.install_map(leaving.clone(), 10);
    exchange(&mut a, &mut b, 11);
    b.install_map(leaving.clone(), 20);
    b.map_confirmed(leaving.epoch(), 20);
    assert!(b.can_serve(0, 21), "{:?}", b.serve_wait(21));
}

/// A release proves a cell stopped only if it was leaving in the map it was sent under:
/// one sent while the cell was still active (it may take new leases afterwards) leaves
/// the wait to run its course.
#[test]
fn a_release_from_a_cell_still_active_ends_no_wait() {
    let cfg = RingConfig::default();
    let (_, mut b, map) = two_serving(cfg);
    let leaving = one_leaves(&map);
    b.install_map(leaving.clone(), 10);
    b.map_confirmed(leaving.epoch(), 10);
    b.step(
        RingMessage::LeaseRelease {
            from: id("1"),
            epoch: map.epoch(),
            before_ms: Some(5),
            keep: None,
        },
        11,
    );
    assert!(!b.can_serve(0, 12), "sent while still active");
    let wait_end = 10 + cfg.map_lease_ms + cfg.clock_drift_margin_ms;
    b.map_confirmed(leaving.epoch(), wait_end);
    b.tick(wait_end);
    assert!(b.can_serve(0, wait_end), "the wait ran its course");
}

/// `can_serve_master_range` (one check for a request of many keys) never says yes where a
/// key of the range could not be served: sampled hashes of the range, at moments around
/// lease expiry and a departed neighbour's wait. And it says no when part of the range
/// waits, even though the rest may be served key by key.
#[test]
fn the_whole_range_check_implies_every_hash_of_it() {
    let cfg = RingConfig::default();
    let (_, mut b, map) = two_serving(cfg);
    let mine = map.cell(&id("2")).unwrap().range.unwrap();
    let samples = |r: cellcache_keyspace::HashRange| {
        let mid = r.start.wrapping_add(r.end.wrapping_sub(r.start) / 2);
        [
            r.start,
            r.start.wrapping_add(1),
            mid,
            r.end.wrapping_sub(1),
            r.end,
        ]
    };
    let check = |ring: &Ring, range, now| {
        if ring.can_serve_master_range(now) {
            for h in samples(range) {
                assert!(ring.can_serve(h, now), "hash {h:#x} at {now}");
            }
        }
    };
    assert!(b.can_serve_master_range(5), "both leases in place");
    for now in [5, cfg.lease_ms / 2, cfg.lease_ms, cfg.lease_ms * 2] {
        check(&b, mine, now);
    }
    assert!(
        !b.can_serve_master_range(cfg.lease_ms * 2),
        "unrenewed leases lapse"
    );
    let fenced = applied(&map, Change::Fence { cell: id("1") });
    b.install_map(fenced.clone(), 10);
    b.map_confirmed(fenced.epoch(), 10);
    let whole = fenced.cell(&id("2")).unwrap().range.unwrap();
    assert!(b.can_serve(mine.start, 11), "its own part, key by key");
    assert!(
        !b.can_serve_master_range(11),
        "but not the whole range: the departed cell's part waits"
    );
    check(&b, whole, 11);
}
