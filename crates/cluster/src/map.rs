//! The versioned cluster map: which cells exist, where they listen, what they master, and
//! which map changes are in flight.
//!
//! A [`ClusterMap`] can only be obtained from [`ClusterMap::bootstrap`], from a validated
//! transition in [`crate::change`], or from [`ClusterMap::decode`], and each of these checks
//! every invariant below, so code holding a `ClusterMap` may rely on them:
//!
//! - cells are sorted by [`CellId`], ids are unique and none of them is fenced;
//! - `Active` cells (and only they) hold a range, and those ranges, taken in id order, tile the
//!   whole hash ring with no gap and no overlap — every hash has exactly one owner;
//! - every `Joining` cell is the child of exactly one division record, every `Leaving`/`Dead`
//!   cell the departed cell of exactly one absorption record, and no two in-flight migrations
//!   involve a common cell;
//! - `1 <= replication_factor <= REPLICATION_FACTOR_MAX` and `epoch >= 1`.
//!
//! The map is distributed as JSON ([`ClusterMap::encode`]): self-describing, stable across
//! versions that only add fields, and small (a 100-cell map is a few KiB).

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::id::CellId;
use crate::range::HashRange;

/// Upper bound on the replication factor: a master plus up to four backups.
pub const REPLICATION_FACTOR_MAX: u8 = 5;
/// Default replication factor: a master and one backup.
pub const REPLICATION_FACTOR_DEFAULT: u8 = 2;
/// Default bound on an encoded map accepted by [`ClusterMap::decode`].
pub const MAP_BYTES_MAX_DEFAULT: usize = 4 * 1024 * 1024;

/// Where a cell listens.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CellAddress {
    /// memcached protocol endpoint (`host:port`).
    pub client: String,
    /// Inter-cell endpoint for forwarding, replication and heartbeats (`host:port`).
    pub peer: String,
}

/// Life-cycle state of a cell in the map.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CellState {
    /// Receiving the second half of its parent's range; masters nothing yet.
    Joining,
    /// Masters its range and backs up its predecessors'.
    Active,
    /// Leaving on purpose; its range already belongs to its successor, which is re-replicating.
    Leaving,
    /// Declared dead; its range already belongs to its successor, which is re-replicating.
    /// When the absorption completes the cell leaves the map and its id is fenced forever.
    Dead,
}

/// One cell of the map.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cell {
    /// Position on the ring; never reused.
    pub id: CellId,
    /// Where it listens.
    pub address: CellAddress,
    /// Life-cycle state.
    pub state: CellState,
    /// The range it masters: `Some` exactly when `state == Active`.
    pub range: Option<HashRange>,
}

/// Why a departing cell is absorbed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AbsorptionReason {
    /// The cell asked to leave (scale-in).
    Leaving,
    /// The cell was suspected and the suspicion was confirmed by consensus.
    Crashed,
}

/// An in-flight map change spanning more than one epoch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Migration {
    /// `parent` streams `range` (the second half of its range) to the `Joining` `child`.
    Division {
        /// The dividing cell; still masters `range` until the division completes.
        parent: CellId,
        /// The new cell.
        child: CellId,
        /// What the child will master.
        range: HashRange,
        /// Cells whose data or role this migration changes (parent, child, parent's backups).
        involved: BTreeSet<CellId>,
    },
    /// `successor` already masters `range` (promoted from backup); re-replication runs.
    Absorption {
        /// The departed cell.
        departed: CellId,
        /// Why it departed.
        reason: AbsorptionReason,
        /// The cell that took its range.
        successor: CellId,
        /// The range it took over.
        range: HashRange,
        /// Cells whose data or role this migration changes.
        involved: BTreeSet<CellId>,
    },
    /// Balancing: `range`, one end of `from`'s range, moves to its neighbour `to` (the
    /// boundary between two Active neighbours moves). `from` masters it until the shift
    /// completes; meanwhile it streams `range` to `targets`, the cells that will hold a copy
    /// of it and do not yet (the new master moving up, or the new last backup moving down).
    Shift {
        /// The cell that gives `range` away; still masters it.
        from: CellId,
        /// The neighbour that will master it.
        to: CellId,
        /// What moves: the upper end of `from`'s range when `to` is its successor, the
        /// lower end when `to` is its predecessor.
        range: HashRange,
        /// Cells `from` streams `range` to before the flip (empty when every future holder
        /// already holds it, as in a ring of `r` cells or fewer).
        targets: Vec<CellId>,
        /// Cells whose data or role this migration changes.
        involved: BTreeSet<CellId>,
    },
}

