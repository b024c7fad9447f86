//! The key index: a bucketized cuckoo hash table of 8-byte slots.
//!
//! Each slot packs an item's arena offset (+1, 40 bits; 0 marks an empty slot), a 22-bit tag
//! taken from the key's hash and a 2-bit access counter the eviction policy may use (S3-FIFO's
//! frequency: it costs no memory here and moves with the entry). A key lives in one of two 8-slot buckets (one 64-byte cache line
//! each). The second bucket is derived from the first and the tag alone
//! (`alt(b) = (f(tag) - b) mod n`, an involution for any bucket count), so entries can be moved
//! between their two buckets without reading the key — partial-key cuckoo hashing. That keeps
//! lookups at two cache lines, allows any bucket count (memory is sized exactly, not to a power of
//! two) and reaches load factors above 95 % before an insert fails. A failed insert is undone and
//! reported as [`IndexFull`]; the shard then evicts one item from the key's two buckets and
//! retries, which cannot fail.
//!
//! The full 64-bit hash is not stored: range enumeration recomputes it from the key in the arena.
//! Tags match falsely with probability 2^-22 per slot compared; callers confirm with the key.

/// Slots per bucket: 8 × 8 bytes = one cache line.
pub(crate) const SLOTS_PER_BUCKET: usize = 8;
/// Bytes per slot.
pub(crate) const SLOT_BYTES: usize = 8;
/// Bits of an arena offset in a slot.
const LOC_BITS: u32 = 40;
const LOC_MASK: u64 = (1 << LOC_BITS) - 1;
const TAG_MASK: u64 = (1 << 22) - 1;
/// The access counter: the slot's two highest bits.
const FREQ_SHIFT: u32 = 62;
/// Highest value of the access counter.
pub(crate) const FREQ_MAX: u8 = 3;

const MIX_BUCKET: u64 = 0x9E37_79B9_7F4A_7C15;
const MIX_ALT: u64 = 0xC2B2_AE3D_27D4_EB4F;

/// The index has no room for one more entry without evicting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct IndexFull;

/// Where a key's hash sends it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Probe {
    tag: u64,
    b1: usize,
    b2: usize,
}

pub(crate) struct Index {
    slots: Vec<u64>,
    buckets: usize,
    used: usize,
    kicks_max: usize,
    rng: u64,
    /// Slots displaced by the current insert, kept to undo a failed one (capacity `kicks_max`,
    /// allocated once).
    path: Vec<usize>,
}

fn fastrange(x: u64, n: usize) -> usize {
    ((u128::from(x) * n as u128) >> 64) as usize
}

impl Index {
    /// `None` if the system refused the slots' memory.
    pub fn new(buckets: usize, kicks_max: usize) -> Option<Index> {
        Some(Index {
            slots: crate::prealloc::zeroed(buckets * SLOTS_PER_BUCKET)?,
            buckets,
            used: 0,
            kicks_max,
            rng: 0x2545_F491_4F6C_DD1D,
            path: Vec::with_capacity(kicks_max),
        })
    }

    /// Bytes of memory the slots take.
    pub fn bytes(&self) -> usize {
        self.slots.len() * SLOT_BYTES
    }

    /// Bytes of the undo path buffer.
    pub fn path_bytes(&self) -> usize {
        self.kicks_max * std::mem::size_of::<usize>()
    }

    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    pub fn len(&self) -> usize {
        self.used
    }

    pub fn probe(&self, hash: u64) -> Probe {
        let tag = hash & TAG_MASK;
        // The ring uses a hash's high bits for ranges, so a cell's keys share them: bucket choice
        // must come from mixed lower bits.
        let b1 = fastrange((hash >> 24).wrapping_mul(MIX_BUCKET), self.buckets);
        let b2 = self.alt(b1, tag);
        Probe { tag, b1, b2 }
    }

    fn alt(&self, bucket: usize, tag: u64) -> usize {
        let f = fastrange((tag + 1).wrapping_mul(MIX_ALT), self.buckets);
        (f + self.buckets - bucket) % self.buckets
    }

