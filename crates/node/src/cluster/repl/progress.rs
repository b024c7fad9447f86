//! How far each target is behind, read at scrape time (`/metrics`, `stats cellcache`,
//! `/cells`): the lanes' lengths and bytes and how long the target has kept records waiting
//! without acknowledging any. Nothing here runs on the request path: a reading takes each
//! target's lock once, briefly, and counts nothing entry by entry.
//!
//! The age of the oldest unacknowledged record would need a clock reading per record
//! queued, on the request path; the *stall* is cheaper and says what an alert needs: the
//! sender stamps when records started waiting (it cut a batch with none waiting before) and
//! every acknowledgement that leaves some waiting stamps it again, so a backup that keeps
//! up stays near zero and one that stopped acknowledging grows by a second a second.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cellcache_cluster::CellId;

use super::Replicator;
use super::target::TargetState;

/// One target's lag at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetLag {
    pub to: CellId,
    /// Live records (client writes) queued and not yet acknowledged.
    pub live_records: u64,
    /// Their bytes.
    pub live_bytes: u64,
    /// Snapshot records (hand-off, re-replication) queued and not yet acknowledged, a
    /// snapshot's end marker counted as one.
    pub snapshot_records: u64,
    /// Their bytes.
    pub snapshot_bytes: u64,
    /// How long records have waited without an acknowledgement (zero: none waiting).
    pub stalled: Duration,
    /// The last attempt to reach it failed.
    pub unreachable: bool,
}

impl TargetState {
    /// Whether records wait in either lane. Acknowledged entries are trimmed under the
    /// same hold of the lock that takes the acknowledgement, so a lane holds only entries
    /// waiting for one.
    pub(super) fn waiting(&self) -> bool {
        !self.backlog.is_empty() || !self.snapshot.is_empty()
    }

    /// The target acknowledged something at `now`: records still waiting wait from now.
    pub(super) fn progressed(&mut self, now: Instant) {
        self.waiting_since = self.waiting().then_some(now);
    }
}

impl Replicator {
    /// Every current target's lag, in the order of their ids.
    pub fn lag(&self) -> Vec<TargetLag> {
        self.targets()
            .iter()
            .map(|t| {
                let st = t.state.lock();
                let snapshot_bytes = st.snapshot_bytes as u64;
                TargetLag {
                    to: t.to.clone(),
                    live_records: st.backlog.len() as u64,
                    live_bytes: (st.backlog_bytes as u64).saturating_sub(snapshot_bytes),
                    snapshot_records: st.snapshot.len() as u64,
                    snapshot_bytes,
                    stalled: st.waiting_since.map_or(Duration::ZERO, |s| s.elapsed()),
                    unreachable: st.unreachable,
                }
            })
            .collect()
    }
}

/// One snapshot stream's progress, shared by the task running it and the readers.
#[derive(Debug)]
pub struct StreamProgress {
    /// A division's hand-off (else a re-replication to a backup).
    pub handoff: bool,
    pub started: Instant,
    /// Items read from the store into the target's snapshot lane so far.
    pub items: AtomicU64,
    /// Their encoded bytes (at most eight chunks of them are still queued: the stream
    /// waits for the target past that).
    pub bytes: AtomicU64,
}

impl StreamProgress {
    pub fn new(handoff: bool) -> Arc<StreamProgress> {
        Arc::new(StreamProgress {
            handoff,
            started: Instant::now(),
            items: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
        })
    }

    /// `items` more items of `bytes` bytes went into the lane.
    pub(super) fn add(&self, items: u64, bytes: u64) {
        self.items.fetch_add(items, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::super::target::{Entry, LaneKind, Target, next_batch, trim_acked};
    use super::super::{ReplPolicy, Replicator};
    use super::*;
    use cellcache_cluster::HashRange;
    use cellcache_cluster::wire::payload::{ReplicationOp, ReplicationRecord};

    fn record(key: &str) -> Entry {
        let mut b = Vec::new();
        let op = ReplicationOp::Delete {
            key: key.as_bytes(),
        };
        ReplicationRecord {
            range: HashRange::FULL,
            seq: 0,
            op,
        }
        .encode(&mut b)
        .expect("encodes");
        Entry::Record(b, Some(cellcache_store::key_hash(key.as_bytes())))
    }

    #[test]
    fn lag_counts_what_waits_and_the_stall_ends_with_an_acknowledgement() {
        let r = Replicator::new(ReplPolicy {
            accept_unreachable: false,
            chunk_bytes: 1024,
            backlog_bytes_max: 1 << 20,
            stream_bytes_per_sec: 0,
            io_timeout: Duration::from_secs(1),
            child_lag_bytes_max: 4096,
            child_answer_window: Duration::from_secs(3600),
        });
        let t = Arc::new(Target::new(CellId::whole(2), 0, true));
        t.state.lock().live_wire.known = true;
        r.layout.lock().targets.insert(t.to.clone(), t.clone());
        let idle = r.lag();
        assert_eq!(idle.len(), 1);
        assert_eq!((idle[0].live_records, idle[0].stalled), (0, Duration::ZERO));

        r.push(&t, 1, record("a"), LaneKind::Live);
        r.push(&t, 1, record("b"), LaneKind::Live);
        r.push(&t, 1, record("c"), LaneKind::Snapshot);
        let queued = r.lag().remove(0);
        assert_eq!((queued.live_records, queued.snapshot_records), (2, 1));
        let bytes = t.state.lock().backlog_bytes as u64;
        assert_eq!(queued.live_bytes + queued.snapshot_bytes, bytes);
        assert!(queued.snapshot_bytes > 0 && queued.live_bytes > queued.snapshot_bytes);
        // Queued but not sent yet: nothing has waited for the target.
        assert_eq!(queued.stalled, Duration::ZERO);

        // The sender cuts the live batch: from now on records wait for the target.
        let batch = {
            let mut st = t.state.lock();
            let b = next_batch(&st, 1024, false).expect("a batch");
            st.sending(&b);
            assert!(st.waiting_since.is_some());
            b
        };
        // It acknowledges the batch: the snapshot record still waits, from now.
        let mut st = t.state.lock();
        let at = batch.last_position;
        st.acknowledged(&batch, at);
        trim_acked(&mut st);
        let now = Instant::now();
        st.progressed(now);
        assert_eq!(st.waiting_since, Some(now));
        drop(st);
        let after = r.lag().remove(0);
        assert_eq!((after.live_records, after.live_bytes), (0, 0));
        assert_eq!(after.snapshot_records, 1);

        // The last one acknowledged: nothing waits, no stall.
        let batch = {
            let mut st = t.state.lock();
            st.snapshot_wire.known = true;
            let b = next_batch(&st, 1024, false).expect("the snapshot batch");
            st.sending(&b);
            b
        };
        let mut st = t.state.lock();
        let at = batch.last_position;
        st.acknowledged(&batch, at);
        trim_acked(&mut st);
        st.progressed(Instant::now());
        drop(st);
        let done = r.lag().remove(0);
        assert_eq!((done.snapshot_records, done.snapshot_bytes), (0, 0));
        assert_eq!(done.stalled, Duration::ZERO);
    }

    #[test]
    fn a_stream_counts_what_it_read() {
        let p = StreamProgress::new(true);
        p.add(3, 300);
        p.add(2, 50);
        assert!(p.handoff);
        assert_eq!(p.items.load(Ordering::Relaxed), 5);
        assert_eq!(p.bytes.load(Ordering::Relaxed), 350);
    }
}
