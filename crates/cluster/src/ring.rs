//! The per-cell ring logic as a deterministic state machine (raft-rs style).
//!
//! A [`Ring`] is fed inbound peer messages ([`Ring::step`]), committed maps
//! ([`Ring::install_map`]), progress reports from the node's data movers and the passing of
//! time ([`Ring::tick`]); it answers with [`Output`]s — messages to send, map changes to
//! propose, data movements to start — collected by [`Ring::drain_outputs`]. It reads no clock
//! and touches no socket, so a whole ring runs on one thread with virtual time (see the
//! simulator test in `tests/ring_sim.rs`).
//!
//! What it decides:
//!
//! - **Failure detection.** Every `heartbeat_interval_ms` a cell heartbeats its backups (its
//!   `r - 1` successors). If its successor has not answered for `suspicion_timeout_ms`, it
//!   *proposes* fencing it; the map only changes if consensus commits the proposal.
//! - **Leases.** A master serves a hash only while every backup of it (in the master's map)
//!   has granted it a lease covering the hash. A backup grants a predecessor a lease for the
//!   predecessor's range *in the backup's own map*, never for a range overlapping an unexpired
//!   grant to another cell. The master counts its lease from the moment it *sent* the
//!   heartbeat (`sent + lease_ms`); the backup counts the grant from the moment it *received*
//!   it, plus a drift margin (`received + lease_ms + clock_drift_margin_ms`). So the master's
//!   lease always ends before the backup considers the grant over, and a backup (or anyone
//!   the backup later grants to) serves an overlapping hash only after that: **never two
//!   masters with valid leases for one hash at one time**, whatever the maps in flight.
//! - **Map leases.** Backup leases alone cannot stop a partitioned *pair* of zombies (a fenced
//!   master still renewing from its equally fenced backup). So a cell also serves and grants
//!   only while the consensus group has recently confirmed its map as current
//!   ([`Output::ConfirmMap`], `map_lease_ms` from when it asked); a stale map can no longer be
//!   confirmed once a newer one committed. A cell that takes over a departed cell's range
//!   waits `map_lease_ms + clock_drift_margin_ms` after installing the map before serving it.
//!   The simulator found this case; the price is that cells stop serving as masters when the
//!   consensus group has had no quorum for `map_lease_ms`.
//! - **Orchestration.** A division's parent starts the hand-off, proposes the flip once the
//!   node reports the child caught up (or the abort after `handoff_timeout_ms`, or after the
//!   child was silent `handoff_stall_timeout_ms` before catching up); an absorption's
//!   successor proposes its completion once re-replication to and from it is done.
//!
//! Proposals are computed against the installed map's epoch and re-issued at most every
//! `proposal_retry_ms` while their condition holds; stale ones are refused by
//! [`crate::change::apply`], so duplicates are harmless.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::change::{Change, Proposal};
use crate::id::CellId;
use crate::map::{AbsorptionReason, CellAddress, CellState, ClusterMap, Migration};
use crate::range::HashRange;

pub use interface::{
    Output, RING_MESSAGE_BYTES_MAX, RingConfig, RingMessage, RingMessageError, ServeWait,
};

#[derive(Debug, Clone, Copy)]
struct Lease {
    range: HashRange,
    /// Exclusive: valid while `now < expires_ms`.
    expires_ms: u64,
    /// Send time of the heartbeat that produced it (the grantee's clock, on both sides): the
    /// grantee ignores reordered older acks by it, the grantor matches releases against it.
    sent_at_ms: u64,
}

/// A stream this cell leads: a division's child or a shift's target receiving `range`.
#[derive(Debug, Clone)]
struct HandOff {
    range: HashRange,
    started_ms: u64,
    last_emitted_ms: u64,
    caught_up: bool,
    /// Last heartbeat answer from the receiver (its start counts as one).
    last_ack_ms: u64,
}

/// A range this cell gave up whose writes made here may still be on their way to its new
/// master: no lease on it is granted until they are delivered or `until_ms` passes.
#[derive(Debug, Clone, Copy)]
struct Tail {
    range: HashRange,
    until_ms: u64,
}

