//! Command-line surface: [`BenchArgs`] (`cellcache bench`) and the [`LoadArgs`] it shares with
//! the side-by-side comparison, plus turning them into an engine configuration and a workload.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use cellcache_keyspace::HashRange;

use crate::engine::{EngineConfig, LoadMode, StopAfter};
use crate::schedule::Arrival;
use crate::workload::growth::Growth;
use crate::workload::keys::KeySpace;
use crate::workload::values::ValueSize;
use crate::workload::{Popularity, Workload};

/// Parses a hash range as `ctl status` prints one: `4000000000000000-7fffffffffffffff` (hex,
/// both ends included; a start above the end wraps past `u64::MAX`).
pub fn parse_hash_range(text: &str) -> Result<HashRange, String> {
    let bad = || format!("bad hash range {text:?} (use START-END in hex, as `ctl status` prints)");
    let (start, end) = text.trim().split_once('-').ok_or_else(bad)?;
    let hex = |h: &str| u64::from_str_radix(h.trim_start_matches("0x"), 16).map_err(|_| bad());
    Ok(HashRange::new(hex(start)?, hex(end)?))
}

/// Parses `10s`, `500ms`, `2m`, `1.5s`, `250us` or a bare number of seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("bad duration {text:?} (use e.g. 10s, 500ms, 2m)"))?;
    let scale = match unit {
        "" | "s" => 1.0,
        "ms" => 1e-3,
        "us" | "µs" => 1e-6,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        _ => return Err(format!("bad duration unit {unit:?} in {text:?}")),
    };
    let secs = value * scale;
    if !secs.is_finite() || secs < 0.0 {
        return Err(format!("bad duration {text:?}"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Key popularity choice on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PopularityArg {
    Uniform,
    Zipf,
}

/// When to show the progress bar.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ProgressArg {
    /// When stderr is a terminal.
    Auto,
    Always,
    Never,
}

/// The workload and the way it is driven: everything except the target servers.
#[derive(Debug, Clone, clap::Args)]
pub struct LoadArgs {
    /// Total connections, spread round-robin over the servers and the threads.
    #[arg(short = 'c', long, default_value_t = 4)]
    pub connections: usize,
    /// Requests in flight per connection (closed loop: always; open loop: at most).
    #[arg(long, default_value_t = 1)]
    pub pipeline: usize,
    /// Generator threads, each with its own event loop.
    #[arg(short = 't', long, default_value_t = 1)]
    pub threads: usize,
    /// Open loop: total arrival rate in requests per second. Without it the run is closed loop.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Open loop: arrival process.
    #[arg(long, value_enum, default_value_t = Arrival::Uniform)]
    pub arrival: Arrival,
    /// Length of the measured phase (e.g. 10s, 500ms). Default 10s unless --requests is given.
    #[arg(short = 'd', long, value_parser = parse_duration, conflicts_with = "requests")]
    pub duration: Option<Duration>,
    /// Stop after this many measured requests instead of after a duration.
    #[arg(short = 'n', long)]
    pub requests: Option<u64>,
    /// Warm-up before measurement; its requests are sent but not measured.
    #[arg(long, value_parser = parse_duration, default_value = "0s")]
    pub warmup: Duration,
    /// Fraction of requests that are gets (the rest are sets).
    #[arg(long, default_value_t = 0.9)]
    pub get_ratio: f64,
    /// Number of distinct keys.
    #[arg(short = 'k', long, default_value_t = 10_000)]
    pub keys: u64,
    /// Prefix of every key.
    #[arg(long, default_value = "key:")]
    pub key_prefix: String,
    /// Pad keys with zeros to at least this many bytes.
    #[arg(long)]
    pub key_len: Option<usize>,
    /// Only keys whose hash falls in START-END (hex, inclusive, as `ctl status` prints a
    /// cell's range): send a cell only the keys it masters, or only keys it forwards.
    #[arg(long, value_parser = parse_hash_range, value_name = "START-END")]
    pub key_hash_range: Option<HashRange>,
    /// Key popularity.
    #[arg(long, value_enum, default_value_t = PopularityArg::Uniform)]
    pub popularity: PopularityArg,
    /// Zipf exponent s (P(rank k) ∝ k^-s); 1.345675 puts 90% of requests on 10% of 1000 keys.
    #[arg(long, default_value_t = 0.99)]
    pub zipf_exponent: f64,
    /// Value size in bytes: fixed (100, 1k), uniform range (64..1024) or weighted mix (100:9,8192:1).
    #[arg(long, default_value = "100")]
    pub value_size: ValueSize,
    /// TTL of every set in seconds (0 = never expires).
    #[arg(long, default_value_t = 0)]
    pub ttl: i64,
    /// Keys per get request (1 = plain get, >1 = multi-get).
    #[arg(long, default_value_t = 1)]
    pub multiget: usize,
    /// Write every key once before the run so gets hit.
    #[arg(long)]
    pub preload: bool,
    /// Cache-aside: after a get misses, set that key (as the connection's next request).
    #[arg(long)]
    pub set_on_miss: bool,
    /// A growing data set: sets write each of the --keys once, in order, then overwrite;
    /// gets read keys whose set was answered, uniformly (docs/benchmarks/bench-tool.md).
    #[arg(long)]
    pub grow: bool,
    /// With --grow: from this time into the measured phase, writes delete the oldest keys
    /// until --shrink-to keys are left, then overwrite those.
    #[arg(long, value_parser = parse_duration, requires = "grow")]
    pub shrink_at: Option<Duration>,
    /// With --shrink-at: keys left after the deletes (default 0).
    #[arg(long, requires = "shrink_at")]
    pub shrink_to: Option<u64>,
    /// Pin generator threads to these cores (e.g. 0 or 0,2-3).
    #[arg(long)]
    pub cpus: Option<crate::affinity::CpuList>,
    /// Seed of the random streams (runs with equal seeds send equal requests).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Wait this long for outstanding replies after the last send; the rest count as timeouts.
    #[arg(long, value_parser = parse_duration, default_value = "5s")]
    pub drain_timeout: Duration,
    /// Open loop: a send later than this after its intended time counts as late.
    #[arg(long, value_parser = parse_duration, default_value = "1ms")]
    pub late_threshold: Duration,
    /// Open loop: due requests that may wait for a free connection, per thread; beyond, dropped.
    #[arg(long, default_value_t = 100_000)]
    pub backlog_max: usize,
    /// TCP connect timeout.
    #[arg(long, value_parser = parse_duration, default_value = "2s")]
    pub connect_timeout: Duration,
    /// Open loop: when the next arrival is closer than this, busy-poll instead of sleeping
    /// (sleeps end on a timerfd, whose wake-up takes tens of µs on a busy machine). 0 = never spin.
    #[arg(long, value_parser = parse_duration, default_value = "100us")]
    pub spin_threshold: Duration,
    #[command(flatten)]
    pub tls: crate::tls::TlsArgs,
}

impl LoadArgs {
    /// The engine configuration for these arguments against `servers` (without TLS: the
    /// caller adds the [`TlsTarget`](crate::tls::TlsTarget), which needs the host names).
    pub fn engine_config(&self, servers: Vec<SocketAddr>) -> EngineConfig {
        let stop = match (self.requests, self.duration) {
            (Some(count), _) => StopAfter::Requests { count },
            (None, Some(d)) => StopAfter::Duration {
                secs: d.as_secs_f64(),
            },
            (None, None) => StopAfter::Duration { secs: 10.0 },
        };
        EngineConfig {
            servers,
            connections: self.connections,
            pipeline: self.pipeline,
            threads: self.threads,
            mode: match self.rate {
                Some(rate_per_sec) => LoadMode::Open {
                    rate_per_sec,
                    arrival: self.arrival,
                },
                None => LoadMode::Closed,
            },
            stop,
            warmup: self.warmup,
            drain_timeout: self.drain_timeout,
            late_threshold: self.late_threshold,
            backlog_max: self.backlog_max,
            connect_timeout: self.connect_timeout,
            spin_threshold: self.spin_threshold,
            cpus: self.cpus.clone().map(|c| c.0).unwrap_or_default(),
            set_on_miss: self.set_on_miss,
            seed: self.seed,
            ..EngineConfig::default()
        }
    }

    /// The workload these arguments describe.
    pub fn workload(&self) -> anyhow::Result<Workload> {
        Ok(Workload {
            keys: match self.key_hash_range {
                Some(range) => KeySpace::within(&self.key_prefix, self.keys, self.key_len, range)?,
                None => KeySpace::new(&self.key_prefix, self.keys, self.key_len)?,
            },
            popularity: match self.popularity {
                PopularityArg::Uniform => Popularity::Uniform,
                PopularityArg::Zipf => Popularity::Zipf {
                    exponent: self.zipf_exponent,
                },
            },
            get_ratio: self.get_ratio,
            multiget: self.multiget,
            value_size: self.value_size.clone(),
            ttl_secs: self.ttl,
            growth: self.grow.then(|| Growth {
                shrink_at_secs: self.shrink_at.map(|d| d.as_secs_f64()),
                keep: self.shrink_to.unwrap_or(0),
            }),
        })
    }
}

/// `cellcache bench`: drive load against one or more memcached-protocol servers.
#[derive(Debug, Clone, clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub command: Option<BenchCommand>,
    /// Target server HOST:PORT; repeat for several cells.
    #[arg(short = 's', long = "server")]
    pub servers: Vec<String>,
    #[command(flatten)]
    pub load: LoadArgs,
    /// Report the CPU time of this server process over the measured phase (from
    /// /proc/PID/stat), and replies per CPU-second; repeat for every cell of a ring to get
    /// the work of the whole ring per reply.
    #[arg(long = "server-pid", value_name = "PID")]
    pub server_pids: Vec<u32>,
    /// Print the JSON report on stdout instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Also write the JSON report to this file.
    #[arg(short = 'o', long)]
    pub output: Option<PathBuf>,
    /// Also draw plots (SVG and PNG) into this directory.
    #[arg(long)]
    pub plot_dir: Option<PathBuf>,
    /// Progress bar on stderr.
    #[arg(long, value_enum, default_value_t = ProgressArg::Auto)]
    pub progress: ProgressArg,
}

/// Subcommands of `cellcache bench`.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum BenchCommand {
    /// Draw latency-percentile and throughput plots, and per-second p99 and hit-ratio
    /// timelines (SVG and PNG) from JSON reports.
    Plot(crate::plot::PlotArgs),
    /// One figure of an autoscaling run: cells, memory fill per cell, replies/s, p99 and hit
    /// ratio over time, divisions and absorptions marked (scripts/bench-autoscale).
    PlotAutoscale(crate::plot::autoscale::AutoscaleArgs),
    /// Count how many items fit in a server before it evicts, and the implied overhead per item.
    Capacity(crate::capacity::CapacityArgs),
    /// Hit ratio of a cache-aside client: a key sequence fixed by the parameters (Zipf gets,
    /// optionally scans of fresh keys), each miss filled with a set.
    HitRatio(crate::hitratio::HitRatioArgs),
    /// Draw hit-ratio reports as grouped bars (SVG and PNG): one group per workload, one bar
    /// per server label.
    HitRatioPlot(crate::plot::hit_ratio::HitRatioPlotArgs),
    /// Side by side: memcached (A) against cellcache (B), interleaved repetitions, ratios B/A.
    Compare(Box<crate::CompareArgs>),
    /// A server on a cell's I/O engine that answers every text request with a fixed reply
    /// and no store: the limit a cell is compared with (`bench compare --a-cmd`).
    Echo(crate::echo::EchoArgs),
}

