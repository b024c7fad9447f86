//! Unit tests of the ring state machine: two and three cells driven by hand, message by
//! message, with explicit virtual times.

use super::*;
use crate::change::apply;

fn addr(n: u32) -> CellAddress {
    CellAddress {
        client: format!("127.0.0.1:{}", 21000 + n),
        peer: format!("127.0.0.1:{}", 31000 + n),
    }
}

fn id(s: &str) -> CellId {
    s.parse().unwrap()
}

/// `m` with cell 1 dividing: the child joins at `addr(1)`.
fn one_divides(m: &ClusterMap) -> ClusterMap {
    apply(
        m,
        &Proposal {
            based_on_epoch: m.epoch(),
            change: Change::BeginDivision {
                parent: id("1"),
                child_address: addr(1),
            },
        },
    )
    .unwrap()
}

/// Bootstrap 1, divide into 1 and 2 (r = 2): each backs up the other.
fn two_cells() -> ClusterMap {
    let m = one_divides(&ClusterMap::bootstrap(id("1"), addr(0), 2).unwrap());
    apply(
        &m,
        &Proposal {
            based_on_epoch: 2,
            change: Change::CompleteDivision { child: id("2") },
        },
    )
    .unwrap()
}

fn sends(outputs: &[Output]) -> Vec<(CellId, RingMessage)> {
    outputs
        .iter()
        .filter_map(|o| match o {
            Output::Send { to, message } => Some((to.clone(), message.clone())),
            _ => None,
        })
        .collect()
}

/// Delivers every message between the two rings until quiet, all at time `now`.
fn exchange(a: &mut Ring, b: &mut Ring, now: u64) {
    for _ in 0..8 {
        let mut moved = false;
        for (to, m) in sends(&a.drain_outputs()) {
            if to == *b.id() {
                b.step(m, now);
                moved = true;
            }
        }
        for (to, m) in sends(&b.drain_outputs()) {
            if to == *a.id() {
                a.step(m, now);
                moved = true;
            }
        }
        if !moved {
            return;
        }
    }
}

#[test]
fn leases_make_masters_serve_and_expire_without_renewal() {
    let map = two_cells();
    let cfg = RingConfig::default();
    let mut a = Ring::new(id("1"), map.clone(), cfg, 0);
    let mut b = Ring::new(id("2"), map, cfg, 0);
    a.map_confirmed(3, 0);
    b.map_confirmed(3, 0);
    assert!(!a.can_serve(0, 0), "no lease yet");
    a.tick(0);
    b.tick(0);
    exchange(&mut a, &mut b, 0);
    assert!(a.can_serve(0, 1) && b.can_serve(u64::MAX, 1));
    assert!(
        !a.can_serve(u64::MAX, 1),
        "never serves a hash it does not own"
    );
    // Lease counted from the heartbeat's send time (0): valid until lease_ms, exclusive.
    assert!(a.can_serve(0, cfg.lease_ms - 1));
    assert!(!a.can_serve(0, cfg.lease_ms));
}

/// A master refused a lease (here: its backup's map not yet confirmed, as after a map
/// change) asks again after `lease_retry_ms`, not at the next heartbeat.
#[test]
fn a_refused_lease_is_asked_for_again_before_the_next_heartbeat() {
    let map = two_cells();
    let cfg = RingConfig::default();
    assert!(cfg.lease_retry_ms < cfg.heartbeat_interval_ms);
    let mut a = Ring::new(id("1"), map.clone(), cfg, 0);
    let mut b = Ring::new(id("2"), map, cfg, 0);
    a.map_confirmed(3, 0);
    a.tick(0);
    exchange(&mut a, &mut b, 0);
    assert!(!a.can_serve(0, 1), "the backup could not grant yet");
    b.map_confirmed(3, 1);
    let retry = cfg.lease_retry_ms;
    a.tick(retry - 1);
    exchange(&mut a, &mut b, retry - 1);
    assert!(
        !a.can_serve(0, retry - 1),
        "not asked again before lease_retry_ms"
    );
    a.tick(retry);
    exchange(&mut a, &mut b, retry);
    assert!(
        a.can_serve(0, retry + 1),
        "asked again after lease_retry_ms"
    );
    // With the lease in hand, nothing more until the heartbeat.
    a.drain_outputs();
    a.tick(2 * retry);
    assert!(sends(&a.drain_outputs()).is_empty());
}

