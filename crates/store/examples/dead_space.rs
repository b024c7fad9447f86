//! How dead space is reclaimed: overwrites and deletes leave dead bytes in slabs. This
//! compares in-place compaction of slabs past a dead-byte threshold against relying on eviction
//! alone, for both eviction policies.
//!
//! `cargo run --release -p cellcache-store --example dead_space [-- OPS]`
//!
//! Workload: a working set that fits (300,000 keys of 14 bytes, values 50–150 bytes ≈ 37 MB in
//! the 64 MiB default), preloaded, then OPS operations on Zipf(0.99)-chosen keys: 50 % gets,
//! 45 % overwrites with a new random size, 5 % deletes; a get that misses re-sets the key. Every
//! overwrite kills the old version's bytes, so without reclaim the arena fills with dead bytes
//! and whole slabs — live items included — get evicted although everything would fit.

use std::time::Instant;

use cellcache_store::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const KEYS: usize = 300_000;

fn main() {
    let ops: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(3_000_000);
    // Zipf(0.99) by inverse CDF, drawn before timing.
    let mut cdf: Vec<f64> = (1..=KEYS).map(|r| 1.0 / (r as f64).powf(0.99)).collect();
    let total: f64 = cdf.iter().sum();
    let mut acc = 0.0;
    for c in &mut cdf {
        acc += *c / total;
        *c = acc;
    }
    let mut rng = StdRng::seed_from_u64(7);
    let plan: Vec<(u32, u8, u16)> = (0..ops)
        .map(|_| {
            let u: f64 = rng.r#gen();
            let k = cdf.partition_point(|&c| c < u).min(KEYS - 1) as u32;
            (k, rng.gen_range(0..100), rng.gen_range(50..=150))
        })
        .collect();
    let value = [b'v'; 150];
    println!(
        "| compaction_dead_permille | eviction | hit % | live items evicted | slabs evicted | compactions | MB compacted | Mops/s |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|---:|");
    for eviction in [
        EvictionPolicyKind::SlabLru,
        EvictionPolicyKind::LeastLiveOfLru { candidates: 8 },
        EvictionPolicyKind::SecondChanceFifo,
    ] {
        for permille in [1000u32, 500, 250, 100] {
            let config = StoreConfig {
                compaction_dead_permille: permille,
                eviction,
                ..StoreConfig::default()
            };
            let store = Store::new(config).expect("config");
            let now = 1_000_000;
            for k in 0..KEYS {
                let key = format!("key:{k:010}");
                store
                    .write(&WriteRequest::set(key.as_bytes(), &value[..100]), now)
                    .expect("preload");
            }
            let (mut hits, mut gets) = (0u64, 0u64);
            let start = Instant::now();
            for &(k, op, len) in &plan {
                let key = format!("key:{k:010}");
                let v = &value[..len as usize];
                match op {
                    0..50 => {
                        gets += 1;
                        if store.get(key.as_bytes(), now, |v| v.value.len()).is_some() {
                            hits += 1;
                        } else {
                            store
                                .write(&WriteRequest::set(key.as_bytes(), v), now)
                                .expect("set");
                        }
                    }
                    50..95 => drop(
                        store
                            .write(&WriteRequest::set(key.as_bytes(), v), now)
                            .expect("set"),
                    ),
                    _ => drop(store.delete(key.as_bytes(), now, DeleteOptions::default())),
                }
            }
            let secs = start.elapsed().as_secs_f64();
            let st = store.stats();
            let name = eviction.to_string();
            println!(
                "| {permille} | {name} | {:.2} | {} | {} | {} | {:.1} | {:.2} |",
                100.0 * hits as f64 / gets as f64,
                st.evicted_items,
                st.evicted_slabs,
                st.compactions,
                st.compacted_bytes as f64 / 1e6,
                ops as f64 / secs / 1e6
            );
        }
    }
}
