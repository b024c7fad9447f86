//! What goes into and comes out of a [`super::Ring`]: its configuration, the messages cells
//! exchange, and the outputs its driver acts on. Kept apart from the state machine so the node
//! and the simulator can depend on the vocabulary without reading the logic.

use serde::{Deserialize, Serialize};

use crate::change::Proposal;
use crate::id::CellId;
use crate::range::HashRange;

/// Largest encoded ring message accepted by [`RingMessage::decode`]; real ones are < 200 bytes.
pub const RING_MESSAGE_BYTES_MAX: usize = 4096;

/// Why ring message bytes were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RingMessageError {
    /// Longer than [`RING_MESSAGE_BYTES_MAX`].
    #[error("ring message of {0} bytes is too large")]
    TooLarge(usize),
    /// Not a ring message.
    #[error("malformed ring message: {0}")]
    Malformed(String),
}

/// Timing of the ring, embeddable in the node's TOML config. All values in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RingConfig {
    /// How often a cell heartbeats its backups (and so renews its leases).
    pub heartbeat_interval_ms: u64,
    /// How often a master that lacks a backup's lease for its range asks again, between
    /// heartbeats: after a division or absorption the grantor may not yet have the new map
    /// or the release of the old master's lease, and waiting a whole heartbeat interval for
    /// the next try stalls the moved range's clients that long.
    pub lease_retry_ms: u64,
    /// Silence of the successor after which its fencing is proposed.
    pub suspicion_timeout_ms: u64,
    /// Lease length granted by a backup to its master.
    pub lease_ms: u64,
    /// Added by the granting backup to cover clock-rate differences between cells.
    pub clock_drift_margin_ms: u64,
    /// Minimum spacing of identical proposals.
    pub proposal_retry_ms: u64,
    /// A division not caught up after this long is aborted.
    pub handoff_timeout_ms: u64,
    /// A division child silent this long before it caught up aborts the division. A shorter
    /// outage only pauses the hand-off, which then resumes from the last record the child
    /// acknowledged. (Once caught up, the parent's writes wait for the child, so silence
    /// then aborts after `suspicion_timeout_ms`.)
    pub handoff_stall_timeout_ms: u64,
    /// A re-replication not reported done after this long is started again.
    pub resync_retry_ms: u64,
    /// How long a confirmation from the consensus group that our map is current stays good
    /// (counted from when we asked). Without a fresh one a cell neither serves nor grants.
    pub map_lease_ms: u64,
    /// A cell that gave up part of its range grants the part's new master no lease on it
    /// until the writes it made there are delivered ([`Output::DeliverTail`]), or this
    /// long at most: past it those writes have failed their clients anyway (it matches
    /// the node's default `request_timeout_ms`).
    pub tail_hold_ms: u64,
}

impl Default for RingConfig {
    fn default() -> Self {
        RingConfig {
            heartbeat_interval_ms: 100,
            lease_retry_ms: 10,
            // Detection within 1 s of a crash (measured in docs/failures.md, section 4):
            // 700 ms of silence, seven heartbeats, is well past a live cell's hiccups and
            // within raft's own election timeouts (400-800 ms).
            suspicion_timeout_ms: 700,
            lease_ms: 500,
            clock_drift_margin_ms: 100,
            proposal_retry_ms: 500,
            handoff_timeout_ms: 60_000,
            handoff_stall_timeout_ms: 10_000,
            resync_retry_ms: 5_000,
            map_lease_ms: 2_000,
            tail_hold_ms: 3_000,
        }
    }
}

/// Ring control messages between cells (carried in Heartbeat/HeartbeatAck frames).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum RingMessage {
    /// Master → backup: "I am alive; renew my lease." `sent_at_ms` is echoed back.
    Heartbeat {
        from: CellId,
        epoch: u64,
        sent_at_ms: u64,
    },
    /// Backup → master: liveness, plus a lease for `grant` when the backup agrees.
    HeartbeatAck {
        from: CellId,
        epoch: u64,
        echo_sent_at_ms: u64,
        grant: Option<HashRange>,
    },
    /// A cell no longer relies on (all or part of) the leases this backup granted it, so the
    /// backup may grant that part to another master without waiting for expiry. The grants
    /// it answered to heartbeats sent before `before_ms` (the sender's clock; all of them
    /// when absent) shrink to `keep` — the one lease the sender still holds from them, now
    /// `keep` — or are forgotten when `keep` is absent. The sender ignores every answer to
    /// a heartbeat sent before `before_ms` from then on, so it relies on nothing else.
    LeaseRelease {
        from: CellId,
        epoch: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        before_ms: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        keep: Option<HashRange>,
    },
}

impl RingMessage {
    /// Payload of a `Heartbeat`/`HeartbeatAck` frame (JSON: tiny, infrequent, self-describing).
    pub fn encode(&self) -> Vec<u8> {
        // Plain data with string keys: serialization cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Parses a frame payload, bounded by [`RING_MESSAGE_BYTES_MAX`].
    pub fn decode(bytes: &[u8]) -> Result<RingMessage, RingMessageError> {
        if bytes.len() > RING_MESSAGE_BYTES_MAX {
            return Err(RingMessageError::TooLarge(bytes.len()));
        }
        serde_json::from_slice(bytes).map_err(|e| RingMessageError::Malformed(e.to_string()))
    }
}

/// What the ring asks its driver (the node, or the simulator) to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// Send a ring message to a peer.
    Send { to: CellId, message: RingMessage },
    /// Submit a map change to the consensus group.
    Propose(Proposal),
    /// What this cell must now hold under the map of `epoch`: anything else may be dropped
    /// from the store.
    Holdings {
        epoch: u64,
        master: Option<HashRange>,
        backups: Vec<HashRange>,
    },
    /// Division: stream `range` (snapshot, then every new write until the flip) to `child`.
    StartHandOff { child: CellId, range: HashRange },
    /// Re-replication: bring `to`'s backup copy of `range` up to date (snapshot + live).
    Resync { to: CellId, range: HashRange },
    /// A peer has a newer map than ours: fetch it.
    NeedMap { from: CellId },
    /// Ask the consensus group whether `epoch` is still the current map (a Raft read-index
    /// or leader-lease check); report a yes with [`super::Ring::map_confirmed`] and this `sent_at_ms`.
    ConfirmMap { epoch: u64, sent_at_ms: u64 },
    /// This cell gave up `range` (a division's child or a shift's receiver masters it
    /// now): deliver what it queued for replication so far, then report it with
    /// [`super::Ring::tail_delivered`]. Until then it grants no lease on `range`, so the
    /// new master does not serve it before the writes made here reached it (it would
    /// refuse them as made under an older map, failing their clients).
    DeliverTail { range: HashRange },
    /// This cell has been removed from the ring: stop serving for good.
    Fenced,
}

/// What a master waits for before it serves its range ([`super::Ring::serve_wait`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ServeWait {
    /// The installed map was not confirmed by the consensus group recently enough.
    pub unconfirmed: bool,
    /// A departed cell's lease over part of the range may not have expired yet.
    pub departed: bool,
    /// This cell granted part of the range to another cell, unexpired.
    pub granted_away: bool,
    /// Backups whose lease covering the range this cell lacks.
    pub leases: Vec<CellId>,
}

impl ServeWait {
    /// Nothing to wait for.
    pub fn serving(&self) -> bool {
        !self.unconfirmed && !self.departed && !self.granted_away && self.leases.is_empty()
    }
}
