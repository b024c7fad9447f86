//! The write-back engine: which dirty key to send to the backing store when, as a pure state
//! machine (no I/O, no clock, no threads; the node drives it and passes `now` in).
//!
//! Guarantees, each kept by one rule:
//! - **Per-key order** (never an older value after a newer one): a key has at most one flush
//!   in flight; its next op waits until that flush is confirmed or failed, and a failed op is
//!   dropped when a newer one is pending (the newer one is the key's whole state).
//! - **Coalescing**: a key's writes while it waits are folded into one op ([`Op::then`]):
//!   ten writes within the window cost one store write.
//! - **Batching and throttling**: [`WriteBack::take_batch`] cuts at most
//!   `batch_items_max` keys and about `batch_bytes_max` bytes, at most
//!   `batches_in_flight_max` batches at once, and at most `items_per_sec_max` keys per second.
//! - **Retry with backoff**: a failed batch keeps its ops and pauses every flush for a
//!   backoff that doubles with each consecutive failure up to `backoff_max_ms`.
//! - **Bounded dirty bytes**: [`WriteBack::has_room`] says whether a new write may be taken;
//!   the node answers `SERVER_ERROR` past the bound instead of dropping data.
//! - **Durability waits**: a waiter registered for a key's version is released once that
//!   version, or a later one of the same key, is in the store (write-through holds the
//!   client's reply on it).
//! - `flush_all` is a barrier ([`WriteBack::record_clear`]): pending ops before it are
//!   dropped, the store is cleared once the flushes in flight are done, and nothing recorded
//!   after it is sent before the clear is confirmed.

use crate::record::{Op, Record};
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

#[cfg(test)]
mod tests;

/// The engine's limits and timings (`[tier]` in the cell's TOML).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteBackConfig {
    /// How long a key stays dirty before its flush is due (0: at once, write-through).
    pub window_ms: u64,
    /// Dirty bytes (keys and values held for the store) past which writes are refused.
    pub dirty_bytes_max: usize,
    /// Keys in one batch at most.
    pub batch_items_max: usize,
    /// Bytes of values in one batch, about (a batch holds at least one key).
    pub batch_bytes_max: usize,
    /// Batches sent and not yet answered, at most.
    pub batches_in_flight_max: usize,
    /// Keys sent per second at most; 0: unthrottled.
    pub items_per_sec_max: u64,
    /// The pause after a failed batch; doubled per consecutive failure.
    pub backoff_initial_ms: u64,
    /// The longest pause.
    pub backoff_max_ms: u64,
}

impl Default for WriteBackConfig {
    fn default() -> Self {
        WriteBackConfig {
            window_ms: 1000,
            dirty_bytes_max: 64 << 20,
            batch_items_max: 256,
            batch_bytes_max: 4 << 20,
            batches_in_flight_max: 2,
            items_per_sec_max: 0,
            backoff_initial_ms: 50,
            backoff_max_ms: 5000,
        }
    }
}

/// Refused: the dirty bytes are at their bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "tier: dirty bytes at their bound ({dirty_bytes} of {dirty_bytes_max}), backing store behind"
)]
pub struct Full {
    /// Dirty bytes now.
    pub dirty_bytes: usize,
    /// The bound.
    pub dirty_bytes_max: usize,
}

/// What to send to the store next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Batch {
    /// Apply these ops (each key once) in one transaction, then [`WriteBack::complete`].
    Ops {
        /// Names the batch in `complete`.
        id: u64,
        /// The ops.
        ops: Vec<(Arc<[u8]>, Op)>,
    },
    /// Remove every record (`flush_all`), then [`WriteBack::complete`].
    Clear {
        /// Names the batch in `complete`.
        id: u64,
    },
}

impl Batch {
    /// The id to complete it with.
    pub fn id(&self) -> u64 {
        match self {
            Batch::Ops { id, .. } | Batch::Clear { id } => *id,
        }
    }
}

/// What a completed batch released.
#[derive(Debug)]
pub struct Completion<W> {
    /// Waiters whose versions are now durable.
    pub released: Vec<W>,
}