/// One cell's ring state machine; see the module docs.
#[derive(Debug)]
pub struct Ring {
    me: CellId,
    config: RingConfig,
    map: ClusterMap,
    fenced: bool,
    /// Leases this cell holds, by granting backup.
    leases: BTreeMap<CellId, Lease>,
    /// Leases this cell granted, by grantee, one per answered heartbeat; kept until expiry
    /// even if the map moves on, unless the grantee releases them.
    grants: BTreeMap<CellId, Vec<Lease>>,
    /// Per backup, the send time of the oldest heartbeat whose answer this cell may still
    /// accept: set when it released leases from that backup (see `LeaseRelease`).
    accept_from_ms: BTreeMap<CellId, u64>,
    /// Heartbeats of masters this cell backs up that came while its map was unconfirmed or
    /// older than theirs, while a range of theirs was still in `tails`, or while another
    /// cell held a grant overlapping their range (sender → the latest one's `sent_at_ms`):
    /// answered with a grant as soon as that ends ([`Ring::answer_deferred`])
    /// instead of at the master's next retry. At most one per predecessor.
    deferred: BTreeMap<CellId, u64>,
    /// My backups under the installed map (cached: `can_serve` is on the request path).
    backups: Vec<CellId>,
    last_heartbeat_ms: Option<u64>,
    /// When backups whose lease this cell lacks were last asked again (see `lease_retry_ms`).
    last_lease_retry_ms: u64,
    /// Last ack per backup; a new successor starts with the time it became successor.
    last_ack_ms: BTreeMap<CellId, u64>,
    proposed: Vec<(Change, u64)>,
    handoffs: BTreeMap<CellId, HandOff>,
    /// Re-replications I owe: (to, range) → last started.
    resync_out: BTreeMap<(CellId, HashRange), u64>,
    /// Predecessors whose resync to me I am waiting for.
    resync_in: BTreeSet<CellId>,
    leave_requested: bool,
    /// The consensus group confirmed our map current at a time `>= map_valid_until_ms -
    /// map_lease_ms`; a map confirmed for epoch e is never confirmed again once e + 1
    /// committed, so a cell with a stale map stops serving within `map_lease_ms` of the
    /// change that made it stale.
    map_valid_until_ms: u64,
    /// Hashes taken over from a departed cell, and when they may first be served: a departed
    /// cell that is really a partitioned zombie has stopped serving by then. A cell that
    /// leaves alive ends the wait for itself sooner (see [`departures`]).
    acquired: Vec<departures::Acquired>,
    /// Per cell, the newest map epoch at which it released every lease it held from this
    /// cell: proof it stopped serving for good if it was leaving in that map.
    released_all: BTreeMap<CellId, u64>,
    /// Ranges given up whose writes are still being delivered (see [`Output::DeliverTail`]).
    tails: Vec<Tail>,
    outputs: Vec<Output>,
    /// The maps installed before `map`, oldest first, at most [`RECENT_MAPS_MAX`]: what a
    /// message stamped with an older epoch is judged by ([`Ring::master_ranges`]).
    recent: VecDeque<ClusterMap>,
}

/// How many replaced maps a [`Ring`] remembers. A replication stream is stamped with the
/// epoch it was produced under, and the tail of a master that just lost a range arrives
/// under an epoch or two before the installed one; a few more cover a burst of changes.
pub const RECENT_MAPS_MAX: usize = 8;

impl Ring {
    /// A ring for cell `me`, starting from `map` (which must contain `me`).
    pub fn new(me: CellId, map: ClusterMap, config: RingConfig, now_ms: u64) -> Ring {
        let mut ring = Ring {
            me,
            config,
            map: map.clone(),
            fenced: false,
            leases: BTreeMap::new(),
            grants: BTreeMap::new(),
            accept_from_ms: BTreeMap::new(),
            deferred: BTreeMap::new(),
            backups: Vec::new(),
            last_heartbeat_ms: None,
            last_lease_retry_ms: 0,
            last_ack_ms: BTreeMap::new(),
            proposed: Vec::new(),
            handoffs: BTreeMap::new(),
            resync_out: BTreeMap::new(),
            resync_in: BTreeSet::new(),
            leave_requested: false,
            map_valid_until_ms: 0,
            acquired: Vec::new(),
            released_all: BTreeMap::new(),
            tails: Vec::new(),
            outputs: Vec::new(),
            recent: VecDeque::new(),
        };
        ring.adopt(map, None, None, now_ms);
        ring
    }

