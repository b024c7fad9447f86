//! S3-FIFO's ghost queue: key hashes of items recently dropped from the small queue unread,
//! kept inside the arena.
//!
//! The table lives in whole slabs taken out of the arena (their list is `Ghost`), so a store
//! with a ghost holds fewer items but never more memory than `memory_limit_bytes`: the cost is
//! honest and measured (docs/store.md). Entries are 4-byte fingerprints of the key hash in
//! buckets of four (16 bytes, a quarter of a cache line). An insert takes an empty entry of its
//! bucket or replaces one chosen round-robin by a table-wide counter, which approximates the
//! paper's FIFO of ghost entries: once the table is full every insert ages out an entry
//! inserted about one table's worth of inserts earlier. A lookup that finds its fingerprint
//! clears it (a key is admitted once per drop). A false match (another key with the same
//! bucket and 32-bit fingerprint, about 4 in 2^32 per lookup) only admits a key as accessed.

/// Entries per bucket.
const BUCKET_ENTRIES: usize = 4;
/// Bytes per entry.
pub(crate) const ENTRY_BYTES: usize = 4;
const BUCKET_BYTES: usize = BUCKET_ENTRIES * ENTRY_BYTES;

/// The ghost table: where its buckets are in the arena, and the replacement counter.
pub(crate) struct Ghost {
    /// Arena offsets of the slabs holding the table, in bucket order (the slabs themselves
    /// are those on the shard's `Ghost` list).
    slab_starts: Vec<u64>,
    buckets_per_slab: usize,
    buckets: usize,
    clock: u32,
}

fn fingerprint(hash: u64) -> u32 {
    // Never 0, which marks an empty entry.
    (hash as u32) | 1
}

fn bucket_of(hash: u64, buckets: usize) -> usize {
    // Mixed, so the ring's shared high bits and the index's bits do not pick the bucket.
    let mixed = hash.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29);
    ((u128::from(mixed) * buckets as u128) >> 64) as usize
}

impl Ghost {
    /// A table over the slabs starting at `slab_starts` (each `slab_len` bytes), which the
    /// caller has zeroed.
    pub fn new(slab_starts: Vec<u64>, slab_len: usize) -> Ghost {
        let buckets_per_slab = slab_len / BUCKET_BYTES;
        Ghost {
            buckets: buckets_per_slab * slab_starts.len(),
            slab_starts,
            buckets_per_slab,
            clock: 0,
        }
    }

    /// Entries the table holds at most.
    pub fn capacity(&self) -> usize {
        self.buckets * BUCKET_ENTRIES
    }

    fn bucket_offset(&self, hash: u64) -> usize {
        let b = bucket_of(hash, self.buckets);
        let slab = b / self.buckets_per_slab;
        self.slab_starts[slab] as usize + (b % self.buckets_per_slab) * BUCKET_BYTES
    }

    fn entry(arena: &[u8], at: usize) -> u32 {
        u32::from_le_bytes([arena[at], arena[at + 1], arena[at + 2], arena[at + 3]])
    }

    /// Remembers `hash`.
    pub fn insert(&mut self, arena: &mut [u8], hash: u64) {
        if self.buckets == 0 {
            return;
        }
        let base = self.bucket_offset(hash);
        let fp = fingerprint(hash);
        let mut free = None;
        for i in 0..BUCKET_ENTRIES {
            let e = Ghost::entry(arena, base + i * ENTRY_BYTES);
            if e == fp {
                return;
            }
            if e == 0 && free.is_none() {
                free = Some(i);
            }
        }
        let i = free.unwrap_or_else(|| {
            self.clock = self.clock.wrapping_add(1);
            self.clock as usize % BUCKET_ENTRIES
        });
        let at = base + i * ENTRY_BYTES;
        arena[at..at + ENTRY_BYTES].copy_from_slice(&fp.to_le_bytes());
    }

    /// Whether `hash` was remembered; forgets it.
    pub fn take(&mut self, arena: &mut [u8], hash: u64) -> bool {
        if self.buckets == 0 {
            return false;
        }
        let base = self.bucket_offset(hash);
        let fp = fingerprint(hash);
        for i in 0..BUCKET_ENTRIES {
            let at = base + i * ENTRY_BYTES;
            if Ghost::entry(arena, at) == fp {
                arena[at..at + ENTRY_BYTES].fill(0);
                return true;
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_once_and_ages_out_old_entries() {
        let slab_len = 1024;
        let mut arena = vec![0u8; 3 * slab_len];
        // Slabs 2 and 0 of the arena, in that order.
        let mut g = Ghost::new(vec![2 * slab_len as u64, 0], slab_len);
        assert_eq!(g.capacity(), 2 * slab_len / ENTRY_BYTES);
        let hash = |i: u64| crate::key_hash(&i.to_le_bytes());
        g.insert(&mut arena, hash(1));
        assert!(g.take(&mut arena, hash(1)));
        assert!(!g.take(&mut arena, hash(1)), "taken once");
        assert!(!g.take(&mut arena, hash(2)));
        // Middle slab untouched: the table stays in its own slabs.
        assert!(arena[slab_len..2 * slab_len].iter().all(|&b| b == 0));
        // Ten table sizes of inserts: the first ones have aged out, the last ones mostly not.
        let n = 10 * g.capacity() as u64;
        for i in 0..n {
            g.insert(&mut arena, hash(i));
        }
        let old = (0..100).filter(|&i| g.take(&mut arena, hash(i))).count();
        let recent = (n - 100..n)
            .filter(|&i| g.take(&mut arena, hash(i)))
            .count();
        assert_eq!(old, 0);
        assert!(recent > 50, "{recent}");
    }
}
