//! The ring's leases: answering heartbeats with grants, taking grants as leases, and
//! releasing what a master no longer relies on (see the module docs of [`super`], "Leases").

use super::*;

impl Ring {
    /// Tells backup `b` that this cell relies on no lease it answered to a heartbeat sent
    /// before `now_ms` but `keep` (the lease it still holds, already cut to it), and stops
    /// accepting such answers.
    pub(super) fn release(&mut self, b: CellId, epoch: u64, keep: Option<HashRange>, now_ms: u64) {
        let from = self.accept_from_ms.entry(b.clone()).or_insert(now_ms);
        *from = (*from).max(now_ms);
        let message = RingMessage::LeaseRelease {
            from: self.me.clone(),
            epoch,
            before_ms: Some(now_ms),
            keep,
        };
        self.outputs.push(Output::Send { to: b, message });
    }

    /// Handles a message from a peer.
    pub fn step(&mut self, message: RingMessage, now_ms: u64) {
        if self.fenced {
            return;
        }
        match message {
            RingMessage::Heartbeat {
                from,
                epoch,
                sent_at_ms,
            } => {
                self.note_epoch(&from, epoch);
                let grant = self.grant_for(&from, sent_at_ms, now_ms);
                // A heartbeat under a map newer than mine (a division's parent heartbeats its
                // child the moment it installs the flip, which may reach the child first) is
                // answered once I install that map, if its sender is my predecessor there.
                let newer = epoch > self.map.epoch();
                if grant.is_none() && (newer || self.may_grant_once_confirmed(&from, now_ms)) {
                    self.defer(&from, sent_at_ms);
                }
                let message = RingMessage::HeartbeatAck {
                    from: self.me.clone(),
                    epoch: self.map.epoch(),
                    echo_sent_at_ms: sent_at_ms,
                    grant,
                };
                self.outputs.push(Output::Send { to: from, message });
            }
            RingMessage::HeartbeatAck {
                from,
                epoch,
                echo_sent_at_ms,
                grant,
            } => {
                self.note_epoch(&from, epoch);
                if let Some(h) = self.handoffs.get_mut(&from) {
                    h.last_ack_ms = h.last_ack_ms.max(now_ms);
                }
                if !self.backups.contains(&from) {
                    return;
                }
                let ack = self.last_ack_ms.entry(from.clone()).or_insert(now_ms);
                *ack = (*ack).max(now_ms);
                let Some(granted) = grant else { return };
                let newer = self
                    .leases
                    .get(&from)
                    .is_none_or(|l| echo_sent_at_ms >= l.sent_at_ms);
                let accepted = self
                    .accept_from_ms
                    .get(&from)
                    .is_none_or(|from_ms| echo_sent_at_ms >= *from_ms);
                if !(newer && accepted) {
                    return;
                }
                let before = self.leases.get(&from).map(|l| l.range);
                // A lease never covers more than this cell masters now: a grantor with an
                // older map may grant a range it since gave up (it is then told so at once),
                // and a part outside it must not come back to life with a later map.
                let mine = self
                    .map
                    .cell(&self.me)
                    .filter(|c| c.state == CellState::Active)
                    .and_then(|c| c.range);
                let range = match mine {
                    Some(m) if m.covers(&granted) => Some(granted),
                    Some(m) if granted.covers(&m) => Some(m),
                    _ => None,
                };
                if let Some(range) = range {
                    let expires_ms = echo_sent_at_ms.saturating_add(self.config.lease_ms);
                    let lease = Lease {
                        range,
                        expires_ms,
                        sent_at_ms: echo_sent_at_ms,
                    };
                    self.leases.insert(from.clone(), lease);
                }
                // Tell the grantor at once what it no longer needs to keep from others: the
                // part of this grant cut off, or what earlier grants covered beyond it.
                let epoch = self.map.epoch();
                if range != Some(granted) {
                    let keep = self.leases.get(&from).map(|l| l.range);
                    self.release(from, epoch, keep, echo_sent_at_ms.saturating_add(1));
                } else if before.is_some_and(|b| !granted.covers(&b)) {
                    self.release(from, epoch, Some(granted), echo_sent_at_ms);
                }
            }
            RingMessage::LeaseRelease {
                from,
                epoch,
                before_ms,
                keep,
            } => {
                self.note_epoch(&from, epoch);
                if before_ms.is_some() && keep.is_none() {
                    self.note_released_all(&from, epoch);
                }
                let Some(before_ms) = before_ms else {
                    self.grants.remove(&from);
                    self.deferred.remove(&from);
                    self.answer_deferred(now_ms);
                    return;
                };
                // A deferred heartbeat the master no longer accepts answers to.
                if self.deferred.get(&from).is_some_and(|at| *at < before_ms) {
                    self.deferred.remove(&from);
                }
                if let Some(gs) = self.grants.get_mut(&from) {
                    gs.retain_mut(|g| {
                        if g.sent_at_ms >= before_ms {
                            return true;
                        }
                        match keep {
                            Some(k) if g.range.covers(&k) => {
                                g.range = k;
                                true
                            }
                            _ => false,
                        }
                    });
                }
                // A heartbeat refused for the grants just released is answered now.
                self.answer_deferred(now_ms);
            }
        }
    }

