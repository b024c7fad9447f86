//! `cellcache`: one binary for the cell (`serve`), its load generator (`bench`) and the
//! operator's tools. Configuration precedence: defaults < `--config` file < `CELLCACHE_*`
//! environment < flags (see `cellcache.example.toml`).

mod serve;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "cellcache",
    version,
    about = "An elastic, replicated, in-memory key-value cache that speaks the memcached protocol.",
    long_about = None
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a cell (memcached-compatible server) on embedded defaults, a config file and flags.
    Serve(serve::ServeArgs),
    /// Print the effective configuration (defaults, file, environment and flags merged) as TOML.
    Config(serve::ServeArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => serve::run(args),
        Command::Config(args) => {
            let config = args.resolve()?;
            print!("{}", toml::to_string_pretty(&config)?);
            Ok(())
        }
    }
}
