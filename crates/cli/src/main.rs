//! `cellcache`: one binary for the cell (`serve`), its load generator (`bench`) and the
//! operator's tools. Configuration precedence: defaults < `--config` file < `CELLCACHE_*`
//! environment < flags (see `cellcache.example.toml`).

mod ctl;
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
    /// Load generator for any memcached-protocol server (closed or open loop, HDR latency);
    /// `bench compare` runs memcached and cellcache side by side, `bench capacity` fills until
    /// evictions start, `bench plot` draws a report.
    Bench(Box<cellcache_bench::BenchArgs>),
    /// Operator tools for a ring: status, ranges, leave.
    Ctl(ctl::CtlArgs),
    /// Local rings for trying cellcache out: `cluster up --cells 3`.
    Cluster(ctl::ClusterArgs),
    /// Show which I/O engines this kernel allows (and why io_uring is not, when it is not).
    Engines(EnginesArgs),
}

#[derive(clap::Args)]
struct EnginesArgs {
    /// Exit with status 1 unless this engine can run here.
    #[arg(long, value_name = "ENGINE")]
    require: Option<cellcache_io::IoEngineKind>,
}

/// `cellcache engines`: epoll and threads always run on Linux; io_uring needs the kernel's
/// permission, which sysctls and container seccomp profiles may withhold.
fn engines(args: EnginesArgs) -> anyhow::Result<()> {
    use cellcache_io::IoEngineKind;
    let uring = cellcache_io::uring_support();
    println!("epoll    available");
    println!("threads  available");
    match &uring {
        Ok(()) => println!("uring    available"),
        Err(e) => println!("uring    unavailable: {e}"),
    }
    let auto = if uring.is_ok() { "uring" } else { "epoll" };
    println!("auto     selects {auto}");
    if let (Some(IoEngineKind::Uring), Err(e)) = (args.require, &uring) {
        anyhow::bail!("io_uring is required but unavailable: {e}");
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => serve::run(args),
        Command::Engines(args) => engines(args),
        Command::Ctl(args) => ctl::run(args),
        Command::Cluster(args) => ctl::run_cluster(args),
        Command::Bench(args) => cellcache_bench::run(*args),
        Command::Config(args) => {
            let config = args.resolve()?;
            print!("{}", toml::to_string_pretty(&config)?);
            Ok(())
        }
    }
}
