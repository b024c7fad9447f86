//! A replication target: its live and snapshot lanes, the batches cut from them, and how
//! each lane is numbered on the wire.
//!
//! Sequence numbers inside a cell (the first element of a lane's entries) come from one
//! cell-wide counter: they order entries across lanes and targets, and sync writes wait for
//! them. On the wire each lane is numbered on its own, by *position*: consecutive, from the
//! position the receiver last acknowledged ([`Numbering`]), because a receiver accepts only
//! the position after its last one (or a resend at or below it) and refuses a frame that
//! jumps. A position is given to an entry when a batch carrying it is cut; the entries
//! that went out at least once keep theirs — they are never taken out of the lane (a live
//! record moves only snapshot items not sent yet) and the lane they are in is sent again
//! before the other — so a resend carries the same positions. When the receiver's position
//! is not the one expected (a gap it refused, an acknowledgement past what was sent, a
//! backlog dropped), the lane's unacknowledged entries are renumbered from the receiver's
//! position and the target is resynchronised, since records may be missing there.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use cellcache_cluster::wire::FrameKind;
use cellcache_cluster::wire::payload::{RangeSeq, set_record_seq};
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
    /// Since when records wait for the target without an acknowledgement (`None`: none
    /// wait); see [`super::progress`].
    pub(super) waiting_since: Option<Instant>,
    /// The lane of the last batch sent (for [`next_batch`]'s turns).
    pub(super) last_lane: LaneKind,
    /// How the live lane is numbered on the wire.
    pub(super) live_wire: Numbering,
    /// How the snapshot lane is numbered on the wire.
    pub(super) snapshot_wire: Numbering,
}

/// A lane's numbering on the wire (see the module docs).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Numbering {
    /// Whether the receiver's position is known: a new target asks it first, with an empty
    /// frame, since the receiver may hold a position from an earlier stream of this cell.
    pub(super) known: bool,
    /// The receiver's last position: the first unacknowledged entry goes out as the next.
    pub(super) acked: u64,
    /// How many unacknowledged entries (from the first) went out at least once.
    pub(super) sent: usize,
}

/// What an acknowledgement did to a lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Acked {
    /// The batch is applied.
    Applied,
    /// The receiver's position is known now (the answer to an empty frame).
    Positioned,
    /// The receiver is at another position than the batch ended at: something other than
    /// this target's stream moved it. The batch is not taken as applied; its entries go
    /// again, renumbered from the receiver's position, and the target needs a resync.
    Diverged,
}

impl TargetState {
    pub(super) fn numbering(&mut self, lane: LaneKind) -> &mut Numbering {
        match lane {
            LaneKind::Live => &mut self.live_wire,
            LaneKind::Snapshot => &mut self.snapshot_wire,
        }
    }

    /// `b` was cut and is about to go out: its entries keep their positions from now on.
    pub(super) fn sending(&mut self, b: &Batch) {
        self.last_lane = b.lane;
        if self.waiting_since.is_none() {
            self.waiting_since = Some(Instant::now());
        }
        if !b.probe {
            let n = self.numbering(b.lane);
            n.sent = n.sent.max(b.entries);
        }
    }

    /// The receiver acknowledged `b` at position `at`.
    pub(super) fn acknowledged(&mut self, b: &Batch, at: u64) -> Acked {
        let n = self.numbering(b.lane);
        let outcome = if b.probe {
            Acked::Positioned
        } else if at == b.last_position {
            n.sent = n.sent.saturating_sub(b.entries);
            Acked::Applied
        } else {
            n.sent = 0;
            Acked::Diverged
        };
        n.acked = at;
        n.known = true;
        if outcome == Acked::Applied {
            match b.lane {
                LaneKind::Live => self.acked = self.acked.max(b.last),
                LaneKind::Snapshot => self.snapshot_acked = self.snapshot_acked.max(b.last),
            }
        }
        outcome
    }

    /// The receiver refused `b` for good (it serves its keys under a newer map): its
    /// entries are dropped unapplied. The positions earlier attempts of it used may have
    /// been applied, so the next entry goes after them (a receiver that did not apply
    /// them refuses it as a gap and says where it is).
    pub(super) fn refused_for_good(&mut self, b: &Batch) {
        let n = self.numbering(b.lane);
        n.acked = n.acked.saturating_add(b.sent_before as u64);
        n.sent = 0;
        match b.lane {
            LaneKind::Live => {
                self.rejected_upto = self.rejected_upto.max(b.last);
                self.acked = self.acked.max(b.last);
            }
            LaneKind::Snapshot => {
                self.snapshot_rejected_upto = self.snapshot_rejected_upto.max(b.last);
                self.snapshot_acked = self.snapshot_acked.max(b.last);
            }
        }
    }

