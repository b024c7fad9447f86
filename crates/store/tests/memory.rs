//! Memory stays within the configured limit plus the documented overhead, measured with a
//! counting global allocator in this test binary (not by trusting the store's own accounting).

use std::alloc::{GlobalAlloc, Layout as AllocLayout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use cellcache_store::*;

struct Counting;

static ALLOCATED: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only counts bytes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: AllocLayout) -> *mut u8 {
        let now = ALLOCATED.fetch_add(layout.size(), Ordering::SeqCst) + layout.size();
        PEAK.fetch_max(now, Ordering::SeqCst);
        // SAFETY: same layout contract as our caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: AllocLayout) -> *mut u8 {
        let now = ALLOCATED.fetch_add(layout.size(), Ordering::SeqCst) + layout.size();
        PEAK.fetch_max(now, Ordering::SeqCst);
        // SAFETY: same layout contract as our caller's.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: AllocLayout) {
        ALLOCATED.fetch_sub(layout.size(), Ordering::SeqCst);
        // SAFETY: `ptr` came from `alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: AllocLayout, new_size: usize) -> *mut u8 {
        if new_size >= layout.size() {
            let now = ALLOCATED.fetch_add(new_size - layout.size(), Ordering::SeqCst) + new_size
                - layout.size();
            PEAK.fetch_max(now, Ordering::SeqCst);
        } else {
            ALLOCATED.fetch_sub(layout.size() - new_size, Ordering::SeqCst);
        }
        // SAFETY: `ptr` came from `alloc` with this layout.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const NOW: u32 = 1_000_000;

/// One test function only: the counter is process-wide, so no other test may allocate
/// concurrently in this binary.
#[test]
fn heap_stays_within_limit_plus_documented_overhead() {
    let runs = [
        (Layout::Shared, EvictionPolicyKind::SlabLru),
        (
            Layout::Partitioned { shards: 4 },
            EvictionPolicyKind::SlabLru,
        ),
        (Layout::Shared, EvictionPolicyKind::SecondChanceFifo),
        (Layout::Shared, EvictionPolicyKind::S3FIFO),
        (
            Layout::Partitioned { shards: 2 },
            EvictionPolicyKind::S3FIFO,
        ),
    ];
    for (layout, eviction) in runs {
        let config = StoreConfig {
            eviction,
            memory_limit_bytes: 8 << 20,
            slab_size_bytes: 64 << 10,
            item_size_max_bytes: 32 << 10,
            layout,
            ..StoreConfig::default()
        };
        let limit = config.memory_limit_bytes;
        // The test's own buffer, allocated before the baseline so it is not charged to the store.
        let mut value = Vec::with_capacity(32 << 10);
        let base = ALLOCATED.load(Ordering::SeqCst);
        PEAK.store(base, Ordering::SeqCst);
        let store = Store::new(config).unwrap();
        let bound = limit + store.overhead_bytes_max();
        // Write 10× the limit with every operation that allocates internally (append/prepend
        // use the scratch buffer, touch rewrites) and varied sizes, so every slab is reused.
        for i in 0..40_000u32 {
            let key = format!("mem-{}", i % 9000);
            if i % 2 == 0 {
                store.get(key.as_bytes(), NOW, |v| v.value.len());
            }
            let len = [10usize, 100, 1000, 5000, 30_000][(i % 5) as usize]
                .min(store.config().item_size_max_bytes);
            value.clear();
            value.resize(len, i as u8);
            store
                .write(&WriteRequest::set(key.as_bytes(), &value), NOW)
                .unwrap();
            if i % 3 == 0 {
                let _ = store.write(
                    &WriteRequest {
                        mode: WriteMode::Append,
                        ..WriteRequest::set(key.as_bytes(), b"tail")
                    },
                    NOW,
                );
            }
            if i % 5 == 0 {
                store.touch(key.as_bytes(), Expiry::at(NOW + 1000), NOW);
            }
            if i % 11 == 0 {
                store.delete(key.as_bytes(), NOW, DeleteOptions::default());
            }
        }
        let st = store.stats();
        assert!(
            st.evicted_slabs > 0,
            "workload must exceed the limit: {st:?}"
        );
        assert!(st.arena_bytes + st.index_bytes <= limit as u64, "{st:?}");
        let peak = PEAK.load(Ordering::SeqCst) - base;
        let held = ALLOCATED.load(Ordering::SeqCst) - base;
        assert!(
            peak <= bound,
            "{layout:?}: peak heap {peak} > limit {limit} + overhead {}",
            store.overhead_bytes_max()
        );
        assert!(
            held <= bound,
            "{layout:?}: held heap {held} > bound {bound}"
        );
        // The documented overhead is small next to the limit.
        assert!(
            store.overhead_bytes_max() < limit / 20,
            "overhead {}",
            store.overhead_bytes_max()
        );
        drop(store);
    }
}
