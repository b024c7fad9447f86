//! Replication of writes to the backups and range streaming (hand-off, re-replication),
//! master side.
//!
//! The store reports every mutation to [`Replicator::record`] under the lock of the shard
//! that applied it. Mutations of keys in this cell's master range are encoded once as
//! full-state [`ReplicationRecord`]s and appended to the backlog of every target (the
//! backups in the installed map, plus a division child during a hand-off). Because the
//! append happens under the shard lock, the backlog order of any one key is the order the
//! store applied its mutations; a target's single sender task sends the backlog in order
//! over the target's link, one batch in flight at a time, and trims it when acknowledged.
//! Sequence numbers come from one cell-wide counter and order entries inside the cell; on
//! the wire each lane is numbered by consecutive positions (see [`target`]): the receiver
//! applies only the position after its last one, skips resends at or below it (records are
//! full state: applying one twice is harmless) and refuses a frame that jumps, and the
//! sender then renumbers from the receiver's position and resynchronises the target.
//!
//! A request that wrote runs with a *capture* installed on its thread ([`capture`]): the
//! positions its mutations got in each backlog. In `sync` mode its reply is held until
//! every target acknowledged those positions ([`Replicator::wait`]).
//!
//! Snapshots ([`Replicator::stream`]) walk the range with `Store::scan_range` and append
//! each item to the target's *snapshot lane* from inside the scan callback, i.e. under the
//! same shard lock the change feed is called under: snapshot and live records of one key
//! are produced in store order, with no gap between them. A `SnapshotDone` marker ends the
//! stream; the stream is done when the target acknowledged it.
//!
//! Two lanes per target. Live records (the backlog above, which sync-mode clients wait on)
//! and snapshot items (throttled, up to eight chunks queued) are queued separately, and the
//! sender always sends pending live records first, as `Replicate` frames; snapshot items go
//! as `SnapshotChunk` frames only when no live record is pending, and the `SnapshotDone`
//! marker likewise, so every live record produced before it is acknowledged first. A write
//! thus waits for at most one snapshot chunk in flight instead of the whole queue (measured
//! in docs/benchmarks/cluster.md, "With live records ahead of the snapshot"). Each lane's
//! sequence numbers grow (they are taken under the target's lock), and the receiver keeps one
//! applied watermark per lane.
//!
//! Large values travel in parts. An item whose value is longer than `chunk_bytes` becomes
//! consecutive `SetPart` records of at most `chunk_bytes` of value each (one entry, one
//! sequence number apiece), so a frame never carries more than about one chunk and a live
//! record waits for at most one part of a large snapshot item, not the whole value. The
//! receiver rebuilds the value per sender ([`Assembly`]) and stores the item when its last
//! part arrives; a sync write waits for the acknowledgement of its last part. The parts of
//! one key share its hash, so the cross-lane move below carries them together, in order.
//!
//! Ordering across lanes, for one key: a live record may overtake a queued snapshot copy of
//! its key, and that older copy must not be applied after it. So when a live record of key
//! `k` is queued, every snapshot item of `k` not sent yet is moved (re-sequenced) into the
//! live lane just ahead of it: the receiver applies old copy, then the change, in store
//! order. An item already sent keeps its wire position and stays; its lane is sent again
//! (if its batch failed) before the live lane, so it still arrives first. Moving rather than dropping keeps `touch` right (its record carries only the
//! expiry, not the item). A live `flush_all` drops every snapshot item queued before it
//! instead (they are all dead). Items are matched by key hash: a collision only moves an
//! unrelated item earlier in the live lane, still after any live record of its own key.
//! Snapshot items scanned after a live record hold a state at least as new, and go after it
//! (live first). A snapshot batch already in flight when a live record of one of its keys
//! is queued finishes (acknowledged, or failed and sent again) before the live lane is
//! sent: one batch is in flight per target.
//!
//! The module is split by concern: [`target`] (a target's two lanes and the batches cut
//! from them), [`capture`] (the positions a request's writes took), [`wait`] (holding a
//! reply until those are acknowledged), [`sender`] (one task per target sending its
//! batches), [`stream`] (snapshots of a range) and [`apply`] (the receiving side).

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use cellcache_cluster::wire::payload::{ReplicationOp, encode_op, set_record_seq};
use cellcache_cluster::{CellId, HashRange};
use cellcache_store::{Change, ChangeKind, ChangeSink};
use parking_lot::Mutex;

use super::link::Link;

mod apply;
mod capture;
mod progress;
mod sender;
mod stream;
mod target;
mod wait;