/// A heartbeat that reached a backup whose map was unconfirmed is answered with a grant
/// the moment the map is confirmed, without waiting for the master to ask again; one that
/// the master released meanwhile is not.
#[test]
fn a_heartbeat_deferred_by_an_unconfirmed_map_is_granted_at_confirmation() {
    let map = two_cells();
    let cfg = RingConfig::default();
    let mut a = Ring::new(id("1"), map.clone(), cfg, 0);
    let mut b = Ring::new(id("2"), map.clone(), cfg, 0);
    a.map_confirmed(3, 0);
    a.tick(0);
    exchange(&mut a, &mut b, 0);
    assert!(!a.can_serve(0, 1), "the backup could not grant yet");
    b.map_confirmed(3, 2);
    b.answer_deferred(2);
    let answers = sends(&b.drain_outputs());
    assert!(
        answers.iter().any(|(to, m)| *to == id("1")
            && matches!(
                m,
                RingMessage::HeartbeatAck {
                    grant: Some(_),
                    echo_sent_at_ms: 0,
                    ..
                }
            )),
        "{answers:?}"
    );
    for (_, m) in answers {
        a.step(m, 3);
    }
    assert!(a.can_serve(0, 3), "served one confirmation after the map");
    assert!(
        !a.can_serve(0, cfg.lease_ms),
        "the lease counts from the heartbeat"
    );

    // Released before the confirmation: no grant comes.
    let mut a = Ring::new(id("1"), map.clone(), cfg, 0);
    let mut b = Ring::new(id("2"), map, cfg, 0);
    a.map_confirmed(3, 0);
    a.tick(0);
    exchange(&mut a, &mut b, 0);
    b.step(
        RingMessage::LeaseRelease {
            from: id("1"),
            epoch: 3,
            before_ms: Some(1),
            keep: None,
        },
        1,
    );
    b.map_confirmed(3, 2);
    b.answer_deferred(2);
    assert!(sends(&b.drain_outputs()).is_empty());
}

#[test]
fn silent_successor_is_proposed_for_fencing_not_removed() {
    let map = two_cells();
    let cfg = RingConfig::default();
    let mut a = Ring::new(id("1"), map, cfg, 0);
    let proposals = |a: &mut Ring| -> Vec<Proposal> {
        a.drain_outputs()
            .into_iter()
            .filter_map(|o| {
                if let Output::Propose(p) = o {
                    Some(p)
                } else {
                    None
                }
            })
            .collect()
    };
    a.tick(cfg.suspicion_timeout_ms - 1);
    assert!(
        proposals(&mut a).is_empty(),
        "not suspected before the timeout"
    );
    a.tick(cfg.suspicion_timeout_ms);
    let p = proposals(&mut a);
    assert_eq!(
        p,
        [Proposal {
            based_on_epoch: 3,
            change: Change::Fence { cell: id("2") }
        }]
    );
    a.tick(cfg.suspicion_timeout_ms + 10);
    assert!(
        proposals(&mut a).is_empty(),
        "retries are spaced by proposal_retry_ms"
    );
    a.tick(cfg.suspicion_timeout_ms + cfg.proposal_retry_ms);
    assert_eq!(proposals(&mut a).len(), 1);
    assert_eq!(
        a.map().cell(&id("2")).unwrap().state,
        CellState::Active,
        "map unchanged locally"
    );
}

