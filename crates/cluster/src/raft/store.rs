//! In-memory storage of the map group: the Raft log ([`LogStore`]) and the state machine
//! ([`MapMachine`]) whose state is the cluster map and whose transition is `change::apply`.
//! Both keep their data behind a `std::sync::Mutex` that is never held across an await, so
//! the async storage traits never block the runtime for longer than a map clone.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::io::Cursor;
use std::ops::RangeBounds;
use std::sync::{Arc, Mutex};

use openraft::storage::{LogFlushed, LogState, RaftLogStorage, RaftStateMachine, Snapshot};
use openraft::{
    BasicNode, Entry, EntryPayload, LogId, OptionalSend, RaftLogReader, RaftSnapshotBuilder,
    SnapshotMeta, StorageError, StorageIOError, StoredMembership, Vote,
};

use super::{CommitOutcome, MapRaft, RaftNodeId};
use crate::change;
use crate::map::{ClusterMap, MAP_BYTES_MAX_DEFAULT};

#[derive(Debug, Default)]
struct LogData {
    last_purged: Option<LogId<RaftNodeId>>,
    entries: BTreeMap<u64, Entry<MapRaft>>,
    committed: Option<LogId<RaftNodeId>>,
    vote: Option<Vote<RaftNodeId>>,
}

/// In-memory Raft log. The mutex is never held across an await.
#[derive(Debug, Clone, Default)]
pub(super) struct LogStore {
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

#[derive(Debug)]
struct MachineData {
    last_applied: Option<LogId<RaftNodeId>>,
    membership: StoredMembership<RaftNodeId, BasicNode>,
    map: ClusterMap,
    snapshot: Option<(SnapshotMeta<RaftNodeId, BasicNode>, Vec<u8>)>,
    snapshots_built: u64,
}

/// The replicated state: the cluster map. Cloned handles share it (`RaftGroup` reads it).
#[derive(Debug, Clone)]
pub(super) struct MapMachine {
    data: Arc<Mutex<MachineData>>,
    /// Woken whenever the map changes (an entry applied, a snapshot installed), so the
    /// cell installs it at once instead of at its next poll.
    changed: Arc<tokio::sync::Notify>,
}

impl MapMachine {
    /// A state machine whose state starts at `map`.
    pub(super) fn new(map: ClusterMap) -> MapMachine {
        MapMachine {
            data: Arc::new(Mutex::new(MachineData {
                last_applied: None,
                membership: StoredMembership::default(),
                map,
                snapshot: None,
                snapshots_built: 0,
            })),
            changed: Arc::default(),
        }
    }

    /// What [`MapMachine::changed`] wakes.
    pub(super) fn changed(&self) -> Arc<tokio::sync::Notify> {
        self.changed.clone()
    }

    /// The latest applied map.
    pub(super) fn current_map(&self) -> ClusterMap {
        self.lock().map.clone()
    }

    /// The latest applied map's epoch.
    pub(super) fn current_epoch(&self) -> u64 {
        self.lock().map.epoch()
    }

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
        drop(data);
        if outcomes
            .iter()
            .any(|o| matches!(o, CommitOutcome::Applied(_)))
        {
            self.changed.notify_one();
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
        drop(data);
        self.changed.notify_one();
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
