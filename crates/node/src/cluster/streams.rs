//! Snapshot streams of this cell's range to another cell — a division's hand-off to its
//! child, or a re-replication to a backup — started by the ring driver, and what they show
//! while they run (`in_progress`, `/metrics`' `cellcache_streams_active` and
//! `cellcache_stream_*`). The snapshot itself is [`super::repl`]'s.

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use cellcache_cluster::{CellId, HashRange};

use super::Cluster;
use super::repl::StreamProgress;

/// The streams running, by target and range (`start`, `end`), each with its progress.
pub(super) type Running = BTreeMap<(CellId, (u64, u64)), Arc<StreamProgress>>;

/// One running stream, as [`Cluster::streams_running`] reads it.
#[derive(Debug, Clone)]
pub struct RunningStream {
    pub to: CellId,
    pub range: HashRange,
    pub progress: Arc<StreamProgress>,
}

impl Cluster {
    /// Streams a snapshot of `range` (plus live writes) to `to`; reports to the ring.
    pub(super) fn start_stream(self: &Arc<Self>, to: CellId, range: HashRange, handoff: bool) {
        let progress = StreamProgress::new(handoff);
        match self
            .streams
            .lock()
            .entry((to.clone(), (range.start, range.end)))
        {
            Entry::Occupied(_) => return,
            Entry::Vacant(v) => {
                v.insert(progress.clone());
            }
        }
        self.refresh_layout();
        let started = if handoff {
            &self.stats.handoff_streams
        } else {
            &self.stats.resync_streams
        };
        started.fetch_add(1, Ordering::Relaxed);
        let cl = self.clone();
        tracing::info!(to = %to, %range, handoff, "streaming range");
        self.handle.spawn(async move {
            let ok = cl.repl.stream(&cl.cell.store, &to, range, &progress).await;
            cl.streams
                .lock()
                .remove(&(to.clone(), (range.start, range.end)));
            tracing::info!(
                to = %to,
                %range,
                ok,
                ms = progress.started.elapsed().as_millis() as u64,
                items = progress.items.load(Ordering::Relaxed),
                bytes = progress.bytes.load(Ordering::Relaxed),
                "stream finished"
            );
            if ok {
                let outputs = {
                    let mut ring = cl.lock_ring();
                    if handoff {
                        ring.handoff_caught_up(&to);
                    } else {
                        ring.resync_done(&to, range);
                    }
                    ring.drain_outputs()
                };
                cl.process(outputs);
            }
            cl.refresh_layout();
        });
    }

    /// The streams running now.
    pub fn streams_running(&self) -> Vec<RunningStream> {
        self.streams
            .lock()
            .iter()
            .map(|((to, (start, end)), progress)| RunningStream {
                to: to.clone(),
                range: HashRange::new(*start, *end),
                progress: progress.clone(),
            })
            .collect()
    }

    /// A predecessor finished re-sending `range` to this cell, under its map `epoch`. The
    /// ring learns it only once this cell installed that map too: the fault tests found a
    /// short re-replication finishing before the map that asked for it was installed here,
    /// so the ring, which starts waiting for it on that install, waited forever and the
    /// absorption never completed.
    pub async fn resync_received(self: &Arc<Self>, from: &CellId, range: HashRange, epoch: u64) {
        let deadline = Instant::now() + Duration::from_millis(self.config.request_timeout_ms);
        while self.epoch() < epoch && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tracing::debug!(%from, %range, epoch, "re-replication received");
        let outputs = {
            let mut ring = self.lock_ring();
            ring.resync_received(from);
            ring.drain_outputs()
        };
        self.process(outputs);
    }
}