#[test]
fn backup_promotes_only_after_its_grant_expired() {
    let map = two_cells();
    let cfg = RingConfig::default();
    let mut a = Ring::new(id("1"), map.clone(), cfg, 0);
    let mut b = Ring::new(id("2"), map.clone(), cfg, 0);
    a.map_confirmed(3, 0);
    b.map_confirmed(3, 0);
    a.tick(0);
    b.tick(0);
    exchange(&mut a, &mut b, 0);
    // Cell 1 is declared dead at epoch 4; cell 2 now owns everything.
    let fenced = apply(
        &map,
        &Proposal {
            based_on_epoch: 3,
            change: Change::Fence { cell: id("1") },
        },
    )
    .unwrap();
    b.install_map(fenced, 10);
    b.map_confirmed(4, 10);
    b.map_confirmed(4, 1_000);
    assert_eq!(b.map().owner(0).id, id("2"));
    // Cell 1 may still serve while its map lease lasts (it may be a partitioned zombie that
    // never learns it was fenced), and while its lease from cell 2 lasts.
    let wait_end = 10 + cfg.map_lease_ms + cfg.clock_drift_margin_ms;
    assert!(wait_end > cfg.lease_ms + cfg.clock_drift_margin_ms);
    assert!(
        b.can_serve(u64::MAX, wait_end - 1),
        "its own old range is unaffected"
    );
    assert!(
        !b.can_serve(0, wait_end - 1),
        "taken-over range waits out the map lease"
    );
    assert!(
        b.can_serve(0, wait_end),
        "then the promoted range is served"
    );
    assert!(
        !b.can_serve(0, 1_000 + cfg.map_lease_ms),
        "without reconfirmation, nothing is"
    );
    // Cell 1, partitioned with its old map, loses its lease before that.
    assert!(a.can_serve(0, cfg.lease_ms - 1));
    // Cell 1, partitioned with its old map, loses its lease before that.
    assert!(!a.can_serve(0, cfg.lease_ms));
    // And cell 2 no longer grants it anything.
    b.step(
        RingMessage::Heartbeat {
            from: id("1"),
            epoch: 3,
            sent_at_ms: 20,
        },
        20,
    );
    let acks = sends(&b.drain_outputs());
    assert!(
        acks.iter()
            .any(|(_, m)| matches!(m, RingMessage::HeartbeatAck { grant: None, .. }))
    );
}

#[test]
fn removed_cell_fences_itself_and_old_maps_are_ignored() {
    let map = two_cells();
    let mut a = Ring::new(id("1"), map.clone(), RingConfig::default(), 0);
    let gone = apply(
        &map,
        &Proposal {
            based_on_epoch: 3,
            change: Change::Fence { cell: id("1") },
        },
    )
    .unwrap();
    let gone = apply(
        &gone,
        &Proposal {
            based_on_epoch: 4,
            change: Change::CompleteAbsorption { departed: id("1") },
        },
    )
    .unwrap();
    a.install_map(map.clone(), 5);
    assert!(!a.is_fenced(), "same epoch ignored");
    a.install_map(gone, 5);
    assert!(a.is_fenced());
    assert!(a.drain_outputs().contains(&Output::Fenced));
    a.install_map(map, 6);
    assert!(a.is_fenced(), "fencing is permanent");
}

#[test]
fn stale_map_stops_serving_when_its_confirmation_lapses() {
    let map = two_cells();
    let cfg = RingConfig {
        lease_ms: 10 * RingConfig::default().map_lease_ms,
        ..RingConfig::default()
    };
    let mut a = Ring::new(id("1"), map.clone(), cfg, 0);
    let mut b = Ring::new(id("2"), map, cfg, 0);
    a.map_confirmed(3, 0);
    b.map_confirmed(3, 0);
    a.tick(0);
    b.tick(0);
    exchange(&mut a, &mut b, 0);
    assert!(a.can_serve(0, cfg.map_lease_ms - 1));
    assert!(
        !a.can_serve(0, cfg.map_lease_ms),
        "backup lease alone is not enough"
    );
    a.map_confirmed(2, 100);
    assert!(
        !a.can_serve(0, cfg.map_lease_ms),
        "a confirmation of another epoch does not count"
    );
    a.tick(cfg.heartbeat_interval_ms);
    let confirms = a
        .drain_outputs()
        .iter()
        .filter(|o| matches!(o, Output::ConfirmMap { .. }))
        .count();
    assert!(confirms >= 1, "the ring asks for confirmation");
}

#[test]
fn newer_epoch_from_peer_asks_for_the_map() {
    let map = two_cells();
    let mut a = Ring::new(id("1"), map, RingConfig::default(), 0);
    a.drain_outputs();
    a.step(
        RingMessage::Heartbeat {
            from: id("2"),
            epoch: 9,
            sent_at_ms: 0,
        },
        0,
    );
    assert!(
        a.drain_outputs()
            .contains(&Output::NeedMap { from: id("2") })
    );
}

