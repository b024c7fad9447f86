//! The consensus seam: how a cell gets map changes agreed, behind a trait of our own.
//!
//! The cluster map changes only through [`Consensus::propose`], which returns the committed
//! map or a typed refusal; every replica of the group applies committed proposals with
//! [`crate::change::apply`], so all of them hold the same map at each epoch. The rest of the
//! code base depends on this trait, not on a Raft library, so the library can be swapped or
//! upgraded in one place and the ring can be simulated with a perfect oracle.
//!
//! Group shape: an odd number of voters, at most [`VOTERS_MAX_DEFAULT`], the other cells
//! follow as learners. [`Membership::from_map`] picks voters spread evenly around the ring,
//! so the correlated failure the ring already cannot survive (adjacent cells) costs at most one or two
//! voters rather than a quorum.
//!
//! [`LocalConsensus`] is the single-voter group: correct for a one-cell cluster, for tools
//! that edit a map offline, and for tests. The multi-voter group is `raft::RaftGroup`
//! (openraft, behind the default cargo feature `raft`).

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Mutex;

use crate::change::{self, ChangeError, Proposal};
use crate::id::CellId;
use crate::map::ClusterMap;

/// Default number of voters in the consensus group.
pub const VOTERS_MAX_DEFAULT: usize = 5;

/// Who votes and who only follows.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Membership {
    /// Cells that vote; a majority of them must be reachable for any map change.
    pub voters: BTreeSet<CellId>,
    /// Cells that receive the log without voting.
    pub learners: BTreeSet<CellId>,
}

impl Membership {
    /// Deterministic membership for `map`: an odd number of Active cells, up to
    /// `voters_max`, spread evenly around the ring vote; every other cell in the map (any
    /// state) learns. An even group survives no more voters lost than the odd one below it
    /// and has one more whose loss can cost the quorum: two voters stop every map change
    /// when either dies, one voter and a learner only when the voter does — so a ring of
    /// one that divided goes on, and absorbs the new cell, when that new cell dies.
    pub fn from_map(map: &ClusterMap, voters_max: usize) -> Membership {
        let active: Vec<&CellId> = map.active_cells().map(|c| &c.id).collect();
        let n = active.len();
        let v = voters_max.min(n).max(1);
        let v = if v % 2 == 0 { v - 1 } else { v };
        // Evenly spaced indices: floor(i * n / v) are distinct for v <= n.
        let voters: BTreeSet<CellId> = (0..v).map(|i| active[i * n / v].clone()).collect();
        let learners = map
            .cells()
            .iter()
            .map(|c| c.id.clone())
            .filter(|id| !voters.contains(id))
            .collect();
        Membership { voters, learners }
    }
}

/// Why a proposal was not committed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConsensusError {
    /// Committed to the log but refused by the transition rules (stale epoch, overlap, …):
    /// the map did not change. Re-read the map and decide again.
    #[error("change refused: {0}")]
    Refused(#[from] ChangeError),
    /// This replica is not the leader; retry there (if known).
    #[error("not the leader (leader: {leader:?})")]
    NotLeader { leader: Option<CellId> },
    /// No quorum within the implementation's timeout: the outcome is unknown until the map is
    /// read again (the change may still commit).
    #[error("consensus unavailable: {0}")]
    Unavailable(String),
}

/// A consensus group agreeing on the cluster map. `propose` is asynchronous because a real
/// group needs network round trips; callers run it on the control plane, never on the
/// request path.
pub trait Consensus {
    /// Proposes a change; resolves to the map it produced once committed and applied.
    fn propose(
        &self,
        proposal: Proposal,
    ) -> impl Future<Output = Result<ClusterMap, ConsensusError>> + Send;
    /// The latest map this replica has applied.
    fn current_map(&self) -> ClusterMap;
    /// That map's epoch, without copying the map (asked every tick of a cell's drive loop).
    fn current_epoch(&self) -> u64 {
        self.current_map().epoch()
    }
    /// The group's voters and learners.
    fn membership(&self) -> Membership;
}

/// A consensus group of exactly one voter, in process. Proposals commit immediately; the
/// mutex serializes concurrent proposers, so of two racing changes computed against one epoch
/// exactly one commits and the other is refused as stale.
#[derive(Debug)]
pub struct LocalConsensus {
    map: Mutex<ClusterMap>,
}