pub use apply::{Assembly, SequenceError, apply_records, check_sequence};
use capture::with_capture;
pub use capture::{Captured, capture};
pub use progress::{StreamProgress, TargetLag};
pub use target::Target;
use target::{Entry, LaneKind, TargetState};
pub use wait::WaitError;
use wait::Waiter;

/// How the replicator reaches a target's link.
pub type LinkFor = Arc<dyn Fn(&CellId) -> Option<Arc<Link>> + Send + Sync>;
/// Called when a target refused a batch, with the refuser's epoch.
pub type OnRefused = Arc<dyn Fn(&CellId, u64) + Send + Sync>;

/// Positions a request's mutations took: wait for these acknowledgements.
pub type Positions = Vec<(Arc<Target>, u64)>;

/// Policy knobs, from the node config.
#[derive(Debug, Clone, Copy)]
pub struct ReplPolicy {
    pub accept_unreachable: bool,
    pub chunk_bytes: usize,
    pub backlog_bytes_max: usize,
    pub stream_bytes_per_sec: u64,
    /// A batch not acknowledged within this is sent again (`peer_reply_timeout_ms`).
    pub io_timeout: Duration,
    /// A division child not waited for yet is waited for while more than this many bytes
    /// of live records are queued for it and it answers (`handoff_lag_bytes_max`).
    pub child_lag_bytes_max: usize,
    /// A child answers if it acknowledged something within this (`lease_ms`).
    pub child_answer_window: Duration,
}

struct Layout {
    /// The range whose mutations are replicated (this cell's master range).
    master: Option<HashRange>,
    /// Epoch of the map the layout comes from; stamped on the records produced under it.
    epoch: u64,
    targets: BTreeMap<CellId, Arc<Target>>,
    /// Removed targets whose sender may still deliver their tail: a new target for the same
    /// cell starts sending only once its predecessor's sender ended.
    retired: BTreeMap<CellId, Arc<Target>>,
}

/// The store's change sink and the master side of replication; see the module docs.
///
/// Lock order (its part of the node's, ranked in full on `Cluster`): store shard →
/// `layout` → `policy`; store shard → a target's `state`; `waiters` → a target's `state`.
/// [`ChangeSink::record`] runs under the shard lock and takes `layout`, which it releases
/// before pushing to the targets (one target's `state` at a time). Nothing here takes a
/// store lock or `layout` while holding `waiters`, `policy` or a target's `state`, and no
/// guard lives across an `.await` or a waiter's completion.
pub struct Replicator {
    /// Lock order: after the store's shard locks, see `Cluster`.
    layout: Mutex<Layout>,
    seq: AtomicU64,
    /// Lock order: before a target's state, see `Cluster`.
    waiters: Mutex<Vec<Waiter>>,
    /// Lock order: innermost (taken under `layout`), see `Cluster`.
    policy: Mutex<ReplPolicy>,
    /// Writes acknowledged although a backup was unreachable (policy `accept`).
    pub unreplicated_acks: AtomicU64,
    /// Replication payload bytes acknowledged by targets.
    pub bytes_sent: AtomicU64,
    /// Items (and their encoded bytes) snapshot streams read into their targets' lanes.
    pub stream_items: AtomicU64,
    pub stream_bytes: AtomicU64,
}

impl Replicator {
    pub fn new(policy: ReplPolicy) -> Arc<Replicator> {
        Arc::new(Replicator {
            layout: Mutex::new(Layout {
                master: None,
                epoch: 0,
                targets: BTreeMap::new(),
                retired: BTreeMap::new(),
            }),
            seq: AtomicU64::new(0),
            waiters: Mutex::new(Vec::new()),
            policy: Mutex::new(policy),
            unreplicated_acks: AtomicU64::new(0),
            bytes_sent: AtomicU64::new(0),
            stream_items: AtomicU64::new(0),
            stream_bytes: AtomicU64::new(0),
        })
    }

    fn policy(&self) -> ReplPolicy {
        *self.policy.lock()
    }

    /// The current targets.
    pub fn targets(&self) -> Vec<Arc<Target>> {
        self.layout.lock().targets.values().cloned().collect()
    }

