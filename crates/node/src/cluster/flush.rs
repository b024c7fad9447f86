//! `flush_all` in a ring: every master flushes its own range, once, in its replication
//! stream.
//!
//! A client's `flush_all` reaches every Active cell (`route` broadcasts it). Each flushes
//! only the range it masters: the store drops those keys under all its shard locks and
//! reports one `Flush { range }` in its change feed, so the flush takes one place in the
//! range's replication stream. Backups apply it at that place to their copies of that range
//! only: a write the master acknowledged after the flush (later in its stream) survives on
//! both, one acknowledged before is gone from both. Applying a flush reports nothing, so it
//! never travels further (the ring once passed a flush from backup to backup forever, each
//! wiping every later write).
//!
//! A delayed flush (`flush_all N`) is a promise, kept in [`PendingFlushes`]: the master
//! records it and announces it to its backups (and division children) in its stream, and
//! when its second comes the master flushes whatever part of the promised range it masters
//! then, as above. The master's flush cancels its backups' copy of the promise. If the
//! master dies first, the successor that absorbs its range still holds the promise and keeps
//! it; a division child gets its parent's promises when it becomes a target.

use std::sync::atomic::Ordering;

use cellcache_cluster::{CellState, HashRange};

use super::Cluster;

/// One promised flush: the parts of its range not yet flushed, and when.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Promise {
    at_unix_secs: u32,
    pieces: Vec<HashRange>,
}

/// Delayed flushes this cell knows of: its own and its masters'; see the module docs.
#[derive(Debug, Default)]
pub struct PendingFlushes {
    promises: Vec<Promise>,
}

impl PendingFlushes {
    /// `range` is to be flushed at `at_unix_secs`. Like memcached, a new flush replaces a
    /// pending one (for the hashes of `range`).
    pub fn schedule(&mut self, range: HashRange, at_unix_secs: u32) {
        self.flushed(range);
        self.promises.push(Promise {
            at_unix_secs,
            pieces: vec![range],
        });
    }

    /// `range` was flushed now: no promise for its hashes is pending any more.
    pub fn flushed(&mut self, range: HashRange) {
        for p in &mut self.promises {
            p.pieces = p
                .pieces
                .iter()
                .flat_map(|piece| piece.minus(&range))
                .collect();
        }
        self.promises.retain(|p| !p.pieces.is_empty());
    }

    /// The parts of promises due at `now` that `master` covers, removed from the promises:
    /// this cell flushes them now.
    pub fn take_due(&mut self, now: u32, master: HashRange) -> Vec<HashRange> {
        let mut due = Vec::new();
        for p in self.promises.iter_mut().filter(|p| p.at_unix_secs <= now) {
            for piece in &p.pieces {
                due.extend(piece.intersect(&master));
            }
        }
        for r in &due {
            self.flushed(*r);
        }
        due
    }

    /// Forgets due promises for hashes this cell holds no copy of (`holds` says whether it
    /// holds any hash of a range): their master keeps them.
    pub fn prune(&mut self, now: u32, holds: impl Fn(&HashRange) -> bool) {
        for p in self.promises.iter_mut().filter(|p| p.at_unix_secs <= now) {
            p.pieces.retain(|piece| holds(piece));
        }
        self.promises.retain(|p| !p.pieces.is_empty());
    }

    /// The pending promises for hashes of `range`, as (range, second): what a new
    /// replication target of `range` must be told.
    pub fn within(&self, range: HashRange) -> Vec<(HashRange, u32)> {
        self.promises
            .iter()
            .flat_map(|p| {
                p.pieces
                    .iter()
                    .flat_map(move |piece| piece.intersect(&range))
                    .map(move |r| (r, p.at_unix_secs))
            })
            .collect()
    }

    /// Whether no flush is pending.
    pub fn is_empty(&self) -> bool {
        self.promises.is_empty()
    }
}

impl Cluster {
    /// The range this cell masters now, if it is Active.
    fn master_range(&self) -> Option<HashRange> {
        let ring = self.lock_ring();
        ring.map()
            .cell(&self.me)
            .filter(|c| c.state == CellState::Active)
            .and_then(|c| c.range)
    }

    /// This cell's part of a client's `flush_all`: its master range, now (`delay_secs` 0)
    /// or at `now + delay_secs`. Run inside the request's replication capture, so a sync
    /// reply waits until the backups have the flush (or the promise).
    pub fn flush_master_range(&self, now: u32, delay_secs: u32) {
        let Some(master) = self.master_range() else {
            return;
        };
        if delay_secs == 0 {
            self.flushes.lock().flushed(master);
            self.stats.flushes.fetch_add(1, Ordering::Relaxed);
            self.cell.store.flush_range(master);
        } else {
            let at = now.saturating_add(delay_secs);
            self.flushes.lock().schedule(master, at);
            self.repl.push_flush(master, at);
        }
    }

