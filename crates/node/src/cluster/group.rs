//! The consensus group on the wire: openraft's RPCs, proposals forwarded to the leader and
//! map confirmations, all in `Consensus` frames.
//!
//! Request payload: one op byte, then the body. Reply payload: one status byte (0 ok,
//! 1 refused/failed, 2 not the leader), then the body.
//!
//! Only cells of the receiver's map take part: a `Consensus` frame from a cell the map does
//! not have is refused, and so is a Raft RPC whose `vote` names another node than the cell
//! that sent it (a member cannot vote, or lead, in another cell's name). Counted as
//! `cluster_consensus_refused`.
//!
//! The leader vets a crash suspicion before proposing it ([`vet`]): it probes the suspect
//! itself and through a third cell, so one broken link between a cell and its successor
//! does not evict a healthy successor (tested in `crates/cli/tests/failures/partitions.rs`).

use std::sync::{Arc, Weak};

use cellcache_cluster::raft::{RaftGroup, RaftNodeId, RaftRpc, RaftTransport, TransportError};
use cellcache_cluster::wire::FrameKind;
use cellcache_cluster::{
    AbsorptionReason, CellId, Change, ClusterMap, Consensus, ConsensusError, Proposal,
};

use super::Cluster;

const OP_APPEND: u8 = 1;
const OP_VOTE: u8 = 2;
const OP_SNAPSHOT: u8 = 3;
const OP_PROPOSE: u8 = 4;
const OP_CONFIRM: u8 = 5;
/// "Probe this cell for me": the leader's indirect probe of a suspect through a third cell.
const OP_PROBE: u8 = 6;

const OK: u8 = 0;
const FAILED: u8 = 1;
const NOT_LEADER: u8 = 2;

/// Raft node id of a cell: a 64-bit hash of its id (ids are never reused, so collisions
/// need two cells of one ring to collide in 64 bits).
pub fn raft_id(cell: &CellId) -> RaftNodeId {
    cellcache_store::key_hash(cell.to_string().as_bytes())
}

/// openraft's network, over the cell's peer links.
pub struct Transport {
    pub cluster: Weak<Cluster>,
}

impl RaftTransport for Transport {
    async fn call(
        &self,
        target: RaftNodeId,
        rpc: RaftRpc,
        body: Vec<u8>,
    ) -> Result<Vec<u8>, TransportError> {
        let fail = |reason: String| TransportError { target, reason };
        let cl = self
            .cluster
            .upgrade()
            .ok_or_else(|| fail("cell stopping".into()))?;
        let cell = cl
            .cell_of_raft_id(target)
            .ok_or_else(|| fail("unknown raft node".into()))?;
        let link = cl.link(&cell).ok_or_else(|| fail("no address".into()))?;
        let op = match rpc {
            RaftRpc::AppendEntries => OP_APPEND,
            RaftRpc::Vote => OP_VOTE,
            RaftRpc::InstallSnapshot => OP_SNAPSHOT,
        };
        let mut payload = Vec::with_capacity(body.len() + 1);
        payload.push(op);
        payload.extend_from_slice(&body);
        let reply = tokio::time::timeout(
            std::time::Duration::from_secs(2),
            link.call(FrameKind::Consensus, payload),
        )
        .await
        .map_err(|_| fail("timed out".into()))?
        .map_err(|e| fail(e.to_string()))?;
        match reply.payload.split_first() {
            Some((&OK, body)) => Ok(body.to_vec()),
            Some((_, why)) => Err(fail(String::from_utf8_lossy(why).into_owned())),
            None => Err(fail("empty reply".into())),
        }
    }
}

/// Whether `cell` is still a member (voter or learner) of the consensus group as this
/// replica knows it. A cell removed from the map stays one until the group takes it out:
/// a leaving leader must still reach the others to hand its vote over. Refusing its
/// frames once the map without it was applied here left the last cell of a ring of two a
/// learner with no leader for good (CI: `the_leader_leaving_a_ring_of_two_…`).
pub(super) fn in_the_group(raft: &RaftGroup, cell: &CellId) -> bool {
    use cellcache_cluster::Consensus;
    let m = raft.membership();
    m.voters.contains(cell) || m.learners.contains(cell)
}

