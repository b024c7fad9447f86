//! Side by side: start two servers (by default Debian's memcached as A and cellcache as B) with
//! the same worker threads and memory, run the same experiment against each in interleaved
//! repetitions (A, B, A, B, …), and report every metric as the ratio B/A with its min, median
//! and max over the repetitions.
//!
//! Each repetition starts a fresh server process, waits until it answers `version` (polling a
//! connect, never a blind sleep), runs the experiment, and stops the process, so repetitions are
//! independent and neither server keeps state from the other's run. Interleaving spreads slow
//! drifts of the machine (thermal, noisy neighbours) over both sides equally.
//!
//! Placement: the server is started under `taskset -c <server cpus>` and the generator threads
//! pin themselves to the client cpus, so the two never share a core. The report states the
//! placement that was actually in force, read back from /proc/<pid>/status.
//!
//! TLS: `--tls` (with its trust options) speaks TLS to the sides `--tls-side` names (both by
//! default), readiness check and preload included; the server commands must then start those
//! sides with `-Z` (`--a-cmd`/`--b-cmd`). `--tls --tls-side b` with the same server on both
//! sides measures what TLS costs that server.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};

use crate::args::{LoadArgs, parse_duration};
use crate::capacity::{self, CapacityParams, CapacityReport};
use crate::report::{Machine, RunReport};

/// Which experiment to run on both sides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Experiment {
    /// The load described by the workload options (throughput, hit ratio, latency).
    Load,
    /// Fill until evictions start: items held and overhead per item.
    Capacity,
}

/// Which sides of a comparison speak TLS under `--tls`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum TlsSide {
    Both,
    A,
    B,
}

/// `cellcache bench compare` (mounted by the `cellcache` binary).
#[derive(Debug, Clone, clap::Args)]
pub struct CompareArgs {
    #[command(flatten)]
    pub load: LoadArgs,
    #[command(flatten)]
    pub capacity: CapacityParams,
    /// What to measure on both sides.
    #[arg(long, value_enum, default_value_t = Experiment::Load)]
    pub experiment: Experiment,
    /// Repetitions per side, run interleaved A, B, A, B, …
    #[arg(long, default_value_t = 3)]
    pub repetitions: usize,
    /// Worker threads of each server (-t).
    #[arg(long, default_value_t = 1)]
    pub server_threads: usize,
    /// Memory limit of each server in MiB (-m).
    #[arg(long, default_value_t = 64)]
    pub memory_mb: u64,
    /// cellcache binary (side B); started as `serve -p PORT -t THREADS -m MB -l 127.0.0.1`.
    /// Default: the running executable.
    #[arg(long)]
    pub cellcache_bin: Option<PathBuf>,
    /// memcached binary (side A); started as `-p PORT -t THREADS -m MB -l 127.0.0.1 -U 0`.
    #[arg(long, default_value = "memcached")]
    pub memcached_bin: PathBuf,
    /// Replace side A's command line; {port}, {threads} and {memory_mb} are substituted.
    #[arg(long)]
    pub a_cmd: Option<String>,
    /// Replace side B's command line (e.g. memcached on both sides to validate the harness).
    #[arg(long)]
    pub b_cmd: Option<String>,
    /// Name of side A in reports.
    #[arg(long, default_value = "memcached")]
    pub a_name: String,
    /// Name of side B in reports.
    #[arg(long, default_value = "cellcache")]
    pub b_name: String,
    /// Cores for the servers (default: the last allowed core when there are at least two).
    #[arg(long)]
    pub server_cpus: Option<crate::affinity::CpuList>,
    /// How long a server may take to answer `version` after start.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    pub ready_timeout: Duration,
    /// With --tls: the sides that speak TLS (their commands must start them with -Z); the
    /// other side is plain. `--tls-side b` with the same server on both sides = TLS vs plain.
    #[arg(long, value_enum, default_value_t = TlsSide::Both)]
    pub tls_side: TlsSide,
    /// Print the JSON report instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Also write the JSON report to this file.
    #[arg(short = 'o', long)]
    pub output: Option<PathBuf>,
}

/// Where the processes ran.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Placement {
    pub server_cpus: Vec<usize>,
    pub generator_cpus: Vec<usize>,
    /// How the server was pinned: `taskset`, or `none` with the reason.
    pub method: String,
    /// `Cpus_allowed_list` of the last server process, as the kernel reported it.
    pub server_cpus_observed: String,
}

