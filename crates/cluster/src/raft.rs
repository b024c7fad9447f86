//! The multi-voter consensus group: [`RaftGroup`], an openraft 0.9 implementation of
//! [`Consensus`], over a network seam of our own ([`RaftTransport`]).
//!
//! This is the one module of the crate that runs asynchronously: openraft drives elections
//! and replication with tasks and timers on the caller's tokio runtime. Everything else it
//! needs is here and small: an in-memory log store, a state machine whose state is the
//! [`ClusterMap`] and whose transition function is [`change::apply`], and a network adapter
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
//! does with a restarted cell anyway (SPEC C9).

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::future::Future;
use std::io::Cursor;
use std::ops::RangeBounds;
use std::sync::{Arc, Mutex};

use openraft::error::{
    ClientWriteError, InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError,
};
use openraft::network::RPCOption;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::storage::{LogFlushed, LogState, RaftLogStorage, RaftStateMachine, Snapshot};
use openraft::{
    BasicNode, Entry, EntryPayload, LogId, OptionalSend, RaftLogReader, RaftNetwork,
    RaftNetworkFactory, RaftSnapshotBuilder, SnapshotMeta, StorageError, StorageIOError,
    StoredMembership, Vote,
};
use serde::{Deserialize, Serialize};

use crate::change::{self, ChangeError, Proposal};
use crate::consensus::{Consensus, ConsensusError, Membership};
use crate::id::CellId;
use crate::map::{ClusterMap, MAP_BYTES_MAX_DEFAULT};

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
// Log store

#[derive(Debug, Default)]
struct LogData {
    last_purged: Option<LogId<RaftNodeId>>,
    entries: BTreeMap<u64, Entry<MapRaft>>,
    committed: Option<LogId<RaftNodeId>>,
    vote: Option<Vote<RaftNodeId>>,
}

/// In-memory Raft log. The mutex is never held across an await.
#[derive(Debug, Clone, Default)]
struct LogStore {
    data: Arc<Mutex<LogData>>,
}

impl LogStore {
    fn lock(&self) -> std::sync::MutexGuard<'_, LogData> {
        self.data.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl RaftLogReader<MapRaft> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<MapRaft>>, StorageError<RaftNodeId>> {
        Ok(self
            .lock()
            .entries
            .range(range)
            .map(|(_, e)| e.clone())
            .collect())
    }
}

impl RaftLogStorage<MapRaft> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<MapRaft>, StorageError<RaftNodeId>> {
        let data = self.lock();
        let last = data
            .entries
            .values()
            .next_back()
            .map(|e| e.log_id)
            .or(data.last_purged);
        Ok(LogState {
            last_purged_log_id: data.last_purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<RaftNodeId>) -> Result<(), StorageError<RaftNodeId>> {
        self.lock().vote = Some(*vote);
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<RaftNodeId>>, StorageError<RaftNodeId>> {
        Ok(self.lock().vote)
    }

    async fn save_committed(
        &mut self,
        committed: Option<LogId<RaftNodeId>>,
    ) -> Result<(), StorageError<RaftNodeId>> {
        self.lock().committed = committed;
        Ok(())
    }

    async fn read_committed(
        &mut self,
    ) -> Result<Option<LogId<RaftNodeId>>, StorageError<RaftNodeId>> {
        Ok(self.lock().committed)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<MapRaft>,
    ) -> Result<(), StorageError<RaftNodeId>>
    where
        I: IntoIterator<Item = Entry<MapRaft>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        {
            let mut data = self.lock();
            for entry in entries {
                data.entries.insert(entry.log_id.index, entry);
            }
        }
        // In memory, the append is durable as soon as it is done.
        callback.log_io_completed(Ok(()));
        Ok(())
    }

    async fn truncate(
        &mut self,
        log_id: LogId<RaftNodeId>,
    ) -> Result<(), StorageError<RaftNodeId>> {
        self.lock().entries.split_off(&log_id.index);
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId<RaftNodeId>) -> Result<(), StorageError<RaftNodeId>> {
        let mut data = self.lock();
        data.last_purged = Some(log_id);
        let keep = data.entries.split_off(&(log_id.index + 1));
        data.entries = keep;
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// State machine

#[derive(Debug)]
struct MachineData {
    last_applied: Option<LogId<RaftNodeId>>,
    membership: StoredMembership<RaftNodeId, BasicNode>,
    map: ClusterMap,
    snapshot: Option<(SnapshotMeta<RaftNodeId, BasicNode>, Vec<u8>)>,
    snapshots_built: u64,
}

/// The replicated state: the cluster map. Shared with [`RaftGroup`] for `current_map`.
#[derive(Debug, Clone)]
struct MapMachine {
    data: Arc<Mutex<MachineData>>,
}

impl MapMachine {
    fn lock(&self) -> std::sync::MutexGuard<'_, MachineData> {
        self.data.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl RaftSnapshotBuilder<MapRaft> for MapMachine {
    async fn build_snapshot(&mut self) -> Result<Snapshot<MapRaft>, StorageError<RaftNodeId>> {
        let mut data = self.lock();
        data.snapshots_built += 1;
        let bytes = data.map.encode();
        let last = data.last_applied;
        let snapshot_id = format!(
            "{}-{}-{}",
            last.map(|l| l.leader_id.term).unwrap_or(0),
            last.map(|l| l.index).unwrap_or(0),
            data.snapshots_built
        );
        let meta = SnapshotMeta {
            last_log_id: last,
            last_membership: data.membership.clone(),
            snapshot_id,
        };
        data.snapshot = Some((meta.clone(), bytes.clone()));
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(bytes)),
        })
    }
}

impl RaftStateMachine<MapRaft> for MapMachine {
    type SnapshotBuilder = Self;