/// Resolves `HOST:PORT` strings to socket addresses.
pub fn resolve_servers(servers: &[String]) -> anyhow::Result<Vec<SocketAddr>> {
    if servers.is_empty() {
        bail!("no target: give at least one --server HOST:PORT");
    }
    servers
        .iter()
        .map(|s| {
            s.to_socket_addrs()
                .with_context(|| format!("resolving {s}"))?
                .next()
                .with_context(|| format!("{s} resolves to no address"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchArgs,
    }

    #[derive(Parser)]
    struct CompareCli {
        #[command(flatten)]
        compare: crate::CompareArgs,
    }

    #[test]
    fn argument_definitions_are_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
        CompareCli::command().debug_assert();
    }

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("x").is_err());
        assert!(parse_duration("3 parsecs").is_err());
    }

    #[test]
    fn command_line_maps_to_engine_and_workload() {
        let cli = Cli::try_parse_from([
            "bench",
            "--server",
            "127.0.0.1:11211",
            "--server",
            "127.0.0.1:11212",
            "--rate",
            "50",
            "--arrival",
            "poisson",
            "-c",
            "25",
            "--requests",
            "1000",
            "--popularity",
            "zipf",
            "--zipf-exponent",
            "1.345675",
            "--value-size",
            "1k",
            "--keys",
            "1000",
            "--cpus",
            "0",
        ])
        .unwrap();
        let servers = resolve_servers(&cli.bench.servers).unwrap();
        let config = cli.bench.load.engine_config(servers);
        assert_eq!(config.servers.len(), 2);
        assert_eq!(config.connections, 25);
        assert_eq!(
            config.mode,
            LoadMode::Open {
                rate_per_sec: 50.0,
                arrival: Arrival::Poisson
            }
        );
        assert_eq!(config.stop, StopAfter::Requests { count: 1000 });
        assert_eq!(config.cpus, vec![0]);
        let workload = cli.bench.load.workload().unwrap();
        assert_eq!(workload.popularity, Popularity::Zipf { exponent: 1.345675 });
        assert_eq!(workload.value_size, ValueSize::Fixed(1024));
        assert!(Cli::try_parse_from(["bench", "--duration", "1s", "--requests", "5"]).is_err());
        assert!(resolve_servers(&[]).is_err());
    }

    #[test]
    fn a_growing_data_set_on_the_command_line() {
        let parse = |extra: &[&str]| {
            let mut argv = vec!["bench", "--server", "127.0.0.1:1", "--keys", "1000"];
            argv.extend_from_slice(extra);
            Cli::try_parse_from(argv).map(|cli| cli.bench.load.workload().unwrap())
        };
        assert_eq!(parse(&[]).unwrap().growth, None);
        assert_eq!(
            parse(&["--grow"]).unwrap().growth,
            Some(Growth {
                shrink_at_secs: None,
                keep: 0
            })
        );
        assert_eq!(
            parse(&["--grow", "--shrink-at", "2m", "--shrink-to", "10"])
                .unwrap()
                .growth,
            Some(Growth {
                shrink_at_secs: Some(120.0),
                keep: 10
            })
        );
        assert!(parse(&["--shrink-at", "1s"]).is_err(), "needs --grow");
        assert!(
            parse(&["--grow", "--shrink-to", "1"]).is_err(),
            "needs --shrink-at"
        );
        // The engine refuses what a growing data set cannot honour.
        for extra in [&["--set-on-miss"][..], &["--popularity", "zipf"]] {
            let args = ["bench", "--server", "127.0.0.1:1", "--grow"];
            let cli = Cli::try_parse_from(args.iter().chain(extra)).unwrap();
            let workload = cli.bench.load.workload().unwrap();
            let config = cli
                .bench
                .load
                .engine_config(resolve_servers(&cli.bench.servers).unwrap());
            assert!(config.validate(&workload).is_err(), "{extra:?}");
        }
    }
}
