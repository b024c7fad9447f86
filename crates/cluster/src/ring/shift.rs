//! Where a moving part is: a shift's targets that receive it before the flip, the divisions
//! a map flips, and whether a cell already held all of a range (so it needs no
//! re-replication after).

use super::*;

/// The ranges `me` receives in `map` as a shift's target: held beside its backups until the
/// shift completes (or is aborted, when the next holdings drop them).
pub fn incoming_shifts(map: &ClusterMap, me: &CellId) -> Vec<HashRange> {
    map.migrations()
        .iter()
        .filter_map(|m| match m {
            Migration::Shift { targets, range, .. } if targets.contains(me) => Some(*range),
            _ => None,
        })
        .collect()
}

/// Whether `cell` held a copy of every hash of `range` under `map` (as master, backup or a
/// shift's target).
pub(super) fn held_all(map: &ClusterMap, cell: &CellId, range: HashRange) -> bool {
    let mut held: Vec<HashRange> = map
        .backup_ranges(cell)
        .into_iter()
        .map(|(_, r)| r)
        .chain(incoming_shifts(map, cell))
        .collect();
    held.extend(
        map.cell(cell)
            .filter(|c| c.state == CellState::Active)
            .and_then(|c| c.range),
    );
    let mut missing = vec![range];
    for h in &held {
        missing = missing.iter().flat_map(|m| m.minus(h)).collect();
    }
    missing.is_empty()
}

/// The divisions `new` completes that `old` had in flight, as (parent, child): the child is
/// Active in `new` and the migration is gone.
pub(super) fn flipped_divisions(old: &ClusterMap, new: &ClusterMap) -> Vec<(CellId, CellId)> {
    old.migrations()
        .iter()
        .filter_map(|m| match m {
            Migration::Division { parent, child, .. }
                if !new.migrations().contains(m)
                    && new
                        .cell(child)
                        .is_some_and(|c| c.state == CellState::Active) =>
            {
                Some((parent.clone(), child.clone()))
            }
            _ => None,
        })
        .collect()
}
