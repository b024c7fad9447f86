//! Development entry point: the same parser the `cellcache` binary mounts as `cellcache bench`,
//! usable before the binary exists:
//! `cargo run --release -p cellcache-bench --example bench -- --server 127.0.0.1:11211`
//! runs a load; `... -- compare ...`, `... -- capacity ...` and `... -- plot ...` the rest.

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "bench",
    about = "cellcache load generator (development entry point)"
)]
struct Cli {
    #[command(flatten)]
    bench: cellcache_bench::BenchArgs,
}

fn main() -> anyhow::Result<()> {
    cellcache_bench::run(Cli::parse().bench)
}
