//! Switching a shard's eviction policy in place, under its lock: the policy's metadata is
//! translated, no item moves and nothing is copied.
//!
//! Slab LRU → S3-FIFO: the slabs in use join S3-FIFO's main queue in LRU order (coldest
//! first, so the least recently used slab is the first cleared), access counts start at zero
//! (slab LRU does not count), the ghost's slabs are taken from the free list — clearing the
//! coldest slabs first if too few are free. S3-FIFO → slab LRU (or any other policy): the
//! slabs in use are ordered as S3-FIFO would clear them (small, then main, oldest first),
//! main's open slab stops receiving items (its free tail is used again once it is cleared),
//! and the ghost's slabs go back to the free list. The extra memory is the new policy's
//! arrays while the old one's still exist: `Shard::metadata_bytes_max` per shard at most.

use super::*;

impl Shard {
    /// Replaces the eviction policy by `kind` (validated by the caller).
    pub fn switch_policy(&mut self, kind: EvictionPolicyKind, now: u32) {
        let order = self.policy.clearing_order();
        let n = self.slabs.len();
        let mut policy = new_policy(kind, n);
        let to_s3fifo = matches!(kind, EvictionPolicyKind::S3Fifo { .. });
        for &s in &order {
            if to_s3fifo {
                policy.on_main(s);
            } else {
                policy.on_open(s);
            }
        }
        self.policy = policy;
        self.main_head = None;
        self.index.clear_freqs();
        self.counts_frequency = to_s3fifo;
        // The ghost: given back, then taken again at the new policy's size.
        for s in 0..n as SlabId {
            if self.slabs.meta[s as usize].list == ListId::Ghost {
                self.slabs.move_to(s, ListId::Free);
            }
        }
        self.ghost = None;
        if let EvictionPolicyKind::S3Fifo { ghost_permille, .. } = kind {
            let wanted = self.ghost_slabs_wanted(ghost_permille);
            while self.free_full_slabs() < wanted {
                let view = LiveView(&self.slabs.meta);
                let Some(victim) = self.policy.victim(&view, None) else {
                    break;
                };
                self.evict_slab(victim, now);
            }
            self.reserve_ghost(ghost_permille);
        }
    }

    fn free_full_slabs(&self) -> usize {
        self.slabs
            .meta
            .iter()
            .filter(|m| m.list == ListId::Free && u64::from(m.len) == self.slab_size)
            .count()
    }
}

/// A policy of `kind` for a shard of `slabs` slabs, with nothing in it yet.
pub(super) fn new_policy(kind: EvictionPolicyKind, slabs: usize) -> Box<dyn EvictionPolicy> {
    match kind {
        EvictionPolicyKind::SlabLru => Box::new(SlabLru::new(slabs)),
        EvictionPolicyKind::LeastLiveOfLru { candidates } => {
            Box::new(LeastLiveOfLru::new(slabs, candidates))
        }
        EvictionPolicyKind::SecondChanceFifo => Box::new(SecondChanceFifo::new(slabs)),
        EvictionPolicyKind::S3Fifo { small_permille, .. } => {
            Box::new(S3Fifo::new(slabs, small_permille))
        }
    }
}
