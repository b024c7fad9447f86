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

    /// The part of `from`'s range a shift of `share` (0 to 1) of it to its neighbour `to`
    /// moves: the end next to `to`, at least one hash and never all of them. `None` when
    /// `from` masters nothing or `to` is not its neighbour.
    pub fn shift_part(&self, from: &CellId, to: &CellId, share: f64) -> Option<HashRange> {
        let given = self
            .cell(from)
            .filter(|c| c.state == CellState::Active)?
            .range?;
        let len = given.len();
        if len < 2 || !share.is_finite() {
            return None;
        }
        let part = ((len as f64 * share.clamp(0.0, 1.0)) as u128).clamp(1, len - 1) as u64;
        if self.successor(from).is_some_and(|c| c.id == *to) {
            Some(HashRange::new(given.end.wrapping_sub(part - 1), given.end))
        } else if self.predecessor(from).is_some_and(|c| c.id == *to) {
            Some(HashRange::new(
                given.start,
                given.start.wrapping_add(part - 1),
            ))
        } else {
            None
        }
    }

    /// Whether `id` holds a copy of `hash` as master or backup under this map.
    pub fn holds_copy(&self, id: &CellId, hash: u64) -> bool {
        let owner = self.owner(hash);
        owner.id == *id || self.backups(&owner.id).iter().any(|c| c.id == *id)
    }
}
