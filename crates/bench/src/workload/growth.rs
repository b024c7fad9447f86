//! A data set that grows, holds and shrinks (`--grow`, `--shrink-at`, `--shrink-to`): the
//! load an autoscaling ring is measured under (docs/benchmarks/elasticity.md).
//!
//! Each generator thread owns every `threads`-th key of the key space (thread `t` of `T`
//! keys `t`, `t + T`, `t + 2T` …, in that order), so the threads' data sets never overlap:
//! - **grow**: a write sets the thread's next key never written, until all its keys are;
//! - **hold**: a write overwrites a random live key (the data set keeps its size);
//! - **shrink**, from `shrink_at` on: a write deletes the thread's oldest live key, until
//!   `keep` keys of the whole space are left; then writes overwrite again (hold). While a
//!   get of that key is unanswered the delete waits and the write overwrites instead.
//!
//! A get reads a random *live* key, uniformly: one whose set was answered and whose delete
//! was not yet sent. The generator learns of answers from [`GrowthState::settled`], so a get
//! never races its own thread's unanswered set or delete (a get in flight holds its key's
//! delete back): with nothing evicted and nothing lost, every get hits (a thread's keys
//! are its own, so only one thread's requests touch a key). With no live key (before the first set is answered, or after
//! shrinking to nothing) a get reads, and a write sets, the thread's oldest key not yet
//! deleted, without counting it as written: such a get misses.

use std::collections::{BTreeMap, BTreeSet};

use rand::Rng;
use serde::{Deserialize, Serialize};

use super::OpKind;

/// The plan: when the data set starts shrinking, and to how many keys.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Growth {
    /// Seconds into the measured phase at which writes become deletes (`None`: never).
    pub shrink_at_secs: Option<f64>,
    /// Keys of the whole key space left once the deletes are done.
    pub keep: u64,
}

/// What one write of the plan is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Write {
    /// Set key `0` (a key index of the whole space).
    Set(u64),
    /// Delete key `0`.
    Delete(u64),
}

/// One thread's part of a growing data set. Key indices in and out are of the whole space.
#[derive(Debug, Clone)]
pub struct GrowthState {
    thread: u64,
    threads: u64,
    /// Keys this thread owns, and how many of them it keeps after shrinking.
    share: u64,
    keep: u64,
    /// The run clock's nanosecond at which shrinking starts (`u64::MAX`: never).
    shrink_at_ns: u64,
    /// Local indices: keys `0..written` were sent a set, `0..deleted` a delete.
    written: u64,
    deleted: u64,
    /// Sets of new keys sent but not answered yet (local indices). Deletes need no such
    /// record: they go oldest first, so every key below `deleted` was sent one.
    unsettled_sets: BTreeSet<u64>,
    /// Gets sent but not answered yet, by local index: the key's delete waits for them.
    unsettled_gets: BTreeMap<u64, u32>,
}

/// How many of `count` keys fall to thread `thread` of `threads` (every `threads`-th key).
fn share_of(count: u64, thread: u64, threads: u64) -> u64 {
    count / threads + u64::from(thread < count % threads)
}

impl GrowthState {
    /// Thread `thread` of `threads`'s part of `plan` over `key_count` keys; `measure_start_ns`
    /// is when the measured phase begins on the run's clock (the warm-up's length).
    pub fn new(
        plan: Growth,
        key_count: u64,
        thread: usize,
        threads: usize,
        measure_start_ns: u64,
    ) -> Self {
        let (thread, threads) = (thread as u64, threads.max(1) as u64);
        let shrink_at_ns = plan.shrink_at_secs.map_or(u64::MAX, |s| {
            measure_start_ns.saturating_add((s.max(0.0) * 1e9) as u64)
        });
        Self {
            thread,
            threads,
            share: share_of(key_count, thread, threads),
            keep: share_of(plan.keep.min(key_count), thread, threads),
            shrink_at_ns,
            written: 0,
            deleted: 0,
            unsettled_sets: BTreeSet::new(),
            unsettled_gets: BTreeMap::new(),
        }
    }