    /// This cell's id.
    pub fn id(&self) -> &CellId {
        &self.me
    }

    /// The installed map.
    pub fn map(&self) -> &ClusterMap {
        &self.map
    }

    /// Whether this cell was removed from the ring.
    pub fn is_fenced(&self) -> bool {
        self.fenced
    }

    /// Everything produced since the last call (raft-rs `ready`).
    pub fn drain_outputs(&mut self) -> Vec<Output> {
        std::mem::take(&mut self.outputs)
    }

    /// Whether this cell may answer for `hash` as its master at `now_ms`: it owns the hash in
    /// a map the consensus group confirmed recently, holds an unexpired lease covering it from
    /// every backup, has not granted an unexpired lease covering it to another cell, and, if
    /// it took the hash over from a departed cell, has waited out that cell's map lease.
    pub fn can_serve(&self, hash: u64, now_ms: u64) -> bool {
        if self.fenced || now_ms >= self.map_valid_until_ms || self.map.owner(hash).id != self.me {
            return false;
        }
        self.leases_allow(HashRange::new(hash, hash), now_ms)
    }

    /// Whether this cell may answer for every hash of the range it masters at `now_ms`; when
    /// it may, [`Ring::can_serve`] holds for each of them, so a request of many keys checks
    /// once instead of once per key (and per key only when this says no: part of the range
    /// may still be servable).
    pub fn can_serve_master_range(&self, now_ms: u64) -> bool {
        self.map
            .cell(&self.me)
            .and_then(|c| c.range)
            .is_some_and(|range| self.can_serve_all(range, now_ms))
    }

    /// Installs a committed map. Older or equal epochs are ignored.
    pub fn install_map(&mut self, map: ClusterMap, now_ms: u64) {
        if self.fenced || map.epoch() <= self.map.epoch() {
            return;
        }
        // What this cell could serve until now no departed cell can (see `record_acquired`).
        let served = self
            .map
            .cell(&self.me)
            .and_then(|c| c.range)
            .filter(|r| self.can_serve_all(*r, now_ms));
        let old = std::mem::replace(&mut self.map, map.clone());
        if self.recent.len() == RECENT_MAPS_MAX {
            self.recent.pop_front();
        }
        self.recent.push_back(old.clone());
        self.adopt(map, Some(old), served, now_ms);
        self.end_waits_for_stopped();
        // Heartbeats that came stamped with this map (kept if their senders are my
        // predecessors in it) get their grants now, not at the next tick.
        self.answer_deferred(now_ms);
        // Heartbeat and confirm now, not at the next tick, so leases under the new map
        // arrive within one round trip.
        if !self.fenced {
            self.heartbeat(now_ms);
        }
    }

    /// The ranges `cell` masters for a message stamped with map `epoch`: its range in the
    /// installed map and, for an older epoch, in the maps this cell installed around it (the
    /// last one at or before `epoch` and the first after it), as far as it remembers them.
    /// Epochs this cell skipped (it installs the newest committed map, not every one) lie
    /// between those two, so a cell that mastered a hash at `epoch` masters it in one of
    /// them unless it gained and lost it within the skipped epochs. Empty for a cell that
    /// masters nothing in any of them.
    pub fn master_ranges(&self, cell: &CellId, epoch: u64) -> Vec<HashRange> {
        let mut maps = vec![&self.map];
        if epoch < self.map.epoch() {
            let after = self.recent.iter().position(|m| m.epoch() > epoch);
            let before = match after {
                Some(0) => None,
                Some(i) => Some(i - 1),
                None => self.recent.len().checked_sub(1),
            };
            maps.extend(before.and_then(|i| self.recent.get(i)));
            maps.extend(after.and_then(|i| self.recent.get(i)));
        }
        let mut ranges: Vec<HashRange> = Vec::new();
        for m in maps {
            let range = m
                .cell(cell)
                .filter(|c| c.state == CellState::Active)
                .and_then(|c| c.range);
            if let Some(r) = range.filter(|r| !ranges.contains(r)) {
                ranges.push(r);
            }
        }
        ranges
    }