    /// The receiver refused a batch of `lane` as a gap: it expects position `expected`.
    pub(super) fn gap(&mut self, lane: LaneKind, expected: u64) {
        let n = self.numbering(lane);
        n.acked = expected.saturating_sub(1);
        n.sent = 0;
        n.known = true;
    }

    /// Both lanes' entries were dropped (a backlog over its bound): the positions sent may
    /// have been applied, so the next entries go after them.
    pub(super) fn dropped(&mut self) {
        for n in [&mut self.live_wire, &mut self.snapshot_wire] {
            n.acked = n.acked.saturating_add(n.sent as u64);
            n.sent = 0;
        }
    }
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
    /// Its sender task ended: a later target for the same cell may start sending (two
    /// streams to one cell at once would interleave their positions).
    pub(super) finished: AtomicBool,
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
                waiting_since: None,
                last_lane: LaneKind::Live,
                live_wire: Numbering::default(),
                snapshot_wire: Numbering::default(),
            }),
            wake: tokio::sync::Notify::new(),
            closed: AtomicBool::new(false),
            needs_resync: AtomicBool::new(false),
            waited: AtomicBool::new(waited),
            finished: AtomicBool::new(false),
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
    /// Wire position of its last entry.
    pub(super) last_position: u64,
    /// How many entries it carries.
    pub(super) entries: usize,
    /// How many of its entries had gone out before (see [`TargetState::refused_for_good`]).
    pub(super) sent_before: usize,
    /// An empty frame asking the receiver's position in the lane.
    pub(super) probe: bool,
}

/// The next batch for a target: the pending live records if any (consecutive, one epoch,
/// up to `chunk` bytes), else the snapshot lane's next records or its `SnapshotDone`
/// marker. The marker is reached only when no live record is pending, so every live record
/// queued before it has been acknowledged. A lane whose entries went out unacknowledged is
/// sent again first (see the module docs); a lane whose receiver's position is not known
/// yet gets an empty frame asking it.
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
    let order = if st.live_wire.sent > 0 {
        [LaneKind::Live, LaneKind::Snapshot]
    } else if st.snapshot_wire.sent > 0 || (alternate && st.last_lane == LaneKind::Live) {
        [LaneKind::Snapshot, LaneKind::Live]
    } else {
        [LaneKind::Live, LaneKind::Snapshot]
    };
    for lane in order {
        let (entries, acked, below, numbering) = match lane {
            LaneKind::Live => (&st.backlog, st.acked, u64::MAX, st.live_wire),
            LaneKind::Snapshot => (
                &st.snapshot,
                st.snapshot_acked,
                live_pending.unwrap_or(u64::MAX),
                st.snapshot_wire,
            ),
        };
        let mut pending = entries
            .iter()
            .filter(|(seq, _, _)| *seq > acked && *seq < below)
            .peekable();
        let Some((_, first_epoch, _)) = pending.peek() else {
            continue;
        };
        let (kind, marker) = match lane {
            LaneKind::Live => (FrameKind::Replicate, None),
            LaneKind::Snapshot => (FrameKind::SnapshotChunk, Some(FrameKind::SnapshotDone)),
        };
        let mut batch = Batch {
            kind,
            payload: Vec::new(),
            last: 0,
            epoch: *first_epoch,
            lane,
            last_position: numbering.acked,
            entries: 0,
            sent_before: numbering.sent,
            probe: !numbering.known,
        };
        if batch.probe {
            return Some(batch);
        }
        for (seq, epoch, e) in pending {
            if *epoch != batch.epoch {
                break;
            }
            let position = numbering.acked + 1 + batch.entries as u64;
            match e {
                Entry::Record(b, _) => {
                    if !batch.payload.is_empty() && batch.payload.len() + b.len() > chunk {
                        break;
                    }
                    let at = batch.payload.len();
                    batch.payload.extend_from_slice(b);
                    set_record_seq(&mut batch.payload[at..], position);
                }
                Entry::Done(range) => {
                    if !batch.payload.is_empty() {
                        break;
                    }
                    let done = RangeSeq {
                        range: *range,
                        seq: position,
                    };
                    done.encode(&mut batch.payload);
                    batch.kind = marker.unwrap_or(kind);
                    batch.last = *seq;
                    batch.last_position = position;
                    batch.entries = 1;
                    return Some(batch);
                }
            }
            batch.last = *seq;
            batch.last_position = position;
            batch.entries += 1;
        }
        if !batch.payload.is_empty() {
            return Some(batch);
        }
    }
    None
}
