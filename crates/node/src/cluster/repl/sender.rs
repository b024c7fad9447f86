//! One task per target: sends its lanes' batches in order, one batch in flight, trims what
//! the target acknowledged, and renumbers a lane from the target's position when the target
//! is not where the lane expects it (see [`super::target`]).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use cellcache_cluster::wire::FrameKind;

use super::super::link::LinkError;
use cellcache_cluster::wire::payload::{RangeSeq, SequenceGap};

use super::target::{Acked, Target, has_pending, next_batch, trim_acked};
use super::{LinkFor, OnRefused, Replicator};

impl Replicator {
    /// One target's sender: sends the backlog in order, one batch in flight. It starts once
    /// the sender of `previous` (an earlier target for the same cell, still delivering its
    /// tail) ended, so two streams to one cell never interleave.
    pub(super) async fn sender(
        self: Arc<Self>,
        t: Arc<Target>,
        previous: Option<Arc<Target>>,
        link_for: LinkFor,
        on_refused: OnRefused,
    ) {
        if let Some(previous) = previous {
            while !previous.finished.load(Ordering::Acquire) && !t.closed.load(Ordering::Acquire) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        self.send_lanes(&t, &link_for, &on_refused).await;
        t.finished.store(true, Ordering::Release);
    }

    async fn send_lanes(&self, t: &Arc<Target>, link_for: &LinkFor, on_refused: &OnRefused) {
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
                    st.sending(b);
                }
                batch
            };
            let Some(mut batch) = batch else {
                let _ = tokio::time::timeout(Duration::from_millis(100), t.wake.notified()).await;
                continue;
            };
            let batch_epoch = batch.epoch;
            let Some(link) = link_for(&t.to) else {
                t.state.lock().unreachable = true;
                self.check_waiters();
                tokio::time::sleep(backoff).await;
                continue;
            };
            let records = batch.payload.len();
            let payload = std::mem::take(&mut batch.payload);
            let call = link.call_at(batch.kind, Some(batch_epoch), payload);
            let io_timeout = self.policy().io_timeout;
            let reply = tokio::time::timeout(io_timeout, call)
                .await
                .unwrap_or(Err(LinkError::Lost));
            match reply {
                Ok(f) if f.kind == FrameKind::ReplicateAck => {
                    let at = RangeSeq::decode(&f.payload).map_or(batch.last_position, |a| a.seq);
                    self.bytes_sent.fetch_add(records as u64, Ordering::Relaxed);
                    let now = Instant::now();
                    let mut st = t.state.lock();
                    st.unreachable = false;
                    st.last_ack = now;
                    let acked = st.acknowledged(&batch, at);
                    trim_acked(&mut st);
                    st.progressed(now);
                    drop(st);
                    if acked == Acked::Diverged {
                        tracing::warn!(to = %t.to, at, expected = batch.last_position, lane = ?batch.lane, "replication target at another position than sent: renumbering and resynchronising it");
                        t.needs_resync.store(true, Ordering::Release);
                    }
                    backoff = Duration::from_millis(10);
                    self.check_waiters();
                }
                Ok(f)
                    if f.kind == FrameKind::Refused
                        && SequenceGap::decode(&f.payload).is_some() =>
                {
                    // The target missed positions (or never had this stream's): send again
                    // from where it is, and resynchronise it for what it may have missed.
                    let expected = SequenceGap::decode(&f.payload).map_or(0, |g| g.expected);
                    tracing::warn!(to = %t.to, expected, sent = batch.last_position, lane = ?batch.lane, "replication refused as a sequence gap: renumbering and resynchronising");
                    t.state.lock().gap(batch.lane, expected);
                    t.needs_resync.store(true, Ordering::Release);
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_millis(200));
                }
                Ok(f)
                    if !batch.probe
                        && f.epoch > batch_epoch
                        && self.layout.lock().epoch > batch_epoch =>
                {
                    // Fenced: the target serves these keys under a newer map, so writes made
                    // under the old one are not confirmed (their clients get SERVER_ERROR).
                    tracing::warn!(to = %t.to, epoch = f.epoch, batch_epoch, entries = batch.entries, reason = %String::from_utf8_lossy(&f.payload), "replication refused for good: its writes fail");
                    let mut st = t.state.lock();
                    st.refused_for_good(&batch);
                    trim_acked(&mut st);
                    st.progressed(Instant::now());
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
            self.trim_backlog(t);
        }
    }

    /// The position of the last record queued so far (see [`Replicator::drained`]).
    pub fn position(&self) -> u64 {
        self.seq.load(Ordering::Acquire)
    }

    /// Whether every target — a removed one still delivering its tail too — acknowledged
    /// what was queued for it up to position `upto` (a departing master's tail is
    /// delivered), waiting at most `timeout`. Records queued after `upto` — the
    /// re-replication a map change starts, copies of what is already stored — are not
    /// waited for; with `writes_only`, neither are snapshot items queued before (a
    /// re-replication to another backup can take far longer than the writes clients wait
    /// for, and a live write takes along the unsent snapshot items of its key).
    pub async fn drained(&self, upto: u64, timeout: Duration, writes_only: bool) -> bool {
        let targets: Vec<(Arc<Target>, u64)> = {
            let layout = self.layout.lock();
            layout
                .targets
                .values()
                .chain(layout.retired.values())
                .map(|t| (t.clone(), upto))
                .collect()
        };
        let deadline = Instant::now() + timeout;
        loop {
            let pending = targets.iter().any(|(t, upto)| {
                let st = t.state.lock();
                !st.unreachable
                    && (st
                        .backlog
                        .iter()
                        .any(|(s, _, _)| *s <= *upto && *s > st.acked)
                        || !writes_only
                            && st
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
