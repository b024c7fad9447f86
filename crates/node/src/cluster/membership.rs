//! Who is in the ring: admitting a joining cell (a division of a parent's range), starting
//! a cell's absorption when it leaves, and, on the leader, keeping the consensus group's
//! membership in step with the map.

use super::*;

/// Why a cell was not admitted, or a leave not begun.
#[derive(Debug, thiserror::Error)]
pub enum MembershipError {
    /// A cell that died at this address is still being absorbed: the new process must come
    /// in as a new cell (empty store, new id) once that is done.
    #[error(
        "address {address} still belongs to cell {cell} ({state:?}); retry after its absorption"
    )]
    AddressInUse {
        address: String,
        cell: CellId,
        state: CellState,
    },
    /// No cell of the map can divide.
    #[error("no active cell")]
    NoActiveCell,
    /// A shift between cells that are not Active neighbours (or a share that moves nothing).
    #[error("cell {0} has no part to give its neighbour {1}")]
    NotNeighbours(String, String),
    /// The ring did not commit the change.
    #[error(transparent)]
    NotCommitted(#[from] group::ProposeError),
}

/// How often a leaving cell looks whether it still votes ([`Cluster::leave_the_voters`]).
const LEAVE_VOTERS_POLL: Duration = Duration::from_millis(50);

/// Reconciliation passes in a row at most (see [`Cluster::reconcile_membership`]).
const RECONCILE_PASSES_MAX: usize = 10;

impl Cluster {
    /// On the leader: makes the consensus group's membership follow the map (new cells
    /// learn, `Membership::from_map` votes). One pass runs at a time; a call during a pass
    /// makes it look at the map again when it ends, so no map change goes unreconciled (a
    /// call dropped while a pass finished reading an older map once left a departing voter
    /// counted as one: the last cell of the 1 → N → 1 run without a quorum).
    pub(super) fn reconcile_membership(self: &Arc<Self>) {
        self.reconcile_wanted.store(true, Ordering::Release);
        if self.reconciling.swap(true, Ordering::AcqRel) {
            return;
        }
        let cl = self.clone();
        self.handle.spawn(async move {
            loop {
                cl.reconcile_passes().await;
                cl.reconciling.store(false, Ordering::Release);
                // A call between the last pass's read of the wish and the store above found
                // the flag set and left: run again for it, unless another runner took over.
                if !cl.reconcile_wanted.load(Ordering::Acquire)
                    || cl.reconciling.swap(true, Ordering::AcqRel)
                {
                    break;
                }
            }
        });
    }

    /// Reconciliation passes until one changes nothing and no new call came meanwhile
    /// (at most `RECONCILE_PASSES_MAX` in a row: a change that keeps failing is retried at
    /// the next call, not in a tight loop).
    async fn reconcile_passes(self: &Arc<Self>) {
        let timeout = self.membership_change_timeout();
        for _ in 0..RECONCILE_PASSES_MAX {
            // This pass reads the map after this: calls until here are answered by it.
            self.reconcile_wanted.store(false, Ordering::Release);
            let Some(raft) = self.raft.get() else { break };
            if raft.leader() != Some(raft.id()) {
                break;
            }
            let map = raft.current_map();
            let want = cellcache_cluster::Membership::from_map(&map, self.config.voters_max);
            let have = raft.membership();
            let mut changed = false;
            for c in map.cells() {
                if !have.voters.contains(&c.id) && !have.learners.contains(&c.id) {
                    tracing::info!(cell = %c.id, "adding cell to the consensus group as a learner");
                    let add = raft.add_learner(group::raft_id(&c.id), &c.id);
                    match tokio::time::timeout(timeout, add).await {
                        Ok(Ok(())) => changed = true,
                        Ok(Err(e)) => {
                            tracing::warn!(cell = %c.id, error = %e, "add learner failed")
                        }
                        Err(_) => tracing::warn!(cell = %c.id, "add learner timed out"),
                    }
                }
            }
            if want.voters != raft.membership().voters {
                let ids = want.voters.iter().map(group::raft_id).collect();
                match tokio::time::timeout(timeout, raft.change_voters(ids)).await {
                    Ok(Ok(())) => {
                        changed = true;
                        tracing::info!(voters = ?want.voters, "consensus voters changed");
                    }
                    Ok(Err(e)) => tracing::warn!(error = %e, "changing voters failed"),
                    Err(_) => tracing::warn!(voters = ?want.voters, "changing voters timed out"),
                }
            }
            // Departed cells (kept as learners when they stopped voting) leave the group.
            let gone: BTreeSet<CellId> = raft
                .membership()
                .learners
                .into_iter()
                .filter(|c| !want.learners.contains(c) && !want.voters.contains(c))
                .collect();
            if !gone.is_empty() {
                let ids = gone.iter().map(group::raft_id).collect();
                match tokio::time::timeout(timeout, raft.remove_members(ids)).await {
                    Ok(Ok(())) => {
                        changed = true;
                        tracing::info!(cells = ?gone, "departed cells left the consensus group");
                    }
                    Ok(Err(e)) => tracing::warn!(error = %e, "removing departed cells failed"),
                    Err(_) => tracing::warn!(cells = ?gone, "removing departed cells timed out"),
                }
            }
            if !changed && !self.reconcile_wanted.load(Ordering::Acquire) {
                break;
            }
        }
    }

