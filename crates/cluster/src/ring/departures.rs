//! Waiting out departed cells before serving what they mastered.
//!
//! A cell that takes a range over from a cell that departed (absorbed, fenced) may not
//! serve it until that cell can no longer serve it either: a departed cell may be a zombie,
//! cut off on an older map, serving under that map until its confirmation lapses — so the
//! new master waits `map_lease_ms + clock_drift_margin_ms` ([`Ring::record_acquired`]).
//!
//! A cell that *leaves* is no zombie: when it installs the map in which it is leaving it
//! masters nothing and releases every lease it holds from its backups (after its last
//! writes reached them). That release, sent at an epoch in which the sender is leaving,
//! proves it stopped serving for good, so the waits recorded on its account alone end when
//! it arrives ([`Ring::note_released_all`]) — about a round trip after the map, instead of
//! two seconds of stalled clients per absorption. Invariants:
//!
//! - A wait is attributed to a cell only when that cell is the sole reason for it (the one
//!   departure of the map, and the part's only giver); every other wait runs its course.
//! - A release ends waits only if the map of its epoch, as this cell knows it, has the
//!   sender leaving; a map this cell skipped or forgot proves nothing, and the wait runs on.

use std::collections::BTreeSet;

use super::Ring;
use crate::id::CellId;
use crate::map::{CellState, ClusterMap};
use crate::range::HashRange;

/// A part of this cell's range it may first serve at `not_before_ms`.
#[derive(Debug, Clone)]
pub(super) struct Acquired {
    pub(super) range: HashRange,
    pub(super) not_before_ms: u64,
    /// The departed cell the wait is for, when it is for that cell alone.
    pub(super) departed: Option<CellId>,
}

impl Ring {
    /// Parts of `new` (this cell's range in `map`) it did not master under `old` and must
    /// wait for, see `acquired`.
    ///
    /// No wait for a part that came from a cell still alive in `map`, if no cell departed in
    /// between: a division child or a shift's receiver. Its giver serves it only under a
    /// lease from every backup of its own, and those keep the two apart: moving down, the
    /// receiver is the giver's first backup, and its own grants to the giver keep it from
    /// serving the part until the giver released them; moving up (and to a division child),
    /// the giver's grant of the grown range, or its lease from the backup it shares with the
    /// child, comes only under the new map, where the giver no longer masters the part.
    pub(super) fn record_acquired(
        &mut self,
        old: Option<&ClusterMap>,
        map: &ClusterMap,
        new: HashRange,
        served: Option<HashRange>,
        now_ms: u64,
    ) {
        let Some(old) = old else { return };
        let old_range = old.cell(&self.me).and_then(|c| c.range);
        let gained = match old_range {
            Some(o) => new.minus(&o),
            None => vec![new],
        };
        let departed: BTreeSet<&CellId> = map
            .cells()
            .iter()
            .filter(|c| c.state != CellState::Active && c.state != CellState::Joining)
            .map(|c| &c.id)
            .chain(map.fenced.iter().filter(|id| !old.is_fenced(id)))
            .collect();
        let not_before = now_ms
            .saturating_add(self.config.map_lease_ms)
            .saturating_add(self.config.clock_drift_margin_ms);
        for part in gained {
            let givers: Vec<&CellId> = old
                .active_cells()
                .filter(|c| c.range.is_some_and(|r| r.overlaps(&part)))
                .map(|c| &c.id)
                .collect();
            let from_live = departed.is_empty()
                && givers.iter().all(|g| {
                    **g != self.me && map.cell(g).is_some_and(|c| c.state == CellState::Active)
                });
            if from_live {
                continue;
            }
            // Waited for on account of one cell only when that cell is the one departure and
            // the part's only giver: then its own word that it stopped ends the wait.
            let only = match (departed.len(), givers.as_slice()) {
                (1, [g]) if departed.contains(*g) => Some((*g).clone()),
                _ => None,
            };
            self.wait_for(part, not_before, only);
        }
        // A departed cell may be a zombie on any older map, serving what it mastered there
        // until that map's confirmation lapses: not only the range it had last. (A cell of a
        // ring of one has no backup to stop it; the simulator found its division child,
        // alone once the parent was fenced, serving the half it had never got a lease for
        // while the parent, still on the map before the flip, served it too.) Every part of
        // my range that such a cell mastered in a map I remember is waited for — but what I
        // could serve until now: no other cell could serve that meanwhile.
        let gone: Vec<&CellId> = map
            .cells()
            .iter()
            .filter(|c| matches!(c.state, CellState::Leaving | CellState::Dead))
            .map(|c| &c.id)
            .chain(map.fenced.iter().filter(|id| !old.is_fenced(id)))
            .collect();
        let mut waits = Vec::new();
        for m in self.recent.iter() {
            for d in &gone {
                let Some(r) = m
                    .cell(d)
                    .filter(|c| c.state == CellState::Active)
                    .and_then(|c| c.range)
                else {
                    continue;
                };
                for part in r.intersect(&new) {
                    let unserved = match served {
                        Some(s) => part.minus(&s),
                        None => vec![part],
                    };
                    waits.extend(unserved.into_iter().map(|p| (p, (*d).clone())));
                }
            }
        }
        for (part, d) in waits {
            self.wait_for(part, not_before, Some(d));
        }
    }

    /// Records a wait for `range`, unless it is for a cell known to have stopped.
    fn wait_for(&mut self, range: HashRange, not_before_ms: u64, departed: Option<CellId>) {
        if departed.as_ref().is_some_and(|d| self.has_stopped(d)) {
            return;
        }
        self.acquired.push(Acquired {
            range,
            not_before_ms,
            departed,
        });
    }

    /// `from` released every lease it held from this cell at its map `epoch`: if it was
    /// leaving then, the waits on its account end (now, or once this cell installs that
    /// map).
    pub(super) fn note_released_all(&mut self, from: &CellId, epoch: u64) {
        let newest = self.released_all.entry(from.clone()).or_insert(epoch);
        *newest = (*newest).max(epoch);
        self.end_waits_for_stopped();
    }

    /// Drops the waits for cells whose release proves they stopped, and forgets releases of
    /// cells neither in the map nor waited for.
    pub(super) fn end_waits_for_stopped(&mut self) {
        let stopped: Vec<CellId> = self
            .released_all
            .keys()
            .filter(|c| self.has_stopped(c))
            .cloned()
            .collect();
        self.acquired
            .retain(|a| a.departed.as_ref().is_none_or(|d| !stopped.contains(d)));
        let waited: BTreeSet<CellId> = self
            .acquired
            .iter()
            .filter_map(|a| a.departed.clone())
            .collect();
        let map = &self.map;
        self.released_all
            .retain(|c, _| map.cell(c).is_some() || waited.contains(c));
    }

    /// Whether `cell` released everything at an epoch in which it was leaving.
    fn has_stopped(&self, cell: &CellId) -> bool {
        let Some(&epoch) = self.released_all.get(cell) else {
            return false;
        };
        self.known_map(epoch)
            .and_then(|m| m.cell(cell))
            .is_some_and(|c| c.state == CellState::Leaving)
    }

    /// The map of `epoch`, if this cell installed it and still remembers it.
    fn known_map(&self, epoch: u64) -> Option<&ClusterMap> {
        std::iter::once(&self.map)
            .chain(self.recent.iter())
            .find(|m| m.epoch() == epoch)
    }
}
