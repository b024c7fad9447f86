//! Map transitions as pure, validated functions.
//!
//! Every change to the cluster map is a [`Proposal`] — a [`Change`] plus the epoch of the map it
//! was computed against — and [`apply`] turns `(map, proposal)` into the next map with
//! `epoch + 1`, or a typed [`ChangeError`]. The consensus group applies committed proposals
//! with this function on every replica, so it must be deterministic; it is also what makes the
//! map safe under concurrency:
//!
//! - a proposal computed against any epoch other than the current one is refused
//!   ([`ChangeError::StaleEpoch`]): two proposers racing on the same map never both win;
//! - a change whose involved cells intersect those of an in-flight migration is refused
//!   ([`ChangeError::Overlap`]): absorption and division never run on overlapping cells;
//! - the resulting map is re-validated, so every committed map has exactly one owner per hash.
//!
//! Involved cells: a division of X into N involves N, X, the `r - 2` predecessors of X (their
//! backup sets gain N) and the `r - 1` successors of X (their backup ranges shrink). An
//! absorption of D involves D, its `r - 1` predecessors (their backup sets lose D) and its `r`
//! successors (the first promotes D's range, the others re-replicate it). For `r = 2` a
//! division touches exactly three cells: X, N and X's successor.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::id::{CellId, IdError};
use crate::map::{AbsorptionReason, Cell, CellAddress, CellState, ClusterMap, MapError, Migration};
use crate::range::{HashRange, RangeError};

/// One map transition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Change {
    /// A new cell (listening at `child_address`) enters after `parent` and will take the second
    /// half of its range. Its id is chosen deterministically by [`CellId::between`].
    BeginDivision {
        /// The dividing cell.
        parent: CellId,
        /// Where the new cell listens.
        child_address: CellAddress,
    },
    /// The child caught up: it now masters its half (the atomic flip).
    CompleteDivision {
        /// The joining cell.
        child: CellId,
    },
    /// The division is abandoned (child or parent failed); the child's id is fenced.
    AbortDivision {
        /// The joining cell.
        child: CellId,
    },
    /// `departed` leaves or is declared dead: its successor masters its range from this epoch.
    BeginAbsorption {
        /// The cell to absorb.
        departed: CellId,
        /// Why.
        reason: AbsorptionReason,
    },
    /// Re-replication finished: the departed cell leaves the map and its id is fenced.
    CompleteAbsorption {
        /// The absorbed cell.
        departed: CellId,
    },
    /// Balancing: `range`, one end of `from`'s range, will move to its Active neighbour `to`
    /// (see [`Migration::Shift`]); `from` streams it to the cells that will hold it.
    BeginShift {
        /// The cell giving part of its range away.
        from: CellId,
        /// The neighbour taking it.
        to: CellId,
        /// The part that moves: an end of `from`'s range, not all of it.
        range: HashRange,
    },
    /// The shift's copies are in place: `to` masters the range from this epoch.
    CompleteShift {
        /// The giving cell.
        from: CellId,
    },
    /// The shift is abandoned (a target fell silent or it took too long); nothing moved.
    AbortShift {
        /// The giving cell.
        from: CellId,
    },
    /// Declare a cell dead wherever it is in its life cycle: an Active cell is absorbed as
    /// crashed (ending, in the same change, any migration its absorption overlaps), a Joining
    /// cell's division is aborted, a Leaving cell becomes Dead.
    Fence {
        /// The cell.
        cell: CellId,
    },
}

/// A change and the epoch of the map it was computed against.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Proposal {
    /// Epoch of the map the proposer looked at.
    pub based_on_epoch: u64,
    /// What to do.
    pub change: Change,
}