/// Counters and gauges (`stats cellcache`'s `tier_*`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteBackStats {
    /// Writes recorded.
    pub recorded: u64,
    /// Writes folded into a pending op of the same key.
    pub coalesced: u64,
    /// Ops the store confirmed.
    pub flushed_ops: u64,
    /// Batches the store confirmed.
    pub flushed_batches: u64,
    /// Batches that failed (each retried).
    pub failed_batches: u64,
    /// Writes refused past the dirty bound (counted by the caller through `refused`).
    pub refused: u64,
    /// Dirty bytes now.
    pub dirty_bytes: u64,
    /// Keys with an op not yet confirmed.
    pub dirty_keys: u64,
}

/// What the engine knows of a key beyond the store (a loader asks before reading the store).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Known {
    /// Nothing: the store has the key's state.
    Store,
    /// The key is absent (deleted, or cleared by a pending `flush_all`).
    Absent,
    /// The key holds this record (dirty or being flushed).
    Present(Record),
    /// The store's record, with this expiry (a touch not yet flushed).
    StoreWithExpiry(u32),
}

struct Pending {
    op: Op,
    version: u64,
    due_ms: u64,
}

struct Entry<W> {
    /// The newest op not yet sent.
    pending: Option<Pending>,
    /// The op sent and not yet answered.
    flushing: Option<Flushing>,
    /// Waiters and the version each waits for.
    waiters: Vec<(u64, W)>,
}

/// A key sent in a batch, and the version sent.
type Sent = (Arc<[u8]>, u64);

struct Flushing {
    version: u64,
    op: Op,
    /// The dirty bytes it counts for (as recorded, before an expired put became a delete).
    counted: usize,
}

struct ClearState<W> {
    version: u64,
    /// A batch id while the clear is in flight.
    sent: Option<u64>,
    waiters: Vec<W>,
}

/// The engine. `W` is what a waiter is (the node's held reply).
pub struct WriteBack<W> {
    config: WriteBackConfig,
    entries: HashMap<Arc<[u8]>, Entry<W>>,
    /// Keys whose pending op may be sent (none in flight), by due time.
    due: BTreeSet<(u64, Arc<[u8]>)>,
    /// The keys and versions of each batch in flight.
    in_flight: HashMap<u64, Vec<Sent>>,
    next_batch: u64,
    clear: Option<ClearState<W>>,
    /// The version of the newest `flush_all` recorded (0: none).
    cleared_version: u64,
    dirty_bytes: usize,
    consecutive_failures: u32,
    paused_until_ms: u64,
    /// Throttle: keys that may still be sent, and when the allowance was last refilled.
    allowance: f64,
    allowance_at_ms: u64,
    stats: WriteBackStats,
}

fn op_bytes(key: &[u8], op: &Op) -> usize {
    key.len() + op.value_bytes()
}

impl<W> WriteBack<W> {
    /// An empty engine.
    pub fn new(config: WriteBackConfig) -> Self {
        let allowance = config.items_per_sec_max as f64;
        WriteBack {
            config,
            entries: HashMap::new(),
            due: BTreeSet::new(),
            in_flight: HashMap::new(),
            next_batch: 1,
            clear: None,
            cleared_version: 0,
            dirty_bytes: 0,
            consecutive_failures: 0,
            paused_until_ms: 0,
            allowance,
            allowance_at_ms: 0,
            stats: WriteBackStats::default(),
        }
    }

    /// The configuration in force.
    pub fn config(&self) -> &WriteBackConfig {
        &self.config
    }

    /// Changes the configuration (a live policy switch: a shorter window makes pending keys
    /// due sooner from now on; keys already due stay due).
    pub fn reconfigure(&mut self, config: WriteBackConfig, now_ms: u64) {
        if config.window_ms < self.config.window_ms {
            let cut = self.config.window_ms - config.window_ms;
            let moved: Vec<_> = self.due.iter().cloned().collect();
            self.due.clear();
            for (due_ms, key) in moved {
                let due_ms = due_ms.saturating_sub(cut).max(now_ms.min(due_ms));
                if let Some(p) = self.entries.get_mut(&key).and_then(|e| e.pending.as_mut()) {
                    p.due_ms = due_ms;
                }
                self.due.insert((due_ms, key));
            }
        }
        self.config = config;
    }