impl Migration {
    /// Cells this migration touches; no other migration may touch any of them.
    pub fn involved(&self) -> &BTreeSet<CellId> {
        match self {
            Migration::Division { involved, .. }
            | Migration::Absorption { involved, .. }
            | Migration::Shift { involved, .. } => involved,
        }
    }
}

/// Why a map is invalid or cannot be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum MapError {
    /// The encoded map is larger than the configured bound.
    #[error("encoded map is {len} bytes, more than the {max} allowed")]
    TooLarge { len: usize, max: usize },
    /// The bytes are not a map.
    #[error("malformed map encoding: {0}")]
    Malformed(String),
    /// The map breaks an invariant of the module docs.
    #[error("invalid map: {0}")]
    Invalid(String),
}

/// The cluster map; see the module docs for its invariants.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterMap {
    /// The ring's identity, chosen at random when its first cell bootstrapped and kept by
    /// every later map: cells of two rings never take each other's frames or maps (a
    /// restarted first cell bootstraps a new ring with a new identity).
    #[serde(default)]
    pub(crate) ring: u64,
    pub(crate) epoch: u64,
    pub(crate) replication_factor: u8,
    pub(crate) cells: Vec<Cell>,
    pub(crate) migrations: Vec<Migration>,
    /// Ids of cells that were absorbed or aborted: a message from one is refused for good.
    pub(crate) fenced: BTreeSet<CellId>,
    /// Placement index: `(range start, index into cells)` of the Active cells sorted by start.
    /// Derived from `cells`, rebuilt by `validate`.
    #[serde(skip)]
    pub(crate) starts: Vec<(u64, usize)>,
}

impl ClusterMap {
    /// The first map of a cluster: one Active cell mastering the whole ring, epoch 1, ring
    /// identity 0 (see [`ClusterMap::bootstrap_ring`]).
    pub fn bootstrap(
        id: CellId,
        address: CellAddress,
        replication_factor: u8,
    ) -> Result<ClusterMap, MapError> {
        ClusterMap::bootstrap_ring(id, address, replication_factor, 0)
    }

    /// [`ClusterMap::bootstrap`] of the ring identified by `ring` (a random number the
    /// caller draws: this crate reads no randomness).
    pub fn bootstrap_ring(
        id: CellId,
        address: CellAddress,
        replication_factor: u8,
        ring: u64,
    ) -> Result<ClusterMap, MapError> {
        let mut map = ClusterMap {
            ring,
            epoch: 1,
            replication_factor,
            cells: vec![Cell {
                id,
                address,
                state: CellState::Active,
                range: Some(HashRange::FULL),
            }],
            migrations: Vec::new(),
            fenced: BTreeSet::new(),
            starts: Vec::new(),
        };
        map.validate()?;
        Ok(map)
    }

    /// The ring's identity (see the field).
    pub fn ring(&self) -> u64 {
        self.ring
    }

    /// Monotonic version; every committed change increments it by exactly one.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Copies of each item: the master plus `replication_factor - 1` backups.
    pub fn replication_factor(&self) -> u8 {
        self.replication_factor
    }

    /// All cells, sorted by id (ring order).
    pub fn cells(&self) -> &[Cell] {
        &self.cells
    }

