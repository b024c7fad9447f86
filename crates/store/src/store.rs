//! The thread-safe store: shards behind mutexes, one CAS counter, one change feed.
//!
//! Layout: `Layout::Shared` is one shard — one arena, index and LRU order behind one
//! lock; `Layout::Partitioned { shards }` is N shards of `memory_limit / N` bytes, each with its
//! own lock, the shard chosen by mixed hash bits (not the ring's high bits, which all keys of a
//! cell share). Callers see the same API either way, so a later mediator can switch between
//! them.
//!
//! Readers: values are handed to a callback while the shard lock is held ([`Store::read`]). The
//! caller copies the bytes it needs (typically straight into a connection's output buffer) and
//! returns; only then can the slab be evicted, compacted or reused. This was chosen over
//! refcounting each entry while it is read because it costs no per-item counter bytes, no
//! atomic traffic and no deferred-free machinery, and the one copy is the copy any server makes
//! into its socket buffer anyway. The price is that the callback must be short and must not call
//! back into the store.
//!
//! Lock order: every operation holds one shard lock at a time, except a flush taking effect,
//! which takes all shard locks in ascending shard order (so two flushes cannot deadlock and
//! nothing else takes two). The CAS, sequence and pending-flush values are atomics; the change
//! sink is called under the shard lock(s).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::config::{ConfigError, EvictionPolicyKind, StoreConfig};
use crate::expiry::Expiry;
use crate::feed::{ChangeKind, ChangeSink};
use crate::ops::*;
use crate::shard::{Ctx, Shard};
use crate::slab::SlabId;
use crate::stats::Stats;

/// Keys of a [`Store::read_many`] whose memory is asked for together before the first of
/// them is read. Enough misses to keep a core's line-fill buffers busy (10 – 16 on current
/// x86 cores) while the group's hashes fit in a stack array and its lock is held briefly.
pub const READ_AHEAD_KEYS: usize = 16;
use cellcache_keyspace::HashRange;

mod tier;
pub use tier::FillOutcome;

const MIX_SHARD: u64 = 0xFF51_AFD7_ED55_8CCD;

/// Position of a [`Store::scan_range`] walk: the shard, and the place in its slab order
/// (taken when the walk enters the shard) to visit next.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ScanCursor {
    shard: usize,
    /// The shard's slabs, coldest first (`Shard::scan_order`), or on a later pass the slabs
    /// S3-FIFO moved items into; `None` until entered.
    order: Option<Arc<[SlabId]>>,
    at: usize,
    /// The shard's `move_clock` when this pass over it began.
    since: u64,
    /// Passes over this shard so far (the first one is 0).
    pass: u32,
}

impl ScanCursor {
    /// Where every walk starts.
    pub const START: ScanCursor = ScanCursor {
        shard: 0,
        order: None,
        at: 0,
        since: 0,
        pass: 0,
    };
}

/// What one [`Store::drop_step`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DropStep {
    /// `dropped` items removed; the walk goes on at `next` (`None`: it is complete).
    Dropped {
        dropped: usize,
        next: Option<ScanCursor>,
    },
    /// Nothing removed: the caller's `still` said no.
    Stale,
    /// The cursor was past the end.
    Done,
}

/// Passes over a shard after which the slabs moved into are visited in one call: bounds a
/// walk under S3-FIFO promotions that never pause.
const SCAN_PASSES_MAX: u32 = 4;
/// Slabs moved into that a pass visits in one call instead of one per call.
const SCAN_SLABS_AT_ONCE: usize = 4;