    /// Whether a heartbeat of `to` got no grant only because this cell's map is not
    /// confirmed (yet, or any more): it is an active backup of `to`.
    fn may_grant_once_confirmed(&self, to: &CellId, now_ms: u64) -> bool {
        now_ms >= self.map_valid_until_ms
            && self
                .map
                .cell(&self.me)
                .is_some_and(|c| c.state == CellState::Active)
            && self
                .map
                .backup_ranges(&self.me)
                .iter()
                .any(|(c, _)| c.id == *to)
    }

    /// The node delivered what this cell had queued for replication when it gave up
    /// `range` ([`Output::DeliverTail`]): its new master may get a lease on it now (a
    /// heartbeat that came meanwhile is answered at once).
    pub fn tail_delivered(&mut self, range: HashRange, now_ms: u64) {
        self.tails.retain(|t| t.range != range);
        self.answer_deferred(now_ms);
    }

    /// Answers the heartbeats deferred while this cell's map was unconfirmed, its tail
    /// undelivered or a conflicting grant to another cell unreleased, as far as that ended:
    /// a grant decided now ([`Ring::grant_for`], as for a heartbeat arriving
    /// now), so a new master waits for one confirmation round trip, not for its next retry
    /// on top. Call after [`Ring::map_confirmed`]; `tick` calls it too.
    pub fn answer_deferred(&mut self, now_ms: u64) {
        if self.deferred.is_empty() || now_ms >= self.map_valid_until_ms {
            return;
        }
        for (to, sent_at_ms) in std::mem::take(&mut self.deferred) {
            if let Some(grant) = self.grant_for(&to, sent_at_ms, now_ms) {
                let message = RingMessage::HeartbeatAck {
                    from: self.me.clone(),
                    epoch: self.map.epoch(),
                    echo_sent_at_ms: sent_at_ms,
                    grant: Some(grant),
                };
                self.outputs.push(Output::Send { to, message });
            }
        }
    }

    /// Remembers `to`'s heartbeat sent at `sent_at_ms` for [`Ring::answer_deferred`] (the
    /// latest one per master).
    fn defer(&mut self, to: &CellId, sent_at_ms: u64) {
        let at = self.deferred.entry(to.clone()).or_insert(sent_at_ms);
        *at = (*at).max(sent_at_ms);
    }

    fn note_epoch(&mut self, from: &CellId, epoch: u64) {
        if epoch > self.map.epoch() {
            self.outputs.push(Output::NeedMap { from: from.clone() });
        }
    }