/// Why a proposal was refused. Refusals are normal outcomes of concurrency: the proposer
/// re-reads the map and decides again.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum ChangeError {
    /// The proposal was computed against another epoch.
    #[error("proposal based on epoch {proposed} but the map is at epoch {current}")]
    StaleEpoch { proposed: u64, current: u64 },
    /// No such cell in the map.
    #[error("cell {0} is not in the map")]
    UnknownCell(CellId),
    /// The cell is in the wrong life-cycle state for this change.
    #[error("cell {cell} is {state:?}; this change needs it {expected}")]
    WrongState {
        cell: CellId,
        state: CellState,
        expected: String,
    },
    /// An involved cell already takes part in an in-flight migration.
    #[error("cell {0} already takes part in an in-flight migration")]
    Overlap(CellId),
    /// The last Active cell cannot be absorbed.
    #[error("cannot absorb the last active cell")]
    LastCell,
    /// Another live cell already listens at this peer address.
    #[error("peer address {0} is already used by a cell in the map")]
    DuplicateAddress(String),
    /// The range cannot be divided further.
    #[error(transparent)]
    Range(#[from] RangeError),
    /// No id is available.
    #[error(transparent)]
    Id(#[from] IdError),
    /// The transition would produce an invalid map (a bug in this module; refused anyway).
    #[error("transition breaks a map invariant: {0}")]
    Invariant(#[from] MapError),
}

/// Applies `proposal` to `map`: the next map (epoch + 1) or why not. Pure and deterministic.
pub fn apply(map: &ClusterMap, proposal: &Proposal) -> Result<ClusterMap, ChangeError> {
    if proposal.based_on_epoch != map.epoch {
        return Err(ChangeError::StaleEpoch {
            proposed: proposal.based_on_epoch,
            current: map.epoch,
        });
    }
    let mut next = map.clone();
    match &proposal.change {
        Change::BeginDivision {
            parent,
            child_address,
        } => begin_division(&mut next, parent, child_address)?,
        Change::CompleteDivision { child } => complete_division(&mut next, child)?,
        Change::AbortDivision { child } => abort_division(&mut next, child)?,
        Change::BeginAbsorption { departed, reason } => {
            begin_absorption(&mut next, departed, *reason)?
        }
        Change::CompleteAbsorption { departed } => complete_absorption(&mut next, departed)?,
        Change::BeginShift { from, to, range } => begin_shift(&mut next, from, to, range)?,
        Change::CompleteShift { from } => complete_shift(&mut next, from)?,
        Change::AbortShift { from } => {
            take_shift(&mut next, from)?;
        }
        Change::Fence { cell } => fence(&mut next, cell)?,
    }
    next.epoch += 1;
    next.validate()?;
    Ok(next)
}

fn cell_in<'a>(map: &'a ClusterMap, id: &CellId) -> Result<&'a Cell, ChangeError> {
    map.cell(id)
        .ok_or_else(|| ChangeError::UnknownCell(id.clone()))
}

fn cell_index(map: &ClusterMap, id: &CellId) -> Result<usize, ChangeError> {
    map.cells
        .binary_search_by(|c| c.id.cmp(id))
        .map_err(|_| ChangeError::UnknownCell(id.clone()))
}

fn expect_state(cell: &Cell, state: CellState, expected: &'static str) -> Result<(), ChangeError> {
    if cell.state == state {
        Ok(())
    } else {
        Err(ChangeError::WrongState {
            cell: cell.id.clone(),
            state: cell.state,
            expected: expected.into(),
        })
    }
}

fn refuse_overlap(map: &ClusterMap, involved: &BTreeSet<CellId>) -> Result<(), ChangeError> {
    for m in &map.migrations {
        if let Some(id) = m.involved().intersection(involved).next() {
            return Err(ChangeError::Overlap(id.clone()));
        }
    }
    Ok(())
}

/// Up to `n` Active cells counter-clockwise from `id`, nearest first.
fn predecessors(map: &ClusterMap, id: &CellId, n: usize) -> Vec<CellId> {
    let mut out = Vec::new();
    let mut at = id.clone();
    while out.len() < n {
        match map.predecessor(&at) {
            Some(p) if p.id != *id && !out.contains(&p.id) => {
                at = p.id.clone();
                out.push(at.clone());
            }
            _ => break,
        }
    }
    out
}

/// Up to `n` Active cells clockwise from `id`, nearest first.
fn successors(map: &ClusterMap, id: &CellId, n: usize) -> Vec<CellId> {
    let mut out = Vec::new();
    let mut at = id.clone();
    while out.len() < n {
        match map.successor(&at) {
            Some(s) if s.id != *id && !out.contains(&s.id) => {
                at = s.id.clone();
                out.push(at.clone());
            }
            _ => break,
        }
    }
    out
}