    fn global(&self, local: u64) -> u64 {
        local * self.threads + self.thread
    }

    fn local(&self, key: u64) -> u64 {
        key / self.threads
    }

    /// Keys written and not deleted (sent, not necessarily answered).
    pub fn live(&self) -> u64 {
        self.written - self.deleted
    }

    /// The write due at `now_ns` on the run's clock.
    pub fn write(&mut self, now_ns: u64, rng: &mut impl Rng) -> Write {
        let shrinking = now_ns >= self.shrink_at_ns && self.written - self.deleted > self.keep;
        if shrinking && !self.unsettled_gets.contains_key(&self.deleted) {
            let local = self.deleted;
            self.deleted += 1;
            return Write::Delete(self.global(local));
        }
        if now_ns < self.shrink_at_ns && self.written < self.share {
            let local = self.written;
            self.written += 1;
            self.unsettled_sets.insert(local);
            return Write::Set(self.global(local));
        }
        if self.written == self.deleted {
            // Nothing live to overwrite: set the oldest key not deleted (a new one if any).
            let local = self.deleted.min(self.share.saturating_sub(1));
            return Write::Set(self.global(local));
        }
        Write::Set(self.global(rng.gen_range(self.deleted..self.written)))
    }

    /// The key a get reads: a random live key whose set was answered (recorded as read
    /// until [`settled`](Self::settled): its delete waits, so a get never races it).
    pub fn read(&mut self, rng: &mut impl Rng) -> u64 {
        // Keys below `deleted` are gone or going; keys from the oldest unanswered set of a
        // new key on may not be there yet.
        let lo = self.deleted;
        let hi = self.unsettled_sets.first().copied().unwrap_or(self.written);
        if lo < hi {
            let local = rng.gen_range(lo..hi);
            *self.unsettled_gets.entry(local).or_default() += 1;
            self.global(local)
        } else {
            self.global(self.deleted.min(self.share.saturating_sub(1)))
        }
    }