    /// Whether a new write may be taken, else why not.
    pub fn has_room(&self) -> Result<(), Full> {
        if self.dirty_bytes < self.config.dirty_bytes_max {
            Ok(())
        } else {
            Err(Full {
                dirty_bytes: self.dirty_bytes,
                dirty_bytes_max: self.config.dirty_bytes_max,
            })
        }
    }

    /// Counts a write refused past the bound.
    pub fn count_refused(&mut self) {
        self.stats.refused += 1;
    }

    /// Records `op` as `key`'s newest state at `version` (increasing per key).
    pub fn record(&mut self, key: &[u8], op: Op, version: u64, now_ms: u64) {
        self.stats.recorded += 1;
        let window = self.config.window_ms;
        let bytes = op_bytes(key, &op);
        if let Some(entry) = self.entries.get_mut(key) {
            match entry.pending.take() {
                Some(p) => {
                    self.stats.coalesced += 1;
                    self.dirty_bytes -= op_bytes(key, &p.op);
                    let op = p.op.then(op);
                    self.dirty_bytes += op_bytes(key, &op);
                    entry.pending = Some(Pending {
                        op,
                        version,
                        due_ms: p.due_ms,
                    });
                }
                None => {
                    let due_ms = now_ms + window;
                    self.dirty_bytes += bytes;
                    entry.pending = Some(Pending {
                        op,
                        version,
                        due_ms,
                    });
                    if entry.flushing.is_none() {
                        self.due.insert((due_ms, Arc::from(key)));
                    }
                }
            }
            return;
        }
        let key: Arc<[u8]> = Arc::from(key);
        let due_ms = now_ms + window;
        self.dirty_bytes += bytes;
        self.due.insert((due_ms, key.clone()));
        self.entries.insert(
            key,
            Entry {
                pending: Some(Pending {
                    op,
                    version,
                    due_ms,
                }),
                flushing: None,
                waiters: Vec::new(),
            },
        );
    }

    /// Records `flush_all` at `version`: every pending op is dropped, and the store is
    /// cleared before anything recorded later is sent.
    pub fn record_clear(&mut self, version: u64) {
        self.cleared_version = version;
        let mut settled = Vec::new();
        for (key, entry) in &mut self.entries {
            if let Some(p) = entry.pending.take() {
                self.dirty_bytes -= op_bytes(key, &p.op);
                self.due.remove(&(p.due_ms, key.clone()));
            }
            let flushing = entry.flushing.as_ref().map_or(0, |f| f.version);
            let (keep, done): (Vec<_>, Vec<_>) =
                entry.waiters.drain(..).partition(|(v, _)| *v <= flushing);
            entry.waiters = keep;
            settled.extend(done.into_iter().map(|(_, w)| w));
        }
        self.entries
            .retain(|_, e| e.flushing.is_some() || !e.waiters.is_empty());
        let clear = self.clear.get_or_insert(ClearState {
            version,
            sent: None,
            waiters: Vec::new(),
        });
        clear.version = version;
        if clear.sent.is_some() {
            // A clear in flight does not cover what was dropped after it was sent: clear again.
            clear.sent = None;
        }
        clear.waiters.extend(settled);
    }

    /// Registers `waiter` for `key`'s `version`; gives it back when that is durable already.
    pub fn wait(&mut self, key: &[u8], version: u64, waiter: W) -> Result<(), W> {
        if let Some(clear) = &mut self.clear
            && clear.version >= version
        {
            clear.waiters.push(waiter);
            return Ok(());
        }
        let Some(entry) = self.entries.get_mut(key) else {
            return Err(waiter);
        };
        let newest = entry
            .pending
            .as_ref()
            .map(|p| p.version)
            .or(entry.flushing.as_ref().map(|f| f.version));
        match newest {
            Some(v) if v >= version => {
                entry.waiters.push((version, waiter));
                Ok(())
            }
            _ => Err(waiter),
        }
    }