    /// The consensus group answered the [`Output::ConfirmMap`] sent at `sent_at_ms`: `epoch`
    /// was current when it answered.
    pub fn map_confirmed(&mut self, epoch: u64, sent_at_ms: u64) {
        if epoch == self.map.epoch() {
            let until = sent_at_ms.saturating_add(self.config.map_lease_ms);
            self.map_valid_until_ms = self.map_valid_until_ms.max(until);
        }
    }

    /// Takes `map` on (`old`: the map before it; `served`: the range this cell could serve
    /// as master under `old` when `map` came).
    fn adopt(
        &mut self,
        map: ClusterMap,
        old: Option<ClusterMap>,
        served: Option<HashRange>,
        now_ms: u64,
    ) {
        let Some(me) = map.cell(&self.me).cloned() else {
            self.fence_self();
            return;
        };
        if map.is_fenced(&self.me) {
            self.fence_self();
            return;
        }
        let old_backups = std::mem::take(&mut self.backups);
        let old_range = old
            .as_ref()
            .and_then(|o| o.cell(&self.me))
            .and_then(|c| c.range);
        self.backups = if me.state == CellState::Active {
            map.backups(&self.me).iter().map(|c| c.id.clone()).collect()
        } else {
            Vec::new()
        };
        // Leases from cells that are no longer my backups are useless now: drop and release
        // them so those cells can grant my old range to its new master at once.
        let released: Vec<CellId> = self
            .leases
            .keys()
            .filter(|b| !self.backups.contains(b))
            .cloned()
            .collect();
        for b in released {
            self.leases.remove(&b);
            self.release(b, map.epoch(), None, now_ms);
        }
        // A lease that covers more than my range now is cut to it (or dropped), and its
        // grantor told at once, so it may grant the rest to the part's new master.
        if let Some(range) = me.range.filter(|_| me.state == CellState::Active) {
            let cut: Vec<(CellId, Option<HashRange>)> = self
                .leases
                .iter()
                .filter(|(_, l)| !range.covers(&l.range))
                .map(|(b, l)| (b.clone(), l.range.covers(&range).then_some(range)))
                .collect();
            for (b, keep) in cut {
                match keep {
                    Some(k) => {
                        if let Some(l) = self.leases.get_mut(&b) {
                            l.range = k;
                        }
                    }
                    None => {
                        self.leases.remove(&b);
                    }
                }
                self.release(b, map.epoch(), keep, now_ms);
            }
        }
        for b in &self.backups {
            self.last_ack_ms.entry(b.clone()).or_insert(now_ms);
        }
        // What this cell mastered and gave up: its new master may be this cell's
        // predecessor, served on this cell's own grant (a ring of one dividing, a shift up
        // in a ring of two), which must wait for the writes made here to reach it.
        let gave_from = old
            .as_ref()
            .and_then(|o| o.cell(&self.me))
            .filter(|c| c.state == CellState::Active)
            .and_then(|c| c.range);
        if let Some(o) = gave_from {
            let kept = me.range.filter(|_| me.state == CellState::Active);
            let gave = kept.map_or_else(|| vec![o], |k| o.minus(&k));
            for range in gave {
                let until_ms = now_ms.saturating_add(self.config.tail_hold_ms);
                self.tails.push(Tail { range, until_ms });
                self.outputs.push(Output::DeliverTail { range });
            }
        }
        self.last_ack_ms.retain(|b, _| self.backups.contains(b));
        if let Some(range) = me.range {
            self.record_acquired(old.as_ref(), &map, range, served, now_ms);
        }
        self.outputs.push(Output::Holdings {
            epoch: map.epoch(),
            master: me.range,
            backups: if me.state == CellState::Active {
                map.backup_ranges(&self.me)
                    .into_iter()
                    .map(|(_, r)| r)
                    .chain(incoming_shifts(&map, &self.me))
                    .collect()
            } else {
                Vec::new()
            },
        });
        // Re-replication owed: to every backup that is new, or all of them if my range
        // changed — but not after a shift to those that already held all of my new range
        // (its targets received the moved part before the flip).
        let shifted = old.as_ref().is_some_and(|o| {
            o.migrations().iter().any(|m| {
                matches!(m, Migration::Shift { involved, .. } if involved.contains(&self.me))
                    && !map.migrations().contains(m)
            })
        });
        // Divisions whose flip this map is: (parent, child).
        let flipped = old
            .as_ref()
            .map_or_else(Vec::new, |o| flipped_divisions(o, &map));
        // A division's child flipped now received all of my old range before the flip (the
        // snapshot and every write since: it caught up, and stayed a replication target),
        // so as my new backup it holds my new range already. (Re-sending it cost the
        // parent, the busiest cell of the ring, a second stream of half its data right
        // after the flip.)
        let children_done: Vec<CellId> = flipped
            .iter()
            .filter(|(parent, _)| *parent == self.me)
            .map(|(_, child)| child.clone())
            .collect();
        // Likewise, as the child just flipped, my backups that held all of my new range in
        // the old map — my parent's backups — hold it already: they received every write
        // made there until the flip (my parent's lease release, which my lease from them
        // waits for, waits for those writes), and receive mine from the flip on.
        let i_flipped = flipped.iter().any(|(_, child)| *child == self.me);
        if let (Some(range), Some(o)) = (me.range, old.as_ref()) {
            for b in &self.backups {
                if children_done.contains(b) || (i_flipped && held_all(o, b, range)) {
                    continue;
                }
                let held = shifted && held_all(o, b, range);
                if !old_backups.contains(b) || (old_range != Some(range) && !held) {
                    self.resync_out.insert((b.clone(), range), now_ms);
                    self.outputs.push(Output::Resync {
                        to: b.clone(),
                        range,
                    });
                }
            }
        }
        self.resync_out
            .retain(|(to, range), _| self.backups.contains(to) && Some(*range) == me.range);
        if let Some(old) = &old {
            let before: BTreeSet<CellId> = old
                .backup_ranges(&self.me)
                .into_iter()
                .map(|(c, _)| c.id.clone())
                .collect();
            let was_active = old
                .cell(&self.me)
                .is_some_and(|c| c.state == CellState::Active);
            for (p, range) in map.backup_ranges(&self.me) {
                // A division's child just flipped sends me nothing if I held its range (the
                // rule above, on its side). A cell new to me since my last map is such a
                // child too: cells enter the map only by division (I skipped its begin).
                let child =
                    flipped.iter().any(|(_, child)| *child == p.id) || old.cell(&p.id).is_none();
                let child_held = child && held_all(old, &self.me, range);
                if was_active
                    && me.state == CellState::Active
                    && !before.contains(&p.id)
                    && !child_held
                {
                    self.resync_in.insert(p.id.clone());
                }
            }
        }
        let preds: BTreeSet<CellId> = map
            .backup_ranges(&self.me)
            .into_iter()
            .map(|(c, _)| c.id.clone())
            .collect();
        self.resync_in.retain(|p| preds.contains(p));
        self.deferred.retain(|p, _| preds.contains(p));
        // Hand-offs this cell leads: a division's parent streams its range to the child, a
        // shift's giver the moved part to its targets.
        let mut current = BTreeSet::new();
        for m in map.migrations() {
            let (receivers, range) = match m {
                Migration::Division { parent, child, .. } if *parent == self.me => (
                    std::slice::from_ref(child),
                    me.range.unwrap_or(HashRange::FULL),
                ),
                Migration::Shift {
                    from,
                    targets,
                    range,
                    ..
                } if *from == self.me => (targets.as_slice(), *range),
                _ => continue,
            };
            for child in receivers {
                current.insert(child.clone());
                if !self.handoffs.contains_key(child) {
                    self.handoffs.insert(
                        child.clone(),
                        HandOff {
                            range,
                            started_ms: now_ms,
                            last_emitted_ms: now_ms,
                            caught_up: false,
                            last_ack_ms: now_ms,
                        },
                    );
                    self.outputs.push(Output::StartHandOff {
                        child: child.clone(),
                        range,
                    });
                }
            }
        }
        self.handoffs.retain(|child, _| current.contains(child));
        self.proposed.clear();
    }

