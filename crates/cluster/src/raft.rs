//! The multi-voter consensus group: [`RaftGroup`], an openraft 0.9 implementation of
//! [`Consensus`], over a network seam of our own ([`RaftTransport`]).
//!
//! This is the one module of the crate that runs asynchronously: openraft drives elections
//! and replication with tasks and timers on the caller's tokio runtime. Everything else it
//! needs is here and small: an in-memory log store, a state machine whose state is the
//! [`ClusterMap`] and whose transition function is [`crate::change::apply`], and a network adapter
//! that turns openraft's RPCs into opaque request/response bytes for [`RaftTransport`] (the
//! node carries them in `FrameKind::Consensus` frames; tests carry them through a map of
//! in-process groups).
//!
//! Guarantees: a proposal resolves only after its log entry is committed by a majority of
//! voters and applied locally; every replica applies the same entries in the same order
//! with the same pure function, so all hold the same map at each epoch. A refused change
//! (stale epoch, overlap…) is committed as a no-op and reported as
//! [`ConsensusError::Refused`]. Replicas must start from maps of the same lineage (the
//! bootstrap map, or any later map of the same cluster): replaying entries onto a newer map
//! is harmless because entries computed against older epochs are refused as stale.
//!
//! The log is in memory: a restarted cell rejoins as a new member, which is what the ring
//! does with a restarted cell anyway (a cell declared dead that comes back is fenced and
//! rejoins as a new cell).

use std::collections::BTreeMap;
use std::future::Future;
use std::io::Cursor;
use std::sync::Arc;

use openraft::error::{
    ClientWriteError, InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError,
};
use openraft::network::RPCOption;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{BasicNode, Entry, RaftNetwork, RaftNetworkFactory};
use serde::{Deserialize, Serialize};

use crate::change::{ChangeError, Proposal};
use crate::consensus::{Consensus, ConsensusError, Membership};
use crate::id::CellId;
use crate::map::ClusterMap;
use store::{LogStore, MapMachine};

/// Raft node ids are small integers assigned by the node; the cell id travels in
/// `BasicNode::addr` so membership can be reported in cell ids.
pub type RaftNodeId = u64;

/// What a committed entry produced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CommitOutcome {
    /// The change applied; this is the new map.
    Applied(ClusterMap),
    /// The change was refused; the map did not change.
    Refused(ChangeError),
    /// A Raft-internal entry (leader blank, membership change).
    Internal,
}

openraft::declare_raft_types!(
    /// openraft type configuration of the map group.
    pub MapRaft:
        D = Proposal,
        R = CommitOutcome,
        NodeId = RaftNodeId,
        Node = BasicNode,
        Entry = Entry<MapRaft>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

/// Which Raft RPC a [`RaftTransport`] call carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RaftRpc {
    /// Log replication and heartbeats.
    AppendEntries,
    /// Elections.
    Vote,
    /// Snapshot chunks for lagging members.
    InstallSnapshot,
}

/// Why a transport call failed: the peer may be down or unreachable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("raft transport to node {target} failed: {reason}")]
pub struct TransportError {
    /// The peer.
    pub target: RaftNodeId,
    /// What happened.
    pub reason: String,
}

/// The network seam: deliver `body` to `target`'s [`RaftGroup::handle_rpc`] and return its
/// answer. Implementations own connections, timeouts and retries.
pub trait RaftTransport: Send + Sync + 'static {
    /// One request/response exchange.
    fn call(
        &self,
        target: RaftNodeId,
        rpc: RaftRpc,
        body: Vec<u8>,
    ) -> impl Future<Output = Result<Vec<u8>, TransportError>> + Send;
}

// ---------------------------------------------------------------------------------------------
// Network adapter

/// openraft's view of one peer, forwarding through the transport.
struct PeerClient<T> {
    transport: Arc<T>,
    target: RaftNodeId,
}

