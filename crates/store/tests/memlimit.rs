//! `cache_memlimit`: lowering the limit at run time evicts down to it and keeps the store
//! within it; raising it back lets the store fill the preallocated arena again; a limit
//! above the arena is refused.

use cellcache_store::{ConfigError, Store, StoreConfig, WriteRequest};

const NOW: u32 = 1_000;

fn fill(store: &Store, prefix: &str, n: usize) {
    let value = vec![b'v'; 1000];
    for i in 0..n {
        let key = format!("{prefix}{i}");
        store
            .write(&WriteRequest::set(key.as_bytes(), &value), NOW)
            .expect("write succeeds, evicting when full");
    }
}

fn slabs_in_use(store: &Store) -> u64 {
    let s = store.stats();
    s.slabs_partial + s.slabs_full
}

#[test]
fn lowering_the_limit_evicts_and_bounds_use_raising_restores() {
    let config = StoreConfig {
        memory_limit_bytes: 8 << 20,
        slab_size_bytes: 64 << 10,
        item_size_max_bytes: 32 << 10,
        ..StoreConfig::default()
    };
    let store = Store::new(config).unwrap();
    fill(&store, "a", 20_000);
    let full = slabs_in_use(&store);
    assert!(full > 60, "arena filled: {full} slabs");

    store.set_memory_limit(2 << 20, NOW).unwrap();
    let lowered = slabs_in_use(&store);
    assert!(
        lowered <= (2 << 20) / (64 << 10),
        "{lowered} slabs after lowering"
    );
    fill(&store, "b", 20_000);
    assert!(
        slabs_in_use(&store) <= lowered.max(1) + 1,
        "stays within the new limit"
    );
    store.check_invariants();

    store.set_memory_limit(8 << 20, NOW).unwrap();
    fill(&store, "c", 20_000);
    assert!(
        slabs_in_use(&store) >= full - 1,
        "raising the limit uses the arena again"
    );

    assert!(matches!(
        store.set_memory_limit(9 << 20, NOW),
        Err(ConfigError::MemoryLimitAboveArena { .. })
    ));
}