    /// The newest version of `key` the store has not confirmed yet (a pending `flush_all`
    /// counts for every key): a write-through read of `key` waits for it, so no reader is
    /// told a value that a crash could still take back.
    pub fn unconfirmed_version(&self, key: &[u8]) -> Option<u64> {
        let entry = self.entries.get(key).and_then(|e| {
            e.pending
                .as_ref()
                .map(|p| p.version)
                .or(e.flushing.as_ref().map(|f| f.version))
        });
        let clear = self.clear.as_ref().map(|c| c.version);
        entry.max(clear)
    }

    /// What the engine knows of `key` beyond the store.
    pub fn known(&self, key: &[u8]) -> Known {
        let entry = self.entries.get(key);
        let newest = entry.and_then(|e| {
            // Under a pending clear, what is in flight was recorded before it: cleared.
            let flushing = match self.clear {
                Some(_) => None,
                None => e.flushing.as_ref().map(|f| f.op.clone()),
            };
            let pending = e.pending.as_ref().map(|p| p.op.clone());
            match (flushing, pending) {
                (Some(f), Some(p)) => Some(f.then(p)),
                (f, p) => p.or(f),
            }
        });
        match newest {
            Some(Op::Put(r)) => Known::Present(r),
            Some(Op::Delete) => Known::Absent,
            _ if self.clear.is_some() => Known::Absent,
            Some(Op::Touch { expiry_unix }) => Known::StoreWithExpiry(expiry_unix),
            None => Known::Store,
        }
    }

    /// When the next flush may be due (`None`: nothing to send, or everything waits on
    /// batches in flight).
    pub fn next_due_ms(&self) -> Option<u64> {
        if self.in_flight.len() >= self.config.batches_in_flight_max {
            return None;
        }
        let first = match &self.clear {
            Some(c) if c.sent.is_none() && self.in_flight.is_empty() => Some(0),
            Some(_) => None,
            None => self.due.first().map(|(d, _)| *d),
        }?;
        Some(first.max(self.paused_until_ms))
    }

    /// The next batch due at `now_ms` (`now_unix` turns expired puts into deletes), if any.
    pub fn take_batch(&mut self, now_ms: u64, now_unix: u32) -> Option<Batch> {
        if self.in_flight.len() >= self.config.batches_in_flight_max
            || now_ms < self.paused_until_ms
        {
            return None;
        }
        if let Some(clear) = &mut self.clear {
            if clear.sent.is_some() || !self.in_flight.is_empty() {
                return None;
            }
            let id = self.next_batch;
            self.next_batch += 1;
            clear.sent = Some(id);
            self.in_flight.insert(id, Vec::new());
            return Some(Batch::Clear { id });
        }
        let mut items_max = self.config.batch_items_max.max(1);
        if self.config.items_per_sec_max > 0 {
            let rate = self.config.items_per_sec_max as f64;
            let elapsed = now_ms.saturating_sub(self.allowance_at_ms) as f64 / 1000.0;
            self.allowance = (self.allowance + elapsed * rate).min(rate.max(1.0));
            self.allowance_at_ms = now_ms;
            items_max = items_max.min(self.allowance as usize);
            if items_max == 0 {
                return None;
            }
        }
        let mut ops = Vec::new();
        let mut keys = Vec::new();
        let mut bytes = 0;
        while ops.len() < items_max && bytes < self.config.batch_bytes_max {
            let Some((due_ms, _)) = self.due.first() else {
                break;
            };
            if *due_ms > now_ms {
                break;
            }
            let Some((_, key)) = self.due.pop_first() else {
                break;
            };
            let Some(entry) = self.entries.get_mut(&key) else {
                continue;
            };
            let Some(p) = entry.pending.take() else {
                continue;
            };
            // The dirty bytes counted the op as recorded; they stay counted until answered.
            let counted = op_bytes(&key, &p.op);
            let op = p.op.at(now_unix);
            bytes += op.value_bytes();
            entry.flushing = Some(Flushing {
                version: p.version,
                op: op.clone(),
                counted,
            });
            keys.push((key.clone(), p.version));
            ops.push((key, op));
        }
        if ops.is_empty() {
            return None;
        }
        if self.config.items_per_sec_max > 0 {
            self.allowance -= ops.len() as f64;
        }
        let id = self.next_batch;
        self.next_batch += 1;
        self.in_flight.insert(id, keys);
        Some(Batch::Ops { id, ops })
    }
}