/// min / median / max over repetitions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Spread {
    pub min: f64,
    pub median: f64,
    pub max: f64,
}

impl Spread {
    /// The spread of `values` (NaN-free; empty gives zeros).
    pub fn of(values: &[f64]) -> Self {
        let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return Self::default();
        }
        v.sort_by(f64::total_cmp);
        let mid = v.len() / 2;
        let median = if v.len() % 2 == 1 {
            v[mid]
        } else {
            (v[mid - 1] + v[mid]) / 2.0
        };
        Self {
            min: v[0],
            median,
            max: v[v.len() - 1],
        }
    }
}

/// One metric on both sides and their ratio B/A, per repetition pair.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetricComparison {
    pub metric: String,
    pub a: Spread,
    pub b: Spread,
    pub ratio_b_over_a: Spread,
}

/// One side's result of one repetition.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "experiment")]
pub enum SideResult {
    Load(Box<RunReport>),
    Capacity(Box<CapacityReport>),
}

/// One run of one side.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompareRun {
    pub side: String,
    pub repetition: usize,
    pub result: SideResult,
    /// The server process's user + system CPU seconds over the load's measured phase
    /// (`crate::server_cpu`); absent for capacity runs and in reports made before it.
    #[serde(default)]
    pub server_cpu_secs: Option<f64>,
}

/// The whole comparison.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompareReport {
    pub schema: String,
    pub command: Vec<String>,
    pub machine: Machine,
    pub experiment: Experiment,
    pub a_name: String,
    pub b_name: String,
    /// The command templates used to start each side.
    pub a_command: String,
    pub b_command: String,
    /// Whether the generator spoke TLS to each side (`--tls`, `--tls-side`).
    #[serde(default)]
    pub a_tls: bool,
    #[serde(default)]
    pub b_tls: bool,
    pub server_threads: usize,
    pub memory_mb: u64,
    pub repetitions: usize,
    pub placement: Placement,
    pub metrics: Vec<MetricComparison>,
    pub runs: Vec<CompareRun>,
}

/// Schema tag of [`CompareReport`].
pub const COMPARE_SCHEMA: &str = "cellcache-bench-compare/1";

/// A started server, killed on drop so an error never leaves one behind.
struct ServerProcess {
    child: Child,
    addr: SocketAddr,
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A loopback port that was free a moment ago (bound and released).
pub fn free_port() -> anyhow::Result<u16> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).context("finding a free port")?;
    Ok(listener.local_addr()?.port())
}

/// Whether this process runs as root (memcached then needs `-u root`).
pub fn running_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false)
}

/// The default memcached command template.
pub fn memcached_template(bin: &std::path::Path) -> String {
    let user = if running_as_root() { " -u root" } else { "" };
    format!(
        "{} -p {{port}} -t {{threads}} -m {{memory_mb}} -l 127.0.0.1 -U 0{user}",
        bin.display()
    )
}

fn expand(template: &str, port: u16, threads: usize, memory_mb: u64) -> Vec<String> {
    template
        .split_whitespace()
        .map(|w| {
            w.replace("{port}", &port.to_string())
                .replace("{threads}", &threads.to_string())
                .replace("{memory_mb}", &memory_mb.to_string())
        })
        .collect()
}

