//! The receiving side: checking that a frame continues its lane, applying records in order
//! and rebuilding values sent in parts.

use std::collections::HashMap;

use cellcache_cluster::HashRange;
use cellcache_cluster::wire::payload::{ReplicationOp, ReplicationRecord};
use cellcache_store::{ChangeKind, Store};

/// What every part of one value repeats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct PartMeta {
    pub(super) flags: u32,
    pub(super) expiry_unix_secs: u64,
    pub(super) cas: u64,
    pub(super) stale: bool,
    pub(super) total_len: usize,
}

/// A value being rebuilt from its parts.
pub(super) struct Partial {
    pub(super) meta: PartMeta,
    pub(super) value: Vec<u8>,
}

/// The values one sender has sent part of (see the module docs), keyed by item key. Kept
/// per sender, not per connection or lane: a resent or moved part continues the value.
#[derive(Default)]
pub struct Assembly {
    pub(super) items: HashMap<Vec<u8>, Partial>,
    pub(super) bytes: usize,
}

impl Assembly {
    /// Values under construction.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether no value is under construction.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    pub(super) fn forget(&mut self, key: &[u8]) {
        if let Some(p) = self.items.remove(key) {
            self.bytes -= p.value.len();
        }
    }

    pub(super) fn clear(&mut self) {
        self.items.clear();
        self.bytes = 0;
    }

    /// Adds one part; returns the whole item once its last part is in. Parts come in order,
    /// possibly repeated (a part resent after a lost acknowledgement, or moved ahead of a
    /// live record while its first copy was in flight): a repeat is ignored, a part that
    /// starts a value replaces any older partial copy, and one that fits nowhere (never sent
    /// by a correct master) drops the partial copy, with a warning. At most `bytes_max`
    /// bytes are held; beyond that the largest partial copy is dropped.
    pub(super) fn add(
        &mut self,
        key: &[u8],
        meta: PartMeta,
        offset: usize,
        part: &[u8],
        bytes_max: usize,
    ) -> Option<Partial> {
        if offset == 0 {
            self.forget(key);
            let value = Vec::with_capacity(meta.total_len);
            self.items.insert(key.to_vec(), Partial { meta, value });
        }
        let Some(p) = self.items.get_mut(key) else {
            tracing::warn!(offset, "value part without its beginning: not stored");
            return None;
        };
        if p.meta != meta {
            tracing::warn!(
                offset,
                "value part of another version: partial copy dropped"
            );
            self.forget(key);
            return None;
        }
        if offset + part.len() <= p.value.len() && offset != 0 {
            return None; // a repeat
        }
        if offset != p.value.len() {
            tracing::warn!(
                offset,
                have = p.value.len(),
                "value part out of order: partial copy dropped"
            );
            self.forget(key);
            return None;
        }
        p.value.extend_from_slice(part);
        self.bytes += part.len();
        if p.value.len() == meta.total_len {
            let done = self.items.remove(key);
            self.bytes -= meta.total_len;
            return done;
        }
        while self.bytes > bytes_max {
            let Some(biggest) = self
                .items
                .iter()
                .max_by_key(|(_, p)| p.value.len())
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            tracing::warn!(
                bytes = self.bytes,
                "values in parts over their bound: the largest dropped"
            );
            self.forget(&biggest);
        }
        None
    }
}

