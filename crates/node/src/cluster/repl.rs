//! Replication (SPEC C5) and range streaming (hand-off, re-replication), master side.
//!
//! The store reports every mutation to [`Replicator::record`] under the lock of the shard
//! that applied it. Mutations of keys in this cell's master range are encoded once as
//! full-state [`ReplicationRecord`]s and appended to the backlog of every target (the
//! backups in the installed map, plus a division child during a hand-off). Because the
//! append happens under the shard lock, the backlog order of any one key is the order the
//! store applied its mutations; a target's single sender task sends the backlog in order
//! over the target's link, one batch in flight at a time, and trims it when acknowledged.
//! Sequence numbers come from one cell-wide counter, so they only grow within a target's
//! stream, even across target changes, and the receiver skips anything at or below what it
//! has applied (records are full state: applying one twice is harmless).
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
//! thus waits for at most one snapshot chunk in flight instead of the whole queue
//! (issues 6 and 7). Each lane's sequence numbers grow (they are taken under the target's
//! lock), and the receiver keeps one applied watermark per lane.
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
//! `k` is queued, every snapshot item of `k` still unacknowledged is moved (re-sequenced)
//! into the live lane just ahead of it: the receiver applies old copy, then the change, in
//! store order. Moving rather than dropping keeps `touch` right (its record carries only the
//! expiry, not the item). A live `flush_all` drops every snapshot item queued before it
//! instead (they are all dead). Items are matched by key hash: a collision only moves an
//! unrelated item earlier in the live lane, still after any live record of its own key.
//! Snapshot items scanned after a live record hold a state at least as new, and go after it
//! (live first). A snapshot batch already in flight when a live record of one of its keys
//! is queued finishes (acknowledged, or failed and moved) before the live lane is sent: one
//! batch is in flight per target.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cellcache_cluster::wire::FrameKind;
use cellcache_cluster::wire::payload::{
    ItemState, RangeSeq, ReplicationOp, ReplicationRecord, encode_item, encode_op,
};
use cellcache_cluster::{CellId, HashRange};
use cellcache_store::{Change, ChangeKind, ChangeSink, ScanCursor, Store};
use parking_lot::Mutex;

use super::link::{Link, LinkError};

/// Offset of `seq` in an encoded record (see `wire::payload`).
const SEQ_OFFSET: usize = 17;

/// One entry of a target's backlog.
enum Entry {
    /// One encoded record, with its key's hash (`None` for a flush).
    Record(Vec<u8>, Option<u64>),
    /// End of a snapshot of `range`.
    Done(HashRange),
}

/// (sequence, map epoch the entry was produced under, entry).
type Lane = VecDeque<(u64, u64, Entry)>;

/// Which lane a batch came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LaneKind {
    Live,
    Snapshot,
}

struct TargetState {
    /// Live records: the lane sent first.
    backlog: Lane,
    /// Snapshot items and `SnapshotDone` markers: sent when no live record is pending.
    snapshot: Lane,
    /// Bytes of records in both lanes.
    backlog_bytes: usize,
    /// Bytes of records in the snapshot lane.
    snapshot_bytes: usize,
    /// Highest live sequence the target acknowledged.
    acked: u64,
    /// Highest snapshot-lane sequence the target acknowledged.
    snapshot_acked: u64,
    /// Live entries up to this sequence were refused for good (the target serves their keys
    /// under a newer map): their writes are not confirmed.
    rejected_upto: u64,
    /// The same for the snapshot lane (the stream failed).
    snapshot_rejected_upto: u64,
    /// The last attempt to reach the target failed (policy `no_backup` applies).
    unreachable: bool,
    /// When the target last acknowledged a batch (or was created).
    last_ack: Instant,
    /// The lane of the last batch sent (for [`next_batch`]'s turns).
    last_lane: LaneKind,
}

/// A cell receiving this cell's replication stream.
pub struct Target {
    pub to: CellId,
    state: Mutex<TargetState>,
    wake: tokio::sync::Notify,
    closed: AtomicBool,
    /// Its backlog overflowed and was dropped: it needs a fresh snapshot of the range.
    needs_resync: AtomicBool,
    /// Sync writes wait for its acknowledgement. A backup's always are; a division child's
    /// only from the end of its snapshot (see [`Replicator::stream`]).
    waited: AtomicBool,
}

impl Target {
    /// A target whose stream starts after sequence `from`; sync writes wait for it if
    /// `waited`.
    fn new(to: CellId, from: u64, waited: bool) -> Target {
        Target {
            to,
            state: Mutex::new(TargetState {
                backlog: VecDeque::new(),
                snapshot: VecDeque::new(),
                backlog_bytes: 0,
                snapshot_bytes: 0,
                acked: from,
                snapshot_acked: from,
                rejected_upto: 0,
                snapshot_rejected_upto: 0,
                unreachable: false,
                last_ack: Instant::now(),
                last_lane: LaneKind::Live,
            }),
            wake: tokio::sync::Notify::new(),
            closed: AtomicBool::new(false),
            needs_resync: AtomicBool::new(false),
            waited: AtomicBool::new(waited),
        }
    }

    /// Whether the target lost records and must be resynced (clears the flag).
    pub fn take_needs_resync(&self) -> bool {
        self.needs_resync.swap(false, Ordering::AcqRel)
    }
}

/// How the replicator reaches a target's link.
pub type LinkFor = Arc<dyn Fn(&CellId) -> Option<Arc<Link>> + Send + Sync>;
/// Called when a target refused a batch, with the refuser's epoch.
pub type OnRefused = Arc<dyn Fn(&CellId, u64) + Send + Sync>;

/// Positions a request's mutations took: wait for these acknowledgements.
pub type Positions = Vec<(Arc<Target>, u64)>;

/// What a request's mutations produced: backlog positions to wait for, and whether one of
/// them fell outside this cell's master range (the map moved between routing and
/// execution: the write is not replicated and must not be acknowledged).
#[derive(Default)]
pub struct Captured {
    pub positions: Positions,
    pub stray: bool,
    /// The request changed the store (whether or not the change is replicated).
    pub mutated: bool,
}