    /// A cell that left the ring, before it stops: waits until the consensus group no
    /// longer counts it as a voter (at most `leave_voters_wait_ms`). The leader takes it out
    /// when the cell starts leaving, but the cell may be the leader itself, or the change
    /// may still be under way; stopping first left the last cell of a ring of two without a
    /// quorum, serving no key request ever after.
    pub(super) async fn leave_the_voters(self: &Arc<Self>) {
        let Some(raft) = self.raft.get() else { return };
        let wait = Duration::from_millis(self.config.leave_voters_wait_ms);
        let until = tokio::time::Instant::now() + wait;
        let mut logged = false;
        while raft.votes().await.unwrap_or(false) {
            if tokio::time::Instant::now() >= until {
                tracing::warn!(cell = %self.me, ?wait, "stopping while the consensus group may still count this cell as a voter");
                return;
            }
            if !std::mem::replace(&mut logged, true) {
                tracing::info!(cell = %self.me, "waiting to leave the consensus voters before stopping");
            }
            if raft.leader() == Some(raft.id()) {
                self.reconcile_membership();
            }
            tokio::time::sleep(LEAVE_VOTERS_POLL).await;
        }
    }

    /// How long one change of the consensus group's membership may take before a
    /// reconciliation pass gives up on it (and the next call retries): a change waiting on a
    /// voter that is gone must not hold every later one back.
    fn membership_change_timeout(&self) -> Duration {
        Duration::from_millis(self.config.request_timeout_ms * 4)
    }

    /// `cluster join`: a new cell at `address` divides `parent` (default: the cell with the
    /// largest range). Resolves to the committed map.
    pub async fn admit(
        self: &Arc<Self>,
        address: CellAddress,
        parent: Option<CellId>,
    ) -> Result<ClusterMap, MembershipError> {
        let deadline = Instant::now() + Duration::from_millis(self.config.request_timeout_ms * 4);
        loop {
            let map = self.lock_ring().map().clone();
            if let Some(c) = map.cells().iter().find(|c| c.address == address) {
                if c.state == CellState::Joining {
                    // Already admitted (a retried join): answer with the map that has it.
                    return Ok(map);
                }
                return Err(MembershipError::AddressInUse {
                    address: address.client.clone(),
                    cell: c.id.clone(),
                    state: c.state,
                });
            }
            let parent = match &parent {
                Some(p) => p.clone(),
                None => map
                    .active_cells()
                    .max_by_key(|c| c.range.map_or(0, |r| r.len()))
                    .map(|c| c.id.clone())
                    .ok_or(MembershipError::NoActiveCell)?,
            };
            let p = Proposal {
                based_on_epoch: map.epoch(),
                change: Change::BeginDivision {
                    parent,
                    child_address: address.clone(),
                },
            };
            match group::propose(
                self,
                p,
                Duration::from_millis(self.config.request_timeout_ms),
            )
            .await
            {
                Ok(m) => {
                    self.install_map(m.clone());
                    return Ok(m);
                }
                Err(e) if Instant::now() >= deadline => return Err(e.into()),
                Err(e) => {
                    tracing::debug!(error = %e, "join proposal not committed; retrying");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    }

    /// `cluster leave CELL` / the ring's own leave: proposes the cell's absorption.
    /// Begins a shift (balancing): `share` (0 to 1) of `from`'s range, the end next to its
    /// neighbour `to`, moves to `to`. The giving cell streams it and completes the change.
    pub async fn shift(
        self: &Arc<Self>,
        from: CellId,
        to: CellId,
        share: f64,
    ) -> Result<ClusterMap, MembershipError> {
        let map = self.lock_ring().map().clone();
        let range = map
            .shift_part(&from, &to, share)
            .ok_or_else(|| MembershipError::NotNeighbours(from.to_string(), to.to_string()))?;
        self.change(map.epoch(), Change::BeginShift { from, to, range })
            .await
    }

    pub async fn leave(self: &Arc<Self>, cell: CellId) -> Result<ClusterMap, MembershipError> {
        let epoch = self.epoch();
        let change = Change::BeginAbsorption {
            departed: cell,
            reason: cellcache_cluster::AbsorptionReason::Leaving,
        };
        self.change(epoch, change).await
    }

    /// Proposes `change` to the map of `epoch`, and installs the map that commits it.
    async fn change(
        self: &Arc<Self>,
        epoch: u64,
        change: Change,
    ) -> Result<ClusterMap, MembershipError> {
        let p = Proposal {
            based_on_epoch: epoch,
            change,
        };
        let wait = Duration::from_millis(self.config.request_timeout_ms);
        let m = group::propose(self, p, wait).await?;
        self.install_map(m.clone());
        Ok(m)
    }
}
