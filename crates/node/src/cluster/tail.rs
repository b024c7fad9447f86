//! A departing master's tail: the writes a cell made in a range it no longer masters reach
//! their targets before the range's new master serves it. Otherwise the new master, serving
//! under the newer map, refuses them as made under an older one and their clients get
//! `SERVER_ERROR … not confirmed` (see docs/cluster.md, "Division", the drain).

use std::sync::Arc;
use std::time::Duration;

use cellcache_cluster::wire::FrameKind;
use cellcache_cluster::{HashRange, RingMessage};

use super::Cluster;

impl Cluster {
    /// Sends `release` (a `LeaseRelease`) to `to` once every write made under the lease is
    /// delivered: the successor of this range may serve it as soon as the backup learns of
    /// the release. Only what is queued now: the re-replication the same map starts (its
    /// outputs come after this one) copies stored items, and waiting for it held a
    /// division's child off its lease for tens of milliseconds.
    pub(super) fn release_after_tail(
        self: &Arc<Self>,
        to: cellcache_cluster::CellId,
        release: RingMessage,
    ) {
        let upto = self.repl.position();
        let cl = self.clone();
        self.handle.spawn(async move {
            let budget = Duration::from_millis(cl.config.ring.lease_ms);
            if !cl.repl.drained(upto, budget, false).await {
                tracing::warn!(to = %to, "replication tail not drained; the lease will expire instead");
                return;
            }
            if let Some(link) = cl.link(&to) {
                link.send(FrameKind::Heartbeat, release.encode());
            }
        });
    }

    /// Reports `range`, given up under the map just installed, delivered to the ring once
    /// the writes queued so far reached their targets (`Output::DeliverTail`): every write
    /// made in it was queued before that map was installed (the map gate). Until then the
    /// ring grants the range's new master no lease on it; after `tail_hold_ms` it does
    /// anyway (those writes have failed their clients by then).
    pub(super) fn deliver_tail(self: &Arc<Self>, range: HashRange) {
        let upto = self.repl.position();
        let cl = self.clone();
        self.handle.spawn(async move {
            let budget = Duration::from_millis(cl.config.ring.tail_hold_ms);
            if !cl.repl.drained(upto, budget, true).await {
                tracing::warn!(%range, "replication tail of a range given up not delivered in time: its new master may refuse it");
            }
            let outputs = {
                let mut ring = cl.lock_ring();
                ring.tail_delivered(range, cl.now_ms());
                ring.drain_outputs()
            };
            cl.process(outputs);
        });
    }
}