thread_local! {
    static CAPTURE: RefCell<Option<Captured>> = const { RefCell::new(None) };
}

/// Runs `f` recording the backlog positions of the mutations it makes.
pub fn capture<R>(f: impl FnOnce() -> R) -> (R, Captured) {
    CAPTURE.with(|c| *c.borrow_mut() = Some(Captured::default()));
    let r = f();
    let captured = CAPTURE.with(|c| c.borrow_mut().take()).unwrap_or_default();
    (r, captured)
}

struct Waiter {
    positions: Positions,
    deadline: Instant,
    done: Box<dyn FnOnce(Result<(), WaitError>) + Send>,
}

/// Why a write's replication could not be confirmed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitError {
    /// A backup is unreachable (policy `refuse`).
    Unreachable,
    /// No acknowledgement within the request timeout.
    Timeout,
}

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
}

/// The store's change sink and the master side of replication; see the module docs.
pub struct Replicator {
    layout: Mutex<Layout>,
    seq: AtomicU64,
    waiters: Mutex<Vec<Waiter>>,
    policy: Mutex<ReplPolicy>,
    /// Writes acknowledged although a backup was unreachable (policy `accept`).
    pub unreplicated_acks: AtomicU64,
    /// Replication payload bytes acknowledged by targets.
    pub bytes_sent: AtomicU64,
}

