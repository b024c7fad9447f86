//! The consensus group on the wire: openraft's RPCs, proposals forwarded to the leader and
//! map confirmations, all in `Consensus` frames.
//!
//! Request payload: one op byte, then the body. Reply payload: one status byte (0 ok,
//! 1 refused/failed, 2 not the leader), then the body.
//!
//! The leader vets a crash suspicion before proposing it ([`vet`]): it probes the suspect
//! itself, so one broken link between a cell and its successor does not evict a healthy
//! successor (issue 7, C9).

use std::sync::{Arc, Weak};

use cellcache_cluster::raft::{RaftNodeId, RaftRpc, RaftTransport, TransportError};
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

/// Answers a `Consensus` frame's payload.
pub async fn handle(cl: Arc<Cluster>, payload: Vec<u8>) -> Vec<u8> {
    let Some((&op, body)) = payload.split_first() else {
        return vec![FAILED];
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
    if let Some(rpc) = rpc {
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
                return [&[FAILED][..], REFUTED_PREFIX.as_bytes(), why.as_bytes()].concat();
            }
            match raft.propose(p).await {
                Ok(map) => [&[OK][..], &map.encode()].concat(),
                Err(ConsensusError::NotLeader { .. }) => vec![NOT_LEADER],
                Err(e) => [&[FAILED][..], e.to_string().as_bytes()].concat(),
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

/// On the leader, before a proposal goes to the log: the second observer of a crash
/// suspicion. The leader asks the suspect for its map over its own peer link, for at most
/// `indirect_probe_timeout_ms`; any reply means the suspect is alive and reachable, so the
/// suspicion came from one bad link (or a slow proposer) and the proposal is refused. No
/// reply in time, or no way to reach it (a killed process refuses the connection at once),
/// confirms it. The leader itself is never probed (answering itself would prove nothing
/// about its links); a suspicion the leader raised itself is probed too, as a second,
/// later attempt over the same link.
pub async fn vet(cl: &Arc<Cluster>, p: &Proposal) -> Result<(), String> {
    let Some(cell) = suspect(p) else {
        return Ok(());
    };
    let timeout = cl.config.indirect_probe_timeout_ms;
    if *cell == cl.me || timeout == 0 {
        return Ok(());
    }
    let Some(link) = cl.link(cell) else {
        return Ok(());
    };
    let probe = link.call(FrameKind::MapRequest, Vec::new());
    match tokio::time::timeout(std::time::Duration::from_millis(timeout), probe).await {
        Ok(Ok(_)) => {
            cl.stats
                .suspicions_refuted
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tracing::info!(suspect = %cell, "suspicion refuted: the suspect answered the leader's probe");
            Err(format!("suspect {cell} answered the leader's probe"))
        }
        Ok(Err(e)) => {
            tracing::info!(suspect = %cell, error = %e, "suspicion confirmed: the suspect is unreachable from the leader");
            Ok(())
        }
        Err(_) => {
            tracing::info!(suspect = %cell, timeout_ms = timeout, "suspicion confirmed: the suspect did not answer the leader's probe");
            Ok(())
        }
    }
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
                    return Err(ProposeError::Refused(why));
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
