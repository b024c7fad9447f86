//! The per-item overhead target checked by machine: with the default 64 MiB configuration,
//! 14-byte keys and 100-byte values, the store holds at least 1.5× memcached's 349,504 items
//! before its first eviction, index memory included (≤ 14 bytes of overhead per item).

use cellcache_store::*;

#[test]
fn holds_one_and_a_half_times_memcached() {
    let config = StoreConfig::default();
    let limit = config.memory_limit_bytes;
    let store = Store::new(config).unwrap();
    let value = [b'v'; 100];
    let mut held = 0;
    // Bounded: 64 MiB cannot hold more than 64 MiB / 114 bytes of payload.
    for i in 0..(limit / 114) as u64 {
        let key = format!("key:{i:010}");
        store
            .write(&WriteRequest::set(key.as_bytes(), &value), 1_000_000)
            .unwrap();
        let st = store.stats();
        if st.evicted_slabs > 0 || st.evicted_items > 0 {
            break;
        }
        held = st.curr_items;
    }
    let st = store.stats();
    assert!(st.arena_bytes + st.index_bytes <= limit as u64);
    assert!(held >= 524_256, "held {held} items before first eviction");
    let overhead = limit as f64 / held as f64 - 114.0;
    assert!(overhead <= 14.0, "overhead {overhead:.2} bytes per item");
}
