//! `cellcache`: one binary for the cell (`serve`), its load generator (`bench`) and the
//! operator's tools. Configuration precedence: defaults < `--config` file < `CELLCACHE_*`
//! environment < flags (see `cellcache.example.toml`).

#![forbid(unsafe_code)]

mod ctl;
mod help;
mod scale_flags;
mod serve;

use clap::{CommandFactory, FromArgMatches, Subcommand};

#[derive(clap::Parser)]
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
    /// Operator tools for a ring: status, ranges, split, leave.
    Ctl(ctl::CtlArgs),
    /// Local rings for trying cellcache out: `cluster up --cells 3`, `cluster down`,
    /// `cluster pid`.
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

fn main() -> std::process::ExitCode {
    // `serve` and `config` show each flag's default and TOML key (see `help`).
    let command = Cli::command()
        .mut_subcommand("serve", help::annotate_serve)
        .mut_subcommand("config", help::annotate_serve);
    let cli = match Cli::from_arg_matches(&command.get_matches()) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    let result = match cli.command {
        Command::Serve(args) => serve::run(args),
        Command::Engines(args) => engines(args),
        Command::Ctl(args) => ctl::run(args),
        Command::Cluster(args) => ctl::run_cluster(args),
        Command::Bench(args) => cellcache_bench::run(*args),
        Command::Config(args) => args.resolve().and_then(|config| {
            print!("{}", toml::to_string_pretty(&config)?);
            Ok(())
        }),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // One line, whatever RUST_BACKTRACE says: an operating error is not a bug, and
            // its backtrace (what `main() -> Result` prints) only buries the cause.
            eprintln!("error: {}", one_line(&e));
            std::process::ExitCode::FAILURE
        }
    }
}

/// The error and its causes as one line, outermost first, each said once: a cause whose text
/// its outer message already contains (libraries often format their source into their own
/// message) is left out, and line breaks inside a message become spaces.
fn one_line(e: &anyhow::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    for cause in e.chain() {
        let text = cause
            .to_string()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        if text.is_empty() || parts.iter().any(|p| p.contains(&text)) {
            continue;
        }
        parts.push(text);
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::one_line;
    use anyhow::Context;

    #[test]
    fn an_error_chain_says_each_cause_once_on_one_line() {
        let io = std::io::Error::new(std::io::ErrorKind::AddrInUse, "Address in use");
        let inner = anyhow::Error::new(io).context("binding 127.0.0.1:11211: Address in use");
        let e: anyhow::Result<()> = Err(inner);
        let e = e.context("starting the cell").unwrap_err();
        assert_eq!(
            one_line(&e),
            "starting the cell: binding 127.0.0.1:11211: Address in use"
        );
        let multi = anyhow::anyhow!("first line\n  second line");
        assert_eq!(one_line(&multi), "first line second line");
    }
}