fn begin_division(
    map: &mut ClusterMap,
    parent: &CellId,
    child_address: &CellAddress,
) -> Result<(), ChangeError> {
    let parent_cell = cell_in(map, parent)?;
    expect_state(parent_cell, CellState::Active, "Active")?;
    let (_, child_range) = parent_cell
        .range
        .unwrap_or(crate::HashRange::FULL)
        .split_in_half()?;
    if map
        .cells
        .iter()
        .any(|c| c.address.peer == child_address.peer)
    {
        return Err(ChangeError::DuplicateAddress(child_address.peer.clone()));
    }
    // The child goes right after the parent, below every id ever used after it (live or
    // fenced), so a fenced id is never handed out again.
    let upper = map
        .cells
        .iter()
        .map(|c| &c.id)
        .chain(map.fenced.iter())
        .filter(|id| *id > parent)
        .min()
        .cloned();
    let child = CellId::between(parent, upper.as_ref())?;
    let r = usize::from(map.replication_factor);
    let mut involved: BTreeSet<CellId> = [parent.clone(), child.clone()].into();
    involved.extend(predecessors(map, parent, r.saturating_sub(2)));
    involved.extend(successors(map, parent, r - 1));
    refuse_overlap(map, &involved)?;
    let at = map.cells.partition_point(|c| c.id < child);
    map.cells.insert(
        at,
        Cell {
            id: child.clone(),
            address: child_address.clone(),
            state: CellState::Joining,
            range: None,
        },
    );
    map.migrations.push(Migration::Division {
        parent: parent.clone(),
        child,
        range: child_range,
        involved,
    });
    Ok(())
}

fn take_migration(
    map: &mut ClusterMap,
    matches: impl Fn(&Migration) -> bool,
    subject: &CellId,
) -> Result<Migration, ChangeError> {
    let index = map.migrations.iter().position(matches);
    match index {
        Some(i) => Ok(map.migrations.remove(i)),
        None => {
            let cell = cell_in(map, subject)?;
            Err(ChangeError::WrongState {
                cell: subject.clone(),
                state: cell.state,
                expected: "subject of a matching in-flight migration".into(),
            })
        }
    }
}

fn complete_division(map: &mut ClusterMap, child: &CellId) -> Result<(), ChangeError> {
    let m = take_migration(
        map,
        |m| matches!(m, Migration::Division { child: c, .. } if c == child),
        child,
    )?;
    let Migration::Division { parent, range, .. } = m else {
        return Err(ChangeError::UnknownCell(child.clone()));
    };
    let p = cell_index(map, &parent)?;
    let parent_range = map.cells[p].range.unwrap_or(crate::HashRange::FULL);
    let (keep, give) = parent_range.split_in_half()?;
    if give != range {
        // The parent's range changed since the division began; impossible while the parent is
        // involved, but refuse rather than hand out the wrong half.
        return Err(ChangeError::Invariant(MapError::Invalid(format!(
            "division of {parent} planned {range}, parent now gives {give}"
        ))));
    }
    map.cells[p].range = Some(keep);
    let c = cell_index(map, child)?;
    map.cells[c].state = CellState::Active;
    map.cells[c].range = Some(give);
    Ok(())
}

fn abort_division(map: &mut ClusterMap, child: &CellId) -> Result<(), ChangeError> {
    take_migration(
        map,
        |m| matches!(m, Migration::Division { child: c, .. } if c == child),
        child,
    )?;
    let c = cell_index(map, child)?;
    map.cells.remove(c);
    map.fenced.insert(child.clone());
    Ok(())
}

fn begin_absorption(
    map: &mut ClusterMap,
    departed: &CellId,
    reason: AbsorptionReason,
) -> Result<(), ChangeError> {
    let d = cell_in(map, departed)?;
    expect_state(d, CellState::Active, "Active")?;
    let range = d.range.unwrap_or(crate::HashRange::FULL);
    let Some(successor) = map.successor(departed).map(|c| c.id.clone()) else {
        return Err(ChangeError::LastCell);
    };
    let r = usize::from(map.replication_factor);
    let mut involved: BTreeSet<CellId> = [departed.clone()].into();
    involved.extend(predecessors(map, departed, r - 1));
    involved.extend(successors(map, departed, r));
    refuse_overlap(map, &involved)?;
    let s = cell_index(map, &successor)?;
    let successor_range = map.cells[s].range.unwrap_or(crate::HashRange::FULL);
    map.cells[s].range = Some(range.merge(&successor_range)?);
    let d = cell_index(map, departed)?;
    map.cells[d].range = None;
    map.cells[d].state = match reason {
        AbsorptionReason::Leaving => CellState::Leaving,
        AbsorptionReason::Crashed => CellState::Dead,
    };
    map.migrations.push(Migration::Absorption {
        departed: departed.clone(),
        reason,
        successor,
        range,
        involved,
    });
    Ok(())
}

fn complete_absorption(map: &mut ClusterMap, departed: &CellId) -> Result<(), ChangeError> {
    take_migration(
        map,
        |m| matches!(m, Migration::Absorption { departed: d, .. } if d == departed),
        departed,
    )?;
    let d = cell_index(map, departed)?;
    map.cells.remove(d);
    map.fenced.insert(departed.clone());
    Ok(())
}