    /// Request `op` of `key` was answered (or failed): reads may now count on it.
    pub fn settled(&mut self, op: OpKind, key: u64) {
        if key % self.threads != self.thread {
            return;
        }
        let local = self.local(key);
        match op {
            OpKind::Set => {
                self.unsettled_sets.remove(&local);
            }
            OpKind::Get => {
                if let Some(n) = self.unsettled_gets.get_mut(&local) {
                    *n -= 1;
                    if *n == 0 {
                        self.unsettled_gets.remove(&local);
                    }
                }
            }
            OpKind::Delete => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::SmallRng;

    /// A get, answered at once.
    fn read(s: &mut GrowthState, rng: &mut SmallRng) -> u64 {
        let key = s.read(rng);
        s.settled(OpKind::Get, key);
        key
    }

    fn settle_all(s: &mut GrowthState, writes: &[Write]) {
        for w in writes {
            match *w {
                Write::Set(k) => s.settled(OpKind::Set, k),
                Write::Delete(k) => s.settled(OpKind::Delete, k),
            }
        }
    }

    #[test]
    fn grows_in_order_holds_then_shrinks_to_what_it_keeps() {
        let mut rng = SmallRng::seed_from_u64(3);
        let plan = Growth {
            shrink_at_secs: Some(10.0),
            keep: 20,
        };
        // Thread 1 of 3 over 100 keys owns 1, 4, … 97: 33 keys, keeps 7 of the 20.
        let mut s = GrowthState::new(plan, 100, 1, 3, 2_000_000_000);
        let sec = 1_000_000_000;
        let grown: Vec<Write> = (0..33).map(|_| s.write(sec, &mut rng)).collect();
        let expect: Vec<Write> = (0..33).map(|j| Write::Set(j * 3 + 1)).collect();
        assert_eq!(grown, expect, "every owned key once, in order");
        assert_eq!(s.live(), 33);
        // Nothing answered yet: a get has nothing live to read.
        assert_eq!(read(&mut s, &mut rng), 1);
        settle_all(&mut s, &grown[..10]);
        for _ in 0..200 {
            let k = read(&mut s, &mut rng);
            assert!(k % 3 == 1 && k < 30, "only acknowledged keys: {k}");
        }
        settle_all(&mut s, &grown);
        // A get in flight holds its key's delete back: the write overwrites instead.
        let mut held = s.clone();
        let mut r = rng.clone();
        let oldest = loop {
            let k = held.read(&mut r);
            if k == 1 {
                break k;
            }
            held.settled(OpKind::Get, k);
        };
        assert!(matches!(held.write(12 * sec, &mut r), Write::Set(_)));
        held.settled(OpKind::Get, oldest);
        assert_eq!(held.write(12 * sec, &mut r), Write::Delete(1));
        // Hold (11.9 s on the run's clock is 9.9 s into the measured phase): overwrites.
        for _ in 0..100 {
            match s.write(11 * sec + 900_000_000, &mut rng) {
                Write::Set(k) => assert!(k % 3 == 1 && k <= 97, "{k}"),
                w => panic!("no delete before shrink_at: {w:?}"),
            }
        }
        assert_eq!(s.live(), 33);
        // Shrink: the oldest first, down to 7 keys, then overwrites of those.
        let gone: Vec<Write> = (0..26).map(|_| s.write(12 * sec, &mut rng)).collect();
        let expect: Vec<Write> = (0..26).map(|j| Write::Delete(j * 3 + 1)).collect();
        assert_eq!(gone, expect);
        // The deletes unanswered: a get reads only keys no delete was sent for.
        for _ in 0..200 {
            assert!(read(&mut s, &mut rng) >= 79);
        }
        settle_all(&mut s, &gone[..5]);
        for _ in 0..200 {
            assert!(
                read(&mut s, &mut rng) >= 79,
                "an older delete is still in flight"
            );
        }
        settle_all(&mut s, &gone);
        assert_eq!(s.live(), 7);
        for _ in 0..100 {
            match s.write(20 * sec, &mut rng) {
                Write::Set(k) => assert!((79..=97).contains(&k) && k % 3 == 1, "{k}"),
                w => panic!("kept keys stay: {w:?}"),
            }
            let k = read(&mut s, &mut rng);
            assert!((79..=97).contains(&k) && k % 3 == 1, "{k}");
        }
    }

    #[test]
    fn threads_share_the_key_space_and_shrinking_stops_growth() {
        let mut rng = SmallRng::seed_from_u64(1);
        let plan = Growth {
            shrink_at_secs: Some(0.0),
            keep: 0,
        };
        let shares: Vec<u64> = (0..4).map(|t| share_of(10, t, 4)).collect();
        assert_eq!(shares, [3, 3, 2, 2]);
        assert_eq!(shares.iter().sum::<u64>(), 10);
        // Shrinking from the start: nothing to delete, so writes set key 0 of the share
        // and nothing grows.
        let mut s = GrowthState::new(plan, 10, 0, 1, 0);
        assert_eq!(s.write(0, &mut rng), Write::Set(0));
        assert_eq!(s.live(), 0);
        // Never shrinking: the whole space once, then overwrites.
        let never = Growth {
            shrink_at_secs: None,
            keep: 0,
        };
        let mut s = GrowthState::new(never, 5, 0, 1, 0);
        let w: Vec<Write> = (0..5).map(|_| s.write(u64::MAX - 1, &mut rng)).collect();
        assert_eq!(w, (0..5).map(Write::Set).collect::<Vec<_>>());
        settle_all(&mut s, &w);
        assert!(matches!(s.write(u64::MAX - 1, &mut rng), Write::Set(k) if k < 5));
        assert_eq!(s.live(), 5);
    }
}
