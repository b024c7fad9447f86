//! A replication target: its live and snapshot lanes, and the batches cut from them.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use cellcache_cluster::wire::FrameKind;
use cellcache_cluster::wire::payload::RangeSeq;
use cellcache_cluster::{CellId, HashRange};
use parking_lot::Mutex;

/// One entry of a target's backlog.
pub(super) enum Entry {
    /// One encoded record, with its key's hash (`None` for a flush).
    Record(Vec<u8>, Option<u64>),
    /// End of a snapshot of `range`.
    Done(HashRange),
}

/// (sequence, map epoch the entry was produced under, entry).
pub(super) type Lane = VecDeque<(u64, u64, Entry)>;

/// Which lane a batch came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LaneKind {
    Live,
    Snapshot,
}

pub(super) struct TargetState {
    /// Live records: the lane sent first.
    pub(super) backlog: Lane,
    /// Snapshot items and `SnapshotDone` markers: sent when no live record is pending.
    pub(super) snapshot: Lane,
    /// Bytes of records in both lanes.
    pub(super) backlog_bytes: usize,
    /// Bytes of records in the snapshot lane.
    pub(super) snapshot_bytes: usize,
    /// Highest live sequence the target acknowledged.
    pub(super) acked: u64,
    /// Highest snapshot-lane sequence the target acknowledged.
    pub(super) snapshot_acked: u64,
    /// Live entries up to this sequence were refused for good (the target serves their keys
    /// under a newer map): their writes are not confirmed.
    pub(super) rejected_upto: u64,
    /// The same for the snapshot lane (the stream failed).
    pub(super) snapshot_rejected_upto: u64,
    /// The last attempt to reach the target failed (policy `no_backup` applies).
    pub(super) unreachable: bool,
    /// When the target last acknowledged a batch (or was created).
    pub(super) last_ack: Instant,
    /// The lane of the last batch sent (for [`next_batch`]'s turns).
    pub(super) last_lane: LaneKind,
}

/// A cell receiving this cell's replication stream.
pub struct Target {
    pub to: CellId,
    /// Lock order: taken under a store shard lock or `waiters`, takes nothing; see
    /// `Cluster`.
    pub(super) state: Mutex<TargetState>,
    pub(super) wake: tokio::sync::Notify,
    pub(super) closed: AtomicBool,
    /// Its backlog overflowed and was dropped: it needs a fresh snapshot of the range.
    pub(super) needs_resync: AtomicBool,
    /// Sync writes wait for its acknowledgement. A backup's always are; a division child's
    /// only from the end of its snapshot (see [`Replicator::stream`]).
    pub(super) waited: AtomicBool,
}

impl Target {
    /// A target whose stream starts after sequence `from`; sync writes wait for it if
    /// `waited`.
    pub(super) fn new(to: CellId, from: u64, waited: bool) -> Target {
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

pub(super) fn trim_acked(st: &mut TargetState) {
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
pub(super) fn has_pending(st: &TargetState) -> bool {
    st.backlog.iter().any(|(s, _, _)| *s > st.acked)
        || st.snapshot.iter().any(|(s, _, _)| *s > st.snapshot_acked)
}

/// One frame's worth of a lane.
pub(super) struct Batch {
    pub(super) kind: FrameKind,
    pub(super) payload: Vec<u8>,
    /// Sequence of its last entry.
    pub(super) last: u64,
    pub(super) epoch: u64,
    pub(super) lane: LaneKind,
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
pub(super) fn next_batch(st: &TargetState, chunk: usize, alternate: bool) -> Option<Batch> {
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
