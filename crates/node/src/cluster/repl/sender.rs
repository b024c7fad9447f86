//! One task per target: sends its lanes' batches in order, one batch in flight, and
//! trims what the target acknowledged.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use cellcache_cluster::wire::FrameKind;

use super::super::link::LinkError;
use cellcache_cluster::wire::payload::RangeSeq;

use super::target::{Batch, LaneKind, Target, has_pending, next_batch, trim_acked};
use super::{LinkFor, OnRefused, Replicator};

impl Replicator {
    /// One target's sender: sends the backlog in order, one batch in flight.
    pub(super) async fn sender(
        self: Arc<Self>,
        t: Arc<Target>,
        link_for: LinkFor,
        on_refused: OnRefused,
    ) {
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
}