    fn fence_self(&mut self) {
        if !self.fenced {
            self.fenced = true;
            self.leases.clear();
            self.backups.clear();
            self.outputs.push(Output::Fenced);
        }
    }

    /// Asks the consensus group to confirm the map, and every backup for a lease (division
    /// children only show they are alive).
    fn heartbeat(&mut self, now_ms: u64) {
        self.last_heartbeat_ms = Some(now_ms);
        let epoch = self.map.epoch();
        self.outputs.push(Output::ConfirmMap {
            epoch,
            sent_at_ms: now_ms,
        });
        let children = self.handoffs.keys().filter(|c| !self.backups.contains(c));
        for b in self
            .backups
            .iter()
            .chain(children)
            .cloned()
            .collect::<Vec<_>>()
        {
            let message = RingMessage::Heartbeat {
                from: self.me.clone(),
                epoch,
                sent_at_ms: now_ms,
            };
            self.outputs.push(Output::Send { to: b, message });
        }
    }

    /// Advances time: heartbeats, suspicion, retries, orchestration proposals.
    pub fn tick(&mut self, now_ms: u64) {
        if self.fenced {
            return;
        }
        for gs in self.grants.values_mut() {
            gs.retain(|g| now_ms < g.expires_ms);
        }
        self.grants.retain(|_, gs| !gs.is_empty());
        self.acquired.retain(|a| now_ms < a.not_before_ms);
        self.tails.retain(|t| now_ms < t.until_ms);
        self.answer_deferred(now_ms);
        let due = self
            .last_heartbeat_ms
            .is_none_or(|t| now_ms >= t.saturating_add(self.config.heartbeat_interval_ms));
        if due {
            self.heartbeat(now_ms);
        }
        // Between heartbeats, a master missing a backup's lease for its range asks that
        // backup again (the lease is what lets it serve a range it just took over).
        let retry_due = now_ms
            >= self
                .last_lease_retry_ms
                .saturating_add(self.config.lease_retry_ms);
        if !due && retry_due {
            let lacking = self.backups_without_lease(now_ms);
            if !lacking.is_empty() {
                self.last_lease_retry_ms = now_ms;
            }
            for b in lacking {
                let message = RingMessage::Heartbeat {
                    from: self.me.clone(),
                    epoch: self.map.epoch(),
                    sent_at_ms: now_ms,
                };
                self.outputs.push(Output::Send { to: b, message });
            }
        }
        let epoch = self.map.epoch();
        // Suspicion of the successor (each cell watches the next one).
        if let Some(successor) = self.backups.first().cloned() {
            let last = self.last_ack_ms.get(&successor).copied().unwrap_or(now_ms);
            if now_ms.saturating_sub(last) >= self.config.suspicion_timeout_ms {
                self.propose(Change::Fence { cell: successor }, epoch, now_ms);
            }
        }
        // Hand-offs led by this cell (a division's parent, a shift's giver): the change is
        // completed once every receiver caught up and answers, or aborted.
        for m in self.map.migrations().to_vec() {
            let (receivers, moving, complete, abort) = match m {
                Migration::Division {
                    parent,
                    child,
                    range,
                    ..
                } if parent == self.me => (
                    vec![child.clone()],
                    range,
                    Change::CompleteDivision {
                        child: child.clone(),
                    },
                    Change::AbortDivision { child },
                ),
                Migration::Shift {
                    from,
                    targets,
                    range,
                    ..
                } if from == self.me => (
                    targets,
                    range,
                    Change::CompleteShift { from: from.clone() },
                    Change::AbortShift { from },
                ),
                _ => continue,
            };
            let mut all_ready = self.can_serve_all(moving, now_ms);
            let mut failed = false;
            for child in &receivers {
                let Some(h) = self.handoffs.get(child).cloned() else {
                    all_ready = false;
                    continue;
                };
                let silent_ms = now_ms.saturating_sub(h.last_ack_ms);
                let child_silent = silent_ms >= self.config.suspicion_timeout_ms;
                // Before it caught up, no write waits for the receiver: an outage only
                // pauses the stream, which resumes from the last acknowledged record, so it
                // is given `handoff_stall_timeout_ms`. Once caught up, the giver's writes wait
                // for it, so a silent receiver is not waited for longer than a crashed
                // backup would be.
                let stalled = if h.caught_up {
                    child_silent
                } else {
                    silent_ms >= self.config.handoff_stall_timeout_ms
                };
                if stalled || now_ms.saturating_sub(h.started_ms) >= self.config.handoff_timeout_ms
                {
                    failed = true;
                } else if !h.caught_up || child_silent {
                    all_ready = false;
                    if !h.caught_up
                        && now_ms.saturating_sub(h.last_emitted_ms) >= self.config.resync_retry_ms
                    {
                        self.outputs.push(Output::StartHandOff {
                            child: child.clone(),
                            range: h.range,
                        });
                        if let Some(h) = self.handoffs.get_mut(child) {
                            h.last_emitted_ms = now_ms;
                        }
                    }
                }
            }
            if failed {
                self.propose(abort, epoch, now_ms);
            } else if all_ready {
                self.propose(complete, epoch, now_ms);
            }
        }
        // Re-replications not reported done are started again.
        for ((to, range), started) in self.resync_out.iter_mut() {
            if now_ms.saturating_sub(*started) >= self.config.resync_retry_ms {
                *started = now_ms;
                self.outputs.push(Output::Resync {
                    to: to.clone(),
                    range: *range,
                });
            }
        }
        // Absorptions this cell completes as the successor.
        if self.resync_out.is_empty() && self.resync_in.is_empty() {
            let done: Vec<CellId> = self
                .map
                .migrations()
                .iter()
                .filter_map(|m| match m {
                    Migration::Absorption {
                        departed,
                        successor,
                        ..
                    } if *successor == self.me => Some(departed.clone()),
                    _ => None,
                })
                .collect();
            for departed in done {
                self.propose(Change::CompleteAbsorption { departed }, epoch, now_ms);
            }
        }
        if self.leave_requested
            && self
                .map
                .cell(&self.me)
                .is_some_and(|c| c.state == CellState::Active)
        {
            let reason = AbsorptionReason::Leaving;
            let change = Change::BeginAbsorption {
                departed: self.me.clone(),
                reason,
            };
            self.propose(change, epoch, now_ms);
        }
    }