    /// Sets the replicated range and the set of targets; new targets get a sender task on
    /// `rt` sending through `link_for`. Removed targets stop. Targets in `children` are
    /// division children: a new one is not waited for until its snapshot ends; every other
    /// target is (a child that became a backup included).
    #[allow(clippy::too_many_arguments)]
    pub fn set_layout(
        self: &Arc<Self>,
        epoch: u64,
        master: Option<HashRange>,
        targets: &[CellId],
        children: &[CellId],
        rt: &tokio::runtime::Handle,
        link_for: &LinkFor,
        on_refused: &OnRefused,
    ) {
        let mut layout = self.layout.lock();
        layout.master = master;
        layout.epoch = epoch;
        let removed: Vec<CellId> = layout
            .targets
            .keys()
            .filter(|c| !targets.contains(c))
            .cloned()
            .collect();
        layout
            .retired
            .retain(|_, t| !t.finished.load(Ordering::Acquire));
        for c in removed {
            if let Some(t) = layout.targets.remove(&c) {
                t.closed.store(true, Ordering::Release);
                t.wake.notify_one();
                layout.retired.insert(c, t);
            }
        }
        for c in targets {
            if let Some(t) = layout.targets.get(c) {
                if !children.contains(c) {
                    t.waited.store(true, Ordering::Release);
                }
                continue;
            }
            let from = self.seq.load(Ordering::Acquire);
            let t = Arc::new(Target::new(c.clone(), from, !children.contains(c)));
            layout.targets.insert(c.clone(), t.clone());
            let previous = layout.retired.remove(c);
            let sender = self
                .clone()
                .sender(t, previous, link_for.clone(), on_refused.clone());
            rt.spawn(sender);
        }
        drop(layout);
        self.check_waiters();
    }

    /// Appends a record or a marker to one of a target's lanes; returns its sequence. A live
    /// record first takes along the unacknowledged snapshot items it supersedes (see the
    /// module docs).
    fn push(&self, t: &Target, epoch: u64, entry: Entry, lane: LaneKind) -> u64 {
        let mut st = t.state.lock();
        if lane == LaneKind::Live
            && let Entry::Record(_, key) = &entry
            && st.snapshot.iter().any(|(s, _, _)| *s > st.snapshot_acked)
        {
            let key = *key;
            let st = &mut *st;
            let mut kept = VecDeque::with_capacity(st.snapshot.len());
            // The first `sent` unacknowledged items keep their wire positions: they stay.
            let mut sent = st.snapshot_wire.sent;
            for (s, e, item) in std::mem::take(&mut st.snapshot) {
                let unsent = s > st.snapshot_acked && sent == 0;
                if s > st.snapshot_acked {
                    sent = sent.saturating_sub(1);
                }
                let hit = match &item {
                    Entry::Record(_, k) => unsent && (key.is_none() || *k == key),
                    Entry::Done(_) => false,
                };
                if !hit {
                    kept.push_back((s, e, item));
                    continue;
                }
                if let Entry::Record(b, _) = &item {
                    st.snapshot_bytes -= b.len();
                    st.backlog_bytes -= b.len();
                }
                if key.is_some() {
                    // Not yet applied there: it goes just ahead of the live record.
                    self.append(st, LaneKind::Live, e, item);
                }
                // A flush: the item is dead, dropped.
            }
            st.snapshot = kept;
        }
        let seq = self.append(&mut st, lane, epoch, entry);
        drop(st);
        t.wake.notify_one();
        seq
    }

    /// Whether a division child not waited for yet falls behind the live writes while it
    /// answers: then writes wait for it (backpressure), or a write volume above what its
    /// link carries would starve the snapshot (live records go first) and the hand-off
    /// would never end. A child that does not answer (cut off, paused) is not waited for:
    /// its hand-off pauses instead, and resumes when it is back.
    fn child_lags(&self, t: &Target) -> bool {
        let policy = self.policy();
        let st = t.state.lock();
        let live_bytes = st.backlog_bytes - st.snapshot_bytes;
        live_bytes > policy.child_lag_bytes_max
            && !st.unreachable
            && st.last_ack.elapsed() < policy.child_answer_window
    }

    /// Appends to a lane under the target's lock: sequences are taken under it, so each
    /// lane's grow in order.
    fn append(&self, st: &mut TargetState, lane: LaneKind, epoch: u64, entry: Entry) -> u64 {
        let seq = self.seq.fetch_add(1, Ordering::AcqRel) + 1;
        let mut entry = entry;
        if let Entry::Record(b, _) = &mut entry {
            // One record per entry, encoded before its place in this lane was known.
            set_record_seq(b, seq);
            st.backlog_bytes += b.len();
            if lane == LaneKind::Snapshot {
                st.snapshot_bytes += b.len();
            }
        }
        match lane {
            LaneKind::Live => st.backlog.push_back((seq, epoch, entry)),
            LaneKind::Snapshot => st.snapshot.push_back((seq, epoch, entry)),
        }
        seq
    }

