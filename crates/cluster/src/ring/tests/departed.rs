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
