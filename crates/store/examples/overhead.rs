//! Per-item overhead (SPEC M4): fill a store with 14-byte keys and 100-byte values until the
//! first eviction and report how many items it held and where the bytes went.
//!
//! `cargo run --release -p cellcache-store --example overhead [-- MEMORY_MIB [INDEX_ITEM_BYTES]]`

use cellcache_store::*;

const KEY_BYTES: usize = 14;
const VALUE_BYTES: usize = 100;
/// memcached 1.6 with `-m 64`: 349,504 such items, 78 bytes of overhead each.
const MEMCACHED_ITEMS: u64 = 349_504;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mib: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(64);
    let mut config = StoreConfig {
        memory_limit_bytes: mib << 20,
        ..StoreConfig::default()
    };
    if let Some(e) = args.get(2).and_then(|a| a.parse().ok()) {
        config.index_item_bytes_expected = e;
    }
    let store = Store::new(config.clone()).expect("config");
    let value = [b'v'; VALUE_BYTES];
    let now = 1_000_000;
    let mut held = 0u64;
    for i in 0u64.. {
        let key = format!("key:{i:010}");
        assert_eq!(key.len(), KEY_BYTES);
        store
            .write(&WriteRequest::set(key.as_bytes(), &value), now)
            .expect("set");
        let st = store.stats();
        if st.evicted_items > 0 || st.evicted_slabs > 0 {
            break;
        }
        held = st.curr_items;
    }
    let st = store.stats();
    // The stats after the evicting write are a slab off; the shape before it is what matters:
    // recompute the per-item figures from the held count and the fixed memory split.
    let payload = (KEY_BYTES + VALUE_BYTES) as f64;
    let limit = config.memory_limit_bytes as f64;
    let per_item_total = limit / held as f64 - payload;
    let header = (st.bytes as f64 / st.curr_items as f64) - payload;
    let index = st.index_bytes as f64 / held as f64;
    let rest = per_item_total - header - index;
    println!("memory_limit_bytes      {}", config.memory_limit_bytes);
    println!(
        "index_item_bytes_expected {}",
        config.index_item_bytes_expected
    );
    println!("arena_bytes             {}", st.arena_bytes);
    println!(
        "index_bytes             {} ({} slots)",
        st.index_bytes, st.index_slots
    );
    println!("items held before first eviction {held}");
    println!(
        "index load at that point {:.3}",
        held as f64 / st.index_slots as f64
    );
    println!(
        "overhead per item        {per_item_total:.2} B  (item header {header:.2}, index {index:.2}, slab waste + unused {rest:.2})"
    );
    if mib == 64 {
        println!(
            "vs memcached -m 64       {:.3}x items ({} vs {MEMCACHED_ITEMS}; target 1.5x = 524256)",
            held as f64 / MEMCACHED_ITEMS as f64,
            held
        );
    }
}