    fn propose(&mut self, change: Change, epoch: u64, now_ms: u64) {
        let retry = self.config.proposal_retry_ms;
        match self.proposed.iter_mut().find(|(c, _)| *c == change) {
            Some((_, at)) if now_ms.saturating_sub(*at) < retry => return,
            Some((_, at)) => *at = now_ms,
            None => self.proposed.push((change.clone(), now_ms)),
        }
        self.outputs.push(Output::Propose(Proposal {
            based_on_epoch: epoch,
            change,
        }));
    }

    /// Balancing: propose that `range`, an end of this cell's range, moves to its neighbour
    /// `to` (see [`Change::BeginShift`]); this cell then streams it and completes the shift.
    pub fn request_shift(&mut self, to: CellId, range: HashRange, now_ms: u64) {
        if self.fenced {
            return;
        }
        let change = Change::BeginShift {
            from: self.me.clone(),
            to,
            range,
        };
        let epoch = self.map.epoch();
        self.propose(change, epoch, now_ms);
    }

    /// Scale-out: propose that a new cell at `child_address` divides this cell's range.
    pub fn request_division(&mut self, child_address: CellAddress, now_ms: u64) {
        if self.fenced {
            return;
        }
        let change = Change::BeginDivision {
            parent: self.me.clone(),
            child_address,
        };
        let epoch = self.map.epoch();
        self.propose(change, epoch, now_ms);
    }

    /// Scale-in: propose (and keep proposing) this cell's graceful absorption.
    pub fn request_leave(&mut self) {
        self.leave_requested = true;
    }

    /// The node reports that `child` has the snapshot and is in step with live writes.
    pub fn handoff_caught_up(&mut self, child: &CellId) {
        if let Some(h) = self.handoffs.get_mut(child) {
            h.caught_up = true;
        }
    }

    /// The node reports that `to`'s copy of `range` is in sync.
    pub fn resync_done(&mut self, to: &CellId, range: HashRange) {
        self.resync_out.remove(&(to.clone(), range));
    }

    /// The node reports that `from` finished re-sending its range to this cell.
    pub fn resync_received(&mut self, from: &CellId) {
        self.resync_in.remove(from);
    }
}

mod departures;
mod interface;
mod leases;
mod shift;
pub use shift::incoming_shifts;
use shift::{flipped_divisions, held_all};
#[cfg(test)]
mod tests;
