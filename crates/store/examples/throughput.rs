//! Throughput of the store alone: shared vs partitioned layout, 1 and N threads, uniform and
//! Zipf key popularity, and the eviction policies (hit ratio under pressure, throughput).
//!
//! `cargo run --release -p cellcache-store --example throughput [-- OPS_PER_THREAD [policies]]`
//! (`policies` runs only the eviction-policy table).
//!
//! Workload: `KEYS` keys of 14 bytes, 100-byte values, 90 % gets / 10 % sets, keys drawn
//! uniformly or from Zipf(s = 0.99) over ranks (rank r → key r), each thread its own seeded RNG;
//! the key sequence is drawn before the clock starts so sampling cost is not measured. A get
//! that misses is followed by a set of that key (cache-aside, as a client would), so the hit
//! ratio reflects the eviction policy. The store is preloaded with every key. Memory is the
//! 64 MiB default, which holds about half of the key set, so sets evict as in a cache under
//! pressure. Each configuration runs `REPEATS` times interleaved; the median is reported.

use std::sync::Arc;
use std::time::Instant;

use cellcache_store::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const KEYS: usize = 1_000_000;
const VALUE_BYTES: usize = 100;
const ZIPF_S: f64 = 0.99;
const REPEATS: usize = 3;
const SET_PERCENT: u32 = 10;

/// Inverse-CDF Zipf sampler over ranks 0..n.
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

#[derive(Clone, Copy, Debug)]
enum Dist {
    Uniform,
    Zipf,
    /// Zipf gets as above, but `SCAN_PERCENT` of operations are sets of fresh keys that are never
    /// read (a bulk loader or one-hit wonders), which a cache should not let displace hot items.
    ZipfScan,
}

const SCAN_PERCENT: u32 = 30;

fn key(i: usize) -> [u8; 14] {
    let mut k = *b"key:0000000000";
    let mut n = i;
    for b in k[4..].iter_mut().rev() {
        *b = b'0' + (n % 10) as u8;
        n /= 10;
    }
    k
}

struct Run {
    mops: f64,
    hit_ratio: f64,
}

fn run(config: &StoreConfig, threads: usize, dist: Dist, ops: usize, zipf: &Arc<Zipf>) -> Run {
    let store = Arc::new(Store::new(config.clone()).expect("config"));
    let value = [b'v'; VALUE_BYTES];
    let now = 1_000_000;
    for i in 0..KEYS {
        store
            .write(&WriteRequest::set(&key(i), &value), now)
            .expect("preload");
    }
    let plans: Vec<Vec<(u32, bool)>> = (0..threads)
        .map(|t| {
            let mut rng = StdRng::seed_from_u64(t as u64 + 1);
            (0..ops)
                .map(|j| {
                    if matches!(dist, Dist::ZipfScan) && rng.gen_range(0..100) < SCAN_PERCENT {
                        return ((KEYS + t * ops + j) as u32, true);
                    }
                    let i = match dist {
                        Dist::Uniform => rng.gen_range(0..KEYS),
                        Dist::Zipf | Dist::ZipfScan => zipf.sample(&mut rng),
                    };
                    (i as u32, rng.gen_range(0..100) < SET_PERCENT)
                })
                .collect()
        })
        .collect();
    let start = Instant::now();
    let handles: Vec<_> = plans
        .into_iter()
        .map(|plan| {
            let store = store.clone();
            std::thread::spawn(move || {
                let (mut hits, mut gets) = (0u64, 0u64);
                let mut out = [0u8; VALUE_BYTES];
                for (i, is_set) in plan {
                    let k = key(i as usize);
                    if is_set {
                        store
                            .write(&WriteRequest::set(&k, &value), now)
                            .expect("set");
                    } else {
                        gets += 1;
                        let hit =
                            store.get(&k, now, |v| out[..v.value.len()].copy_from_slice(v.value));
                        if hit.is_some() {
                            hits += 1;
                        } else {
                            store
                                .write(&WriteRequest::set(&k, &value), now)
                                .expect("set");
                        }
                    }
                }
                (hits, gets)
            })
        })
        .collect();
    let (mut hits, mut gets) = (0, 0);
    for h in handles {
        let (a, b) = h.join().expect("worker");
        hits += a;
        gets += b;
    }
    let secs = start.elapsed().as_secs_f64();
    Run {
        mops: (threads * ops) as f64 / secs / 1e6,
        hit_ratio: hits as f64 / gets as f64,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let ops: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2_000_000);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let zipf = Arc::new(Zipf::new(KEYS, ZIPF_S));
    let shared = StoreConfig::default();
    let partitioned = StoreConfig {
        layout: Layout::Partitioned { shards: 4 * cores },
        ..StoreConfig::default()
    };
    let least_live = StoreConfig {
        eviction: EvictionPolicyKind::LeastLiveOfLru { candidates: 8 },
        ..StoreConfig::default()
    };
    println!("ops per thread {ops}, keys {KEYS}, cores {cores}, median of {REPEATS}");
    println!(
        "| dist | threads | shared Mops/s | partitioned ({}) Mops/s | partitioned / shared | hit % shared | hit % partitioned |",
        4 * cores
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let only_policies = std::env::args().nth(2).is_some_and(|a| a == "policies");
    let mut thread_counts = if only_policies { vec![] } else { vec![1] };
    if cores > 1 && !only_policies {
        thread_counts.push(cores);
    }
    for dist in [Dist::Uniform, Dist::Zipf] {
        for &threads in &thread_counts {
            let (mut a, mut b, mut ha, mut hb) = (vec![], vec![], vec![], vec![]);
            for _ in 0..REPEATS {
                let r = run(&shared, threads, dist, ops, &zipf);
                a.push(r.mops);
                ha.push(r.hit_ratio);
                let r = run(&partitioned, threads, dist, ops, &zipf);
                b.push(r.mops);
                hb.push(r.hit_ratio);
            }
            let (a, b) = (median(a), median(b));
            println!(
                "| {dist:?} | {threads} | {a:.2} | {b:.2} | {:.2} | {:.1} | {:.1} |",
                b / a,
                100.0 * median(ha),
                100.0 * median(hb)
            );
        }
    }
    println!();
    println!("| dist | eviction | hit % | Mops/s (1 thread) |");
    println!("|---|---|---:|---:|");
    let second_chance = StoreConfig {
        eviction: EvictionPolicyKind::SecondChanceFifo,
        ..StoreConfig::default()
    };
    let s3fifo = StoreConfig {
        eviction: EvictionPolicyKind::S3FIFO,
        ..StoreConfig::default()
    };
    for dist in [Dist::Uniform, Dist::Zipf, Dist::ZipfScan] {
        for cfg in [&shared, &least_live, &second_chance, &s3fifo] {
            let name = cfg.eviction.to_string();
            let r = run(cfg, 1, dist, ops, &zipf);
            println!(
                "| {dist:?} | {name} | {:.2} | {:.2} |",
                100.0 * r.hit_ratio,
                r.mops
            );
        }
    }
}
