//! 23 configurations of arena size, slab size, value size, operation count and get/set ratio,
//! each run against the store: slabs purged, get and set time, memory. They are tests 1–23 of
//! the "Benchmark of Supporting Data Structures" in the Cell Cycle proposal cellcache started
//! from, so the store can be set against the figures it reports; configurations and figures are in
//! docs/benchmarks/data/arena-slab-configs.csv (described in that folder's README).
//!
//! `cargo run --release -p cellcache-store --example arena_slab_configs -- --csv docs/benchmarks/data/arena-slab-configs.csv`
//!
//! Per test: `operations` operations, of which one in `get_set_ratio + 1` is a set and the rest
//! are gets. Every set writes a fresh key (`key:<n>`, sequential) with a `value_bytes` value, so
//! the bytes written grow with the operation count exactly as the proposal's purge counts imply
//! (its purged slabs ≈ (sets × value − arena) / slab). Every get reads a key chosen uniformly
//! among the keys set so far (seeded RNG), so some gets miss once their slab was purged. The
//! store gets `memory_limit = arena_mb` (its index is carved out of that limit, so its arena is
//! slightly smaller than the proposal's) and `slab_size = slab_kb`, binary units. Times are the sums
//! of per-operation wall times (including ~20 ns of timer cost per operation). Each test runs in
//! a fresh child process (this binary with `--test ID`), so "RSS" is that process's VmRSS after
//! its workload with the store alive: the arena pages actually touched plus the index and the
//! program itself, unaffected by earlier tests.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use cellcache_store::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

struct Test {
    id: u32,
    operations: u64,
    ratio: u64,
    value_bytes: usize,
    arena_mb: f64,
    slab_kb: f64,
    proposal_purged: u64,
    proposal_get_s: f64,
    proposal_set_s: f64,
    proposal_mem_mb: f64,
}

fn parse_csv(text: &str) -> Vec<Test> {
    text.lines()
        .skip(1)
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split(',').map(str::trim).collect();
            Test {
                id: f[0].parse().expect("test_id"),
                operations: f[1].parse().expect("operations"),
                ratio: f[2].parse().expect("get_set_ratio"),
                value_bytes: f[3].parse().expect("value_bytes"),
                arena_mb: f[4].parse().expect("arena_mb"),
                slab_kb: f[5].parse().expect("slab_kb"),
                proposal_purged: f[6].parse().expect("proposal_slabs_purged"),
                proposal_get_s: f[7].parse().expect("proposal get"),
                proposal_set_s: f[8].parse().expect("proposal set"),
                proposal_mem_mb: f[9].parse().expect("proposal mem"),
            }
        })
        .collect()
}

fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = args
        .iter()
        .position(|a| a == "--csv")
        .and_then(|i| args.get(i + 1))
        .cloned()
        .unwrap_or_else(|| {
            // The proposal's table travels with the repository (docs/benchmarks/data/).
            concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../docs/benchmarks/data/arena-slab-configs.csv"
            )
            .to_string()
        });
    let only: Option<u32> = args
        .iter()
        .position(|a| a == "--test")
        .and_then(|i| args.get(i + 1)?.parse().ok());
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
    if only.is_none() {
        println!(
            "| test | ops | get/set | value B | arena MB | slab KB | purged (proposal) | purged | get s (proposal) | get s | set s (proposal) | set s | hit % | mem MB (proposal) | RSS MiB |"
        );
        println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        let exe = std::env::current_exe().expect("current exe");
        for t in parse_csv(&text) {
            let out = std::process::Command::new(&exe)
                .args(["--csv", &path, "--test", &t.id.to_string()])
                .output()
                .expect("run child");
            print!("{}", String::from_utf8_lossy(&out.stdout));
        }
        return;
    }
    for t in parse_csv(&text) {
        if only.is_some_and(|o| o != t.id) {
            continue;
        }
        let slab = (t.slab_kb * 1024.0) as usize;
        let config = StoreConfig {
            memory_limit_bytes: (t.arena_mb * 1024.0 * 1024.0) as usize,
            slab_size_bytes: slab,
            item_size_max_bytes: slab,
            index_item_bytes_expected: t.value_bytes + 20,
            ..StoreConfig::default()
        };
        let store = Store::new(config).expect("config");
        let value = vec![b'x'; t.value_bytes];
        let mut rng = StdRng::seed_from_u64(u64::from(t.id));
        let mut key = String::new();
        let (mut get_time, mut set_time) = (Duration::ZERO, Duration::ZERO);
        let (mut keys, mut hits, mut gets) = (0u64, 0u64, 0u64);
        let now = 1_000_000;
        for i in 0..t.operations {
            key.clear();
            if i % (t.ratio + 1) == 0 || keys == 0 {
                write!(key, "key:{keys}").expect("fmt");
                keys += 1;
                let start = Instant::now();
                store
                    .write(&WriteRequest::set(key.as_bytes(), &value), now)
                    .expect("set");
                set_time += start.elapsed();
            } else {
                write!(key, "key:{}", rng.gen_range(0..keys)).expect("fmt");
                let start = Instant::now();
                let hit = store.get(key.as_bytes(), now, |v| v.value.len()).is_some();
                get_time += start.elapsed();
                gets += 1;
                hits += u64::from(hit);
            }
        }
        let st = store.stats();
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {:.1} | {:.3} | {:.1} | {:.3} | {:.1} | {:.1} | {:.1} |",
            t.id,
            t.operations,
            t.ratio,
            t.value_bytes,
            t.arena_mb,
            t.slab_kb,
            t.proposal_purged,
            st.evicted_slabs,
            t.proposal_get_s,
            get_time.as_secs_f64(),
            t.proposal_set_s,
            set_time.as_secs_f64(),
            100.0 * hits as f64 / gets.max(1) as f64,
            t.proposal_mem_mb,
            rss_mib(),
        );
        drop(store);
    }
}
