//! Snapshots of a range into a target's snapshot lane (hand-off and re-replication).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use cellcache_cluster::wire::payload::{ItemState, encode_item};
use cellcache_cluster::{CellId, HashRange};
use cellcache_store::{ScanCursor, Store};

use super::progress::StreamProgress;
use super::target::{Entry, LaneKind, Target};
use super::{Replicator, now_secs};

impl Replicator {
    /// Streams a snapshot of `range` into `to`'s snapshot lane (`to` must be a target), then
    /// a `SnapshotDone`; resolves when `to` acknowledged it. Throttled by the policy (the
    /// throttle applies to the snapshot only: live records never wait for it). What it read
    /// so far is counted in `progress`.
    pub async fn stream(
        &self,
        store: &Store,
        to: &CellId,
        range: HashRange,
        progress: &StreamProgress,
    ) -> bool {
        let Some((t, epoch)) = ({
            let layout = self.layout.lock();
            layout.targets.get(to).cloned().map(|t| (t, layout.epoch))
        }) else {
            return false;
        };
        let policy = self.policy();
        let mut cursor = Some(ScanCursor::START);
        let started = Instant::now();
        let mut bytes_total: u64 = 0;
        while let Some(c) = cursor {
            if t.closed.load(Ordering::Acquire) {
                return false;
            }
            let now = now_secs();
            let mut bytes = 0usize;
            let mut items = 0u64;
            cursor = store.scan_range(range, now, c, |item| {
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
                items += 1;
                for b in records {
                    bytes += b.len();
                    self.push(&t, epoch, Entry::Record(b, Some(hash)), LaneKind::Snapshot);
                }
            });
            bytes_total += bytes as u64;
            progress.add(items, bytes as u64);
            self.stream_items.fetch_add(items, Ordering::Relaxed);
            self.stream_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
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
pub(super) const CLOSED_POLL: Duration = Duration::from_millis(20);

/// Sleeps `wait`, or less if `t` is closed meanwhile (then returns false): a throttled stream
/// to a target gone from the map ends with it instead of after its throttle's next pause
/// (the fault tests saw one linger 1.6-2.3 s).
pub(super) async fn sleep_unless_closed(t: &Target, wait: Duration) -> bool {
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