/// Why a replication payload was not applied (nothing of it was).
#[derive(Debug, thiserror::Error)]
pub enum SequenceError {
    #[error("bad replication payload: {0}")]
    Wire(#[from] cellcache_cluster::wire::WireError),
    /// The records do not continue the lane: the first is past the next position, or one
    /// does not follow the one before it. A correct master never sends that; a frame
    /// jumping far ahead would, if applied, make every later record look like a resend.
    #[error("sequence gap: expected {expected}, got {got}")]
    Gap { expected: u64, got: u64 },
}

/// Checks, before anything is applied, that `payload`'s records continue a lane whose last
/// applied position is `applied`: their positions are consecutive and the first is at most
/// `applied + 1`. Records at or below `applied` are resends (an acknowledgement was lost),
/// which [`apply_records`] skips. An empty payload continues any lane: a master asks a
/// receiver's position with one.
pub fn check_sequence(payload: &[u8], applied: u64) -> Result<(), SequenceError> {
    let mut next = applied.saturating_add(1);
    let mut first = true;
    for rec in ReplicationRecord::decode_all(payload) {
        let seq = rec?.seq;
        let fits = if first { seq <= next } else { seq == next };
        if !fits {
            return Err(SequenceError::Gap {
                expected: applied.saturating_add(1),
                got: seq,
            });
        }
        first = false;
        next = seq.saturating_add(1);
    }
    Ok(())
}

/// Applies a `Replicate` or `SnapshotChunk` payload to the backup's store, advancing
/// `applied` (records at or below it are skipped), rebuilding values sent in parts in
/// `parts` (at most `parts_bytes_max` bytes held) and leaving out keys `keep` refuses.
/// A flush record is handed to `flush` with its range and second (0: now). Returns how
/// many values it rebuilt from parts.
#[allow(clippy::too_many_arguments)]
pub fn apply_records(
    store: &Store,
    payload: &[u8],
    applied: &mut u64,
    parts: &mut Assembly,
    parts_bytes_max: usize,
    now: u32,
    keep: impl Fn(u64) -> bool,
    mut flush: impl FnMut(HashRange, u32),
) -> Result<u64, cellcache_cluster::wire::WireError> {
    use cellcache_store::{Expiry, OwnedItem};
    let mut rebuilt = 0;
    for rec in ReplicationRecord::decode_all(payload) {
        let rec = rec?;
        if rec.seq <= *applied {
            continue;
        }
        *applied = rec.seq;
        let key = rec.op.key();
        if key.is_some_and(|k| !keep(cellcache_store::key_hash(k))) {
            continue; // not a key this cell holds a copy of (any more)
        }
        match (key, &rec.op) {
            (_, ReplicationOp::SetPart { .. }) => {}
            // Any other change supersedes a value still arriving in parts.
            (Some(k), _) => parts.forget(k),
            (None, _) => parts.clear(),
        }
        let expiry = |s: u64| Expiry::at(u32::try_from(s).unwrap_or(u32::MAX));
        let outcome = match rec.op {
            ReplicationOp::SetPart {
                key,
                flags,
                expiry_unix_secs,
                cas,
                stale,
                total_len,
                offset,
                part,
            } => {
                let meta = PartMeta {
                    flags,
                    expiry_unix_secs,
                    cas,
                    stale,
                    total_len: total_len as usize,
                };
                let whole = parts.add(key, meta, offset as usize, part, parts_bytes_max);
                let Some(p) = whole else { continue };
                rebuilt += 1;
                store.insert_item(
                    &OwnedItem {
                        key: key.to_vec(),
                        value: p.value,
                        flags: p.meta.flags,
                        expiry: expiry(p.meta.expiry_unix_secs),
                        cas: p.meta.cas,
                        stale: p.meta.stale,
                    },
                    now,
                )
            }
            ReplicationOp::Set {
                key,
                value,
                flags,
                expiry_unix_secs,
                cas,
                stale,
            } => store.insert_item(
                &OwnedItem {
                    key: key.to_vec(),
                    value: value.to_vec(),
                    flags,
                    expiry: expiry(expiry_unix_secs),
                    cas,
                    stale,
                },
                now,
            ),
            ReplicationOp::Delete { key } => store.apply_change(&ChangeKind::Delete { key }, now),
            ReplicationOp::Touch {
                key,
                expiry_unix_secs,
            } => store.apply_change(
                &ChangeKind::Touch {
                    key,
                    expiry: expiry(expiry_unix_secs),
                },
                now,
            ),
            ReplicationOp::Flush { at_unix_secs } => {
                flush(rec.range, u32::try_from(at_unix_secs).unwrap_or(u32::MAX));
                Ok(())
            }
        };
        if let Err(e) = outcome {
            // A backup out of memory keeps going: it is a cache, and the master's copy is
            // authoritative; the item is simply missing here.
            tracing::debug!(error = %e, "replicated record not stored");
        }
    }
    Ok(rebuilt)
}