    /// Reads a word of each of the probe's buckets so that their cache lines are on their
    /// way before [`Index::find`] needs them (a multi-key read asks for many keys' lines
    /// before it waits for any). The value means nothing; fold it into
    /// [`std::hint::black_box`] so the loads stay.
    pub fn touch(&self, p: Probe) -> u64 {
        self.slots[p.b1 * SLOTS_PER_BUCKET] ^ self.slots[p.b2 * SLOTS_PER_BUCKET]
    }

    /// Slot numbers whose tag matches, in probe order; `visit` returns true to stop (found).
    pub fn find(&self, p: Probe, mut visit: impl FnMut(usize, u64) -> bool) -> Option<usize> {
        for b in [p.b1, p.b2] {
            let base = b * SLOTS_PER_BUCKET;
            for s in base..base + SLOTS_PER_BUCKET {
                let e = self.slots[s];
                if e != 0 && (e >> LOC_BITS) & TAG_MASK == p.tag && visit(s, (e & LOC_MASK) - 1) {
                    return Some(s);
                }
            }
            if p.b1 == p.b2 {
                break;
            }
        }
        None
    }

    /// The slots of the probe's two buckets (one bucket when both coincide).
    pub fn bucket_slots(&self, p: Probe) -> impl Iterator<Item = usize> {
        let second = if p.b2 == p.b1 {
            0..0
        } else {
            p.b2 * SLOTS_PER_BUCKET..(p.b2 + 1) * SLOTS_PER_BUCKET
        };
        (p.b1 * SLOTS_PER_BUCKET..(p.b1 + 1) * SLOTS_PER_BUCKET).chain(second)
    }

    /// Finds the slot holding exactly `loc` for this probe.
    pub fn find_loc(&self, p: Probe, loc: u64) -> Option<usize> {
        self.find(p, |_, l| l == loc)
    }

    /// Points an occupied slot at `loc`, keeping its tag and access counter.
    pub fn set_loc(&mut self, slot: usize, loc: u64) {
        debug_assert!(loc < LOC_MASK);
        self.slots[slot] = (self.slots[slot] & !LOC_MASK) | (loc + 1);
    }

    /// The access counter of an occupied slot (0 for a new entry).
    pub fn freq(&self, slot: usize) -> u8 {
        (self.slots[slot] >> FREQ_SHIFT) as u8
    }

    /// Sets the access counter of an occupied slot (at most [`FREQ_MAX`]).
    pub fn set_freq(&mut self, slot: usize, freq: u8) {
        debug_assert!(self.slots[slot] != 0 && freq <= FREQ_MAX);
        let mask = u64::from(FREQ_MAX) << FREQ_SHIFT;
        self.slots[slot] = (self.slots[slot] & !mask) | (u64::from(freq) << FREQ_SHIFT);
    }

    pub fn remove(&mut self, slot: usize) {
        debug_assert!(self.slots[slot] != 0);
        self.slots[slot] = 0;
        self.used -= 1;
    }

    /// Location stored in an occupied slot, or None if empty.
    pub fn loc_at(&self, slot: usize) -> Option<u64> {
        let e = self.slots[slot];
        if e == 0 {
            None
        } else {
            Some((e & LOC_MASK) - 1)
        }
    }

    /// Sets every access counter to 0.
    pub fn clear_freqs(&mut self) {
        let mask = !(u64::from(FREQ_MAX) << FREQ_SHIFT);
        for e in &mut self.slots {
            *e &= mask;
        }
    }

    pub fn clear(&mut self) {
        self.slots.fill(0);
        self.used = 0;
    }

    fn next_random(&mut self) -> u64 {
        // xorshift64: deterministic, no dependency, quality is ample for choosing a victim slot.
        let mut x = self.rng;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng = x;
        x
    }

    fn free_slot(&self, bucket: usize) -> Option<usize> {
        let base = bucket * SLOTS_PER_BUCKET;
        (base..base + SLOTS_PER_BUCKET).find(|&s| self.slots[s] == 0)
    }

