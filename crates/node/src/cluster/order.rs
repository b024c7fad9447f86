//! Per-key order of the requests a ring cell routes, as one memcached keeps it.
//!
//! One memcached runs a connection's requests in the order they arrive, so a `get`
//! pipelined after a `set` of the same key sees that `set`. A ring cell routes each request
//! on its own: to the local store, to the key's master over a link, or — when the master
//! cannot take it yet (a lease or map confirmation pending, a map being fetched, the master
//! refused it under another map) — into the *parked* queue, to be routed again shortly.
//! Without care a later request for the same key overtakes one that waits: a ring cell
//! answered `get`s with misses right after a ring formed (the ring_order test).
//!
//! The rule: a request waits (is parked) while an earlier request for one of its keys
//! - is parked, or is in the pass that routes parked requests again and not yet routed;
//! - or is forwarded to another cell than the one this request would go to, unanswered
//!   (one forwarded to the same cell keeps its place on that link).
//!
//! Parked requests carry a sequence number from the first time they are parked, and every
//! pass routes them again in that order: a request parked again keeps its place ahead of
//! the ones parked after it. Passes run one at a time, [`PARK_RETRY`] after the queue
//! became non-empty or as soon as a forwarded request is answered.
//!
//! `flush_all` is a *barrier*: it touches every key. It waits while anything earlier is
//! parked, being routed again or in flight, and every later keyed request waits while it is
//! parked — so `set k noreply`, `flush_all`, `get k` misses through a ring as on one
//! memcached, and a `set` pipelined after a `flush_all` survives it.
//!
//! Keys are compared by hash: two keys with one hash only wait for each other needlessly.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use cellcache_cluster::CellId;
use parking_lot::Mutex;

use super::route::{Ctx, Done};

/// How long parked requests wait before they are routed again.
pub const PARK_RETRY: Duration = Duration::from_millis(10);

/// The order state of one cell (see the module docs).
#[derive(Default)]
pub struct Order {
    /// Lock order: a leaf lock, see `Cluster`.
    state: Mutex<State>,
    /// Anything parked, being routed again or in flight: when false (almost always), a
    /// request needs no lock to know it may go.
    busy: AtomicBool,
    /// A pass runs; `again` asks it for one more.
    routing: AtomicBool,
    again: AtomicBool,
}

#[derive(Default)]
struct State {
    next_seq: u64,
    /// Parked requests by sequence number, then by arrival: the parts of one request (a
    /// multi-key get split by master) share its sequence number.
    queue: BTreeMap<(u64, u64), Parked>,
    arrivals: u64,
    /// Key hash → sequence numbers of the parked requests that touch it.
    waiting: HashMap<u64, BTreeSet<u64>>,
    /// Sequence numbers of the parked barriers.
    barriers: BTreeSet<u64>,
    /// Key hash → requests of the running pass that touch it and are not routed yet.
    draining: HashMap<u64, u32>,
    /// Barriers of the running pass not routed yet.
    draining_barriers: u32,
    /// Key hash → the cell its unanswered forwarded requests went to, and how many.
    in_flight: HashMap<u64, (CellId, u32)>,
}

impl State {
    fn busy(&self) -> bool {
        !self.queue.is_empty()
            || !self.draining.is_empty()
            || self.draining_barriers != 0
            || !self.in_flight.is_empty()
    }
}

/// A request waiting to be routed again.
pub struct Parked {
    pub bytes: Vec<u8>,
    pub hashes: Vec<u64>,
    /// A `flush_all`: it touches every key.
    pub barrier: bool,
    pub ctx: Ctx,
    pub done: Done,
}

impl Order {
    /// Whether any request may have to wait (a lock-free look).
    pub fn busy(&self) -> bool {
        self.busy.load(Ordering::Acquire)
    }

    /// Whether a request for `hashes`, placed to go to `to` (a remote master) or to run
    /// here (`None`), must wait; `seq` is its place if it was parked before.
    pub fn must_wait(&self, hashes: &[u64], to: Option<&CellId>, seq: Option<u64>) -> bool {
        let s = self.state.lock();
        // The running pass holds only requests older than any new one, and none older than
        // the one it routes now.
        let barrier_before = match seq {
            None => !s.barriers.is_empty() || s.draining_barriers != 0,
            Some(mine) => s.barriers.first().is_some_and(|first| *first < mine),
        };
        barrier_before
            || hashes.iter().any(|h| {
                let parked_before = s.waiting.get(h).is_some_and(|seqs| match seq {
                    None => !seqs.is_empty(),
                    Some(mine) => seqs.first().is_some_and(|first| *first < mine),
                });
                let routing_before = seq.is_none() && s.draining.contains_key(h);
                let flying_elsewhere = s
                    .in_flight
                    .get(h)
                    .is_some_and(|(owner, _)| Some(owner) != to);
                parked_before || routing_before || flying_elsewhere
            })
    }