fn proposals(outputs: &[Output]) -> Vec<Change> {
    outputs
        .iter()
        .filter_map(|o| match o {
            Output::Propose(p) => Some(p.change.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn division_parent_streams_then_proposes_the_flip_or_the_abort() {
    let cfg = RingConfig::default();
    let map = two_cells();
    let begin = |map: &ClusterMap, n| {
        apply(
            map,
            &Proposal {
                based_on_epoch: map.epoch(),
                change: Change::BeginDivision {
                    parent: id("1"),
                    child_address: addr(n),
                },
            },
        )
        .unwrap()
    };
    let dividing = begin(&map, 7);
    let mut x = Ring::new(id("1"), map.clone(), cfg, 0);
    x.drain_outputs();
    x.request_division(addr(7), 0);
    assert_eq!(
        proposals(&x.drain_outputs()),
        [Change::BeginDivision {
            parent: id("1"),
            child_address: addr(7)
        }]
    );
    x.install_map(dividing.clone(), 10);
    let out = x.drain_outputs();
    let range = map.cell(&id("1")).unwrap().range.unwrap();
    assert!(out.contains(&Output::StartHandOff {
        child: id("1.5"),
        range
    }));
    x.tick(20);
    assert!(
        proposals(&x.drain_outputs()).is_empty(),
        "no flip before the child caught up"
    );
    x.handoff_caught_up(&id("1.5"));
    x.tick(30);
    assert!(
        proposals(&x.drain_outputs()).is_empty(),
        "no flip of a range the parent cannot serve itself (no lease, no confirmed map)"
    );
    let mut backup = Ring::new(id("2"), dividing.clone(), cfg, 30);
    x.map_confirmed(dividing.epoch(), 30);
    backup.map_confirmed(dividing.epoch(), 30);
    x.tick(cfg.heartbeat_interval_ms + 30);
    exchange(&mut x, &mut backup, cfg.heartbeat_interval_ms + 30);
    x.tick(cfg.heartbeat_interval_ms + 31);
    assert_eq!(
        proposals(&x.drain_outputs()),
        [Change::CompleteDivision { child: id("1.5") }]
    );

    // A child that never catches up is abandoned.
    let mut y = Ring::new(id("1"), map.clone(), cfg, 0);
    y.install_map(begin(&map, 8), 0);
    y.drain_outputs();
    y.tick(cfg.handoff_timeout_ms);
    assert!(proposals(&y.drain_outputs()).contains(&Change::AbortDivision { child: id("1.5") }));

    // A child silent before it caught up only pauses the hand-off (nothing waits for it);
    // `handoff_stall_timeout_ms` of silence aborts it.
    let abort = Change::AbortDivision { child: id("1.5") };
    let mut z = Ring::new(id("1"), map.clone(), cfg, 0);
    z.install_map(begin(&map, 8), 0);
    z.drain_outputs();
    z.tick(cfg.handoff_stall_timeout_ms - 1);
    assert!(!proposals(&z.drain_outputs()).contains(&abort));
    z.tick(cfg.handoff_stall_timeout_ms);
    assert!(proposals(&z.drain_outputs()).contains(&abort));
    // Once caught up the parent's writes wait for the child: silence aborts after the
    // suspicion timeout, as for a backup.
    let mut w = Ring::new(id("1"), map.clone(), cfg, 0);
    w.install_map(begin(&map, 8), 0);
    w.drain_outputs();
    w.handoff_caught_up(&id("1.5"));
    w.tick(cfg.suspicion_timeout_ms - 1);
    assert!(!proposals(&w.drain_outputs()).contains(&abort));
    w.tick(cfg.suspicion_timeout_ms);
    assert!(proposals(&w.drain_outputs()).contains(&abort));
}

#[test]
fn absorbing_successor_completes_after_resyncs_both_ways() {
    // Three cells 1, 2, 3 (r = 2); cell 2 dies; cell 3 takes its range.
    let cfg = RingConfig::default();
    let mut map = two_cells();
    map = apply(
        &map,
        &Proposal {
            based_on_epoch: map.epoch(),
            change: Change::BeginDivision {
                parent: id("2"),
                child_address: addr(2),
            },
        },
    )
    .unwrap();
    map = apply(
        &map,
        &Proposal {
            based_on_epoch: map.epoch(),
            change: Change::CompleteDivision { child: id("3") },
        },
    )
    .unwrap();
    let fenced = apply(
        &map,
        &Proposal {
            based_on_epoch: map.epoch(),
            change: Change::Fence { cell: id("2") },
        },
    )
    .unwrap();
    let mut s = Ring::new(id("3"), map.clone(), cfg, 0);
    s.drain_outputs();
    s.install_map(fenced.clone(), 10);
    let out = s.drain_outputs();
    let new_range = fenced.cell(&id("3")).unwrap().range.unwrap();
    assert!(
        out.contains(&Output::Resync {
            to: id("1"),
            range: new_range
        }),
        "{out:?}"
    );
    s.tick(20);
    assert!(proposals(&s.drain_outputs()).is_empty(), "resyncs pending");
    s.resync_done(&id("1"), new_range);
    s.tick(30);
    assert!(
        proposals(&s.drain_outputs()).is_empty(),
        "still waiting for the predecessor's resync"
    );
    s.resync_received(&id("1"));
    s.tick(40);
    assert_eq!(
        proposals(&s.drain_outputs()),
        [Change::CompleteAbsorption { departed: id("2") }]
    );
    // The predecessor re-sends its range to its new backup.
    let mut p = Ring::new(id("1"), map, cfg, 0);
    p.drain_outputs();
    p.install_map(fenced.clone(), 10);
    let p_range = fenced.cell(&id("1")).unwrap().range.unwrap();
    assert!(p.drain_outputs().contains(&Output::Resync {
        to: id("3"),
        range: p_range
    }));
}

#[test]
fn ring_messages_round_trip_and_bad_bytes_are_refused() {
    let messages = [
        RingMessage::Heartbeat {
            from: id("2.25"),
            epoch: 7,
            sent_at_ms: 99,
        },
        RingMessage::HeartbeatAck {
            from: id("3"),
            epoch: 8,
            echo_sent_at_ms: 99,
            grant: Some(HashRange::new(u64::MAX - 1, 5)),
        },
        RingMessage::LeaseRelease {
            from: id("1"),
            epoch: 9,
            before_ms: None,
            keep: None,
        },
        RingMessage::LeaseRelease {
            from: id("1"),
            epoch: 9,
            before_ms: Some(12),
            keep: Some(HashRange::new(3, 4)),
        },
    ];
    for m in messages {
        assert_eq!(RingMessage::decode(&m.encode()).unwrap(), m);
    }
    assert!(matches!(
        RingMessage::decode(b"{"),
        Err(RingMessageError::Malformed(_))
    ));
    let huge = vec![b' '; RING_MESSAGE_BYTES_MAX + 1];
    assert!(matches!(
        RingMessage::decode(&huge),
        Err(RingMessageError::TooLarge(_))
    ));
}

/// Regression for the bug the simulator found: a fenced master and its equally fenced backup,
/// cut off from the consensus group together, keep renewing leases between themselves. The
/// cell that takes their range over must not serve until they have stopped.
#[test]
fn partitioned_zombie_pair_never_overlaps_the_new_owner() {
    let cfg = RingConfig::default();
    // Ring 1, 2, 3 (r = 2): 1 is backed up by 2.
    let mut map = two_cells();
    map = apply(
        &map,
        &Proposal {
            based_on_epoch: map.epoch(),
            change: Change::BeginDivision {
                parent: id("2"),
                child_address: addr(2),
            },
        },
    )
    .unwrap();
    map = apply(
        &map,
        &Proposal {
            based_on_epoch: map.epoch(),
            change: Change::CompleteDivision { child: id("3") },
        },
    )
    .unwrap();
    let epoch = map.epoch();
    let mut zombie = Ring::new(id("1"), map.clone(), cfg, 0);
    let mut zombie_backup = Ring::new(id("2"), map.clone(), cfg, 0);
    zombie.map_confirmed(epoch, 0);
    zombie_backup.map_confirmed(epoch, 0);
    // The group (unreachable for 1 and 2 from now on) fences 2, then 1: 3 owns everything.
    let mut later = map.clone();
    for cell in ["2", "1"] {
        later = apply(
            &later,
            &Proposal {
                based_on_epoch: later.epoch(),
                change: Change::Fence { cell: id(cell) },
            },
        )
        .unwrap();
    }
    let mut owner = Ring::new(id("3"), map, cfg, 0);
    owner.install_map(later.clone(), 0);
    let hash = 0; // mastered by 1 in the old map, by 3 in the new one
    assert_eq!(later.owner(hash).id, id("3"));
    let (mut zombie_served, mut owner_served) = (false, false);
    for now in 0..4 * cfg.map_lease_ms {
        if now % cfg.heartbeat_interval_ms == 0 {
            zombie.tick(now);
            zombie_backup.tick(now);
            exchange(&mut zombie, &mut zombie_backup, now);
            owner.tick(now);
            owner.map_confirmed(later.epoch(), now);
        }
        let (z, o) = (zombie.can_serve(hash, now), owner.can_serve(hash, now));
        assert!(
            !(z && o),
            "t={now}ms: the zombie and the new owner both serve hash {hash:#x}"
        );
        zombie_served |= z;
        owner_served |= o;
    }
    assert!(
        zombie_served,
        "the zombie served while its map lease lasted (the test is live)"
    );
    assert!(owner_served, "the new owner took over in the end");
}

/// What a sender masters is judged by the installed map and, for a message stamped with an
/// older epoch, by the maps installed around that epoch; a skipped epoch falls between them.
#[test]
fn master_ranges_cover_the_installed_map_and_the_epochs_around_an_older_stamp() {
    let cfg = RingConfig::default();
    let one = ClusterMap::bootstrap(id("1"), addr(0), 2).unwrap();
    let dividing = one_divides(&one);
    let divided = two_cells();
    let half = |c: &str| divided.cell(&id(c)).unwrap().range.unwrap();
    let mut a = Ring::new(id("1"), one, cfg, 0);
    a.install_map(dividing, 1);
    a.install_map(divided.clone(), 2);
    assert_eq!(a.master_ranges(&id("1"), 3), [half("1")]);
    assert_eq!(a.master_ranges(&id("2"), 3), [half("2")]);
    // Stamped before the division completed: cell 1 still mastered the whole ring then.
    assert_eq!(a.master_ranges(&id("1"), 2), [half("1"), HashRange::FULL]);
    assert_eq!(a.master_ranges(&id("2"), 1), [half("2")]);
    assert!(a.master_ranges(&id("9"), 3).is_empty(), "not in any map");
    // Epoch 2 skipped: it lies between the maps installed before and after it.
    let mut b = Ring::new(
        id("1"),
        ClusterMap::bootstrap(id("1"), addr(0), 2).unwrap(),
        cfg,
        0,
    );
    b.install_map(divided.clone(), 2);
    assert_eq!(b.master_ranges(&id("1"), 2), [half("1"), HashRange::FULL]);
}

/// A ring remembers a bounded number of replaced maps.
#[test]
fn a_ring_remembers_a_bounded_number_of_maps() {
    let cfg = RingConfig::default();
    let mut map = two_cells();
    let mut a = Ring::new(id("1"), map.clone(), cfg, 0);
    for _ in 0..RECENT_MAPS_MAX {
        let change = match map.migrations().first() {
            Some(Migration::Division { child, .. }) => Change::AbortDivision {
                child: child.clone(),
            },
            _ => Change::BeginDivision {
                parent: id("2"),
                child_address: addr(9),
            },
        };
        let proposal = Proposal {
            based_on_epoch: map.epoch(),
            change,
        };
        map = apply(&map, &proposal).unwrap();
        a.install_map(map.clone(), 0);
    }
    assert_eq!(a.recent.len(), RECENT_MAPS_MAX);
    let first = a.recent.front().unwrap().epoch();
    a.install_map(
        apply(
            &map,
            &Proposal {
                based_on_epoch: map.epoch(),
                change: Change::BeginDivision {
                    parent: id("2"),
                    child_address: addr(8),
                },
            },
        )
        .unwrap_or(map),
        0,
    );
    assert_eq!(a.recent.len(), RECENT_MAPS_MAX, "the oldest is forgotten");
    assert!(a.recent.front().unwrap().epoch() > first);
}

/// `map` with `change` applied (it must apply).
fn applied(map: &ClusterMap, change: Change) -> ClusterMap {
    let proposal = Proposal {
        based_on_epoch: map.epoch(),
        change,
    };
    apply(map, &proposal).unwrap()
}

/// Two cells (1: lower half, 2: upper half) with leases in place at time 0.
fn two_serving(cfg: RingConfig) -> (Ring, Ring, ClusterMap) {
    let map = two_cells();
    let mut a = Ring::new(id("1"), map.clone(), cfg, 0);
    let mut b = Ring::new(id("2"), map.clone(), cfg, 0);
    a.map_confirmed(3, 0);
    b.map_confirmed(3, 0);
    a.tick(0);
    b.tick(0);
    exchange(&mut a, &mut b, 0);
    (a, b, map)
}

mod departed;
mod flip;
mod shift;
mod tail;
