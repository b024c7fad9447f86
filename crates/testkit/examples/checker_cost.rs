//! How long the history checker takes on histories of a given size: records register
//! workloads against a memcached-protocol server and times the check. Used for the figures
//! in docs/testing.md:
//!
//! ```text
//! memcached -u root -l 127.0.0.1 -p 22122 -U 0 &
//! cargo run --release -p cellcache-testkit --example checker_cost -- 127.0.0.1:22122
//! ```

use std::net::SocketAddr;
use std::time::Instant;

use cellcache_testkit::history::{CheckConfig, check};
use cellcache_testkit::workload::{self, Shape, WorkloadConfig};

fn main() -> anyhow::Result<()> {
    let addr: SocketAddr = std::env::args()
        .nth(1)
        .ok_or_else(|| anyhow::anyhow!("usage: checker_cost HOST:PORT"))?
        .parse()?;
    println!("| shape | clients | ops per client | keys | operations | record | check | valid |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    let registers = Shape::Registers { read_percent: 50 };
    let logs = Shape::AppendLogs { read_percent: 20 };
    for (shape, clients, ops, keys) in [
        (registers, 4, 200, 8),
        (registers, 8, 2000, 8),
        (registers, 16, 1000, 4),
        (registers, 8, 2000, 1),
        (logs, 8, 2000, 4),
        (logs, 8, 2000, 1),
    ] {
        let name = match shape {
            Shape::Registers { .. } => "registers",
            Shape::AppendLogs { .. } => "append logs",
        };
        let config = WorkloadConfig {
            clients,
            ops_per_client: ops,
            keys,
            shape,
            ..WorkloadConfig::registers(vec![addr])
        };
        let started = Instant::now();
        let run = workload::run(config)?;
        let recorded = started.elapsed();
        let started = Instant::now();
        let report = check(&run.history, CheckConfig::default());
        println!(
            "| {name} | {clients} | {ops} | {keys} | {} | {:.0?} | {:.0?} | {} |",
            report.operations_checked,
            recorded,
            started.elapsed(),
            report.is_valid()
        );
    }
    Ok(())
}
