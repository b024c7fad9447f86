//! Development entry point: the same parser the `cellcache` binary mounts, usable before the
//! binary exists. `cargo run --release -p cellcache-bench --example bench -- --server 127.0.0.1:11211`
//! runs a load; `... -- compare --b-cmd '...'` runs the side-by-side.

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "bench",
    about = "cellcache load generator (development entry point)"
)]
#[command(args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    compare: Option<Top>,
    #[command(flatten)]
    bench: cellcache_bench::BenchArgs,
}

#[derive(Subcommand)]
enum Top {
    /// Side by side: memcached (A) against cellcache (B), interleaved repetitions.
    Compare(Box<cellcache_bench::CompareArgs>),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.compare {
        Some(Top::Compare(args)) => cellcache_bench::run_compare(*args),
        None => cellcache_bench::run(cli.bench),
    }
}
