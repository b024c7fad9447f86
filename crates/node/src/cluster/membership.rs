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

impl Cluster {
    /// On the leader: makes the consensus group's membership follow the map (new cells
    /// learn, `Membership::from_map` votes).
    pub(super) fn reconcile_membership(self: &Arc<Self>) {
        if self.reconciling.swap(true, Ordering::AcqRel) {
            return;
        }
        let cl = self.clone();
        self.handle.spawn(async move {
            for _ in 0..10 {
                let Some(raft) = cl.raft.get() else { break };
                if raft.leader() != Some(raft.id()) {
                    break;
                }
                let map = raft.current_map();
                let want = cellcache_cluster::Membership::from_map(&map, cl.config.voters_max);
                let have = raft.membership();
                let mut changed = false;
                for c in map.cells() {
                    if !have.voters.contains(&c.id) && !have.learners.contains(&c.id) {
                        tracing::info!(cell = %c.id, "adding cell to the consensus group as a learner");
                        let add = raft.add_learner(group::raft_id(&c.id), &c.id);
                        match tokio::time::timeout(Duration::from_secs(10), add).await {
                            Ok(Ok(())) => changed = true,
                            Ok(Err(e)) => tracing::warn!(cell = %c.id, error = %e, "add learner failed"),
                            Err(_) => tracing::warn!(cell = %c.id, "add learner timed out"),
                        }
                    }
                }
                if want.voters != raft.membership().voters {
                    let ids = want.voters.iter().map(group::raft_id).collect();
                    match raft.change_voters(ids).await {
                        Ok(()) => {
                            changed = true;
                            tracing::info!(voters = ?want.voters, "consensus voters changed");
                        }
                        Err(e) => tracing::warn!(error = %e, "changing voters failed"),
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
                    match raft.remove_members(ids).await {
                        Ok(()) => {
                            changed = true;
                            tracing::info!(cells = ?gone, "departed cells left the consensus group");
                        }
                        Err(e) => tracing::warn!(error = %e, "removing departed cells failed"),
                    }
                }
                if !changed {
                    break;
                }
            }
            cl.reconciling.store(false, Ordering::Release);
        });
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
