//! The ring's counters of one cell (`stats cellcache`'s `cluster_*` fields, `ctl status`).
//!
//! Only the cluster module counts: the counters' fields are visible to it alone, and the rest
//! of the node reads them all at once through [`Cluster::counters`], as plain numbers. They
//! are monotonic event counts with no invariant tying one to another, so they stay relaxed
//! atomics incremented where the event happens.

use std::sync::atomic::{AtomicU64, Ordering};

use super::Cluster;

/// The counters themselves; see the module docs.
#[derive(Debug, Default)]
pub(super) struct ClusterStats {
    pub(super) forwarded: AtomicU64,
    pub(super) refused: AtomicU64,
    pub(super) unavailable: AtomicU64,
    /// Client writes executed here that landed outside the range this cell masters by the
    /// time they ran (answered with the retryable error, not replicated). The map gate
    /// ([`super::Cluster::map_gate`]) makes this impossible; it is counted so a regression
    /// shows.
    pub(super) stray_writes: AtomicU64,
    pub(super) replicate_refused: AtomicU64,
    /// Replication frames refused because their records did not continue the sender's
    /// lane (a jump or a hole in the positions): the sender is asked to resynchronise.
    pub(super) replicate_gaps: AtomicU64,
    /// Replicated records (and flushes, and snapshot ends) dropped because their sender
    /// does not master their key (range) in this cell's maps.
    pub(super) replicate_unentitled: AtomicU64,
    /// Forwarded requests refused because their sender is not a cell of this cell's map.
    pub(super) forward_not_member: AtomicU64,
    /// Maps a peer pushed (`MapUpdate` frames): never installed, only a hint to catch up.
    pub(super) map_pushes_ignored: AtomicU64,
    /// Consensus frames refused: their sender is not a cell of this cell's map, or a Raft
    /// RPC names another node than the cell that sent it.
    pub(super) consensus_refused: AtomicU64,
    pub(super) maps_installed: AtomicU64,
    /// Crash suspicions this cell, as the consensus leader, refused because the suspect
    /// answered its probe ([`super::group::vet`]).
    pub(super) suspicions_refuted: AtomicU64,
    /// Replicated items that arrived in parts (values over `replication_chunk_bytes`) and
    /// were rebuilt and stored.
    pub(super) values_rebuilt: AtomicU64,
    /// Snapshot streams started as a division's parent (a restart counts again).
    pub(super) handoff_streams: AtomicU64,
    /// Snapshot streams started to re-replicate a range to a backup.
    pub(super) resync_streams: AtomicU64,
    /// Flushes of this cell's master range (a client's `flush_all`, or a delayed one due).
    pub(super) flushes: AtomicU64,
    /// Flush records applied as a backup (one per flush of each master this cell backs up).
    pub(super) flushes_applied: AtomicU64,
    /// Requests refused for a full peer queue: forwarded requests this cell refused because
    /// their connection had `peer_forwards_in_flight_max` in progress, and requests its own
    /// links refused past `peer_queue_bytes_max` (both routed again by their sender).
    pub(super) peer_busy: AtomicU64,
    /// Peer connections closed in their handshake (no or a wrong cluster secret, not a
    /// cellcache peer, or too slow: `peer_handshake_timeout_ms`).
    pub(super) peer_handshakes_failed: AtomicU64,
    /// Peer connections closed at once because `peer_connections_max` were open.
    pub(super) peer_connections_refused: AtomicU64,
    /// Write replies held until the backups acknowledged the write (replication `sync`).
    pub(super) replies_held: AtomicU64,
}

/// A reading of a cell's ring counters (see [`ClusterStats`] for what each counts), plus the
/// replicator's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClusterCounters {
    pub forwarded: u64,
    pub refused: u64,
    pub unavailable: u64,
    pub stray_writes: u64,
    pub replicate_refused: u64,
    pub replicate_gaps: u64,
    pub replicate_unentitled: u64,
    pub forward_not_member: u64,
    pub map_pushes_ignored: u64,
    pub consensus_refused: u64,
    pub maps_installed: u64,
    pub suspicions_refuted: u64,
    pub values_rebuilt: u64,
    pub handoff_streams: u64,
    pub resync_streams: u64,
    pub flushes: u64,
    pub flushes_applied: u64,
    pub peer_busy: u64,
    pub peer_handshakes_failed: u64,
    pub peer_connections_refused: u64,
    pub replies_held: u64,
    /// Replication payload bytes acknowledged by targets.
    pub replication_bytes_sent: u64,
    /// Writes acknowledged although a backup was unreachable (policy `accept`).
    pub unreplicated_acks: u64,
    /// Items snapshot streams read into their targets' lanes, and their encoded bytes.
    pub stream_items: u64,
    pub stream_bytes: u64,
}