impl<W> WriteBack<W> {
    /// The store answered batch `id`: `ok` if it applied it durably. Releases the waiters
    /// whose versions are now durable; on failure keeps every op (or its newer pending
    /// successor) and pauses flushing for the backoff.
    pub fn complete(&mut self, id: u64, ok: bool, now_ms: u64) -> Completion<W> {
        let mut released = Vec::new();
        if ok {
            self.consecutive_failures = 0;
            self.paused_until_ms = 0;
            self.stats.flushed_batches += 1;
        } else {
            self.consecutive_failures = self.consecutive_failures.saturating_add(1);
            let doublings = self.consecutive_failures.saturating_sub(1).min(32);
            let backoff = self
                .config
                .backoff_initial_ms
                .saturating_mul(1u64 << doublings)
                .min(self.config.backoff_max_ms);
            self.paused_until_ms = now_ms + backoff;
            self.stats.failed_batches += 1;
        }
        let Some(keys) = self.in_flight.remove(&id) else {
            return Completion { released };
        };
        if let Some(clear) = &mut self.clear
            && clear.sent == Some(id)
        {
            if ok {
                released.append(&mut clear.waiters);
                self.clear = None;
            } else {
                clear.sent = None;
            }
            return Completion { released };
        }
        for (key, version) in keys {
            let Some(entry) = self.entries.get_mut(&key) else {
                continue;
            };
            let Some(f) = entry.flushing.take() else {
                continue;
            };
            debug_assert_eq!(f.version, version);
            if ok {
                self.stats.flushed_ops += 1;
                self.dirty_bytes -= f.counted;
                let (done, keep): (Vec<_>, Vec<_>) =
                    entry.waiters.drain(..).partition(|(v, _)| *v <= f.version);
                entry.waiters = keep;
                released.extend(done.into_iter().map(|(_, w)| w));
            } else if entry.pending.is_some() || f.version < self.cleared_version {
                // A newer pending op, or a `flush_all` recorded after it, is the key's whole
                // state: the failed op is not needed (and must not land after the clear).
                self.dirty_bytes -= f.counted;
                if entry.pending.is_none() {
                    // Its waiters are settled by the clear.
                    let settled = entry.waiters.drain(..).map(|(_, w)| w);
                    match &mut self.clear {
                        Some(clear) => clear.waiters.extend(settled),
                        None => released.extend(settled),
                    }
                }
            } else {
                // Sent again as it was sent (an expired put stays a delete).
                self.dirty_bytes -= f.counted;
                self.dirty_bytes += op_bytes(&key, &f.op);
                entry.pending = Some(Pending {
                    op: f.op,
                    version: f.version,
                    due_ms: now_ms,
                });
            }
            match &entry.pending {
                Some(p) => {
                    self.due.insert((p.due_ms, key.clone()));
                }
                None if entry.waiters.is_empty() => {
                    self.entries.remove(&key);
                }
                None => {}
            }
        }
        Completion { released }
    }

    /// Counters and gauges now.
    pub fn stats(&self) -> WriteBackStats {
        WriteBackStats {
            dirty_bytes: self.dirty_bytes as u64,
            dirty_keys: self.entries.len() as u64,
            ..self.stats
        }
    }

    /// Whether nothing is dirty, in flight or waiting for a clear (fully drained).
    pub fn is_clean(&self) -> bool {
        self.entries.is_empty() && self.clear.is_none() && self.in_flight.is_empty()
    }
}