impl Replicator {
    pub fn new(policy: ReplPolicy) -> Arc<Replicator> {
        Arc::new(Replicator {
            layout: Mutex::new(Layout {
                master: None,
                epoch: 0,
                targets: BTreeMap::new(),
            }),
            seq: AtomicU64::new(0),
            waiters: Mutex::new(Vec::new()),
            policy: Mutex::new(policy),
            unreplicated_acks: AtomicU64::new(0),
            bytes_sent: AtomicU64::new(0),
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
        for c in removed {
            if let Some(t) = layout.targets.remove(&c) {
                t.closed.store(true, Ordering::Release);
                t.wake.notify_one();
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
            rt.spawn(self.clone().sender(t, link_for.clone(), on_refused.clone()));
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
            for (s, e, item) in std::mem::take(&mut st.snapshot) {
                let hit = match &item {
                    Entry::Record(_, k) => s > st.snapshot_acked && (key.is_none() || *k == key),
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
            // One record per entry: its `seq` field sits after op (1) and range (16).
            if let Some(field) = b.get_mut(SEQ_OFFSET..SEQ_OFFSET + 8) {
                field.copy_from_slice(&seq.to_le_bytes());
            }
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

    /// Holds `done` until every position is acknowledged (or fails it, see [`WaitError`]).
    pub fn wait(
        &self,
        positions: Positions,
        timeout: Duration,
        done: Box<dyn FnOnce(Result<(), WaitError>) + Send>,
    ) {
        self.waiters.lock().push(Waiter {
            positions,
            deadline: Instant::now() + timeout,
            done,
        });
        self.check_waiters();
    }

    /// Completes the waiters whose positions are acknowledged, fails the expired or
    /// unreachable ones.
    pub fn check_waiters(&self) {
        let accept = self.policy().accept_unreachable;
        let now = Instant::now();
        let mut finished = Vec::new();
        {
            let mut waiters = self.waiters.lock();
            let mut i = 0;
            while i < waiters.len() {
                let w = &waiters[i];
                let mut outcome = Some(Ok(()));
                let mut unreplicated = false;
                for (t, seq) in &w.positions {
                    let st = t.state.lock();
                    if *seq <= st.rejected_upto {
                        outcome = Some(Err(WaitError::Unreachable));
                        break;
                    }
                    if st.acked >= *seq {
                        continue;
                    }
                    if st.unreachable {
                        if accept {
                            unreplicated = true;
                            continue;
                        }
                        outcome = Some(Err(WaitError::Unreachable));
                        break;
                    }
                    outcome = if now >= w.deadline {
                        Some(Err(WaitError::Timeout))
                    } else {
                        None
                    };
                    break;
                }
                if let Some(o) = outcome {
                    if unreplicated && o.is_ok() {
                        self.unreplicated_acks.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!("write acknowledged without an unreachable backup");
                    }
                    let w = waiters.swap_remove(i);
                    finished.push((w.done, o));
                } else {
                    i += 1;
                }
            }
        }
        for (done, o) in finished {
            done(o);
        }
    }

    /// One target's sender: sends the backlog in order, one batch in flight.
    async fn sender(self: Arc<Self>, t: Arc<Target>, link_for: LinkFor, on_refused: OnRefused) {
        let mut backoff = Duration::from_millis(10);
        loop {
            if t.closed.load(Ordering::Acquire) {
                // A removed target still gets what was produced for it (a departing
                // master's tail); it stops once that is delivered, refused or unreachable.
                let st = t.state.lock();
                if !has_pending(&st) || st.unreachable {
                    return;
                }
            }
            let chunk = self.policy().chunk_bytes;
            let alternate = !t.waited.load(Ordering::Acquire);
            let batch = {
                let mut st = t.state.lock();
                let batch = next_batch(&st, chunk, alternate);
                if let Some(b) = &batch {
                    st.last_lane = b.lane;
                }
                batch
            };
            let Some(Batch {
                kind,
                payload,
                last,
                epoch: batch_epoch,
                lane,
            }) = batch
            else {
                let _ = tokio::time::timeout(Duration::from_millis(100), t.wake.notified()).await;
                continue;
            };
            let Some(link) = link_for(&t.to) else {
                t.state.lock().unreachable = true;
                self.check_waiters();
                tokio::time::sleep(backoff).await;
                continue;
            };
            let records = payload.len();
            let call = link.call_at(kind, Some(batch_epoch), payload);
            let io_timeout = self.policy().io_timeout;
            let reply = tokio::time::timeout(io_timeout, call)
                .await
                .unwrap_or(Err(LinkError::Lost));
            match reply {
                Ok(f) if f.kind == FrameKind::ReplicateAck => {
                    let acked = RangeSeq::decode(&f.payload).map_or(last, |a| a.seq.min(last));
                    self.bytes_sent.fetch_add(records as u64, Ordering::Relaxed);
                    let mut st = t.state.lock();
                    st.unreachable = false;
                    st.last_ack = Instant::now();
                    match lane {
                        LaneKind::Live => st.acked = st.acked.max(acked),
                        LaneKind::Snapshot => st.snapshot_acked = st.snapshot_acked.max(acked),
                    }
                    trim_acked(&mut st);
                    drop(st);
                    backoff = Duration::from_millis(10);
                    self.check_waiters();
                }
                Ok(f) if f.epoch > batch_epoch && self.layout.lock().epoch > batch_epoch => {
                    // Fenced: the target serves these keys under a newer map, so writes made
                    // under the old one are not confirmed (their clients get SERVER_ERROR).
                    tracing::debug!(to = %t.to, epoch = f.epoch, batch_epoch, reason = %String::from_utf8_lossy(&f.payload), "replication refused for good");
                    let mut st = t.state.lock();
                    match lane {
                        LaneKind::Live => {
                            st.rejected_upto = st.rejected_upto.max(last);
                            st.acked = st.acked.max(last);
                        }
                        LaneKind::Snapshot => {
                            st.snapshot_rejected_upto = st.snapshot_rejected_upto.max(last);
                            st.snapshot_acked = st.snapshot_acked.max(last);
                        }
                    }
                    trim_acked(&mut st);
                    drop(st);
                    self.check_waiters();
                }
                Ok(f) => {
                    // Refused by a target with another map: refresh ours, retry.
                    tracing::debug!(to = %t.to, epoch = f.epoch, reason = %String::from_utf8_lossy(&f.payload), "replication refused");
                    on_refused(&t.to, f.epoch);
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_millis(200));
                }
                Err(e) => {
                    if matches!(e, LinkError::Unreachable(..)) {
                        t.state.lock().unreachable = true;
                        self.check_waiters();
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_millis(200));
                }
            }
            self.trim_backlog(&t);
        }
    }

    /// Whether every target acknowledged everything queued for it (a departing master's
    /// tail is delivered), waiting at most `timeout`.
    pub async fn drained(&self, timeout: Duration) -> bool {
        let targets: Vec<(Arc<Target>, u64)> = self
            .layout
            .lock()
            .targets
            .values()
            .map(|t| (t.clone(), self.seq.load(Ordering::Acquire)))
            .collect();
        let deadline = Instant::now() + timeout;
        loop {
            let pending = targets.iter().any(|(t, upto)| {
                let st = t.state.lock();
                !st.unreachable
                    && (st
                        .backlog
                        .iter()
                        .any(|(s, _, _)| *s <= *upto && *s > st.acked)
                        || st
                            .snapshot
                            .iter()
                            .any(|(s, _, _)| *s <= *upto && *s > st.snapshot_acked))
            });
            if !pending {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
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
            t.needs_resync.store(true, Ordering::Release);
            drop(st);
            self.check_waiters();
        }
    }

    /// Streams a snapshot of `range` into `to`'s snapshot lane (`to` must be a target), then
    /// a `SnapshotDone`; resolves when `to` acknowledged it. Throttled by the policy (the
    /// throttle applies to the snapshot only: live records never wait for it).
    pub async fn stream(&self, store: &Store, to: &CellId, range: HashRange) -> bool {
        let Some((t, epoch)) = ({
            let layout = self.layout.lock();
            layout.targets.get(to).cloned().map(|t| (t, layout.epoch))
        }) else {
            return false;
        };
        let policy = self.policy();
        let store_range = cellcache_store::HashRange::new(range.start, range.end);
        let mut cursor = Some(ScanCursor::START);
        let started = Instant::now();
        let mut bytes_total: u64 = 0;
        while let Some(c) = cursor {
            if t.closed.load(Ordering::Acquire) {
                return false;
            }
            let now = now_secs();
            let mut bytes = 0usize;
            cursor = store.scan_range(store_range, now, c, |item| {
                let state = ItemState {
                    key: item.key,
                    value: item.value,
                    flags: item.flags,
                    expiry_unix_secs: u64::from(item.expiry.as_unix_secs()),
                    cas: item.cas,
                    stale: item.stale,
                };
                let Ok(records) = encode_item(range, &state, policy.chunk_bytes) else {
                    return;
                };
                let hash = cellcache_store::key_hash(item.key);
                for b in records {
                    bytes += b.len();
                    self.push(&t, epoch, Entry::Record(b, Some(hash)), LaneKind::Snapshot);
                }
            });
            bytes_total += bytes as u64;
            // Backpressure: let the target drain before reading more.
            while t.state.lock().snapshot_bytes > policy.chunk_bytes * 8 {
                if t.closed.load(Ordering::Acquire) {
                    return false;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            if policy.stream_bytes_per_sec > 0 {
                let due = Duration::from_secs_f64(
                    bytes_total as f64 / policy.stream_bytes_per_sec as f64,
                );
                if let Some(wait) = due.checked_sub(started.elapsed())
                    && !sleep_unless_closed(&t, wait).await
                {
                    return false;
                }
            }
        }
        // From here on writes wait for the target (a division child until now was not): every
        // write recorded before this is in the live lane ahead of the marker, which is sent
        // only once they are all acknowledged; every later one is waited for. So when the
        // marker is acknowledged, each write either reached the target or its client waits.
        t.waited.store(true, Ordering::Release);
        let marker = self.push(&t, epoch, Entry::Done(range), LaneKind::Snapshot);
        loop {
            if t.closed.load(Ordering::Acquire) {
                return false;
            }
            let (acked, rejected) = {
                let st = t.state.lock();
                (st.snapshot_acked, st.snapshot_rejected_upto)
            };
            if marker <= rejected {
                return false; // dropped with an overflowing backlog: not delivered
            }
            if acked >= marker {
                return true;
            }
            let _ = tokio::time::timeout(Duration::from_millis(20), t.wake.notified()).await;
        }
    }
}

/// How often a throttled stream checks, while it waits, whether its target was closed.
const CLOSED_POLL: Duration = Duration::from_millis(20);

/// Sleeps `wait`, or less if `t` is closed meanwhile (then returns false): a throttled stream
/// to a target gone from the map ends with it instead of after its throttle's next pause
/// (the fault tests saw one linger 1.6-2.3 s).
async fn sleep_unless_closed(t: &Target, wait: Duration) -> bool {
    let until = Instant::now() + wait;
    loop {
        if t.closed.load(Ordering::Acquire) {
            return false;
        }
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return true;
        }
        tokio::time::sleep(left.min(CLOSED_POLL)).await;
    }
}

fn trim_acked(st: &mut TargetState) {
    while st.backlog.front().is_some_and(|(s, _, _)| *s <= st.acked) {
        if let Some((_, _, Entry::Record(b, _))) = st.backlog.pop_front() {
            st.backlog_bytes -= b.len();
        }
    }
    while st
        .snapshot
        .front()
        .is_some_and(|(s, _, _)| *s <= st.snapshot_acked)
    {
        if let Some((_, _, Entry::Record(b, _))) = st.snapshot.pop_front() {
            st.backlog_bytes -= b.len();
            st.snapshot_bytes -= b.len();
        }
    }
}

/// Whether a target has anything unacknowledged in either lane.
fn has_pending(st: &TargetState) -> bool {
    st.backlog.iter().any(|(s, _, _)| *s > st.acked)
        || st.snapshot.iter().any(|(s, _, _)| *s > st.snapshot_acked)
}

/// One frame's worth of a lane.
struct Batch {
    kind: FrameKind,
    payload: Vec<u8>,
    /// Sequence of its last entry.
    last: u64,
    epoch: u64,
    lane: LaneKind,
}

/// The next batch for a target: the pending live records if any (consecutive, one epoch,
/// up to `chunk` bytes), else the snapshot lane's next records or its `SnapshotDone`
/// marker. The marker is reached only when no live record is pending, so every live record
/// queued before it has been acknowledged.
///
/// With `alternate` (a division child still taking its snapshot, which no write waits for)
/// the snapshot lane gets every other turn while both have records, so a steady stream of
/// writes cannot starve the snapshot. On its turn it sends only entries older than the
/// oldest pending live record: a snapshot item left in the lane with a smaller sequence
/// has no pending live record of its key after it (that record would have taken it along),
/// so it may go first, while an item scanned after a pending live record of its key must
/// follow it. The marker obeys the same bound, so every live record queued before it is
/// acknowledged first.
fn next_batch(st: &TargetState, chunk: usize, alternate: bool) -> Option<Batch> {
    let live_pending = st
        .backlog
        .iter()
        .map(|(s, _, _)| *s)
        .find(|s| *s > st.acked);
    let order = if alternate && st.last_lane == LaneKind::Live {
        [LaneKind::Snapshot, LaneKind::Live]
    } else {
        [LaneKind::Live, LaneKind::Snapshot]
    };
    for lane in order {
        let (entries, acked, below) = match lane {
            LaneKind::Live => (&st.backlog, st.acked, u64::MAX),
            LaneKind::Snapshot => (
                &st.snapshot,
                st.snapshot_acked,
                live_pending.unwrap_or(u64::MAX),
            ),
        };
        let mut payload = Vec::new();
        let mut last = 0;
        let mut batch_epoch = None;
        for (seq, epoch, e) in entries.iter() {
            if *seq <= acked {
                continue;
            }
            if *seq >= below || batch_epoch.is_some_and(|b| b != *epoch) {
                break;
            }
            match e {
                Entry::Record(b, _) => {
                    if !payload.is_empty() && payload.len() + b.len() > chunk {
                        break;
                    }
                    batch_epoch = Some(*epoch);
                    payload.extend_from_slice(b);
                    last = *seq;
                }
                Entry::Done(range) => {
                    if payload.is_empty() {
                        let mut p = Vec::new();
                        RangeSeq {
                            range: *range,
                            seq: *seq,
                        }
                        .encode(&mut p);
                        return Some(Batch {
                            kind: FrameKind::SnapshotDone,
                            payload: p,
                            last: *seq,
                            epoch: *epoch,
                            lane,
                        });
                    }
                    break;
                }
            }
        }
        if !payload.is_empty() {
            let kind = match lane {
                LaneKind::Live => FrameKind::Replicate,
                LaneKind::Snapshot => FrameKind::SnapshotChunk,
            };
            return Some(Batch {
                kind,
                payload,
                last,
                epoch: batch_epoch.unwrap_or(0),
                lane,
            });
        }
    }
    None
}

fn now_secs() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| u32::try_from(d.as_secs()).unwrap_or(u32::MAX))
        .max(1)
}

/// Runs `f` on the calling thread's capture, if a request installed one.
fn with_capture(f: impl FnOnce(&mut Captured)) {
    CAPTURE.with(|c| {
        if let Some(v) = c.borrow_mut().as_mut() {
            f(v);
        }
    });
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
                let flushed = super::flush::ring_range(range);
                let parts = if flushed.is_full() {
                    vec![master]
                } else {
                    flushed.intersect(&master)
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

/// What every part of one value repeats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PartMeta {
    flags: u32,
    expiry_unix_secs: u64,
    cas: u64,
    stale: bool,
    total_len: usize,
}

/// A value being rebuilt from its parts.
struct Partial {
    meta: PartMeta,
    value: Vec<u8>,
}

/// The values one sender has sent part of (see the module docs), keyed by item key. Kept
/// per sender, not per connection or lane: a resent or moved part continues the value.
#[derive(Default)]
pub struct Assembly {
    items: HashMap<Vec<u8>, Partial>,
    bytes: usize,
}

impl Assembly {
    /// Values under construction.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether no value is under construction.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    fn forget(&mut self, key: &[u8]) {
        if let Some(p) = self.items.remove(key) {
            self.bytes -= p.value.len();
        }
    }

    fn clear(&mut self) {
        self.items.clear();
        self.bytes = 0;
    }

    /// Adds one part; returns the whole item once its last part is in. Parts come in order,
    /// possibly repeated (a part resent after a lost acknowledgement, or moved ahead of a
    /// live record while its first copy was in flight): a repeat is ignored, a part that
    /// starts a value replaces any older partial copy, and one that fits nowhere (never sent
    /// by a correct master) drops the partial copy, with a warning. At most `bytes_max`
    /// bytes are held; beyond that the largest partial copy is dropped.
    fn add(
        &mut self,
        key: &[u8],
        meta: PartMeta,
        offset: usize,
        part: &[u8],
        bytes_max: usize,
    ) -> Option<Partial> {
        if offset == 0 {
            self.forget(key);
            let value = Vec::with_capacity(meta.total_len);
            self.items.insert(key.to_vec(), Partial { meta, value });
        }
        let Some(p) = self.items.get_mut(key) else {
            tracing::warn!(offset, "value part without its beginning: not stored");
            return None;
        };
        if p.meta != meta {
            tracing::warn!(
                offset,
                "value part of another version: partial copy dropped"
            );
            self.forget(key);
            return None;
        }
        if offset + part.len() <= p.value.len() && offset != 0 {
            return None; // a repeat
        }
        if offset != p.value.len() {
            tracing::warn!(
                offset,
                have = p.value.len(),
                "value part out of order: partial copy dropped"
            );
            self.forget(key);
            return None;
        }
        p.value.extend_from_slice(part);
        self.bytes += part.len();
        if p.value.len() == meta.total_len {
            let done = self.items.remove(key);
            self.bytes -= meta.total_len;
            return done;
        }
        while self.bytes > bytes_max {
            let Some(biggest) = self
                .items
                .iter()
                .max_by_key(|(_, p)| p.value.len())
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            tracing::warn!(
                bytes = self.bytes,
                "values in parts over their bound: the largest dropped"
            );
            self.forget(&biggest);
        }
        None
    }
}

/// Applies a `Replicate` or `SnapshotChunk` payload to the backup's store, advancing
/// `applied` (records at or below it are skipped), rebuilding values sent in parts in
/// `parts` (at most `parts_bytes_max` bytes held) and leaving out keys `keep` refuses.
/// A flush record is handed to `flush` with its range and second (0: now). Returns how
/// many values it rebuilt from parts.
#[allow(clippy::too_many_arguments)]
pub fn apply_records(
    store: &Store,
    payload: &[u8],
    applied: &mut u64,
    parts: &mut Assembly,
    parts_bytes_max: usize,
    now: u32,
    keep: impl Fn(u64) -> bool,
    mut flush: impl FnMut(HashRange, u32),
) -> Result<u64, String> {
    use cellcache_store::{Expiry, OwnedItem};
    let mut rebuilt = 0;
    for rec in ReplicationRecord::decode_all(payload) {
        let rec = rec.map_err(|e| e.to_string())?;
        if rec.seq <= *applied {
            continue;
        }
        *applied = rec.seq;
        let key = rec.op.key();
        if key.is_some_and(|k| !keep(cellcache_store::key_hash(k))) {
            continue; // not a key this cell holds a copy of (any more)
        }
        match (key, &rec.op) {
            (_, ReplicationOp::SetPart { .. }) => {}
            // Any other change supersedes a value still arriving in parts.
            (Some(k), _) => parts.forget(k),
            (None, _) => parts.clear(),
        }
        let expiry = |s: u64| Expiry::at(u32::try_from(s).unwrap_or(u32::MAX));
        let outcome = match rec.op {
            ReplicationOp::SetPart {
                key,
                flags,
                expiry_unix_secs,
                cas,
                stale,
                total_len,
                offset,
                part,
            } => {
                let meta = PartMeta {
                    flags,
                    expiry_unix_secs,
                    cas,
                    stale,
                    total_len: total_len as usize,
                };
                let whole = parts.add(key, meta, offset as usize, part, parts_bytes_max);
                let Some(p) = whole else { continue };
                rebuilt += 1;
                store.insert_item(
                    &OwnedItem {
                        key: key.to_vec(),
                        value: p.value,
                        flags: p.meta.flags,
                        expiry: expiry(p.meta.expiry_unix_secs),
                        cas: p.meta.cas,
                        stale: p.meta.stale,
                    },
                    now,
                )
            }
            ReplicationOp::Set {
                key,
                value,
                flags,
                expiry_unix_secs,
                cas,
                stale,
            } => store.insert_item(
                &OwnedItem {
                    key: key.to_vec(),
                    value: value.to_vec(),
                    flags,
                    expiry: expiry(expiry_unix_secs),
                    cas,
                    stale,
                },
                now,
            ),
            ReplicationOp::Delete { key } => store.apply_change(&ChangeKind::Delete { key }, now),
            ReplicationOp::Touch {
                key,
                expiry_unix_secs,
            } => store.apply_change(
                &ChangeKind::Touch {
                    key,
                    expiry: expiry(expiry_unix_secs),
                },
                now,
            ),
            ReplicationOp::Flush { at_unix_secs } => {
                flush(rec.range, u32::try_from(at_unix_secs).unwrap_or(u32::MAX));
                Ok(())
            }
        };
        if let Err(e) = outcome {
            // A backup out of memory keeps going: it is a cache, and the master's copy is
            // authoritative; the item is simply missing here.
            tracing::debug!(error = %e, "replicated record not stored");
        }
    }
    Ok(rebuilt)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replicator() -> Arc<Replicator> {
        Replicator::new(ReplPolicy {
            accept_unreachable: false,
            chunk_bytes: 1024,
            backlog_bytes_max: 1 << 20,
            stream_bytes_per_sec: 0,
            io_timeout: Duration::from_secs(1),
            child_lag_bytes_max: 4096,
            child_answer_window: Duration::from_secs(3600),
        })
    }

    fn encode(op: ReplicationOp<'_>) -> Vec<u8> {
        let mut b = Vec::new();
        ReplicationRecord {
            range: HashRange::FULL,
            seq: 0,
            op,
        }
        .encode(&mut b)
        .expect("encodes");
        b
    }

    fn set(key: &str, value: &str) -> Entry {
        Entry::Record(
            encode(ReplicationOp::Set {
                key: key.as_bytes(),
                value: value.as_bytes(),
                flags: 0,
                expiry_unix_secs: 0,
                cas: 1,
                stale: false,
            }),
            Some(cellcache_store::key_hash(key.as_bytes())),
        )
    }

    fn touch(key: &str) -> Entry {
        Entry::Record(
            encode(ReplicationOp::Touch {
                key: key.as_bytes(),
                expiry_unix_secs: 7,
            }),
            Some(cellcache_store::key_hash(key.as_bytes())),
        )
    }

    /// (seq, op name, key, value) of each record of a batch.
    fn records(b: &Batch) -> Vec<(u64, &'static str, String, String)> {
        ReplicationRecord::decode_all(&b.payload)
            .map(|r| {
                let r = r.expect("decodes");
                let s = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
                match r.op {
                    ReplicationOp::Set { key, value, .. } => (r.seq, "set", s(key), s(value)),
                    ReplicationOp::Touch { key, .. } => (r.seq, "touch", s(key), String::new()),
                    ReplicationOp::Delete { key } => (r.seq, "delete", s(key), String::new()),
                    ReplicationOp::Flush { .. } => (r.seq, "flush", String::new(), String::new()),
                    ReplicationOp::SetPart { key, part, .. } => (r.seq, "part", s(key), s(part)),
                }
            })
            .collect()
    }

    /// Takes the next batch and acknowledges it, as the sender does on a `ReplicateAck`.
    fn send(t: &Target) -> Option<Batch> {
        send_turn(t, false)
    }

    /// [`send`] in `alternate` mode or not, recording the lane's turn as the sender does.
    fn send_turn(t: &Target, alternate: bool) -> Option<Batch> {
        let mut st = t.state.lock();
        let b = next_batch(&st, 1024, alternate)?;
        st.last_lane = b.lane;
        match b.lane {
            LaneKind::Live => st.acked = b.last,
            LaneKind::Snapshot => st.snapshot_acked = b.last,
        }
        trim_acked(&mut st);
        Some(b)
    }

    #[test]
    fn a_live_record_is_sent_ahead_of_queued_snapshot_chunks() {
        let r = replicator();
        let t = Target::new(CellId::whole(2), 0, true);
        let value = "v".repeat(200);
        for i in 0..40 {
            r.push(&t, 1, set(&format!("snap{i}"), &value), LaneKind::Snapshot);
        }
        r.push(&t, 1, Entry::Done(HashRange::FULL), LaneKind::Snapshot);
        let live = r.push(&t, 1, set("live", "now"), LaneKind::Live);
        let first = send(&t).expect("a batch");
        assert_eq!(first.kind, FrameKind::Replicate);
        assert_eq!(
            records(&first),
            vec![(live, "set", "live".into(), "now".into())]
        );
        // Then the snapshot, in chunks, and its marker last.
        let mut kinds = Vec::new();
        let mut keys = Vec::new();
        while let Some(b) = send(&t) {
            kinds.push(b.kind);
            if b.kind == FrameKind::SnapshotChunk {
                keys.extend(records(&b).into_iter().map(|r| r.2));
            }
        }
        assert!(kinds.len() > 2, "several chunks: {kinds:?}");
        assert_eq!(kinds.last(), Some(&FrameKind::SnapshotDone));
        assert!(
            kinds[..kinds.len() - 1]
                .iter()
                .all(|k| *k == FrameKind::SnapshotChunk)
        );
        let expected: Vec<String> = (0..40).map(|i| format!("snap{i}")).collect();
        assert_eq!(keys, expected);
        assert_eq!(t.state.lock().backlog_bytes, 0);
    }

    #[test]
    fn a_live_record_takes_the_older_snapshot_copy_of_its_key_along() {
        let r = replicator();
        let t = Target::new(CellId::whole(2), 0, true);
        r.push(&t, 1, set("a", "old-a"), LaneKind::Snapshot);
        r.push(&t, 1, set("b", "old-b"), LaneKind::Snapshot);
        r.push(&t, 1, set("c", "old-c"), LaneKind::Snapshot);
        let live = r.push(&t, 1, touch("b"), LaneKind::Live);
        // A snapshot item scanned after the live record stays in the snapshot lane.
        r.push(&t, 1, set("b", "new-b"), LaneKind::Snapshot);
        let first = send(&t).expect("the live lane");
        assert_eq!(first.kind, FrameKind::Replicate);
        let got = records(&first);
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(
            (got[0].1, got[0].2.as_str(), got[0].3.as_str()),
            ("set", "b", "old-b")
        );
        assert_eq!(
            (got[1].0, got[1].1, got[1].2.as_str()),
            (live, "touch", "b")
        );
        assert!(got[0].0 < got[1].0, "the copy is applied first: {got:?}");
        let rest = send(&t).expect("the snapshot lane");
        assert_eq!(rest.kind, FrameKind::SnapshotChunk);
        let keys: Vec<(String, String)> = records(&rest).into_iter().map(|r| (r.2, r.3)).collect();
        assert_eq!(
            keys,
            vec![
                ("a".into(), "old-a".into()),
                ("c".into(), "old-c".into()),
                ("b".into(), "new-b".into())
            ]
        );
        assert!(send(&t).is_none());
    }

    #[test]
    fn a_live_flush_drops_the_snapshot_items_queued_before_it() {
        let r = replicator();
        let t = Target::new(CellId::whole(2), 0, true);
        r.push(&t, 1, set("a", "1"), LaneKind::Snapshot);
        r.push(&t, 1, set("b", "2"), LaneKind::Snapshot);
        let flush = Entry::Record(encode(ReplicationOp::Flush { at_unix_secs: 5 }), None);
        r.push(&t, 1, flush, LaneKind::Live);
        r.push(&t, 1, set("c", "3"), LaneKind::Snapshot);
        r.push(&t, 1, Entry::Done(HashRange::FULL), LaneKind::Snapshot);
        let first = send(&t).expect("the flush");
        assert_eq!(
            records(&first).into_iter().map(|r| r.1).collect::<Vec<_>>(),
            ["flush"]
        );
        let rest = send(&t).expect("what the flush left");
        assert_eq!(
            records(&rest).into_iter().map(|r| r.2).collect::<Vec<_>>(),
            ["c"]
        );
        assert_eq!(send(&t).expect("marker").kind, FrameKind::SnapshotDone);
        assert_eq!(t.state.lock().snapshot_bytes, 0);
    }

    #[test]
    fn the_snapshot_marker_waits_for_every_earlier_live_record() {
        let r = replicator();
        let t = Target::new(CellId::whole(2), 0, true);
        r.push(&t, 1, Entry::Done(HashRange::FULL), LaneKind::Snapshot);
        let live = r.push(&t, 1, set("x", "1"), LaneKind::Live);
        // Not acknowledged yet: the next batch is still the live record, not the marker.
        let b = next_batch(&t.state.lock(), 1024, false).expect("a batch");
        assert_eq!((b.kind, b.last), (FrameKind::Replicate, live));
        let b = next_batch(&t.state.lock(), 1024, false).expect("a batch");
        assert_eq!(b.kind, FrameKind::Replicate, "resent until acknowledged");
        send(&t);
        assert_eq!(send(&t).expect("marker").kind, FrameKind::SnapshotDone);
    }

    /// `value` of `len` bytes, different per `version`.
    fn big(len: usize, version: u8) -> Vec<u8> {
        (0..len)
            .map(|i| b'a' + ((i + version as usize) % 26) as u8)
            .collect()
    }

    /// The records of one item, numbered from `first`.
    fn item_records(key: &[u8], value: &[u8], cas: u64, part: usize, first: u64) -> Vec<Vec<u8>> {
        let item = ItemState {
            key,
            value,
            flags: 0,
            expiry_unix_secs: 0,
            cas,
            stale: false,
        };
        let mut recs = encode_item(HashRange::FULL, &item, part).expect("encodes");
        for (i, r) in recs.iter_mut().enumerate() {
            r[SEQ_OFFSET..SEQ_OFFSET + 8].copy_from_slice(&(first + i as u64).to_le_bytes());
        }
        recs
    }

    fn stored(store: &Store, key: &[u8]) -> Option<(Vec<u8>, u64)> {
        store.get(key, now_secs(), |v| (v.value.to_vec(), v.cas))
    }

    #[test]
    fn values_sent_in_parts_are_rebuilt_once_their_last_part_arrives() {
        let store = Store::new(cellcache_store::StoreConfig::default()).expect("store");
        let (mut applied, mut parts) = (0, Assembly::default());
        let mut apply = |payload: &[u8], applied: &mut u64| {
            apply_records(
                &store,
                payload,
                applied,
                &mut parts,
                1 << 20,
                now_secs(),
                |_| true,
                |_, _| {},
            )
            .expect("applies")
        };
        let value = big(100_000, 0);
        let recs = item_records(b"k", &value, 7, 30_000, 1);
        assert_eq!(recs.len(), 4);
        // Parts 1-2 arrive; nothing is stored yet.
        assert_eq!(
            apply(&[recs[0].clone(), recs[1].clone()].concat(), &mut applied),
            0
        );
        assert_eq!(stored(&store, b"k"), None);
        // Another key travels between the parts.
        let other = item_records(b"other", b"small", 3, 30_000, 10);
        assert_eq!(apply(&other[0], &mut applied), 0);
        // A resent part (its acknowledgement was lost) is skipped by sequence; a moved copy
        // of an applied part (new sequence, same bytes) is a repeat and ignored.
        let moved = item_records(b"k", &value, 7, 30_000, 11);
        assert_eq!(
            apply(&[recs[1].clone(), moved[1].clone()].concat(), &mut applied),
            0
        );
        // The rest, moved into the live lane with newer sequences, completes the value.
        assert_eq!(
            apply(&[moved[2].clone(), moved[3].clone()].concat(), &mut applied),
            1
        );
        assert_eq!(stored(&store, b"k"), Some((value.clone(), 7)));
        assert_eq!(stored(&store, b"other"), Some((b"small".to_vec(), 3)));
        assert!(parts.is_empty());
    }

    /// Applies a payload that must decode, keeping every key.
    fn apply_all(
        store: &Store,
        payload: &[u8],
        applied: &mut u64,
        parts: &mut Assembly,
        parts_bytes_max: usize,
    ) -> u64 {
        apply_records(
            store,
            payload,
            applied,
            parts,
            parts_bytes_max,
            now_secs(),
            |_| true,
            |_, _| {},
        )
        .expect("applies")
    }

    #[test]
    fn a_newer_change_supersedes_a_value_still_arriving_in_parts() {
        let store = Store::new(cellcache_store::StoreConfig::default()).expect("store");
        let (mut applied, mut parts) = (0, Assembly::default());
        let old = item_records(b"k", &big(50_000, 1), 5, 20_000, 1);
        let mut payload = old[0].clone();
        // A newer whole value for the key, then a part of the old version that fits nowhere.
        payload.extend(item_records(b"k", b"new", 6, 20_000, 2).concat());
        payload.extend(
            item_records(b"k", &big(50_000, 1), 5, 20_000, 2)[1]
                .iter()
                .copied(),
        );
        let last = SEQ_OFFSET..SEQ_OFFSET + 8;
        let n = payload.len() - old[1].len();
        payload[n + last.start..n + last.end].copy_from_slice(&3u64.to_le_bytes());
        let rebuilt = apply_all(&store, &payload, &mut applied, &mut parts, 1 << 20);
        assert_eq!(rebuilt, 0);
        assert_eq!(stored(&store, b"k"), Some((b"new".to_vec(), 6)));
        assert!(parts.is_empty(), "no partial copy left behind");
        // A new version's first part replaces an older partial copy.
        let a = item_records(b"j", &big(50_000, 2), 8, 20_000, 10);
        let b = item_records(b"j", &big(50_000, 3), 9, 20_000, 11);
        let payload = [a[0].clone(), b.concat()].concat();
        let rebuilt = apply_all(&store, &payload, &mut applied, &mut parts, 1 << 20);
        assert_eq!(rebuilt, 1);
        assert_eq!(stored(&store, b"j"), Some((big(50_000, 3), 9)));
        // Partial copies beyond the bound are dropped, largest first.
        let c = item_records(b"c", &big(50_000, 4), 1, 20_000, 20);
        let d = item_records(b"d", &big(50_000, 5), 1, 20_000, 30);
        let payload = [c[0].clone(), c[1].clone(), d[0].clone()].concat();
        apply_all(&store, &payload, &mut applied, &mut parts, 50_000);
        assert_eq!(parts.len(), 1, "the larger partial copy went");
    }

    #[test]
    fn a_large_live_value_is_queued_in_parts_and_acknowledged_by_its_last() {
        let r = replicator();
        let t = Target::new(CellId::whole(2), 0, true);
        let value = big(5000, 0);
        let mut last = 0;
        for b in item_records(b"big", &value, 1, 1024, 0) {
            last = r.push(
                &t,
                1,
                Entry::Record(b, Some(cellcache_store::key_hash(b"big"))),
                LaneKind::Live,
            );
        }
        let mut rebuilt = Vec::new();
        let mut batches = 0;
        while let Some(b) = send(&t) {
            batches += 1;
            assert!(
                b.payload.len() <= 1024 + 128,
                "one part per frame: {}",
                b.payload.len()
            );
            for (_, kind, key, part) in records(&b) {
                assert_eq!((kind, key.as_str()), ("part", "big"));
                rebuilt.extend_from_slice(part.as_bytes());
            }
            if b.last == last {
                assert!(send(&t).is_none());
            }
        }
        assert_eq!(batches, 5);
        assert_eq!(rebuilt, value);
    }

    #[test]
    fn a_throttled_stream_stops_waiting_when_its_target_closes() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        let t = Arc::new(Target::new(CellId::whole(2), 0, true));
        rt.block_on(async {
            assert!(sleep_unless_closed(&t, Duration::ZERO).await);
            let closer = t.clone();
            tokio::spawn(async move {
                tokio::time::sleep(CLOSED_POLL).await;
                closer.closed.store(true, Ordering::Release);
            });
            // An hour's throttle pause: only the close can end it (the guard below fails the
            // test instead of hanging it).
            let waited = tokio::time::timeout(
                Duration::from_secs(60),
                sleep_unless_closed(&t, Duration::from_secs(3600)),
            )
            .await;
            assert_eq!(waited, Ok(false));
        });
    }

    fn send_alternating(t: &Target) -> Option<Batch> {
        send_turn(t, true)
    }

    #[test]
    fn a_child_still_taking_its_snapshot_gets_turns_without_reordering_a_key() {
        let r = replicator();
        let t = Target::new(CellId::whole(2), 0, false);
        // A write arrives first; the snapshot items scanned after it must follow it.
        let first = r.push(&t, 1, set("x", "live-1"), LaneKind::Live);
        r.push(&t, 1, set("a", "snap-a"), LaneKind::Snapshot);
        r.push(&t, 1, set("x", "snap-x"), LaneKind::Snapshot);
        let b = send_alternating(&t).expect("a batch");
        assert_eq!((b.kind, b.last), (FrameKind::Replicate, first));
        // More writes keep coming, one per turn; the snapshot still gets its turn.
        let mut order = Vec::new();
        for i in 0..3 {
            r.push(&t, 1, set(&format!("w{i}"), "v"), LaneKind::Live);
            let b = send_alternating(&t).expect("a batch");
            order.push((
                b.kind,
                records(&b).into_iter().map(|r| r.2).collect::<Vec<_>>(),
            ));
        }
        let snap = FrameKind::SnapshotChunk;
        let live = FrameKind::Replicate;
        let keys = |k: &[&str]| k.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            order,
            vec![
                (snap, keys(&["a", "x"])),
                (live, keys(&["w0", "w1"])),
                (live, keys(&["w2"])),
            ],
            "the snapshot's turn, then the live lane's (the snapshot lane is empty)"
        );
        // A snapshot item scanned after a pending live record waits for it even on the
        // snapshot's turn, and so does the marker.
        r.push(&t, 1, set("w3", "v"), LaneKind::Live);
        r.push(&t, 1, set("b", "snap-b"), LaneKind::Snapshot);
        r.push(&t, 1, Entry::Done(HashRange::FULL), LaneKind::Snapshot);
        let mut rest = Vec::new();
        while let Some(b) = send_alternating(&t) {
            let keys = if b.kind == FrameKind::SnapshotDone {
                Vec::new()
            } else {
                records(&b).into_iter().map(|r| r.2).collect()
            };
            rest.push((b.kind, keys));
        }
        assert_eq!(
            rest,
            vec![
                (live, keys(&["w3"])),
                (snap, keys(&["b"])),
                (FrameKind::SnapshotDone, vec![]),
            ]
        );
    }

    #[test]
    fn a_child_falling_behind_while_it_answers_is_waited_for() {
        let r = replicator(); // child_lag_bytes_max: 4096
        let t = Target::new(CellId::whole(2), 0, false);
        let value = "v".repeat(1000);
        for i in 0..3 {
            r.push(&t, 1, set(&format!("k{i}"), &value), LaneKind::Live);
        }
        assert!(!r.child_lags(&t), "3 kB queued: within the bound");
        for i in 3..6 {
            r.push(&t, 1, set(&format!("k{i}"), &value), LaneKind::Live);
        }
        assert!(
            r.child_lags(&t),
            "6 kB queued and the child answers: backpressure"
        );
        // Snapshot items do not count: the scan has its own bound.
        let s = Target::new(CellId::whole(3), 0, false);
        for i in 0..6 {
            r.push(&s, 1, set(&format!("k{i}"), &value), LaneKind::Snapshot);
        }
        assert!(!r.child_lags(&s));
        // A child that does not answer is not waited for: its hand-off pauses instead.
        t.state.lock().unreachable = true;
        assert!(!r.child_lags(&t));
    }
}
