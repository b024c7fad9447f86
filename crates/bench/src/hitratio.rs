//! `cellcache bench hit-ratio`: the hit ratio of a cache-aside client against one server, from
//! a key sequence that depends only on the parameters — the same requests, in the same order,
//! reach every server compared, whatever the machine's load.
//!
//! The sequence: `warmup_requests + requests` gets of keys drawn from the workload's Zipf
//! sampler ([`crate::workload::zipf::Zipf`], seeded), with, when `scan_every` > 0, a scan
//! before every `scan_every`-th of them — `scan_len` gets of fresh keys (`s…`, each asked for
//! once in the whole run). Requests go in batches of `batch` pipelined `get`s on one
//! connection; every get that missed is then filled with a `set` of that key (cache-aside),
//! before the next batch. Batch boundaries are fixed by the parameters, not by timing, so the
//! server sees the same requests in the same order on every run; only a server's own
//! background work (memcached's LRU maintainer) can make two runs differ. The hit ratio counts
//! the measured Zipf gets only; the scan's gets are counted apart.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::bail;
use rand::SeedableRng;
use rand::rngs::SmallRng;
use serde::{Deserialize, Serialize};

use crate::client::BlockingClient;
use crate::report::Machine;
use crate::workload::keys::KeySpace;
use crate::workload::values::ValuePool;
use crate::workload::zipf::Zipf;

/// `cellcache bench hit-ratio`.
#[derive(Debug, Clone, clap::Args)]
pub struct HitRatioArgs {
    /// The server (freshly started, with the memory limit under test).
    #[arg(short = 's', long)]
    pub server: String,
    /// What to call the server in the report (default: its address).
    #[arg(long)]
    pub label: Option<String>,
    #[command(flatten)]
    pub params: HitRatioParams,
    /// Print the JSON report instead of the summary.
    #[arg(long)]
    pub json: bool,
    /// Also write the JSON report to this file.
    #[arg(short = 'o', long)]
    pub output: Option<PathBuf>,
}

/// The workload: everything that decides the request sequence.
#[derive(Debug, Clone, PartialEq, clap::Args, Serialize, Deserialize)]
pub struct HitRatioParams {
    /// Distinct keys of the Zipf part.
    #[arg(short = 'k', long)]
    pub keys: u64,
    /// Key length in bytes.
    #[arg(long, default_value_t = 14)]
    pub key_len: usize,
    /// Value length in bytes.
    #[arg(long, default_value_t = 100)]
    pub value_len: usize,
    /// Zipf exponent s (P(rank k) ∝ k^-s).
    #[arg(long, default_value_t = 1.0)]
    pub zipf_exponent: f64,
    /// Gets that warm the cache before measuring.
    #[arg(long)]
    pub warmup_requests: u64,
    /// Measured gets.
    #[arg(short = 'n', long)]
    pub requests: u64,
    /// Gets per round trip (their fills follow in one more).
    #[arg(long, default_value_t = 64)]
    pub batch: usize,
    /// Seed of the key sequence.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// A scan before every this many Zipf gets (0: no scan).
    #[arg(long, default_value_t = 0)]
    pub scan_every: u64,
    /// Gets of fresh keys per scan.
    #[arg(long, default_value_t = 0)]
    pub scan_len: u64,
}

/// The outcome of one run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HitRatioReport {
    pub label: String,
    pub server: String,
    pub server_version: String,
    /// The server's memory limit (`limit_maxbytes`).
    pub limit_bytes: u64,
    pub params: HitRatioParams,
    /// Measured Zipf gets and their hits.
    pub lookups: u64,
    pub hits: u64,
    /// `hits / lookups`.
    pub hit_ratio: f64,
    /// Measured scan gets and their hits.
    pub scan_lookups: u64,
    pub scan_hits: u64,
    /// Sets that filled a miss (whole run), and those not answered `STORED`.
    pub fills: u64,
    pub fills_refused: u64,
    /// `curr_items` and `evictions` at the end.
    pub items_end: u64,
    pub evictions_end: u64,
    pub elapsed_secs: f64,
    pub machine: Machine,
}

use crate::capacity::stat;

/// One request of the sequence: a key and whether it belongs to a scan.
struct Get {
    key: Vec<u8>,
    scan: bool,
    measured: bool,
}

/// The request sequence of `params`, in order.
fn sequence(params: &HitRatioParams) -> anyhow::Result<impl Iterator<Item = Get>> {
    let keys = KeySpace::new("k", params.keys, Some(params.key_len))?;
    // As long as the Zipf keys: "s" and key_len - 1 digits.
    let scan_count = 10u64.saturating_pow(params.key_len.saturating_sub(1).min(19) as u32);
    let scan_keys = KeySpace::new("s", scan_count, Some(params.key_len))?;
    let zipf = Zipf::new(params.keys, params.zipf_exponent)?;
    let mut rng = SmallRng::seed_from_u64(params.seed);
    let warmup = params.warmup_requests;
    let (every, len) = (params.scan_every, params.scan_len);
    let total = warmup + params.requests;
    let mut scanned = 0u64;
    Ok((0..total).flat_map(move |i| {
        let measured = i >= warmup;
        let scan_len = if every > 0 && i % every == every - 1 {
            len
        } else {
            0
        };
        let first = scanned;
        scanned += scan_len;
        let scan = (first..first + scan_len).map({
            let scan_keys = scan_keys.clone();
            move |n| Get {
                key: scan_keys.key(n),
                scan: true,
                measured,
            }
        });
        let zipf_key = Get {
            key: keys.key(zipf.sample(&mut rng)),
            scan: false,
            measured,
        };
        scan.chain(std::iter::once(zipf_key))
    }))
}