    /// The lease this cell grants `to` for its heartbeat sent at `sent_at_ms`, if any: `to`'s
    /// range in my map when I back it up and no unexpired grant to another cell overlaps it.
    fn grant_for(&mut self, to: &CellId, sent_at_ms: u64, now_ms: u64) -> Option<HashRange> {
        let me_active = self
            .map
            .cell(&self.me)
            .is_some_and(|c| c.state == CellState::Active);
        if !me_active || now_ms >= self.map_valid_until_ms {
            return None;
        }
        let (_, range) = self
            .map
            .backup_ranges(&self.me)
            .into_iter()
            .find(|(c, _)| c.id == *to)?;
        if self
            .tails
            .iter()
            .any(|t| now_ms < t.until_ms && t.range.overlaps(&range))
        {
            // Answered once the writes this cell made there are delivered.
            self.defer(to, sent_at_ms);
            return None;
        }
        let conflict = self.grants.iter().any(|(other, gs)| {
            other != to
                && gs
                    .iter()
                    .any(|g| now_ms < g.expires_ms && g.range.overlaps(&range))
        });
        if conflict {
            // Answered once the other cell releases it (a division's or shift's giver does
            // once its tail is delivered) or it expires, not at this master's next retry.
            self.defer(to, sent_at_ms);
            return None;
        }
        let expires_ms = now_ms
            .saturating_add(self.config.lease_ms)
            .saturating_add(self.config.clock_drift_margin_ms);
        let gs = self.grants.entry(to.clone()).or_default();
        // Earlier grants this one outlasts and covers say nothing more.
        gs.retain(|g| !(range.covers(&g.range) && g.expires_ms <= expires_ms));
        gs.push(Lease {
            range,
            expires_ms,
            sent_at_ms,
        });
        Some(range)
    }

    /// The backups whose lease does not cover this cell's master range now.
    pub(super) fn backups_without_lease(&self, now_ms: u64) -> Vec<CellId> {
        let Some(range) = self.map.cell(&self.me).and_then(|c| c.range) else {
            return Vec::new();
        };
        self.backups
            .iter()
            .filter(|b| {
                self.leases
                    .get(*b)
                    .is_none_or(|l| now_ms >= l.expires_ms || !l.range.covers(&range))
            })
            .cloned()
            .collect()
    }

    /// Whether this cell may answer for every hash of `range` (see [`Ring::can_serve`]): a
    /// range changes master only from one that could serve all of it at that moment, so no
    /// earlier master still can (a part given on before its giver could serve it would
    /// leave the cell before that with a lease the new master's backups know nothing of).
    pub(super) fn can_serve_all(&self, range: HashRange, now_ms: u64) -> bool {
        let mine = self.map.cell(&self.me).and_then(|c| c.range);
        !self.fenced
            && now_ms < self.map_valid_until_ms
            && mine.is_some_and(|m| m.covers(&range))
            && self.leases_allow(range, now_ms)
    }

    /// What keeps this cell from serving its whole master range now (`None`: it masters
    /// nothing); every field false means it serves it. For operators and the driver's log:
    /// how long a new master waited after a map change, and for what.
    pub fn serve_wait(&self, now_ms: u64) -> Option<ServeWait> {
        let range = self
            .map
            .cell(&self.me)
            .filter(|c| c.state == CellState::Active)?
            .range?;
        let departed = self
            .acquired
            .iter()
            .any(|a| now_ms < a.not_before_ms && a.range.overlaps(&range));
        let granted_away = self.grants.iter().any(|(to, gs)| {
            *to != self.me
                && gs
                    .iter()
                    .any(|g| now_ms < g.expires_ms && g.range.overlaps(&range))
        });
        let leases = self
            .backups
            .iter()
            .filter(|b| {
                !self
                    .leases
                    .get(*b)
                    .is_some_and(|l| now_ms < l.expires_ms && l.range.covers(&range))
            })
            .cloned()
            .collect();
        Some(ServeWait {
            unconfirmed: now_ms >= self.map_valid_until_ms,
            departed,
            granted_away,
            leases,
        })
    }

    /// The lease side of serving `range`: no wait for a departed cell's lease over any of
    /// it, no unexpired grant of any of it to another cell, and a lease covering all of it
    /// from every backup.
    pub(super) fn leases_allow(&self, range: HashRange, now_ms: u64) -> bool {
        if self
            .acquired
            .iter()
            .any(|a| now_ms < a.not_before_ms && a.range.overlaps(&range))
        {
            return false;
        }
        let granted_away = self.grants.iter().any(|(to, gs)| {
            *to != self.me
                && gs
                    .iter()
                    .any(|g| now_ms < g.expires_ms && g.range.overlaps(&range))
        });
        if granted_away {
            return false;
        }
        self.backups.iter().all(|b| {
            self.leases
                .get(b)
                .is_some_and(|l| now_ms < l.expires_ms && l.range.covers(&range))
        })
    }
}
