//! Per-item overhead (target: at most 14 bytes per item, index included): fill a store with
//! 14-byte keys and 100-byte values until the first eviction and report how many items it held
//! and where the bytes went.
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
    // Cost of walking the whole store for a range hand-off, both ways.
    let start = std::time::Instant::now();
    let mut seen = 0u64;
    store.for_each_in_range(HashRange::FULL, now, |_| seen += 1);
    let index_walk = start.elapsed();
    let start = std::time::Instant::now();
    let (mut scanned, mut steps, mut longest) = (0u64, 0u64, std::time::Duration::ZERO);
    let mut cursor = Some(ScanCursor::START);
    while let Some(c) = cursor {
        let step = std::time::Instant::now();
        cursor = store.scan_range(HashRange::FULL, now, c, |_| scanned += 1);
        longest = longest.max(step.elapsed());
        steps += 1;
    }
    println!(
        "full-range walk          for_each_in_range {seen} items in {:.1} ms (one lock hold); scan_range {scanned} items in {:.1} ms, {steps} steps, longest step {:.2} ms",
        index_walk.as_secs_f64() * 1e3,
        start.elapsed().as_secs_f64() * 1e3,
        longest.as_secs_f64() * 1e3
    );
    if mib == 64 {
        println!(
            "vs memcached -m 64       {:.3}x items ({} vs {MEMCACHED_ITEMS}; target 1.5x = 524256)",
            held as f64 / MEMCACHED_ITEMS as f64,
            held
        );
    }
}
