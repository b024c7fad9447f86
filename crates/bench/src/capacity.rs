//! The capacity experiment: how many items of a given size a server holds in its memory limit
//! before it starts evicting, and the per-item overhead that implies.
//!
//! Distinct keys are written in pipelined batches; after each batch the server's `stats` are
//! read. The first batch after which `evictions` grew marks the limit. The capacity is the
//! most items the server held at once up to then: `curr_items` after that batch or after the
//! batch before, whichever is larger. (After the batch alone is not enough: a server that
//! evicts a whole slab at a time — cellcache — holds fewer items right after its first
//! eviction than just before it, while memcached, evicting one item at a time, holds the
//! most right after.) `limit_maxbytes / items - (key + value)` is the bytes it spends per
//! item beyond the raw key and value. The precision is one batch.
//! The server should be freshly started, so no earlier data occupies memory.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};

use crate::client::BlockingClient;
use crate::report::Machine;
use crate::workload::keys::KeySpace;
use crate::workload::values::ValuePool;

/// `cellcache bench capacity`.
#[derive(Debug, Clone, clap::Args)]
pub struct CapacityArgs {
    /// The server to fill (freshly started, with the memory limit under test).
    #[arg(short = 's', long)]
    pub server: String,
    #[command(flatten)]
    pub params: CapacityParams,
    /// Print the JSON report instead of the summary.
    #[arg(long)]
    pub json: bool,
    /// Also write the JSON report to this file.
    #[arg(short = 'o', long)]
    pub output: Option<PathBuf>,
}

/// What to fill the server with.
#[derive(Debug, Clone, clap::Args, Serialize, Deserialize)]
pub struct CapacityParams {
    /// Key length in bytes.
    #[arg(long, default_value_t = 14)]
    pub item_key_len: usize,
    /// Value length in bytes.
    #[arg(long, default_value_t = 100)]
    pub item_value_len: usize,
    /// Sets per stats check (the result's precision).
    #[arg(long, default_value_t = 1_000)]
    pub fill_batch: usize,
    /// Give up (error) if the server has not evicted after this many keys.
    #[arg(long, default_value_t = 100_000_000)]
    pub fill_keys_max: u64,
}

/// The outcome of filling one server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CapacityReport {
    pub server: String,
    pub server_version: String,
    /// The server's own memory limit (`limit_maxbytes`).
    pub limit_bytes: u64,
    pub key_len: usize,
    pub value_len: usize,
    /// Distinct keys written until evictions started.
    pub keys_written: u64,
    /// Most items the server held at once before it started evicting (`curr_items`, to a
    /// precision of one batch; see the module docs).
    pub items_held: u64,
    /// `evictions` at that moment.
    pub evictions: u64,
    /// `limit_bytes / items_held`.
    pub bytes_per_item: f64,
    /// `bytes_per_item - key_len - value_len`: header, index and slab waste per item.
    pub overhead_bytes_per_item: f64,
    pub machine: Machine,
}

/// A numeric field of a server's `stats` reply.
pub(crate) fn stat(
    stats: &std::collections::BTreeMap<String, String>,
    name: &str,
) -> anyhow::Result<u64> {
    stats
        .get(name)
        .with_context(|| format!("server stats lack {name:?}"))?
        .parse()
        .with_context(|| format!("stat {name:?} is not a number"))
}

/// Fills `addr` until it evicts.
pub fn measure(addr: SocketAddr, params: &CapacityParams) -> anyhow::Result<CapacityReport> {
    const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
    const IO_TIMEOUT: Duration = Duration::from_secs(30);
    let mut client = BlockingClient::connect(addr, CONNECT_TIMEOUT, IO_TIMEOUT)?;
    let version = client.version()?;
    let before = client.stats()?;
    let limit_bytes = stat(&before, "limit_maxbytes")?;
    let evictions_before = stat(&before, "evictions")?;
    let keys = KeySpace::new("c", params.fill_keys_max, Some(params.item_key_len))?;
    let pool = ValuePool::new(params.item_value_len, &mut rand::thread_rng());
    let value = pool.value(params.item_value_len);
    let batch = params.fill_batch.max(1) as u64;
    let mut written = 0u64;
    let mut held_before_batch = 0u64;
    while written < params.fill_keys_max {
        let end = (written + batch).min(params.fill_keys_max);
        let (_, not_stored) = client.set_many(
            (written..end).map(|i| (keys.key(i), value)),
            0,
            batch as usize,
        )?;
        if not_stored > 0 {
            bail!(
                "{addr}: {not_stored} sets were refused while filling (server out of memory without evicting?)"
            );
        }
        written = end;
        let stats = client.stats()?;
        let evictions = stat(&stats, "evictions")?;
        let held = stat(&stats, "curr_items")?;
        if evictions > evictions_before {
            let items_held = held.max(held_before_batch);
            let bytes_per_item = limit_bytes as f64 / items_held.max(1) as f64;
            return Ok(CapacityReport {
                server: addr.to_string(),
                server_version: version,
                limit_bytes,
                key_len: keys.key_len(),
                value_len: params.item_value_len,
                keys_written: written,
                items_held,
                evictions: evictions - evictions_before,
                bytes_per_item,
                overhead_bytes_per_item: bytes_per_item
                    - (keys.key_len() + params.item_value_len) as f64,
                machine: Machine::current(),
            });
        }
        held_before_batch = held;
    }
    bail!(
        "{addr} stored {written} keys without evicting; raise --fill-keys-max or lower its memory limit"
    )
}

impl CapacityReport {
    /// One human-readable line.
    pub fn summary(&self) -> String {
        format!(
            "{} ({}): {} MiB limit holds {} items of {}+{} B before evicting ({} keys written); {:.1} B/item, {:.1} B overhead/item",
            self.server,
            self.server_version,
            self.limit_bytes / (1024 * 1024),
            self.items_held,
            self.key_len,
            self.value_len,
            self.keys_written,
            self.bytes_per_item,
            self.overhead_bytes_per_item
        )
    }
}

/// Entry point of `cellcache bench capacity`.
pub fn run(args: CapacityArgs) -> anyhow::Result<()> {
    let addr = crate::args::resolve_servers(std::slice::from_ref(&args.server))?[0];
    let report = measure(addr, &args.params)?;
    crate::emit(
        &report,
        |r| format!("{}\n", r.summary()),
        args.json,
        args.output.as_deref(),
    )
}
