//! Unit tests of a departing master's tail: a cell that gave up a range grants its new
//! master no lease on it before the writes it made there were delivered.

use super::*;

/// A ring of one divides: the parent is its child's only backup, so the child serves its
/// half on the parent's grant. The parent withholds it until the writes it made in that
/// half are delivered (the node's report), or until `tail_hold_ms` passed: a child serving
/// before would refuse them as made under the old map, failing their clients (found by the
/// autoscale test: a `set` answered "write not confirmed" at the first division).
#[test]
fn a_parent_grants_its_child_no_lease_before_its_tail_is_delivered() {
    let cfg = RingConfig::default();
    let dividing = one_divides(&ClusterMap::bootstrap(id("1"), addr(0), 2).unwrap());
    let done = two_cells();
    let given = done.cell(&id("2")).unwrap().range.unwrap();
    let h = given.start;
    let start = |tail_reported: bool| {
        let mut p = Ring::new(id("1"), dividing.clone(), cfg, 0);
        p.drain_outputs();
        p.install_map(done.clone(), 10);
        assert!(
            p.drain_outputs()
                .contains(&Output::DeliverTail { range: given }),
            "the parent is told to deliver its tail of the half it gave"
        );
        let mut c = Ring::new(id("2"), done.clone(), cfg, 10);
        p.map_confirmed(done.epoch(), 10);
        c.map_confirmed(done.epoch(), 10);
        c.tick(10);
        exchange(&mut c, &mut p, 10);
        assert!(!c.can_serve(h, 11), "no lease while the tail is on its way");
        if tail_reported {
            p.tail_delivered(given, 20);
            exchange(&mut p, &mut c, 20);
        }
        (p, c)
    };
    let (_, c) = start(true);
    assert!(
        c.can_serve(h, 21),
        "the deferred heartbeat is answered at once"
    );

    // Never reported (a lost task, a tail that cannot be delivered): the hold lapses.
    let (mut p, mut c) = start(false);
    let late = 10 + cfg.tail_hold_ms;
    p.tick(late - 1);
    c.tick(late - 1);
    p.map_confirmed(done.epoch(), late - 1);
    c.map_confirmed(done.epoch(), late - 1);
    exchange(&mut c, &mut p, late - 1);
    assert!(!c.can_serve(h, late - 1));
    p.tick(late);
    c.tick(late);
    exchange(&mut c, &mut p, late);
    assert!(c.can_serve(h, late), "served once the hold lapsed");
}