impl LocalConsensus {
    /// A group whose log starts at `map`.
    pub fn new(map: ClusterMap) -> LocalConsensus {
        LocalConsensus {
            map: Mutex::new(map),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ClusterMap> {
        // A panic while holding the lock cannot leave a half-applied map: `apply` is pure and
        // the map is replaced in one assignment, so the poisoned value is still consistent.
        self.map
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Consensus for LocalConsensus {
    fn propose(
        &self,
        proposal: Proposal,
    ) -> impl Future<Output = Result<ClusterMap, ConsensusError>> + Send {
        let outcome = {
            let mut map = self.lock();
            change::apply(&map, &proposal).inspect(|next| *map = next.clone())
        };
        std::future::ready(outcome.map_err(ConsensusError::Refused))
    }

    fn current_map(&self) -> ClusterMap {
        self.lock().clone()
    }

    fn membership(&self) -> Membership {
        Membership::from_map(&self.lock(), 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::change::Change;
    use crate::map::CellAddress;

    fn addr(n: u32) -> CellAddress {
        CellAddress {
            client: format!("127.0.0.1:{}", 22000 + n),
            peer: format!("127.0.0.1:{}", 32000 + n),
        }
    }

    /// LocalConsensus futures are ready at once; poll them without an executor.
    fn now<T>(f: impl Future<Output = T>) -> T {
        let mut f = std::pin::pin!(f);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match f.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(v) => v,
            std::task::Poll::Pending => panic!("LocalConsensus future was not ready"),
        }
    }

    fn grown(cells: u32) -> ClusterMap {
        let group =
            LocalConsensus::new(ClusterMap::bootstrap(CellId::whole(1), addr(0), 2).unwrap());
        for n in 1..cells {
            let map = group.current_map();
            // Always divide the cell with the largest range, as the scale-out policy would.
            let parent = map
                .active_cells()
                .max_by_key(|c| c.range.unwrap().len())
                .unwrap()
                .id
                .clone();
            let m = now(group.propose(Proposal {
                based_on_epoch: map.epoch(),
                change: Change::BeginDivision {
                    parent,
                    child_address: addr(n),
                },
            }))
            .unwrap();
            let child = m.migrations()[0].involved().iter().find(|id| {
                m.cell(id)
                    .is_some_and(|c| c.state == crate::CellState::Joining)
            });
            let child = child.unwrap().clone();
            now(group.propose(Proposal {
                based_on_epoch: m.epoch(),
                change: Change::CompleteDivision { child },
            }))
            .unwrap();
        }
        group.current_map()
    }

    #[test]
    fn racing_proposals_commit_exactly_once() {
        let group = LocalConsensus::new(grown(3));
        let epoch = group.current_map().epoch();
        let p = |n| Proposal {
            based_on_epoch: epoch,
            change: Change::BeginDivision {
                parent: CellId::whole(1),
                child_address: addr(n),
            },
        };
        assert!(now(group.propose(p(10))).is_ok());
        assert!(matches!(
            now(group.propose(p(11))),
            Err(ConsensusError::Refused(ChangeError::StaleEpoch { .. }))
        ));
        assert_eq!(group.current_map().epoch(), epoch + 1);
    }

    #[test]
    fn voters_are_capped_and_spread() {
        let map = grown(12);
        let m = Membership::from_map(&map, VOTERS_MAX_DEFAULT);
        assert_eq!(m.voters.len(), 5);
        assert_eq!(m.voters.len() + m.learners.len(), map.cells().len());
        let ring: Vec<&CellId> = map.active_cells().map(|c| &c.id).collect();
        let positions: Vec<usize> = ring
            .iter()
            .enumerate()
            .filter(|(_, id)| m.voters.contains(**id))
            .map(|(i, _)| i)
            .collect();
        assert!(
            positions.windows(2).all(|w| w[1] - w[0] >= 2),
            "no two voters adjacent: {positions:?}"
        );
        let small = Membership::from_map(&grown(2), VOTERS_MAX_DEFAULT);
        assert_eq!((small.voters.len(), small.learners.len()), (1, 1));
    }

    #[test]
    fn voters_are_an_odd_number() {
        for cells in 1..=12u32 {
            let map = grown(cells);
            for cap in 1..=7 {
                let m = Membership::from_map(&map, cap);
                let want = cap.min(cells as usize);
                let want = want - (1 - want % 2);
                assert_eq!(m.voters.len(), want, "{cells} cells, voters_max {cap}");
                assert_eq!(m.voters.len() + m.learners.len(), cells as usize);
            }
        }
    }
}