/// An in-memory store of one cell. `Send + Sync`; share it with `Arc`.
pub struct Store {
    /// Several are held at once only by `flush_range`, in index order. The change sink is
    /// called under them, so it may take only locks its owner ranks after them (for
    /// `cellcache-node`, lock order: see its `cluster::Cluster`).
    shards: Box<[Mutex<Shard>]>,
    cas: AtomicU64,
    seq: AtomicU64,
    /// Unix second at which a delayed flush_all takes effect; 0 = none pending.
    flush_at: AtomicU32,
    sink: Option<Arc<dyn ChangeSink>>,
    config: StoreConfig,
    /// The eviction policy every shard runs now. Held by a switch across the shards' locks,
    /// which it takes one at a time after it; nothing holding a shard lock takes it.
    eviction: Mutex<EvictionPolicyKind>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Store {
    /// Allocates the arena and index of every shard.
    pub fn new(config: StoreConfig) -> Result<Store, ConfigError> {
        Store::build(config, None)
    }

    /// Like [`Store::new`], reporting every mutation to `sink`.
    pub fn with_change_sink(
        config: StoreConfig,
        sink: Arc<dyn ChangeSink>,
    ) -> Result<Store, ConfigError> {
        Store::build(config, Some(sink))
    }

    fn build(config: StoreConfig, sink: Option<Arc<dyn ChangeSink>>) -> Result<Store, ConfigError> {
        config.validate()?;
        let n = config.shard_count();
        let budget = config.memory_limit_bytes / n;
        let shards = (0..n)
            .map(|_| Shard::new(&config, budget).map(Mutex::new))
            .collect::<Result<_, _>>()?;
        Ok(Store {
            shards,
            cas: AtomicU64::new(0),
            seq: AtomicU64::new(0),
            flush_at: AtomicU32::new(0),
            sink,
            eviction: Mutex::new(config.eviction),
            config,
        })
    }

    /// The eviction policy the shards run (the configured one until a switch).
    pub fn eviction(&self) -> EvictionPolicyKind {
        *self.eviction.lock()
    }

    /// Switches every shard to the eviction policy `kind`, one shard at a time under its lock:
    /// the policy's metadata is translated in place (`shard::switch`), so a request waits at
    /// most for one shard's translation, none fails, no item is copied and only the items of
    /// the slabs a ghost needs are evicted. Reads and writes on other shards go on meanwhile;
    /// each shard runs exactly one policy at any moment. `Err` (nothing changed) if `kind`'s
    /// parameters are invalid.
    pub fn switch_eviction(&self, kind: EvictionPolicyKind, now: u32) -> Result<(), ConfigError> {
        StoreConfig {
            eviction: kind,
            ..self.config.clone()
        }
        .validate()?;
        let mut current = self.eviction.lock();
        self.maybe_flush(now);
        for shard in self.shards.iter() {
            shard.lock().switch_policy(kind, now);
        }
        *current = kind;
        Ok(())
    }

    /// The configuration the store was built with.
    pub fn config(&self) -> &StoreConfig {
        &self.config
    }

    /// The eviction policy `name` stands for, as a switch to it should run it: with the
    /// parameters this store was configured with when it started on that policy (a cell
    /// tuned `small_permille = 200` and switched away and back keeps its tuning), else with
    /// the policy's defaults. `None` for a name no policy has.
    pub fn eviction_named(&self, name: &str) -> Option<EvictionPolicyKind> {
        let configured = self.config.eviction;
        EvictionPolicyKind::from_name(name).map(|kind| {
            if kind.name() == configured.name() {
                configured
            } else {
                kind
            }
        })
    }

    fn ctx(&self) -> Ctx<'_> {
        Ctx {
            cas: &self.cas,
            seq: &self.seq,
            sink: self.sink.as_deref(),
        }
    }

    fn shard(&self, hash: u64) -> &Mutex<Shard> {
        &self.shards[self.shard_index(hash)]
    }

    fn shard_index(&self, hash: u64) -> usize {
        ((u128::from(hash.wrapping_mul(MIX_SHARD)) * self.shards.len() as u128) >> 64) as usize
    }

