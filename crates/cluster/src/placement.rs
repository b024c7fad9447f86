//! Placement: the one place that decides which cell masters a key and which cells back it up.
//!
//! Everything that routes a request, replicates a write or plans a migration asks these
//! functions, so two cells holding the same map always agree. The owner of a hash is the
//! unique `Active` cell whose range contains it (the map's invariants make it unique and
//! total); backups are the next `replication_factor - 1` `Active` cells clockwise. `Joining`,
//! `Leaving` and `Dead` cells never own or back up anything in placement terms: their data
//! movements are described by the map's migration records.

use crate::id::CellId;
use crate::map::{Cell, CellState, ClusterMap};
use crate::range::HashRange;

pub use cellcache_keyspace::key_hash;

impl ClusterMap {
    /// The master of `hash`. O(log n) over the placement index built at validation.
    pub fn owner(&self, hash: u64) -> &Cell {
        // The Active cell with the greatest range start <= hash; if none, the hash lies in the
        // range that wraps past u64::MAX, which is the one with the greatest start.
        let idx = self.starts.partition_point(|&(start, _)| start <= hash);
        let slot = if idx == 0 {
            self.starts.len() - 1
        } else {
            idx - 1
        };
        &self.cells[self.starts[slot].1]
    }

    /// Active cells in ring (id) order.
    pub fn active_cells(&self) -> impl Iterator<Item = &Cell> + Clone {
        self.cells.iter().filter(|c| c.state == CellState::Active)
    }

    /// The next `replication_factor - 1` Active cells clockwise after `id` (fewer when the ring
    /// is smaller; never `id` itself). Works for any id, in the map or not, so a planner can ask
    /// "who would back up a cell placed here".
    pub fn backups(&self, id: &CellId) -> Vec<&Cell> {
        let wanted = usize::from(self.replication_factor).saturating_sub(1);
        let after = self.active_cells().filter(|c| c.id > *id);
        let before = self.active_cells().filter(|c| c.id < *id);
        after.chain(before).take(wanted).collect()
    }

    /// The predecessors `id` backs up (nearest first) with their ranges: the next
    /// `replication_factor - 1` Active cells counter-clockwise.
    pub fn backup_ranges(&self, id: &CellId) -> Vec<(&Cell, HashRange)> {
        let wanted = usize::from(self.replication_factor).saturating_sub(1);
        let before = self
            .active_cells()
            .filter(|c| c.id < *id)
            .collect::<Vec<_>>();
        let after = self
            .active_cells()
            .filter(|c| c.id > *id)
            .collect::<Vec<_>>();
        before
            .into_iter()
            .rev()
            .chain(after.into_iter().rev())
            .take(wanted)
            .filter_map(|c| c.range.map(|r| (c, r)))
            .collect()
    }

    /// The nearest Active cell clockwise after `id`, if any other exists.
    pub fn successor(&self, id: &CellId) -> Option<&Cell> {
        let after = self.active_cells().filter(|c| c.id > *id);
        let before = self.active_cells().filter(|c| c.id < *id);
        after.chain(before).next()
    }

    /// The nearest Active cell counter-clockwise before `id`, if any other exists.
    pub fn predecessor(&self, id: &CellId) -> Option<&Cell> {
        let before = self.active_cells().filter(|c| c.id < *id).last();
        before.or_else(|| self.active_cells().filter(|c| c.id > *id).last())
    }

    /// Whether `id` holds a copy of `hash` as master or backup under this map.
    pub fn holds_copy(&self, id: &CellId, hash: u64) -> bool {
        let owner = self.owner(hash);
        owner.id == *id || self.backups(&owner.id).iter().any(|c| c.id == *id)
    }
}