    /// A backlog above the bound is dropped: its waiters fail and the driver resyncs the
    /// target with a fresh snapshot of the range.
    fn trim_backlog(&self, t: &Target) {
        let max = self.policy().backlog_bytes_max;
        let mut st = t.state.lock();
        if st.backlog_bytes > max {
            tracing::warn!(to = %t.to, bytes = st.backlog_bytes, "replication backlog over its bound: dropped, target needs a resync");
            st.rejected_upto = self.seq.load(Ordering::Acquire);
            st.acked = st.rejected_upto;
            st.snapshot_rejected_upto = st.rejected_upto;
            st.snapshot_acked = st.rejected_upto;
            st.backlog.clear();
            st.snapshot.clear();
            st.backlog_bytes = 0;
            st.snapshot_bytes = 0;
            st.dropped();
            st.waiting_since = None;
            t.needs_resync.store(true, Ordering::Release);
            drop(st);
            self.check_waiters();
        }
    }
}

pub(super) fn now_secs() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| u32::try_from(d.as_secs()).unwrap_or(u32::MAX))
        .max(1)
}

impl ChangeSink for Replicator {
    fn record(&self, change: &Change<'_>) {
        with_capture(|v| v.mutated = true);
        let layout = self.layout.lock();
        let op = match change.kind {
            ChangeKind::Put {
                key,
                value,
                flags,
                expiry,
                cas,
                stale,
            } => ReplicationOp::Set {
                key,
                value,
                flags,
                expiry_unix_secs: u64::from(expiry.as_unix_secs()),
                cas,
                stale,
            },
            ChangeKind::Delete { key } => ReplicationOp::Delete { key },
            ChangeKind::Touch { key, expiry } => ReplicationOp::Touch {
                key,
                expiry_unix_secs: u64::from(expiry.as_unix_secs()),
            },
            ChangeKind::Flush { range } => {
                // A flush of (part of) the master range, now: replicated as a flush of
                // exactly that part. A backup applying a flush reports one of a range it
                // does not master, which goes nowhere.
                let Some(master) = layout.master else { return };
                let parts = if range.is_full() {
                    vec![master]
                } else {
                    range.intersect(&master)
                };
                drop(layout);
                for part in parts {
                    self.push_flush(part, 0);
                }
                return;
            }
        };
        let hash = op.key().map(cellcache_store::key_hash);
        let Some(master) = layout.master.filter(|m| hash.is_none_or(|h| m.contains(h))) else {
            // Replicas applying records have no capture; a client's write does.
            if hash.is_some() {
                with_capture(|v| v.stray = true);
            }
            return;
        };
        if layout.targets.is_empty() {
            return;
        }
        let epoch = layout.epoch;
        let Ok(records) = encode_op(master, op, self.policy().chunk_bytes) else {
            return;
        };
        let targets: Vec<Arc<Target>> = layout.targets.values().cloned().collect();
        drop(layout);
        self.push_to(&targets, epoch, &records, hash);
    }
}

impl Replicator {
    /// Queues `records` (the parts of one change of the key hashing to `hash`) on every
    /// target's live lane and records, for the calling request, the positions it waits for.
    fn push_to(&self, targets: &[Arc<Target>], epoch: u64, records: &[Vec<u8>], hash: Option<u64>) {
        let mut positions = Vec::with_capacity(targets.len());
        for t in targets {
            // A write is replicated once its last part is acknowledged.
            let mut last = 0;
            for b in records {
                let entry = Entry::Record(b.clone(), hash);
                last = self.push(t, epoch, entry, LaneKind::Live);
            }
            if t.waited.load(Ordering::Acquire) || self.child_lags(t) {
                positions.push((t.clone(), last));
            }
        }
        with_capture(|v| v.positions.extend(positions));
    }

    /// Replicates a flush of `range` (part of the master range): now when `at_unix_secs` is
    /// 0, else the promise of one at that second (see `flush`).
    pub fn push_flush(&self, range: HashRange, at_unix_secs: u32) {
        let layout = self.layout.lock();
        if layout.targets.is_empty() || layout.master.is_none_or(|m| !m.covers(&range)) {
            return;
        }
        let epoch = layout.epoch;
        let op = ReplicationOp::Flush {
            at_unix_secs: u64::from(at_unix_secs),
        };
        let Ok(records) = encode_op(range, op, self.policy().chunk_bytes) else {
            return;
        };
        let targets: Vec<Arc<Target>> = layout.targets.values().cloned().collect();
        drop(layout);
        self.push_to(&targets, epoch, &records, None);
    }
}

#[cfg(test)]
mod tests;