    /// get / gets: runs `f` on the item if present, and marks it fetched.
    pub fn get<R>(&self, key: &[u8], now: u32, f: impl FnOnce(ItemView<'_>) -> R) -> Option<R> {
        self.read(key, now, ReadOptions::default(), f)
    }

    /// General read (gat/gats with `touch`, mg flags).
    pub fn read<R>(
        &self,
        key: &[u8],
        now: u32,
        opts: ReadOptions,
        f: impl FnOnce(ItemView<'_>) -> R,
    ) -> Option<R> {
        self.maybe_flush(now);
        let h = crate::key_hash(key);
        self.shard(h).lock().read(h, key, now, opts, &self.ctx(), f)
    }

    /// [`Store::read`] of every key of `keys`, in order, calling `each(i, Some(item))` for a
    /// hit on `keys[i]` and `each(i, None)` for a miss, under the shard's lock as `read`'s
    /// callback runs. The same reads with the same effects (fetched marks, touches, expiry),
    /// made faster for a multi-key get: for [`READ_AHEAD_KEYS`] keys at a time that share a
    /// shard (all of them in the default shared layout) the lock is taken once, and the
    /// index buckets of all of them, then the items their tags point at, are asked for
    /// before the first is read — so their cache misses overlap instead of following one
    /// another. Keys of different shards in one group are read one by one.
    pub fn read_many(
        &self,
        keys: &[&[u8]],
        now: u32,
        opts: ReadOptions,
        mut each: impl FnMut(usize, Option<ItemView<'_>>),
    ) {
        self.maybe_flush(now);
        let ctx = self.ctx();
        for (group, chunk) in keys.chunks(READ_AHEAD_KEYS).enumerate() {
            let mut hashes = [0u64; READ_AHEAD_KEYS];
            for (h, key) in hashes.iter_mut().zip(chunk) {
                *h = crate::key_hash(key);
            }
            let hashes = &hashes[..chunk.len()];
            let first = self.shard_index(hashes[0]);
            let one_shard = hashes.iter().all(|&h| self.shard_index(h) == first);
            let base = group * READ_AHEAD_KEYS;
            if one_shard {
                let mut shard = self.shards[first].lock();
                let mut touched = 0;
                for &h in hashes {
                    touched ^= shard.touch_buckets(h);
                }
                for &h in hashes {
                    touched ^= shard.touch_items(h);
                }
                std::hint::black_box(touched);
                for (j, (&h, key)) in hashes.iter().zip(chunk).enumerate() {
                    let hit =
                        shard.read(h, key, now, opts, &ctx, |item| each(base + j, Some(item)));
                    if hit.is_none() {
                        each(base + j, None);
                    }
                }
            } else {
                for (j, (&h, key)) in hashes.iter().zip(chunk).enumerate() {
                    let mut shard = self.shards[self.shard_index(h)].lock();
                    let hit =
                        shard.read(h, key, now, opts, &ctx, |item| each(base + j, Some(item)));
                    if hit.is_none() {
                        each(base + j, None);
                    }
                }
            }
        }
    }

    /// set/add/replace/append/prepend/cas.
    pub fn write(&self, req: &WriteRequest<'_>, now: u32) -> Result<WriteOutcome, StoreError> {
        self.maybe_flush(now);
        let h = crate::key_hash(req.key);
        self.shard(h).lock().write(h, req, now, &self.ctx())
    }

    /// delete / md.
    pub fn delete(&self, key: &[u8], now: u32, opts: DeleteOptions) -> DeleteOutcome {
        self.maybe_flush(now);
        let h = crate::key_hash(key);
        self.shard(h).lock().delete(h, key, now, opts, &self.ctx())
    }

    /// touch: sets a new expiry; false if absent.
    pub fn touch(&self, key: &[u8], expiry: Expiry, now: u32) -> bool {
        self.maybe_flush(now);
        let h = crate::key_hash(key);
        self.shard(h).lock().touch(h, key, expiry, now, &self.ctx())
    }

    /// Marks `key`'s item as stored through a base64 key (meta `b`), so its key is echoed
    /// in base64 (`ItemView::key_binary`), as memcached does. A bit in place: it is not in
    /// the change feed, so a backup's copy echoes the key as plain bytes.
    pub fn mark_key_binary(&self, key: &[u8], now: u32) {
        let h = crate::key_hash(key);
        self.shard(h).lock().mark_key_binary(h, key, now);
    }

    /// incr/decr/ma.
    pub fn arith(
        &self,
        key: &[u8],
        now: u32,
        req: &ArithRequest,
    ) -> Result<ArithOutcome, StoreError> {
        self.maybe_flush(now);
        let h = crate::key_hash(key);
        self.shard(h).lock().arith(h, key, now, req, &self.ctx())
    }

    /// `flush_all [delay]`: with 0 every item goes now; otherwise every item stored before
    /// `now + delay_secs` becomes invalid at that time. A new flush replaces a pending one.
    pub fn flush_all(&self, now: u32, delay_secs: u32) {
        if delay_secs == 0 {
            self.flush_at.store(0, Ordering::Release);
            self.flush_range(HashRange::FULL);
        } else {
            self.flush_at
                .store(now.saturating_add(delay_secs).max(1), Ordering::Release);
        }
    }

    /// Applies a pending delayed flush once its second has come. One atomic load per operation.
    fn maybe_flush(&self, now: u32) {
        let at = self.flush_at.load(Ordering::Acquire);
        if at != 0
            && now >= at
            && self
                .flush_at
                .compare_exchange(at, 0, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            self.flush_range(HashRange::FULL);
        }
    }

    /// Drops every item whose key hash is in `range` now, under all shard locks at once, and
    /// reports one `Flush { range }`, so the flush has a single place in the feed's order
    /// relative to every shard's mutations (a replica replaying the feed wipes exactly what
    /// the master wiped). A ring cell flushes its master range this way; its backups apply
    /// the reported flush to their copies of that range only.
    pub fn flush_range(&self, range: HashRange) {
        let mut guards: Vec<_> = self.shards.iter().map(|s| s.lock()).collect();
        for g in &mut guards {
            let flushed = if range == HashRange::FULL {
                g.clear_all()
            } else {
                g.drop_range(range, &|_| true)
            };
            // memcached counts a flushed item as `reclaimed` when its memory is reused; here
            // the memory is reclaimed by the flush itself. A replica's copies (`drop_range`,
            // `apply_change`) are not counted again.
            g.count_reclaimed(flushed);
        }
        self.ctx().emit_flush(range);
        drop(guards);
    }

    /// Calls `f` for every live item whose key hash is in `range` (one shard lock at a time).
    pub fn for_each_in_range(&self, range: HashRange, now: u32, mut f: impl FnMut(ItemView<'_>)) {
        self.maybe_flush(now);
        for s in self.shards.iter() {
            s.lock().for_each_in_range(range, now, &mut f);
        }
    }

    /// Visits the live items in `range` of one slab and returns where to continue (`None` when
    /// the walk is complete). Each call holds one shard lock for one slab only, so streaming a
    /// large range (cell duplication, re-replication) never stalls requests for long.
    ///
    /// Consistency with the change feed: items move between slabs only by being rewritten,
    /// which the feed reports with the item's full state, or by an S3-FIFO clearing, after
    /// which the walk visits the slabs moved into again (see below); compaction and
    /// second-chance clearing move items only towards the start of the same slab, which one
    /// call visits whole. So the items visited plus the feed entries recorded
    /// since the walk started give the range's current contents, provided the receiver applies
    /// both in the order the store produced them (both happen under the shard lock — route the
    /// callback and the sink into one queue). Items evicted meanwhile may be missing: it is a
    /// cache.
    ///
    /// Order: shard by shard, each shard's slabs in the order its eviction policy would clear
    /// them (taken when the walk enters the shard; slabs not in use last). A receiver that
    /// writes the items as they come (a division's child: the same shard count puts each item
    /// in the same shard) ends with the sender's recency: the warm hand-off. Under S3-FIFO,
    /// once the shard's slabs are visited, the slabs that clearing moved items into since the
    /// pass began are visited again, pass after pass until one saw no move; a pass of at most
    /// 4 slabs, or the fifth pass, visits all its slabs in one call, so the walk ends. An item
    /// may then be visited twice, both times with its current state.
    pub fn scan_range(
        &self,
        range: HashRange,
        now: u32,
        cursor: ScanCursor,
        mut f: impl FnMut(ItemView<'_>),
    ) -> Option<ScanCursor> {
        self.maybe_flush(now);
        self.walk_step(cursor, &mut |guard, slab| {
            guard.scan_slab(slab, range, now, &mut f)
        })?
    }

    /// One step of a slab walk (see [`Store::scan_range`]): `visit` called under the
    /// cursor's shard lock for the slab or slabs due; `None` when the cursor is past the end.
    fn walk_step(
        &self,
        cursor: ScanCursor,
        visit: &mut dyn FnMut(&mut Shard, SlabId),
    ) -> Option<Option<ScanCursor>> {
        let shard = self.shards.get(cursor.shard)?;
        let mut guard = shard.lock();
        let (order, since) = match cursor.order {
            Some(order) => (order, cursor.since),
            None => (Arc::from(guard.scan_order()), guard.move_clock()),
        };
        let at_once = cursor.pass > 0
            && (order.len() <= SCAN_SLABS_AT_ONCE || cursor.pass >= SCAN_PASSES_MAX);
        let last = if at_once { order.len() } else { cursor.at + 1 };
        for &slab in order.get(cursor.at..last).unwrap_or(&[]) {
            visit(&mut guard, slab);
        }
        let next = if last < order.len() {
            ScanCursor {
                shard: cursor.shard,
                order: Some(order),
                at: last,
                since,
                pass: cursor.pass,
            }
        } else {
            // S3-FIFO moves items between slabs: one moved into a slab this pass had already
            // visited would be missed, so the slabs moved into since the pass began are
            // visited again, until a pass sees no move (a pass of few slabs, or any pass
            // after `SCAN_PASSES_MAX`, visits all of them under this lock hold: no move then).
            let again = if at_once {
                Vec::new()
            } else {
                guard.moved_into_since(since)
            };
            if again.is_empty() {
                ScanCursor {
                    shard: cursor.shard + 1,
                    ..ScanCursor::START
                }
            } else {
                ScanCursor {
                    shard: cursor.shard,
                    order: Some(Arc::from(again)),
                    at: 0,
                    since: guard.move_clock(),
                    pass: cursor.pass + 1,
                }
            }
        };
        Some((next.shard < self.shards.len()).then_some(next))
    }

    /// Copies out every live item whose key hash is in `range`.
    pub fn extract_range(&self, range: HashRange, now: u32) -> Vec<OwnedItem> {
        let mut out = Vec::new();
        self.for_each_in_range(range, now, |v| out.push(OwnedItem::from_view(&v)));
        out
    }

    /// Removes every item whose key hash is in `range` (not reported to the change feed: it is a
    /// placement decision, not a client mutation). Returns how many were removed.
    pub fn drop_range(&self, range: HashRange) -> usize {
        self.drop_range_if(range, |_| true)
    }

    /// Like [`Store::drop_range`], only for the hashes `pick` accepts (a backup applying a
    /// replicated flush drops its copies of the sender's range, never keys it masters).
    pub fn drop_range_if(&self, range: HashRange, pick: impl Fn(u64) -> bool) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().drop_range(range, &pick))
            .sum()
    }

    /// One step of a walk that drops the items whose key hash `drop` accepts, a slab at a
    /// time, so that a cell dropping what it no longer holds never keeps a shard's lock for
    /// longer than one slab (a whole-store walk under the lock stalled every request of a
    /// cell for tens of milliseconds at a division's flip). `still` is asked under the
    /// shard's lock before anything is removed: when it says no, nothing is, and the step
    /// returns [`DropStep::Stale`] (the caller's idea of what to drop is out of date).
    ///
    /// Complete like [`Store::scan_range`] (the same walk: the slabs S3-FIFO moved items into
    /// are visited again), so every item present for the whole walk is visited.
    pub fn drop_step(
        &self,
        at: ScanCursor,
        drop: &dyn Fn(u64) -> bool,
        still: &dyn Fn() -> bool,
    ) -> DropStep {
        let (mut stale, mut dropped) = (false, 0);
        let mut visit = |guard: &mut Shard, slab: SlabId| {
            stale = stale || !still();
            if !stale {
                dropped += guard.drop_in_slab(slab, drop);
            }
        };
        match self.walk_step(at, &mut visit) {
            None => DropStep::Done,
            Some(_) if stale => DropStep::Stale,
            Some(next) => DropStep::Dropped { dropped, next },
        }
    }

    /// Stores an item as-is (its CAS, flags, expiry, stale bit), e.g. received in a hand-off.
    pub fn insert_item(&self, item: &OwnedItem, now: u32) -> Result<(), StoreError> {
        self.maybe_flush(now);
        let h = crate::key_hash(&item.key);
        self.shard(h).lock().insert_item(h, item, now, &self.ctx())
    }

    /// Applies one change-feed entry (replication, replay).
    pub fn apply_change(&self, change: &ChangeKind<'_>, now: u32) -> Result<(), StoreError> {
        match *change {
            ChangeKind::Put {
                key,
                value,
                flags,
                expiry,
                cas,
                stale,
            } => {
                let item = OwnedItem {
                    key: key.to_vec(),
                    value: value.to_vec(),
                    flags,
                    expiry,
                    cas,
                    stale,
                };
                self.insert_item(&item, now)
            }
            ChangeKind::Delete { key } => {
                self.delete(key, now, DeleteOptions::default());
                Ok(())
            }
            ChangeKind::Touch { key, expiry } => {
                self.touch(key, expiry, now);
                Ok(())
            }
            ChangeKind::Flush { range } => {
                // A replayed flush is the master's, already in its feed: not reported again.
                self.drop_range(range);
                Ok(())
            }
        }
    }

    /// Zeroes the counters (`total_items`, evictions, reclaims, compactions, …) as
    /// memcached's `stats reset` does; `curr_items`, `bytes` and the slab lists are gauges
    /// and stay.
    pub fn reset_stats(&self) {
        for sh in self.shards.iter() {
            sh.lock().reset_counters();
        }
    }

    /// Counters summed over shards.
    pub fn stats(&self) -> Stats {
        let mut s = Stats::default();
        for sh in self.shards.iter() {
            sh.lock().add_stats(&mut s);
        }
        s.memory_limit_bytes = self.config.memory_limit_bytes as u64;
        s.cas_counter = self.cas.load(Ordering::Relaxed);
        s
    }

    /// Heap bytes the store may hold beyond `memory_limit_bytes`: slab metadata, LRU arrays and
    /// one scratch buffer per shard (the bounded overhead beyond the limit that docs/store.md
    /// documents).
    pub fn overhead_bytes_max(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().metadata_bytes_max())
            .sum::<usize>()
            + std::mem::size_of::<Store>()
    }

    /// `cache_memlimit`: lets the store use at most `bytes` (arena + index) from now on,
    /// evicting slabs at once when it shrinks. The arena was allocated at start, so the
    /// limit can move anywhere between one slab per shard and `memory_limit_bytes`.
    pub fn set_memory_limit(&self, bytes: usize, now: u32) -> Result<(), ConfigError> {
        if bytes > self.config.memory_limit_bytes {
            return Err(ConfigError::MemoryLimitAboveArena {
                requested: bytes,
                allocated: self.config.memory_limit_bytes,
            });
        }
        let per_shard = bytes / self.shards.len();
        for s in self.shards.iter() {
            let mut s = s.lock();
            let quota = per_shard.saturating_sub(s.index_bytes()) / self.config.slab_size_bytes;
            let quota = if bytes == self.config.memory_limit_bytes {
                s.slab_count()
            } else {
                quota
            };
            s.set_slab_quota(quota, now);
        }
        Ok(())
    }

    /// Verifies internal accounting (every slab's live bytes equal the bytes the index points
    /// into it). Panics on violation; O(index). For tests and debugging.
    pub fn check_invariants(&self) {
        for s in self.shards.iter() {
            s.lock().check_invariants();
        }
    }
}