    /// Whether a barrier (`flush_all`) must wait: anything earlier is parked, being routed
    /// again or in flight.
    pub fn barrier_must_wait(&self, seq: Option<u64>) -> bool {
        let s = self.state.lock();
        let parked_before = match seq {
            None => !s.queue.is_empty() || !s.draining.is_empty() || s.draining_barriers != 0,
            Some(mine) => s.queue.range(..(mine, 0)).next().is_some(),
        };
        parked_before || !s.in_flight.is_empty()
    }

    /// Parks a request (keeping its place if it was parked before); true when the queue was
    /// empty, so the caller schedules a pass.
    pub fn park(&self, mut p: Parked) -> bool {
        let mut s = self.state.lock();
        let seq = match p.ctx.parked {
            Some(seq) => seq,
            None => {
                s.next_seq += 1;
                s.next_seq
            }
        };
        p.ctx.parked = Some(seq);
        for &h in &p.hashes {
            s.waiting.entry(h).or_default().insert(seq);
        }
        if p.barrier {
            s.barriers.insert(seq);
        }
        let first = s.queue.is_empty();
        s.arrivals += 1;
        let arrival = s.arrivals;
        s.queue.insert((seq, arrival), p);
        self.busy.store(true, Ordering::Release);
        first
    }

    /// Starts a pass, or — when one runs — asks it to go once more and returns `None`.
    pub fn begin_pass(&self) -> Option<()> {
        self.again.store(true, Ordering::Release);
        (!self.routing.swap(true, Ordering::AcqRel)).then_some(())
    }

    /// The next batch of a pass, oldest first, or `None` when the pass is over (and no
    /// one asked for another since).
    pub fn next_batch(&self) -> Option<Vec<Parked>> {
        loop {
            if self.again.swap(false, Ordering::AcqRel) {
                let mut s = self.state.lock();
                let batch: Vec<Parked> = std::mem::take(&mut s.queue).into_values().collect();
                s.waiting.clear();
                s.barriers.clear();
                for p in &batch {
                    for &h in &p.hashes {
                        *s.draining.entry(h).or_default() += 1;
                    }
                    s.draining_barriers += u32::from(p.barrier);
                }
                self.busy.store(s.busy(), Ordering::Release);
                return Some(batch);
            }
            self.routing.store(false, Ordering::Release);
            // Asked again after the last look but before `routing` was cleared: go on,
            // unless a new pass took over.
            if !self.again.load(Ordering::Acquire) || self.routing.swap(true, Ordering::AcqRel) {
                return None;
            }
        }
    }

    /// A request of the running pass was routed (run, forwarded or parked again).
    pub fn routed(&self, hashes: &[u64], barrier: bool) {
        let mut s = self.state.lock();
        s.draining_barriers -= u32::from(barrier);
        for h in hashes {
            if let Some(n) = s.draining.get_mut(h) {
                *n -= 1;
                if *n == 0 {
                    s.draining.remove(h);
                }
            }
        }
        self.busy.store(s.busy(), Ordering::Release);
    }

    /// A request for `keys` was forwarded to `owner`.
    pub fn flight_start(&self, owner: &CellId, keys: &[u64]) {
        if keys.is_empty() {
            return;
        }
        let mut s = self.state.lock();
        for &k in keys {
            let e = s.in_flight.entry(k).or_insert_with(|| (owner.clone(), 0));
            // In flight to another cell, this request would have waited.
            e.0 = owner.clone();
            e.1 += 1;
        }
        self.busy.store(true, Ordering::Release);
    }

