//! Hit ratio of the store alone per eviction policy: cache-aside gets over a Zipf key space
//! that is a multiple of the memory, with an optional scan mixed in. Deterministic (seeded,
//! no clock); the network figures with memcached side by side are `scripts/bench-hit-ratio`.
//!
//! `cargo run --release -p cellcache-store --example hit_ratio -- MEMORY_MIB ALPHA WS_FACTOR REQUESTS [SCAN_EVERY SCAN_LEN]`
//!
//! Keys are 14 bytes, values 100 bytes; the key count is `WS_FACTOR × memory / 114` (the
//! working set's raw key and value bytes are that multiple of the memory). The first
//! `REQUESTS` gets warm the cache, the next `REQUESTS` are measured. With a scan, every
//! `SCAN_EVERY` requests `SCAN_LEN` gets of fresh keys (never asked for again) are inserted,
//! each missing and filled; they are not counted in the hit ratio.

use cellcache_store::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const KEY_BYTES: usize = 14;
const VALUE_BYTES: usize = 100;

struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    fn new(n: usize, s: f64) -> Zipf {
        let mut cdf = Vec::with_capacity(n);
        let mut sum = 0.0;
        for r in 1..=n {
            sum += 1.0 / (r as f64).powf(s);
            cdf.push(sum);
        }
        for c in &mut cdf {
            *c /= sum;
        }
        Zipf { cdf }
    }
    fn sample(&self, rng: &mut StdRng) -> usize {
        let u: f64 = rng.r#gen();
        self.cdf.partition_point(|&c| c < u).min(self.cdf.len() - 1)
    }
}

fn arg<T: std::str::FromStr>(i: usize, default: T) -> T {
    std::env::args()
        .nth(i)
        .and_then(|a| a.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let mib: usize = arg(1, 16);
    let alpha: f64 = arg(2, 1.0);
    let factor: usize = arg(3, 10);
    let requests: usize = arg(4, 2_000_000);
    let scan_every: usize = arg(5, 0);
    let scan_len: usize = arg(6, 0);
    let keys = factor * (mib << 20) / (KEY_BYTES + VALUE_BYTES);
    let zipf = Zipf::new(keys, alpha);
    let value = vec![b'v'; VALUE_BYTES];
    println!("memory {mib} MiB, keys {keys}, alpha {alpha}, scan {scan_every}/{scan_len}");
    // `S3FIFO=small,ghost` (per mille) tries other S3-FIFO parameters.
    let s3fifo = std::env::var("S3FIFO")
        .ok()
        .and_then(|v| {
            let (a, b) = v.split_once(',')?;
            Some(EvictionPolicyKind::S3Fifo {
                small_permille: a.parse().ok()?,
                ghost_permille: b.parse().ok()?,
            })
        })
        .unwrap_or(EvictionPolicyKind::S3FIFO);
    // `ONLY_S3FIFO=1` skips the other policies.
    let policies = if std::env::var_os("ONLY_S3FIFO").is_some() {
        vec![s3fifo]
    } else {
        vec![
            EvictionPolicyKind::SlabLru,
            EvictionPolicyKind::SecondChanceFifo,
            s3fifo,
        ]
    };
    for eviction in policies {
        let store = Store::new(StoreConfig {
            memory_limit_bytes: mib << 20,
            eviction,
            ..StoreConfig::default()
        })
        .expect("store");
        let mut rng = StdRng::seed_from_u64(7);
        let (mut hits, mut lookups, mut scan_next) = (0u64, 0u64, 0usize);
        let fill = |key: &[u8]| {
            let _ = store.write(
                &WriteRequest {
                    mode: WriteMode::Set,
                    key,
                    value: &value,
                    flags: 0,
                    expiry: Expiry::NEVER,
                    compare_cas: None,
                    new_cas: None,
                    invalidate: false,
                },
                1,
            );
        };
        for i in 0..2 * requests {
            if scan_every > 0 && i % scan_every == 0 {
                for _ in 0..scan_len {
                    let key = format!("s{scan_next:013}");
                    scan_next += 1;
                    if store.get(key.as_bytes(), 1, |_| ()).is_none() {
                        fill(key.as_bytes());
                    }
                }
            }
            let key = format!("k{:013}", zipf.sample(&mut rng));
            let hit = store.get(key.as_bytes(), 1, |_| ()).is_some();
            if !hit {
                fill(key.as_bytes());
            }
            if i >= requests {
                lookups += 1;
                hits += u64::from(hit);
            }
        }
        let st = store.stats();
        println!(
            "{:<40} hit {:6.2} %  unread evicted {:5.1} %  ghost hits {:5.1} % of inserts  items {}  promoted {}  ghost {}",
            eviction.to_string(),
            100.0 * hits as f64 / lookups as f64,
            100.0 * st.evicted_unfetched as f64 / st.evicted_items.max(1) as f64,
            100.0 * st.ghost_hits as f64 / st.total_items.max(1) as f64,
            st.curr_items,
            st.promoted_items,
            st.ghost_entries
        );
    }
}