/// Answers a `Consensus` frame's payload from the cell `from` (its `Hello`).
pub async fn handle(cl: Arc<Cluster>, from: &CellId, payload: Vec<u8>) -> Vec<u8> {
    let Some((&op, body)) = payload.split_first() else {
        return vec![FAILED];
    };
    let refuse = |why: &str| {
        cl.stats
            .consensus_refused
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tracing::debug!(%from, why, "consensus frame refused");
        [&[FAILED][..], why.as_bytes()].concat()
    };
    let Some(raft) = cl.raft.get() else {
        return [&[FAILED][..], b"consensus not started"].concat();
    };
    let rpc = match op {
        OP_APPEND => Some(RaftRpc::AppendEntries),
        OP_VOTE => Some(RaftRpc::Vote),
        OP_SNAPSHOT => Some(RaftRpc::InstallSnapshot),
        _ => None,
    };
    // Raft's own RPCs are judged by the group's membership; everything else by the map.
    let allowed = cl.is_member(from) || (rpc.is_some() && in_the_group(raft, from));
    if !allowed {
        return refuse("not a cell of this map");
    }
    if let Some(rpc) = rpc {
        if RaftGroup::rpc_sender(rpc, body) != Some(raft_id(from)) {
            return refuse("the RPC names another node than its sender");
        }
        return match raft.handle_rpc(rpc, body).await {
            Ok(b) => [&[OK][..], &b].concat(),
            Err(e) => [&[FAILED][..], e.to_string().as_bytes()].concat(),
        };
    }
    match op {
        OP_PROPOSE => {
            let Ok(p) = serde_json::from_slice::<Proposal>(body) else {
                return [&[FAILED][..], b"bad proposal"].concat();
            };
            if raft.leader() != Some(raft.id()) {
                return vec![NOT_LEADER];
            }
            if let Err(why) = vet(&cl, &p).await {
                return [
                    &[FAILED][..],
                    REFUTED_PREFIX.as_bytes(),
                    why.to_string().as_bytes(),
                ]
                .concat();
            }
            match raft.propose(p).await {
                Ok(map) => [&[OK][..], &map.encode()].concat(),
                Err(ConsensusError::NotLeader { .. }) => vec![NOT_LEADER],
                Err(e) => [&[FAILED][..], e.to_string().as_bytes()].concat(),
            }
        }
        OP_PROBE => {
            let Ok(suspect) = cellcache_cluster::wire::payload::decode_cell_id(body) else {
                return [&[FAILED][..], b"bad probe"].concat();
            };
            if probe(&cl, &suspect).await {
                vec![OK]
            } else {
                vec![FAILED]
            }
        }
        OP_CONFIRM => {
            let mut e = [0u8; 8];
            if body.len() != 8 {
                return vec![FAILED];
            }
            e.copy_from_slice(body);
            if raft.leader() != Some(raft.id()) {
                return vec![NOT_LEADER];
            }
            if raft.confirm_map(u64::from_le_bytes(e)).await {
                vec![OK]
            } else {
                vec![FAILED]
            }
        }
        _ => [&[FAILED][..], b"unknown consensus op"].concat(),
    }
}

/// Starts a forwarded refusal's reason so that the proposer takes it as final (like the
/// transition rules' own "change refused: ...").
const REFUTED_PREFIX: &str = "change refused: ";

/// The cell a proposal declares crashed, if any: `Fence`, or an absorption for a crash.
fn suspect(p: &Proposal) -> Option<&CellId> {
    match &p.change {
        Change::Fence { cell } => Some(cell),
        Change::BeginAbsorption {
            departed,
            reason: AbsorptionReason::Crashed,
        } => Some(departed),
        _ => None,
    }
}