/// The cells holding a copy of a range mastered by `master`: it and its `r - 1` successors.
fn holders(map: &ClusterMap, master: &CellId) -> BTreeSet<CellId> {
    let r = usize::from(map.replication_factor);
    let mut out: BTreeSet<CellId> = successors(map, master, r - 1).into_iter().collect();
    out.insert(master.clone());
    out
}

fn begin_shift(
    map: &mut ClusterMap,
    from: &CellId,
    to: &CellId,
    range: &HashRange,
) -> Result<(), ChangeError> {
    for id in [from, to] {
        expect_state(cell_in(map, id)?, CellState::Active, "Active")?;
    }
    let before = holders(map, from);
    let after = holders(map, to);
    let targets: Vec<CellId> = after.difference(&before).cloned().collect();
    let involved: BTreeSet<CellId> = before.union(&after).cloned().collect();
    refuse_overlap(map, &involved)?;
    map.migrations.push(Migration::Shift {
        from: from.clone(),
        to: to.clone(),
        range: *range,
        targets,
        involved,
    });
    // `validate` (run on every result) checks that `range` is a strict end of `from`'s
    // range on `to`'s side.
    Ok(())
}

/// Removes `from`'s shift from the in-flight migrations: `(to, range)`.
fn take_shift(map: &mut ClusterMap, from: &CellId) -> Result<(CellId, HashRange), ChangeError> {
    let m = take_migration(
        map,
        |m| matches!(m, Migration::Shift { from: f, .. } if f == from),
        from,
    )?;
    match m {
        Migration::Shift { to, range, .. } => Ok((to, range)),
        _ => Err(ChangeError::UnknownCell(from.clone())),
    }
}

fn complete_shift(map: &mut ClusterMap, from: &CellId) -> Result<(), ChangeError> {
    let (to, moved) = take_shift(map, from)?;
    let f = cell_index(map, from)?;
    let t = cell_index(map, &to)?;
    let (given, taken) = match (map.cells[f].range, map.cells[t].range) {
        (Some(g), Some(t)) => (g, t),
        _ => return Err(ChangeError::UnknownCell(to)),
    };
    let kept = given.minus(&moved);
    let [kept] = kept.as_slice() else {
        return Err(ChangeError::Invariant(MapError::Invalid(format!(
            "shift of {moved} out of {given} leaves {kept:?}"
        ))));
    };
    // Upward (`to` is the predecessor): its range ends where the moved part starts.
    let grown = if taken.end.wrapping_add(1) == moved.start {
        taken.merge(&moved)?
    } else {
        moved.merge(&taken)?
    };
    map.cells[f].range = Some(*kept);
    map.cells[t].range = Some(grown);
    Ok(())
}

fn fence(map: &mut ClusterMap, cell: &CellId) -> Result<(), ChangeError> {
    let c = cell_index(map, cell)?;
    match map.cells[c].state {
        CellState::Active => {
            // A dead cell must always be removable, even from the middle of another change,
            // or one crash during a division would wedge the map. So the same atomic change
            // first ends every migration that overlaps the absorption: divisions are aborted
            // (their child never mastered anything), absorptions are closed (their range
            // already has its new master), then the absorption begins. Never both applied.
            if map.successor(cell).is_none() {
                return Err(ChangeError::LastCell);
            }
            let r = usize::from(map.replication_factor);
            let mut involved: BTreeSet<CellId> = [cell.clone()].into();
            involved.extend(predecessors(map, cell, r - 1));
            involved.extend(successors(map, cell, r));
            let overlapping: Vec<Migration> = map
                .migrations
                .iter()
                .filter(|m| m.involved().intersection(&involved).next().is_some())
                .cloned()
                .collect();
            for m in overlapping {
                match m {
                    Migration::Division { child, .. } => abort_division(map, &child)?,
                    Migration::Absorption { departed, .. } => complete_absorption(map, &departed)?,
                    // Nothing moved yet: the giver still masters the range.
                    Migration::Shift { from, .. } => {
                        take_shift(map, &from)?;
                    }
                }
            }
            begin_absorption(map, cell, AbsorptionReason::Crashed)
        }
        CellState::Joining => abort_division(map, cell),
        CellState::Leaving => {
            map.cells[c].state = CellState::Dead;
            for m in &mut map.migrations {
                if let Migration::Absorption {
                    departed, reason, ..
                } = m
                {
                    if departed == cell {
                        *reason = AbsorptionReason::Crashed;
                    }
                }
            }
            Ok(())
        }
        CellState::Dead => Err(ChangeError::WrongState {
            cell: cell.clone(),
            state: CellState::Dead,
            expected: "not already Dead".into(),
        }),
    }
}

#[cfg(test)]
mod tests;