    /// The forwarded request for `keys` was answered (or given up); true when requests
    /// are parked, so the caller routes them again now.
    pub fn flight_end(&self, keys: &[u64]) -> bool {
        let mut s = self.state.lock();
        for k in keys {
            if let Some(e) = s.in_flight.get_mut(k) {
                e.1 -= 1;
                if e.1 == 0 {
                    s.in_flight.remove(k);
                }
            }
        }
        self.busy.store(s.busy(), Ordering::Release);
        !s.queue.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn parked(hashes: &[u64], seq: Option<u64>) -> Parked {
        Parked {
            bytes: Vec::new(),
            hashes: hashes.to_vec(),
            barrier: false,
            ctx: Ctx {
                forwarded: false,
                from_epoch: 0,
                deadline: Instant::now(),
                parked: seq,
            },
            done: Box::new(|_| {}),
        }
    }

    #[test]
    fn a_request_waits_behind_an_earlier_one_for_its_key_only() {
        let o = Order::default();
        assert!(!o.busy());
        assert!(o.park(parked(&[1], None)), "first parked: schedule a pass");
        assert!(!o.park(parked(&[2], None)));
        assert!(o.busy());
        assert!(o.must_wait(&[1], None, None));
        assert!(o.must_wait(&[3, 2], None, None));
        assert!(!o.must_wait(&[3], None, None));
    }

    #[test]
    fn a_pass_routes_in_first_parked_order_and_reparked_requests_keep_their_place() {
        let o = Order::default();
        o.park(parked(&[7], None)); // seq 1: a set that waits for a lease
        o.park(parked(&[7], None)); // seq 2: the get pipelined after it
        o.begin_pass().unwrap();
        let batch = o.next_batch().unwrap();
        assert_eq!(batch.len(), 2);
        let mut batch = batch.into_iter();
        let set = batch.next().unwrap();
        // While the pass runs, a new request for key 7 waits: older ones are in the pass.
        assert!(o.must_wait(&[7], None, None));
        // The set must wait again: parked anew, with its place.
        o.park(set);
        o.routed(&[7], false);
        // A new request parked meanwhile comes after both.
        o.park(parked(&[7], None));
        // The get (seq 2) must not overtake the set (seq 1)…
        let get = batch.next().unwrap();
        assert!(o.must_wait(&[7], None, get.ctx.parked));
        o.park(get);
        o.routed(&[7], false);
        assert!(o.next_batch().is_none(), "pass over");
        // …and the next pass routes them set, get, then the new one.
        o.begin_pass().unwrap();
        let order: Vec<_> = o
            .next_batch()
            .unwrap()
            .iter()
            .map(|p| p.ctx.parked.unwrap())
            .collect();
        assert_eq!(order, [1, 2, 3]);
        // The oldest may go: nothing parked before it.
        assert!(!o.must_wait(&[7], None, Some(1)));
    }

    #[test]
    fn parts_of_one_request_parked_with_its_place_are_all_kept() {
        let o = Order::default();
        o.park(parked(&[1, 2], Some(4)));
        o.park(parked(&[1], Some(4)));
        o.begin_pass().unwrap();
        assert_eq!(
            o.next_batch().unwrap().len(),
            2,
            "neither part replaced the other"
        );
    }

    #[test]
    fn one_pass_at_a_time_and_a_late_call_gets_another_batch() {
        let o = Order::default();
        o.park(parked(&[1], None));
        o.begin_pass().unwrap();
        assert_eq!(o.next_batch().unwrap().len(), 1);
        o.routed(&[1], false);
        // Someone asks while the pass runs: it does not start a second one…
        o.park(parked(&[1], None));
        assert!(o.begin_pass().is_none());
        // …but the running pass takes the new request.
        assert_eq!(o.next_batch().unwrap().len(), 1);
        o.routed(&[1], false);
        assert!(o.next_batch().is_none());
        assert!(!o.busy());
    }

    #[test]
    fn a_flush_waits_for_everything_earlier_and_holds_back_everything_later() {
        let o = Order::default();
        let a: CellId = "1".parse().unwrap();
        o.flight_start(&a, &[4]);
        assert!(o.barrier_must_wait(None), "a set noreply still in flight");
        o.flight_end(&[4]);
        assert!(!o.barrier_must_wait(None));
        o.park(parked(&[4], None)); // seq 1: a set waiting for a lease
        assert!(o.barrier_must_wait(None));
        let mut flush = parked(&[], None);
        flush.barrier = true;
        o.park(flush); // seq 2
        assert!(
            o.must_wait(&[9], None, None),
            "any key waits behind a parked flush"
        );
        assert!(o.barrier_must_wait(Some(2)), "the set goes first");
        assert!(!o.barrier_must_wait(Some(1)));
        o.begin_pass().unwrap();
        let batch = o.next_batch().unwrap();
        assert!(
            o.must_wait(&[9], None, None),
            "still, while the pass routes it"
        );
        for p in batch {
            o.routed(&p.hashes, p.barrier);
        }
        assert!(!o.must_wait(&[9], None, None));
        assert!(!o.busy());
    }

    #[test]
    fn in_flight_keys_hold_back_requests_going_elsewhere() {
        let o = Order::default();
        let a: CellId = "1".parse().unwrap();
        let b: CellId = "2".parse().unwrap();
        o.flight_start(&a, &[5]);
        assert!(!o.must_wait(&[5], Some(&a), None), "same link keeps order");
        assert!(o.must_wait(&[5], Some(&b), None));
        assert!(o.must_wait(&[5], None, None), "would run here before it");
        assert!(!o.flight_end(&[5]), "nothing parked");
        assert!(!o.busy());
        assert!(!o.must_wait(&[5], None, None));
    }
}