impl<T: RaftTransport> PeerClient<T> {
    async fn exchange<Req, Resp, E>(
        &self,
        rpc: RaftRpc,
        request: &Req,
    ) -> Result<Resp, RPCError<RaftNodeId, BasicNode, RaftError<RaftNodeId, E>>>
    where
        Req: Serialize,
        Resp: for<'de> Deserialize<'de>,
        E: std::error::Error + for<'de> Deserialize<'de>,
    {
        let body =
            serde_json::to_vec(request).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let reply = self
            .transport
            .call(self.target, rpc, body)
            .await
            .map_err(|e| RPCError::Unreachable(openraft::error::Unreachable::new(&e)))?;
        let result: Result<Resp, RaftError<RaftNodeId, E>> =
            serde_json::from_slice(&reply).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        result.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

impl<T: RaftTransport> RaftNetwork<MapRaft> for PeerClient<T> {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<MapRaft>,
        _option: RPCOption,
    ) -> Result<
        AppendEntriesResponse<RaftNodeId>,
        RPCError<RaftNodeId, BasicNode, RaftError<RaftNodeId>>,
    > {
        self.exchange(RaftRpc::AppendEntries, &rpc).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<MapRaft>,
        _option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<RaftNodeId>,
        RPCError<RaftNodeId, BasicNode, RaftError<RaftNodeId, InstallSnapshotError>>,
    > {
        self.exchange(RaftRpc::InstallSnapshot, &rpc).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<RaftNodeId>,
        _option: RPCOption,
    ) -> Result<VoteResponse<RaftNodeId>, RPCError<RaftNodeId, BasicNode, RaftError<RaftNodeId>>>
    {
        self.exchange(RaftRpc::Vote, &rpc).await
    }
}

struct PeerFactory<T> {
    transport: Arc<T>,
}

impl<T: RaftTransport> RaftNetworkFactory<MapRaft> for PeerFactory<T> {
    type Network = PeerClient<T>;

    async fn new_client(&mut self, target: RaftNodeId, _node: &BasicNode) -> Self::Network {
        PeerClient {
            transport: self.transport.clone(),
            target,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The group

/// Timing of the consensus group, embeddable in the node's TOML config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RaftConfig {
    /// Leader heartbeat period.
    pub heartbeat_interval_ms: u64,
    /// Election timeout, randomized between min and max.
    pub election_timeout_min_ms: u64,
    /// See `election_timeout_min_ms`.
    pub election_timeout_max_ms: u64,
}

impl Default for RaftConfig {
    fn default() -> Self {
        RaftConfig {
            heartbeat_interval_ms: 100,
            election_timeout_min_ms: 400,
            election_timeout_max_ms: 800,
        }
    }
}

/// Why a group could not be started or reshaped.
#[derive(Debug, thiserror::Error)]
pub enum RaftGroupError {
    /// The timing configuration is inconsistent.
    #[error("invalid raft config: {0}")]
    Config(String),
    /// openraft stopped or refused the operation.
    #[error("raft: {0}")]
    Raft(String),
}

/// One replica of the map's consensus group; see the module docs.
pub struct RaftGroup {
    id: RaftNodeId,
    raft: openraft::Raft<MapRaft>,
    machine: MapMachine,
}

impl RaftGroup {
    /// Starts a replica with node id `id`, whose state machine starts at `map`. Call on a
    /// tokio runtime (openraft spawns its tasks there).
    pub async fn start<T: RaftTransport>(
        id: RaftNodeId,
        map: ClusterMap,
        config: RaftConfig,
        transport: Arc<T>,
    ) -> Result<RaftGroup, RaftGroupError> {
        let raft_config = openraft::Config {
            heartbeat_interval: config.heartbeat_interval_ms,
            election_timeout_min: config.election_timeout_min_ms,
            election_timeout_max: config.election_timeout_max_ms,
            ..Default::default()
        }
        .validate()
        .map_err(|e| RaftGroupError::Config(e.to_string()))?;
        let machine = MapMachine::new(map);
        let raft = openraft::Raft::new(
            id,
            Arc::new(raft_config),
            PeerFactory { transport },
            LogStore::default(),
            machine.clone(),
        )
        .await
        .map_err(|e| RaftGroupError::Raft(e.to_string()))?;
        Ok(RaftGroup { id, raft, machine })
    }

    /// This replica's node id.
    pub fn id(&self) -> RaftNodeId {
        self.id
    }

    /// Woken (one permit) whenever this replica applies a new map: a cell waits on it to
    /// install the map at once rather than at its next poll of `current_map`.
    pub fn map_changed(&self) -> std::sync::Arc<tokio::sync::Notify> {
        self.machine.changed()
    }

    /// Forms a new group with these voters (node id → cell id). Call once, on one replica.
    pub async fn initialize(
        &self,
        voters: &BTreeMap<RaftNodeId, CellId>,
    ) -> Result<(), RaftGroupError> {
        let members: BTreeMap<RaftNodeId, BasicNode> = voters
            .iter()
            .map(|(id, cell)| (*id, BasicNode::new(cell.to_string())))
            .collect();
        self.raft
            .initialize(members)
            .await
            .map_err(|e| RaftGroupError::Raft(e.to_string()))
    }

    /// Adds `id` (cell `cell`) as a learner and waits until it has caught up with the log.
    /// Call on the leader. A learner receives every map but does not vote.
    pub async fn add_learner(&self, id: RaftNodeId, cell: &CellId) -> Result<(), RaftGroupError> {
        let node = BasicNode::new(cell.to_string());
        self.raft
            .add_learner(id, node, true)
            .await
            .map(|_| ())
            .map_err(|e| RaftGroupError::Raft(e.to_string()))
    }

    /// Makes exactly `voters` the voting members (joint consensus, two commits); members not
    /// listed stay as learners. Call on the leader, with ids already added as learners. The
    /// node computes the set with `Membership::from_map` as cells join and leave.
    pub async fn change_voters(
        &self,
        voters: std::collections::BTreeSet<RaftNodeId>,
    ) -> Result<(), RaftGroupError> {
        self.raft
            .change_membership(voters, true)
            .await
            .map(|_| ())
            .map_err(|e| RaftGroupError::Raft(e.to_string()))
    }

    /// Removes `ids` from the group entirely (they must not be voters any more): a departed
    /// cell must stop receiving the log, since a new process may later listen at its address.
    /// Call on the leader.
    pub async fn remove_members(
        &self,
        ids: std::collections::BTreeSet<RaftNodeId>,
    ) -> Result<(), RaftGroupError> {
        self.raft
            .change_membership(openraft::ChangeMembers::RemoveNodes(ids), false)
            .await
            .map(|_| ())
            .map_err(|e| RaftGroupError::Raft(e.to_string()))
    }

    /// Whether the membership committed as this replica knows it counts it as a voter. A
    /// cell that leaves the ring stops only once this is false (a majority of the voters
    /// left then holds a membership without it), or the cells left could be short of a
    /// quorum for good. Latest but uncommitted memberships do not count: a leader that
    /// stepped down may hold one that will never be committed.
    pub async fn votes(&self) -> Result<bool, RaftGroupError> {
        let id = self.id;
        self.raft
            .with_raft_state(move |state| {
                let committed = state.membership_state.committed();
                committed.membership().voter_ids().any(|v| v == id)
            })
            .await
            .map_err(|e| RaftGroupError::Raft(e.to_string()))
    }

    /// The leader's node id, as this replica last heard.
    pub fn leader(&self) -> Option<RaftNodeId> {
        self.raft.metrics().borrow().current_leader
    }

    /// Answers a peer's RPC (the receiving end of [`RaftTransport::call`]): the reply bytes to
    /// send back. Undecodable requests get an error (the peer treats it as a network failure).
    pub async fn handle_rpc(&self, rpc: RaftRpc, body: &[u8]) -> Result<Vec<u8>, TransportError> {
        let bad = |e: serde_json::Error| TransportError {
            target: self.id,
            reason: e.to_string(),
        };
        let reply = match rpc {
            RaftRpc::AppendEntries => {
                let req: AppendEntriesRequest<MapRaft> =
                    serde_json::from_slice(body).map_err(bad)?;
                serde_json::to_vec(&self.raft.append_entries(req).await)
            }
            RaftRpc::Vote => {
                let req: VoteRequest<RaftNodeId> = serde_json::from_slice(body).map_err(bad)?;
                serde_json::to_vec(&self.raft.vote(req).await)
            }
            RaftRpc::InstallSnapshot => {
                let req: InstallSnapshotRequest<MapRaft> =
                    serde_json::from_slice(body).map_err(bad)?;
                serde_json::to_vec(&self.raft.install_snapshot(req).await)
            }
        };
        reply.map_err(bad)
    }

    /// The node a Raft RPC says it comes from: the leader for appends and snapshots, the
    /// candidate for a vote (the `vote` every one of them carries). The receiver checks it
    /// against the cell that sent the frame before handling the RPC. `None`: not a Raft
    /// RPC this version sends.
    pub fn rpc_sender(rpc: RaftRpc, body: &[u8]) -> Option<RaftNodeId> {
        #[derive(Deserialize)]
        struct Head {
            vote: openraft::Vote<RaftNodeId>,
        }
        // Every one of the three requests has its `vote` at the top level.
        let _ = rpc;
        let head: Head = serde_json::from_slice(body).ok()?;
        head.vote.leader_id().voted_for()
    }

    /// Whether `epoch` is the group's current map: a linearizable read through the leader
    /// (what `ring::Output::ConfirmMap` asks). False on a follower or without quorum.
    pub async fn confirm_map(&self, epoch: u64) -> bool {
        self.raft.ensure_linearizable().await.is_ok() && self.current_map().epoch() == epoch
    }

    /// Stops this replica's tasks.
    pub async fn shutdown(&self) -> Result<(), RaftGroupError> {
        self.raft
            .shutdown()
            .await
            .map_err(|e| RaftGroupError::Raft(e.to_string()))
    }
}

impl Consensus for RaftGroup {
    async fn propose(&self, proposal: Proposal) -> Result<ClusterMap, ConsensusError> {
        match self.raft.client_write(proposal).await {
            Ok(response) => match response.data {
                CommitOutcome::Applied(map) => Ok(map),
                CommitOutcome::Refused(e) => Err(ConsensusError::Refused(e)),
                CommitOutcome::Internal => Err(ConsensusError::Unavailable(
                    "proposal committed as internal".into(),
                )),
            },
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
                let leader = f.leader_node.and_then(|n| n.addr.parse().ok());
                Err(ConsensusError::NotLeader { leader })
            }
            Err(e) => Err(ConsensusError::Unavailable(e.to_string())),
        }
    }

    fn current_map(&self) -> ClusterMap {
        self.machine.current_map()
    }

    fn current_epoch(&self) -> u64 {
        self.machine.current_epoch()
    }

    fn membership(&self) -> Membership {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        let config = metrics.membership_config.membership();
        let cell = |id: RaftNodeId| {
            config
                .get_node(&id)
                .and_then(|n| n.addr.parse::<CellId>().ok())
        };
        Membership {
            voters: config.voter_ids().filter_map(cell).collect(),
            learners: config.learner_ids().filter_map(cell).collect(),
        }
    }
}

mod store;
#[cfg(test)]
mod tests;