/// Runs the sequence of `params` against `addr`.
pub fn measure(
    addr: SocketAddr,
    label: String,
    params: &HitRatioParams,
) -> anyhow::Result<HitRatioReport> {
    const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
    const IO_TIMEOUT: Duration = Duration::from_secs(30);
    if params.requests == 0 || params.batch == 0 {
        bail!("--requests and --batch must be > 0");
    }
    let mut client = BlockingClient::connect(addr, CONNECT_TIMEOUT, IO_TIMEOUT)?;
    let server_version = client.version()?;
    let limit_bytes = stat(&client.stats()?, "limit_maxbytes")?;
    let pool = ValuePool::new(params.value_len, &mut SmallRng::seed_from_u64(params.seed));
    let value = pool.value(params.value_len);
    let started = Instant::now();
    let (mut lookups, mut hits, mut scan_lookups, mut scan_hits) = (0u64, 0u64, 0u64, 0u64);
    let (mut fills, mut fills_refused) = (0u64, 0u64);
    let mut requests = sequence(params)?.peekable();
    let mut batch: Vec<Get> = Vec::with_capacity(params.batch);
    while requests.peek().is_some() {
        batch.clear();
        batch.extend(requests.by_ref().take(params.batch));
        let found = client.get_many(batch.iter().map(|g| g.key.as_slice()))?;
        for (get, &hit) in batch.iter().zip(&found) {
            match (get.measured, get.scan) {
                (false, _) => {}
                (true, false) => {
                    lookups += 1;
                    hits += u64::from(hit);
                }
                (true, true) => {
                    scan_lookups += 1;
                    scan_hits += u64::from(hit);
                }
            }
        }
        let misses = batch
            .iter()
            .zip(&found)
            .filter(|(_, hit)| !**hit)
            .map(|(get, _)| (get.key.clone(), value));
        let (stored, other) = client.set_many(misses, 0, params.batch)?;
        fills += stored + other;
        fills_refused += other;
    }
    let end = client.stats()?;
    Ok(HitRatioReport {
        label,
        server: addr.to_string(),
        server_version,
        limit_bytes,
        params: params.clone(),
        lookups,
        hits,
        hit_ratio: hits as f64 / lookups.max(1) as f64,
        scan_lookups,
        scan_hits,
        fills,
        fills_refused,
        items_end: stat(&end, "curr_items")?,
        evictions_end: stat(&end, "evictions")?,
        elapsed_secs: started.elapsed().as_secs_f64(),
        machine: Machine::current(),
    })
}

impl HitRatioReport {
    /// One human-readable line.
    pub fn summary(&self) -> String {
        format!(
            "{} ({}): hit ratio {:.4} ({} of {} gets; scan {} of {}), {} fills ({} refused), {} items at the end, {:.1} s\n",
            self.label,
            self.server_version,
            self.hit_ratio,
            self.hits,
            self.lookups,
            self.scan_hits,
            self.scan_lookups,
            self.fills,
            self.fills_refused,
            self.items_end,
            self.elapsed_secs
        )
    }
}

/// Entry point of `cellcache bench hit-ratio`.
pub fn run(args: HitRatioArgs) -> anyhow::Result<()> {
    let addr = crate::args::resolve_servers(std::slice::from_ref(&args.server))?[0];
    let label = args.label.clone().unwrap_or_else(|| args.server.clone());
    let report = measure(addr, label, &args.params)?;
    crate::emit(
        &report,
        HitRatioReport::summary,
        args.json,
        args.output.as_deref(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> HitRatioParams {
        HitRatioParams {
            keys: 1000,
            key_len: 14,
            value_len: 10,
            zipf_exponent: 1.0,
            warmup_requests: 10,
            requests: 20,
            batch: 4,
            seed: 3,
            scan_every: 5,
            scan_len: 2,
        }
    }

    #[test]
    fn the_sequence_depends_only_on_the_parameters() {
        let a: Vec<_> = sequence(&params()).unwrap().map(|g| g.key).collect();
        let b: Vec<_> = sequence(&params()).unwrap().map(|g| g.key).collect();
        assert_eq!(a, b);
        let other: Vec<_> = sequence(&HitRatioParams {
            seed: 4,
            ..params()
        })
        .unwrap()
        .map(|g| g.key)
        .collect();
        assert_ne!(a, other);
    }

    #[test]
    fn scans_are_fresh_keys_before_every_nth_get() {
        let gets: Vec<_> = sequence(&params()).unwrap().collect();
        // 30 Zipf gets, a scan of 2 before every 5th: 6 scans.
        assert_eq!(gets.len(), 30 + 12);
        let scans: Vec<_> = gets.iter().filter(|g| g.scan).map(|g| &g.key).collect();
        let distinct: std::collections::HashSet<_> = scans.iter().collect();
        assert_eq!((scans.len(), distinct.len()), (12, 12), "each scanned once");
        assert!(gets[4].scan && gets[5].scan && !gets[6].scan);
        assert!(scans.iter().all(|k| k.len() == 14 && k[0] == b's'));
        let measured = gets.iter().filter(|g| g.measured && !g.scan).count();
        assert_eq!(measured, 20);
    }
}