    /// Inserts a new entry (the caller made sure the key is not present). Random-walk cuckoo
    /// displacement, undone completely if it fails after `kicks_max` moves.
    pub fn insert(&mut self, p: Probe, loc: u64) -> Result<(), IndexFull> {
        debug_assert!(loc < LOC_MASK);
        let entry = (p.tag << LOC_BITS) | (loc + 1);
        for b in [p.b1, p.b2] {
            if let Some(s) = self.free_slot(b) {
                self.slots[s] = entry;
                self.used += 1;
                return Ok(());
            }
        }
        let mut path = std::mem::take(&mut self.path);
        path.clear();
        let mut carried = entry;
        let mut bucket = if self.next_random() & 1 == 0 {
            p.b1
        } else {
            p.b2
        };
        for _ in 0..self.kicks_max {
            let s = bucket * SLOTS_PER_BUCKET + (self.next_random() as usize % SLOTS_PER_BUCKET);
            std::mem::swap(&mut self.slots[s], &mut carried);
            path.push(s);
            bucket = self.alt(bucket, (carried >> LOC_BITS) & TAG_MASK);
            if let Some(free) = self.free_slot(bucket) {
                self.slots[free] = carried;
                self.used += 1;
                self.path = path;
                return Ok(());
            }
        }
        // Undo: swapping back along the path in reverse restores every displaced entry.
        for &s in path.iter().rev() {
            std::mem::swap(&mut self.slots[s], &mut carried);
        }
        debug_assert_eq!(carried, entry);
        self.path = path;
        Err(IndexFull)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hash(i: u64) -> u64 {
        crate::key_hash(&i.to_le_bytes())
    }

    #[test]
    fn fills_past_ninety_five_percent_and_finds_everything() {
        let mut idx = Index::new(1000, 500).unwrap();
        let mut n = 0u64;
        while idx.insert(idx.probe(hash(n)), n).is_ok() {
            n += 1;
        }
        let load = idx.len() as f64 / idx.capacity() as f64;
        assert!(load > 0.95, "load {load}");
        for i in 0..n {
            let p = idx.probe(hash(i));
            assert!(idx.find_loc(p, i).is_some(), "lost {i}");
        }
        assert_eq!(idx.len() as u64, n);
    }

    #[test]
    fn alt_is_an_involution() {
        let idx = Index::new(977, 10).unwrap();
        for t in 0..5000u64 {
            for b in [0usize, 1, 500, 976] {
                assert_eq!(idx.alt(idx.alt(b, t), t), b);
            }
        }
    }

    #[test]
    fn the_access_counter_stays_with_its_entry() {
        let mut idx = Index::new(50, 500).unwrap();
        let mut n = 0u64;
        while idx.insert(idx.probe(hash(n)), n).is_ok() {
            let s = idx.find_loc(idx.probe(hash(n)), n).unwrap();
            assert_eq!(idx.freq(s), 0);
            idx.set_freq(s, (n % 4) as u8);
            n += 1;
        }
        // Every displacement and relocation kept each entry's counter and tag.
        for i in 0..n {
            let s = idx.find_loc(idx.probe(hash(i)), i).expect("found");
            assert_eq!(idx.freq(s), (i % 4) as u8, "entry {i}");
            idx.set_loc(s, i + 1_000_000);
            assert_eq!(idx.freq(s), (i % 4) as u8);
            assert_eq!(idx.find_loc(idx.probe(hash(i)), i + 1_000_000), Some(s));
        }
    }

    #[test]
    fn remove_then_reinsert() {
        let mut idx = Index::new(4, 50).unwrap();
        let p = idx.probe(hash(1));
        idx.insert(p, 77).unwrap();
        let s = idx.find_loc(p, 77).unwrap();
        idx.set_loc(s, 78);
        assert!(idx.find_loc(p, 77).is_none());
        let s = idx.find_loc(p, 78).unwrap();
        idx.remove(s);
        assert_eq!(idx.len(), 0);
        assert!(idx.find_loc(p, 78).is_none());
    }
}