fn cpu_list(cpus: &[usize]) -> String {
    cpus.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

fn start_server(
    template: &str,
    tls: &crate::tls::TlsArgs,
    args: &CompareArgs,
    server_cpus: &[usize],
    placement: &mut Placement,
) -> anyhow::Result<ServerProcess> {
    const PORT_ATTEMPTS_MAX: usize = 5;
    let mut last_error = None;
    for _ in 0..PORT_ATTEMPTS_MAX {
        let port = free_port()?;
        let argv = expand(template, port, args.server_threads, args.memory_mb);
        let Some((program, rest)) = argv.split_first() else {
            bail!("empty server command")
        };
        let mut command = if server_cpus.is_empty() {
            let mut c = Command::new(program);
            c.args(rest);
            c
        } else {
            let mut c = Command::new("taskset");
            c.arg("-c")
                .arg(cpu_list(server_cpus))
                .arg(program)
                .args(rest);
            c
        };
        command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = command
            .spawn()
            .with_context(|| format!("starting {}", argv.join(" ")))?;
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let mut server = ServerProcess { child, addr };
        let tls = crate::tls::TlsTarget::from_args(tls, &[(addr, addr.ip().to_string())])?;
        match crate::client::wait_ready_tls(
            addr,
            args.ready_timeout,
            Duration::from_millis(10),
            tls.as_ref(),
        ) {
            Ok(_) => {
                let pid = server.child.id();
                placement.server_cpus_observed =
                    std::fs::read_to_string(format!("/proc/{pid}/status"))
                        .ok()
                        .and_then(|s| {
                            s.lines()
                                .find(|l| l.starts_with("Cpus_allowed_list:"))
                                .map(|l| l[18..].trim().to_owned())
                        })
                        .unwrap_or_default();
                return Ok(server);
            }
            Err(e) => {
                // The port may have been taken between our probe and the server's bind:
                // try another one, unless the process itself died for another reason.
                let exited = server.child.try_wait().ok().flatten();
                last_error = Some(anyhow::anyhow!(
                    "{} did not become ready ({e}); exit status {exited:?}",
                    argv.join(" ")
                ));
            }
        }
    }
    Err(last_error.unwrap_or_else(|| anyhow::anyhow!("server did not start")))
}

/// Entry point of the side-by-side comparison.
pub fn run_compare(args: CompareArgs) -> anyhow::Result<()> {
    let report = compare(&args)?;
    crate::emit(&report, |r| r.table(), args.json, args.output.as_deref())
}

/// Runs the comparison and returns its report.
pub fn compare(args: &CompareArgs) -> anyhow::Result<CompareReport> {
    if args.repetitions == 0 {
        bail!("--repetitions must be at least 1");
    }
    if !args.load.tls.enabled && args.tls_side != TlsSide::Both {
        bail!("--tls-side needs --tls");
    }
    if args.load.tls.enabled && args.experiment == Experiment::Capacity {
        bail!("--tls is implemented for the load experiment only");
    }
    let a_tls = args.load.tls.enabled && args.tls_side != TlsSide::B;
    let b_tls = args.load.tls.enabled && args.tls_side != TlsSide::A;
    let a_template = args
        .a_cmd
        .clone()
        .unwrap_or_else(|| memcached_template(&args.memcached_bin));
    let b_template = match (&args.b_cmd, &args.cellcache_bin) {
        (Some(cmd), _) => cmd.clone(),
        (None, Some(bin)) => format!(
            "{} serve -p {{port}} -t {{threads}} -m {{memory_mb}} -l 127.0.0.1",
            bin.display()
        ),
        (None, None) => {
            let exe = std::env::current_exe().context("locating the running executable")?;
            format!(
                "{} serve -p {{port}} -t {{threads}} -m {{memory_mb}} -l 127.0.0.1",
                exe.display()
            )
        }
    };
    let allowed = crate::affinity::allowed_cpus().unwrap_or_default();
    let server_cpus = match &args.server_cpus {
        Some(cpus) => cpus.0.clone(),
        None if allowed.len() >= 2 => vec![allowed[allowed.len() - 1]],
        None => Vec::new(),
    };
    let generator_cpus = match &args.load.cpus {
        Some(cpus) => cpus.0.clone(),
        None if !server_cpus.is_empty() => allowed
            .iter()
            .copied()
            .filter(|c| !server_cpus.contains(c))
            .collect(),
        None => Vec::new(),
    };
    let taskset_ok = Command::new("taskset")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    let (server_cpus, method) = match (server_cpus.is_empty(), taskset_ok) {
        (true, _) => (Vec::new(), "none (fewer than two cores allowed)".to_owned()),
        (false, true) => (
            server_cpus,
            "taskset for the server, sched_setaffinity for generator threads".to_owned(),
        ),
        (false, false) => (Vec::new(), "none (taskset not found)".to_owned()),
    };
    let mut placement = Placement {
        server_cpus: server_cpus.clone(),
        generator_cpus: generator_cpus.clone(),
        method,
        ..Placement::default()
    };
    let mut load = args.load.clone();
    load.cpus = Some(crate::affinity::CpuList(generator_cpus));
    let side_load = |tls: bool| {
        let mut load = load.clone();
        if !tls {
            load.tls = crate::tls::TlsArgs::default();
        }
        load
    };
    let (a_load, b_load) = (side_load(a_tls), side_load(b_tls));

    let mut runs = Vec::new();
    for repetition in 0..args.repetitions {
        for (side, template, load) in [
            (&args.a_name, &a_template, &a_load),
            (&args.b_name, &b_template, &b_load),
        ] {
            let server = start_server(template, &load.tls, args, &server_cpus, &mut placement)?;
            eprintln!(
                "{side} repetition {}/{} on {} ...",
                repetition + 1,
                args.repetitions,
                server.addr
            );
            let (result, server_cpu_secs) = match args.experiment {
                Experiment::Load => {
                    let sampler = crate::server_cpu::CpuSampler::start(vec![server.child.id()])
                        .context("starting the server CPU sampler")?;
                    let report = crate::run_load(&[server.addr], load, false);
                    let samples = sampler.finish();
                    let report = report?;
                    let from = report.results.measure_started_unix_secs;
                    let cpu = crate::server_cpu::cpu_between(
                        &samples,
                        from,
                        from + report.results.measured_secs,
                    );
                    (SideResult::Load(Box::new(report)), cpu)
                }
                Experiment::Capacity => (
                    SideResult::Capacity(Box::new(capacity::measure(server.addr, &args.capacity)?)),
                    None,
                ),
            };
            drop(server);
            runs.push(CompareRun {
                side: side.clone(),
                repetition,
                result,
                server_cpu_secs,
            });
        }
    }
    let metrics = compare_metrics(&runs, &args.a_name, &args.b_name);
    Ok(CompareReport {
        schema: COMPARE_SCHEMA.to_owned(),
        command: std::env::args().collect(),
        machine: Machine::current(),
        experiment: args.experiment,
        a_name: args.a_name.clone(),
        b_name: args.b_name.clone(),
        a_command: a_template,
        b_command: b_template,
        a_tls,
        b_tls,
        server_threads: args.server_threads,
        memory_mb: args.memory_mb,
        repetitions: args.repetitions,
        placement,
        metrics,
        runs,
    })
}

/// The metrics compared, extracted from one side's run.
fn metrics_of(run: &CompareRun) -> Vec<(String, f64)> {
    match &run.result {
        SideResult::Capacity(c) => vec![
            ("items_held".into(), c.items_held as f64),
            ("bytes_per_item".into(), c.bytes_per_item),
            ("overhead_bytes_per_item".into(), c.overhead_bytes_per_item),
        ],
        SideResult::Load(r) => {
            let res = &r.results;
            let mut m = vec![
                ("throughput_rps".into(), res.all.throughput_rps),
                ("errors".into(), res.all.errors as f64),
                ("dropped".into(), res.dropped as f64),
                ("connections_failed".into(), res.connections_failed as f64),
            ];
            if let Some(h) = res.all.hit_ratio {
                m.push(("hit_ratio".into(), h));
            }
            let replies = res.all.throughput_rps * res.measured_secs;
            if let Some(cpu) = run.server_cpu_secs.filter(|&c| c > 0.0 && replies > 0.0) {
                m.push(("server_cpu_secs".into(), cpu));
                m.push(("replies_per_server_cpu_sec".into(), replies / cpu));
                m.push(("server_cpu_us_per_reply".into(), cpu * 1e6 / replies));
            }
            let mut ops: Vec<(&str, &crate::report::OpReport)> = vec![("all", &res.all)];
            ops.extend(res.ops.iter().map(|(k, v)| (k.as_str(), v)));
            for (name, op) in ops {
                let l = &op.latency;
                for (stat, value) in [
                    ("avg", l.mean_us),
                    ("p50", l.p50_us),
                    ("p90", l.p90_us),
                    ("p95", l.p95_us),
                    ("p99", l.p99_us),
                    ("p99.9", l.p999_us),
                    ("max", l.max_us),
                ] {
                    m.push((format!("{name}.latency_{stat}_us"), value));
                }
            }
            m
        }
    }
}

/// Pairs repetition i of A with repetition i of B and computes spreads and ratios.
pub fn compare_metrics(runs: &[CompareRun], a: &str, b: &str) -> Vec<MetricComparison> {
    let side = |name: &str| -> Vec<Vec<(String, f64)>> {
        runs.iter()
            .filter(|r| r.side == name)
            .map(metrics_of)
            .collect()
    };
    let (a_runs, b_runs) = (side(a), side(b));
    let Some(first) = a_runs.first() else {
        return Vec::new();
    };
    let lookup = |run: &[(String, f64)], metric: &str| {
        run.iter().find(|(m, _)| m == metric).map(|&(_, v)| v)
    };
    first
        .iter()
        .map(|(metric, _)| {
            let a_values: Vec<f64> = a_runs.iter().filter_map(|r| lookup(r, metric)).collect();
            let b_values: Vec<f64> = b_runs.iter().filter_map(|r| lookup(r, metric)).collect();
            let ratios: Vec<f64> = a_runs
                .iter()
                .zip(&b_runs)
                .filter_map(|(ra, rb)| Some((lookup(ra, metric)?, lookup(rb, metric)?)))
                .filter(|&(x, _)| x != 0.0)
                .map(|(x, y)| y / x)
                .collect();
            MetricComparison {
                metric: metric.clone(),
                a: Spread::of(&a_values),
                b: Spread::of(&b_values),
                ratio_b_over_a: Spread::of(&ratios),
            }
        })
        .collect()
}

impl CompareReport {
    /// The human table: one row per metric.
    pub fn table(&self) -> String {
        use std::fmt::Write as _;
        let mut s = String::new();
        let tls = |on: bool| if on { " (generator speaks TLS)" } else { "" };
        let _ = writeln!(
            s,
            "A = {}: {}{}",
            self.a_name,
            self.a_command,
            tls(self.a_tls)
        );
        let _ = writeln!(
            s,
            "B = {}: {}{}",
            self.b_name,
            self.b_command,
            tls(self.b_tls)
        );
        let _ = writeln!(
            s,
            "{} repetitions interleaved, {} server thread(s), {} MiB; machine: {}",
            self.repetitions,
            self.server_threads,
            self.memory_mb,
            self.machine.describe()
        );
        let _ = writeln!(
            s,
            "placement: server cpus {:?} (kernel: {}), generator cpus {:?}; {}",
            self.placement.server_cpus,
            self.placement.server_cpus_observed,
            self.placement.generator_cpus,
            self.placement.method
        );
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "{:<26} {:>12} {:>12} {:>10} {:>10} {:>10}",
            "metric",
            format!("{} med", self.a_name),
            format!("{} med", self.b_name),
            "B/A min",
            "B/A med",
            "B/A max"
        );
        for m in &self.metrics {
            let _ = writeln!(
                s,
                "{:<26} {:>12.2} {:>12.2} {:>10.3} {:>10.3} {:>10.3}",
                m.metric,
                m.a.median,
                m.b.median,
                m.ratio_b_over_a.min,
                m.ratio_b_over_a.median,
                m.ratio_b_over_a.max
            );
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spreads_and_templates() {
        assert_eq!(
            Spread::of(&[3.0, 1.0, 2.0]),
            Spread {
                min: 1.0,
                median: 2.0,
                max: 3.0
            }
        );
        assert_eq!(
            Spread::of(&[4.0, 1.0]),
            Spread {
                min: 1.0,
                median: 2.5,
                max: 4.0
            }
        );
        assert_eq!(Spread::of(&[f64::NAN]), Spread::default());
        assert_eq!(
            expand("mc -p {port} -t {threads} -m {memory_mb}", 99, 2, 64),
            vec!["mc", "-p", "99", "-t", "2", "-m", "64"]
        );
    }

    #[test]
    fn ratios_pair_repetitions() {
        let cap = |items: u64| {
            SideResult::Capacity(Box::new(CapacityReport {
                server: String::new(),
                server_version: String::new(),
                limit_bytes: 1000,
                key_len: 1,
                value_len: 1,
                keys_written: items,
                items_held: items,
                evictions: 1,
                bytes_per_item: 1000.0 / items as f64,
                overhead_bytes_per_item: 0.0,
                machine: Machine::default(),
            }))
        };
        let runs = vec![
            CompareRun {
                side: "a".into(),
                repetition: 0,
                result: cap(10),
                server_cpu_secs: None,
            },
            CompareRun {
                side: "b".into(),
                repetition: 0,
                result: cap(15),
                server_cpu_secs: None,
            },
            CompareRun {
                side: "a".into(),
                repetition: 1,
                result: cap(10),
                server_cpu_secs: None,
            },
            CompareRun {
                side: "b".into(),
                repetition: 1,
                result: cap(20),
                server_cpu_secs: None,
            },
        ];
        let metrics = compare_metrics(&runs, "a", "b");
        let items = metrics.iter().find(|m| m.metric == "items_held").unwrap();
        assert_eq!(
            items.ratio_b_over_a,
            Spread {
                min: 1.5,
                median: 1.75,
                max: 2.0
            }
        );
        assert_eq!(items.a.median, 10.0);
    }
}