impl Cluster {
    /// The counters now, each read on its own (relaxed, as they are counted).
    pub fn counters(&self) -> ClusterCounters {
        let s = &self.stats;
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ClusterCounters {
            forwarded: get(&s.forwarded),
            refused: get(&s.refused),
            unavailable: get(&s.unavailable),
            stray_writes: get(&s.stray_writes),
            replicate_refused: get(&s.replicate_refused),
            replicate_gaps: get(&s.replicate_gaps),
            replicate_unentitled: get(&s.replicate_unentitled),
            forward_not_member: get(&s.forward_not_member),
            map_pushes_ignored: get(&s.map_pushes_ignored),
            consensus_refused: get(&s.consensus_refused),
            maps_installed: get(&s.maps_installed),
            suspicions_refuted: get(&s.suspicions_refuted),
            values_rebuilt: get(&s.values_rebuilt),
            handoff_streams: get(&s.handoff_streams),
            resync_streams: get(&s.resync_streams),
            flushes: get(&s.flushes),
            flushes_applied: get(&s.flushes_applied),
            peer_busy: get(&s.peer_busy),
            peer_handshakes_failed: get(&s.peer_handshakes_failed),
            peer_connections_refused: get(&s.peer_connections_refused),
            replies_held: get(&s.replies_held),
            replication_bytes_sent: get(&self.repl.bytes_sent),
            unreplicated_acks: get(&self.repl.unreplicated_acks),
            stream_items: get(&self.repl.stream_items),
            stream_bytes: get(&self.repl.stream_bytes),
        }
    }
}

impl Cluster {
    /// Every replication target's lag now (see [`super::repl::TargetLag`]).
    pub fn replication_lag(&self) -> Vec<super::repl::TargetLag> {
        self.repl.lag()
    }
}

/// `stats cellcache`'s `cluster_*` lines: the ring's counters of this cell.
impl crate::cell::RingFigures for Cluster {
    fn write_stats(&self, out: &mut Vec<u8>) {
        use crate::stats::stat;
        let c = self.counters();
        stat(out, "cluster_cell", &self.me);
        stat(out, "cluster_epoch", self.epoch());
        stat(out, "cluster_maps_installed", c.maps_installed);
        stat(out, "cluster_map_pushes_ignored", c.map_pushes_ignored);
        stat(out, "cluster_consensus_refused", c.consensus_refused);
        stat(out, "cluster_forwarded", c.forwarded);
        stat(out, "cluster_suspicions_refuted", c.suspicions_refuted);
        stat(out, "cluster_forward_refused", c.refused);
        stat(out, "cluster_forward_not_member", c.forward_not_member);
        stat(out, "cluster_unavailable", c.unavailable);
        stat(out, "cluster_stray_writes", c.stray_writes);
        stat(out, "cluster_replicate_refused", c.replicate_refused);
        stat(out, "cluster_replicate_gaps", c.replicate_gaps);
        stat(out, "cluster_replicate_unentitled", c.replicate_unentitled);
        stat(out, "cluster_handoff_streams", c.handoff_streams);
        stat(out, "cluster_resync_streams", c.resync_streams);
        stat(out, "cluster_values_rebuilt", c.values_rebuilt);
        stat(out, "cluster_flushes", c.flushes);
        stat(out, "cluster_flushes_applied", c.flushes_applied);
        stat(
            out,
            "cluster_replication_bytes_sent",
            c.replication_bytes_sent,
        );
        stat(out, "cluster_unreplicated_acks", c.unreplicated_acks);
        // The mode writes are acknowledged in now (`ctl switch replication` changes it).
        stat(out, "cluster_replication", self.replication().name());
        stat(out, "cluster_replies_held", c.replies_held);
        // Read now, from the targets and streams themselves (`/metrics` has them per target).
        let lag = self.repl.lag();
        let sum = |f: fn(&super::repl::TargetLag) -> u64| lag.iter().map(f).sum::<u64>();
        stat(
            out,
            "cluster_replication_lag_records",
            sum(|l| l.live_records + l.snapshot_records),
        );
        stat(
            out,
            "cluster_replication_queue_bytes",
            sum(|l| l.live_bytes + l.snapshot_bytes),
        );
        stat(out, "cluster_streams_active", self.streams.lock().len());
        stat(out, "cluster_stream_items", c.stream_items);
        stat(out, "cluster_stream_bytes", c.stream_bytes);
        let autoscale = self.autoscale.get().is_some_and(|a| a.enabled());
        stat(out, "cluster_autoscale_enabled", u8::from(autoscale));
        stat(out, "cluster_peer_busy", c.peer_busy);
        stat(
            out,
            "cluster_peer_handshakes_failed",
            c.peer_handshakes_failed,
        );
        stat(
            out,
            "cluster_peer_connections_refused",
            c.peer_connections_refused,
        );
    }
}