    /// In-flight migrations.
    pub fn migrations(&self) -> &[Migration] {
        &self.migrations
    }

    /// Whether `id` was removed from the ring and must never be served again.
    pub fn is_fenced(&self, id: &CellId) -> bool {
        self.fenced.contains(id)
    }

    /// The cell with this id, if it is in the map.
    pub fn cell(&self, id: &CellId) -> Option<&Cell> {
        self.cells
            .binary_search_by(|c| c.id.cmp(id))
            .ok()
            .map(|i| &self.cells[i])
    }

    /// The migration that involves `id`, if any.
    pub fn migration_involving(&self, id: &CellId) -> Option<&Migration> {
        self.migrations.iter().find(|m| m.involved().contains(id))
    }

    /// Stable encoding for distribution (JSON).
    pub fn encode(&self) -> Vec<u8> {
        // Serializing plain data with string keys cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Decodes and validates a map received from a peer or the consensus log.
    pub fn decode(bytes: &[u8], bytes_max: usize) -> Result<ClusterMap, MapError> {
        if bytes.len() > bytes_max {
            return Err(MapError::TooLarge {
                len: bytes.len(),
                max: bytes_max,
            });
        }
        let mut map: ClusterMap =
            serde_json::from_slice(bytes).map_err(|e| MapError::Malformed(e.to_string()))?;
        map.validate()?;
        Ok(map)
    }

    /// Checks every invariant of the module docs and rebuilds the placement index.
    pub(crate) fn validate(&mut self) -> Result<(), MapError> {
        let invalid = |s: String| Err(MapError::Invalid(s));
        if self.epoch == 0 {
            return invalid("epoch 0".into());
        }
        if !(1..=REPLICATION_FACTOR_MAX).contains(&self.replication_factor) {
            return invalid(format!("replication factor {}", self.replication_factor));
        }
        if self.cells.windows(2).any(|w| w[0].id >= w[1].id) {
            return invalid("cells not strictly sorted by id".into());
        }
        for cell in &self.cells {
            if self.fenced.contains(&cell.id) {
                return invalid(format!("cell {} is fenced", cell.id));
            }
            if (cell.state == CellState::Active) != cell.range.is_some() {
                return invalid(format!("cell {}: only Active cells hold a range", cell.id));
            }
        }
        // Ranges of Active cells, in id order, must tile the ring.
        let active: Vec<(usize, HashRange)> = self
            .cells
            .iter()
            .enumerate()
            .filter_map(|(i, c)| c.range.map(|r| (i, r)))
            .collect();
        if active.is_empty() {
            return invalid("no Active cell".into());
        }
        let total: u128 = active.iter().map(|(_, r)| r.len()).sum();
        if total != 1u128 << 64 {
            return invalid(format!("ranges cover {total} hashes, not 2^64"));
        }
        for (k, (_, r)) in active.iter().enumerate() {
            let (_, next) = active[(k + 1) % active.len()];
            if active.len() > 1 && r.end.wrapping_add(1) != next.start {
                return invalid(format!("range {r} is not followed by {next}"));
            }
        }
        self.validate_migrations()?;
        let mut starts: Vec<(u64, usize)> = active.iter().map(|&(i, r)| (r.start, i)).collect();
        starts.sort_unstable();
        self.starts = starts;
        Ok(())
    }

    fn validate_migrations(&self) -> Result<(), MapError> {
        let invalid = |s: String| Err(MapError::Invalid(s));
        let mut seen = BTreeSet::new();
        for m in &self.migrations {
            for id in m.involved() {
                if !seen.insert(id.clone()) {
                    return invalid(format!("cell {id} is in two migrations"));
                }
            }
            let (subject, subject_states, anchor): (&CellId, &[CellState], &CellId) = match m {
                Migration::Division { parent, child, .. } => (child, &[CellState::Joining], parent),
                Migration::Absorption {
                    departed,
                    successor,
                    ..
                } => (departed, &[CellState::Leaving, CellState::Dead], successor),
                Migration::Shift {
                    from, to, range, ..
                } => {
                    self.validate_shift(from, to, range)?;
                    (from, &[CellState::Active], to)
                }
            };
            match self.cell(subject) {
                Some(c) if subject_states.contains(&c.state) => {}
                _ => return invalid(format!("migration subject {subject} in wrong state")),
            }
            match self.cell(anchor) {
                Some(c) if c.state == CellState::Active => {}
                _ => return invalid(format!("migration anchor {anchor} not Active")),
            }
            if !m.involved().contains(subject) || !m.involved().contains(anchor) {
                return invalid("migration does not involve its own cells".into());
            }
        }
        for c in &self.cells {
            let covered = self.migrations.iter().any(|m| match m {
                Migration::Division { child, .. } => *child == c.id,
                Migration::Absorption { departed, .. } => *departed == c.id,
                Migration::Shift { .. } => false,
            });
            if c.state != CellState::Active && !covered {
                return invalid(format!(
                    "cell {} is {:?} without a migration",
                    c.id, c.state
                ));
            }
        }
        Ok(())
    }

    /// A shift moves a strict part of `from`'s range, at the end it shares with its
    /// neighbour `to`.
    fn validate_shift(
        &self,
        from: &CellId,
        to: &CellId,
        range: &HashRange,
    ) -> Result<(), MapError> {
        let invalid = |s: String| Err(MapError::Invalid(s));
        let Some(given) = self.cell(from).and_then(|c| c.range) else {
            return invalid(format!("shift from {from}, which masters nothing"));
        };
        let at_end = (self.successor(from).is_some_and(|c| c.id == *to) && range.end == given.end)
            || (self.predecessor(from).is_some_and(|c| c.id == *to) && range.start == given.start);
        if from == to || !at_end || !given.covers(range) || given.len() == range.len() {
            return invalid(format!("shift of {range} from {from} ({given}) to {to}"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn addr(n: u32) -> CellAddress {
        CellAddress {
            client: format!("127.0.0.1:{}", 11211 + n),
            peer: format!("127.0.0.1:{}", 12211 + n),
        }
    }

    #[test]
    fn bootstrap_round_trips_and_validates() {
        let map = ClusterMap::bootstrap(CellId::whole(1), addr(0), 2).unwrap();
        assert_eq!(map.epoch(), 1);
        let bytes = map.encode();
        let back = ClusterMap::decode(&bytes, MAP_BYTES_MAX_DEFAULT).unwrap();
        assert_eq!(back, map);
        assert!(matches!(
            ClusterMap::decode(&bytes, 10),
            Err(MapError::TooLarge { .. })
        ));
        assert!(ClusterMap::bootstrap(CellId::whole(1), addr(0), 0).is_err());
        assert!(ClusterMap::bootstrap(CellId::whole(1), addr(0), 6).is_err());
    }

    #[test]
    fn decode_refuses_broken_maps() {
        let map = ClusterMap::bootstrap(CellId::whole(1), addr(0), 2).unwrap();
        let text = String::from_utf8(map.encode()).unwrap();
        let gap = text.replace(&format!("\"end\":{}", u64::MAX), "\"end\":5");
        assert_ne!(gap, text);
        assert!(matches!(
            ClusterMap::decode(gap.as_bytes(), 1 << 20),
            Err(MapError::Invalid(_))
        ));
        let zero = text.replace("\"epoch\":1", "\"epoch\":0");
        assert!(ClusterMap::decode(zero.as_bytes(), 1 << 20).is_err());
        let joining = text.replace("\"active\"", "\"joining\"");
        assert!(ClusterMap::decode(joining.as_bytes(), 1 << 20).is_err());
        assert!(matches!(
            ClusterMap::decode(b"{", 1 << 20),
            Err(MapError::Malformed(_))
        ));
    }
}