/// Whether `suspect` answers a map request over this cell's own peer link within
/// `indirect_probe_timeout_ms`.
async fn probe(cl: &Arc<Cluster>, suspect: &CellId) -> bool {
    let timeout = std::time::Duration::from_millis(cl.config.indirect_probe_timeout_ms);
    let Some(link) = cl.link(suspect) else {
        return false;
    };
    let answer = link.call(FrameKind::MapRequest, Vec::new());
    matches!(tokio::time::timeout(timeout, answer).await, Ok(Ok(_)))
}

/// Asks `helper` to probe `suspect` from where it stands (SWIM's indirect probe).
async fn probe_through(cl: &Arc<Cluster>, helper: &CellId, suspect: &CellId) -> bool {
    // The helper's own probe, plus one more of the same for the round trip to it.
    let timeout = std::time::Duration::from_millis(2 * cl.config.indirect_probe_timeout_ms);
    let Some(link) = cl.link(helper) else {
        return false;
    };
    let payload = [
        &[OP_PROBE][..],
        &cellcache_cluster::wire::payload::encode_cell_id(suspect),
    ]
    .concat();
    let answer = link.call(FrameKind::Consensus, payload);
    matches!(
        tokio::time::timeout(timeout, answer).await,
        Ok(Ok(f)) if f.payload.first() == Some(&OK)
    )
}

/// On the leader, before a proposal goes to the log: the second opinion on a crash
/// suspicion. The leader asks the suspect for its map over its own peer link and, at the
/// same time, asks one other cell (neither itself nor the suspect) to do the same from where
/// it stands; each probe waits at most `indirect_probe_timeout_ms`. Any answer means the
/// suspect is alive and reachable, so the suspicion came from one bad link (or a slow
/// proposer) and the proposal is refused. No answer in time, or no way to reach it (a
/// killed process refuses the connection at once), confirms it. The third cell matters when
/// the leader itself raised the suspicion: its own probe would use the very link that
/// failed. A proposal to evict the leader is refused outright: the leader deciding it is
/// alive, and the proposer reached it (if it is dead, a new leader decides instead).
pub async fn vet(cl: &Arc<Cluster>, p: &Proposal) -> Result<(), SuspicionRefuted> {
    let Some(cell) = suspect(p) else {
        return Ok(());
    };
    if cl.config.indirect_probe_timeout_ms == 0 {
        return Ok(());
    }
    let refuted = |how: &'static str| {
        cl.stats
            .suspicions_refuted
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tracing::info!(suspect = %cell, how, "suspicion refuted");
        Err(SuspicionRefuted {
            suspect: cell.clone(),
            how,
        })
    };
    if *cell == cl.me {
        return refuted("it is the leader deciding");
    }
    let helper = {
        let ring = cl.lock_ring();
        ring.map()
            .active_cells()
            .map(|c| c.id.clone())
            .find(|id| *id != cl.me && id != cell)
    };
    let direct = probe(cl, cell);
    let alive = match &helper {
        Some(h) => {
            let (direct, indirect) = tokio::join!(direct, probe_through(cl, h, cell));
            if indirect && !direct {
                return refuted("answered a probe through another cell");
            }
            direct
        }
        None => direct.await,
    };
    if alive {
        return refuted("answered the leader's probe");
    }
    tracing::info!(suspect = %cell, helper = ?helper, "suspicion confirmed: no probe was answered");
    Ok(())
}

/// A crash suspicion the leader's probes refuted: the suspect is alive.
#[derive(Debug, thiserror::Error)]
#[error("suspect {suspect} is alive: {how}")]
pub struct SuspicionRefuted {
    pub suspect: CellId,
    /// How it showed it is alive.
    pub how: &'static str,
}

/// Why a proposal did not commit.
#[derive(Debug, thiserror::Error)]
pub enum ProposeError {
    #[error("refused: {0}")]
    Refused(String),
    #[error("consensus unavailable: {0}")]
    Unavailable(String),
}