    async fn applied_state(
        &mut self,
    ) -> Result<
        (
            Option<LogId<RaftNodeId>>,
            StoredMembership<RaftNodeId, BasicNode>,
        ),
        StorageError<RaftNodeId>,
    > {
        let data = self.lock();
        Ok((data.last_applied, data.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<CommitOutcome>, StorageError<RaftNodeId>>
    where
        I: IntoIterator<Item = Entry<MapRaft>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut data = self.lock();
        let mut outcomes = Vec::new();
        for entry in entries {
            data.last_applied = Some(entry.log_id);
            let outcome = match entry.payload {
                EntryPayload::Blank => CommitOutcome::Internal,
                EntryPayload::Normal(proposal) => match change::apply(&data.map, &proposal) {
                    Ok(next) => {
                        data.map = next.clone();
                        CommitOutcome::Applied(next)
                    }
                    Err(e) => CommitOutcome::Refused(e),
                },
                EntryPayload::Membership(m) => {
                    data.membership = StoredMembership::new(Some(entry.log_id), m);
                    CommitOutcome::Internal
                }
            };
            outcomes.push(outcome);
        }
        Ok(outcomes)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(
        &mut self,
    ) -> Result<Box<Cursor<Vec<u8>>>, StorageError<RaftNodeId>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<RaftNodeId, BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError<RaftNodeId>> {
        let bytes = snapshot.into_inner();
        let map = ClusterMap::decode(&bytes, MAP_BYTES_MAX_DEFAULT).map_err(|e| {
            StorageError::from(StorageIOError::read_snapshot(Some(meta.signature()), &e))
        })?;
        let mut data = self.lock();
        data.map = map;
        data.last_applied = meta.last_log_id;
        data.membership = meta.last_membership.clone();
        data.snapshot = Some((meta.clone(), bytes));
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<MapRaft>>, StorageError<RaftNodeId>> {
        let data = self.lock();
        Ok(data.snapshot.as_ref().map(|(meta, bytes)| Snapshot {
            meta: meta.clone(),
            snapshot: Box::new(Cursor::new(bytes.clone())),
        }))
    }
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
        let machine = MapMachine {
            data: Arc::new(Mutex::new(MachineData {
                last_applied: None,
                membership: StoredMembership::default(),
                map,
                snapshot: None,
                snapshots_built: 0,
            })),
        };
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
        self.machine.lock().map.clone()
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

#[cfg(test)]
mod tests;