    /// A flush record from the master of `range`: drop the copies `flushable` accepts now
    /// (`at_unix_secs` 0), or keep the promise of a flush at that second.
    pub fn flush_received(
        &self,
        range: HashRange,
        at_unix_secs: u32,
        flushable: &dyn Fn(u64) -> bool,
    ) {
        if at_unix_secs == 0 {
            self.flushes.lock().flushed(range);
            self.stats.flushes_applied.fetch_add(1, Ordering::Relaxed);
            let dropped = self.cell.store.drop_range_if(range, flushable);
            tracing::debug!(%range, dropped, "replicated flush applied");
        } else {
            self.flushes.lock().schedule(range, at_unix_secs);
        }
    }

    /// Ring driver tick: keeps the promises that are due for the range this cell masters,
    /// and forgets due ones for ranges it holds no copy of.
    pub fn flush_when_due(&self) {
        if self.flushes.lock().is_empty() {
            return;
        }
        let now = self.cell.now();
        let held: Vec<HashRange> = {
            let ring = self.lock_ring();
            let map = ring.map();
            let mine = map.cell(&self.me).and_then(|c| c.range);
            mine.into_iter()
                .chain(map.backup_ranges(&self.me).into_iter().map(|(_, r)| r))
                .collect()
        };
        let due = match self.master_range() {
            Some(master) => self.flushes.lock().take_due(now, master),
            None => Vec::new(),
        };
        for range in due {
            tracing::info!(%range, "delayed flush_all taking effect");
            self.stats.flushes.fetch_add(1, Ordering::Relaxed);
            self.cell.store.flush_range(range);
        }
        self.flushes
            .lock()
            .prune(now, |r| held.iter().any(|h| h.overlaps(r)));
    }

    /// Tells the replication targets of the master range every promise for it (a new
    /// backup or division child must keep them too; a repeat changes nothing).
    pub fn announce_pending_flushes(&self) {
        let Some(master) = self.master_range() else {
            return;
        };
        let promises = self.flushes.lock().within(master);
        for (range, at) in promises {
            self.repl.push_flush(range, at);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HALF: u64 = u64::MAX / 2;

    #[test]
    fn a_promise_is_kept_by_whoever_masters_its_range_when_due() {
        let mut f = PendingFlushes::default();
        f.schedule(HashRange::new(0, HALF), 100);
        // Not due yet: nothing to flush.
        assert!(f.take_due(99, HashRange::FULL).is_empty());
        // Due, but this cell masters only the second half of it (a division moved the
        // first half away): it flushes its part and keeps the rest for the new master.
        let mine = HashRange::new(HALF / 2, HALF);
        assert_eq!(f.take_due(100, mine), vec![mine]);
        assert_eq!(
            f.within(HashRange::FULL),
            vec![(HashRange::new(0, HALF / 2 - 1), 100)]
        );
        // Then it absorbs the rest (its predecessor died before keeping the promise).
        assert_eq!(
            f.take_due(101, HashRange::new(0, HALF)),
            vec![HashRange::new(0, HALF / 2 - 1)]
        );
        assert!(f.is_empty());
    }

    #[test]
    fn the_masters_flush_cancels_its_backups_promise_and_a_new_flush_replaces_one() {
        let mut f = PendingFlushes::default();
        f.schedule(HashRange::new(0, HALF), 100);
        f.flushed(HashRange::new(0, HALF));
        assert!(
            f.is_empty(),
            "the master's flush record cancels the promise"
        );
        f.schedule(HashRange::new(0, HALF), 100);
        f.schedule(HashRange::new(0, HALF), 200);
        assert_eq!(
            f.within(HashRange::FULL),
            vec![(HashRange::new(0, HALF), 200)]
        );
    }

    #[test]
    fn due_promises_for_ranges_not_held_are_forgotten() {
        let mut f = PendingFlushes::default();
        f.schedule(HashRange::new(0, HALF), 100);
        f.schedule(HashRange::new(HALF + 1, u64::MAX), 300);
        f.prune(200, |_| false);
        assert_eq!(
            f.within(HashRange::FULL),
            vec![(HashRange::new(HALF + 1, u64::MAX), 300)],
            "only the due one goes"
        );
    }
}