/// Proposes a change through the group's leader (here or over a link); retries while the
/// leader is unknown or moving, for about `timeout`.
pub async fn propose(
    cl: &Arc<Cluster>,
    p: Proposal,
    timeout: std::time::Duration,
) -> Result<ClusterMap, ProposeError> {
    let deadline = tokio::time::Instant::now() + timeout;
    let raft = cl
        .raft
        .get()
        .ok_or_else(|| ProposeError::Unavailable("consensus not started".into()))?;
    let mut last = String::from("no leader");
    while tokio::time::Instant::now() < deadline {
        match raft.leader() {
            Some(l) if l == raft.id() => {
                if let Err(why) = vet(cl, &p).await {
                    return Err(ProposeError::Refused(why.to_string()));
                }
                match raft.propose(p.clone()).await {
                    Ok(map) => return Ok(map),
                    Err(ConsensusError::Refused(e)) => {
                        return Err(ProposeError::Refused(e.to_string()));
                    }
                    Err(e) => last = e.to_string(),
                }
            }
            Some(l) => {
                let link = cl.cell_of_raft_id(l).and_then(|c| cl.link(&c));
                if let Some(link) = link {
                    let body = serde_json::to_vec(&p).unwrap_or_default();
                    let payload = [&[OP_PROPOSE][..], &body].concat();
                    match link.call(FrameKind::Consensus, payload).await {
                        Ok(f) => match f.payload.split_first() {
                            Some((&OK, m)) => {
                                return ClusterMap::decode(
                                    m,
                                    cellcache_cluster::map::MAP_BYTES_MAX_DEFAULT,
                                )
                                .map_err(|e| ProposeError::Unavailable(e.to_string()));
                            }
                            Some((&FAILED, why)) => {
                                let why = String::from_utf8_lossy(why).into_owned();
                                if why.starts_with("change refused") {
                                    return Err(ProposeError::Refused(why));
                                }
                                last = why;
                            }
                            _ => last = "leader moved".into(),
                        },
                        Err(e) => last = e.to_string(),
                    }
                }
            }
            None => {}
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    Err(ProposeError::Unavailable(last))
}

/// Asks the leader whether `epoch` is the current map (the ring's `ConfirmMap`).
pub async fn confirm(cl: &Arc<Cluster>, epoch: u64) -> bool {
    let Some(raft) = cl.raft.get() else {
        return false;
    };
    match raft.leader() {
        Some(l) if l == raft.id() => raft.confirm_map(epoch).await,
        Some(l) => {
            let Some(link) = cl.cell_of_raft_id(l).and_then(|c| cl.link(&c)) else {
                return false;
            };
            let payload = [&[OP_CONFIRM][..], &epoch.to_le_bytes()].concat();
            let r = tokio::time::timeout(
                std::time::Duration::from_millis(cl.config.ring.map_lease_ms),
                link.call(FrameKind::Consensus, payload),
            )
            .await;
            matches!(r, Ok(Ok(f)) if f.payload.first() == Some(&OK))
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proposal(change: Change) -> Proposal {
        Proposal {
            based_on_epoch: 1,
            change,
        }
    }

    /// Only crash evictions are probed: a graceful leave or any other change goes straight
    /// to the log.
    #[test]
    fn only_crash_evictions_name_a_suspect() {
        let d = CellId::whole(2);
        let fence = proposal(Change::Fence { cell: d.clone() });
        assert_eq!(suspect(&fence), Some(&d));
        let crashed = proposal(Change::BeginAbsorption {
            departed: d.clone(),
            reason: AbsorptionReason::Crashed,
        });
        assert_eq!(suspect(&crashed), Some(&d));
        let leaving = proposal(Change::BeginAbsorption {
            departed: d.clone(),
            reason: AbsorptionReason::Leaving,
        });
        assert_eq!(suspect(&leaving), None);
        let complete = proposal(Change::CompleteAbsorption { departed: d });
        assert_eq!(suspect(&complete), None);
    }
}
