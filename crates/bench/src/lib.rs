//! `cellcache bench`: a load generator for any server speaking the memcached text protocol.
//!
//! It drives closed-loop (connections × pipeline depth) or open-loop (fixed arrival rate,
//! latency from each request's intended send time, so no coordinated omission) load with a
//! configurable workload, records HDR latency histograms per operation, counts every error, and
//! reports a table, JSON and plots. [`run_compare`] runs the same workload against two servers
//! (memcached and cellcache) in interleaved repetitions and reports ratios.
//!
//! Layout, in data-flow order: [`args`] (command line) → [`workload`] (what to ask) →
//! [`engine`] (mio event loops; [`schedule`] for open-loop arrivals; bytes are
//! `cellcache-proto`'s codec, bounded by [`wire`]'s limits) →
//! [`stats`] (histograms, counters) → [`report`] (JSON, table) → [`plot`]. [`client`] is the
//! blocking control connection (readiness, stats, preload); [`capacity`] and [`compare`] are the
//! experiments built on top, [`hitratio`] the deterministic cache-aside hit-ratio run, and
//! [`echo`] the fixed-reply server on a cell's own I/O engine that a cell is measured
//! against; [`affinity`] pins threads; [`tls`] is `--tls` (rustls client
//! configuration; the engine and the control client carry the sessions).

// The calls into the OS (CPU affinity, thread CPU time, timerfd) go through rustix's and nix's
// safe wrappers, so the crate needs no unsafe code of its own.
#![forbid(unsafe_code)]

pub mod affinity;
pub mod args;
pub mod capacity;
pub mod client;
pub mod compare;
pub mod echo;
pub mod engine;
pub mod hitratio;
pub mod plot;
pub mod report;
pub mod schedule;
pub mod server_cpu;
pub mod stats;
pub mod timer;
pub mod tls;
pub mod wire;
pub mod workload;

use std::io::{IsTerminal, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;

pub use args::{BenchArgs, BenchCommand, LoadArgs};
pub use compare::{CompareArgs, run_compare};

use engine::{Progress, StopAfter};
use report::{Machine, RunConfigReport, RunReport, WorkloadReport};
use workload::values::ValuePool;

/// Timeouts of the control connection used for readiness and preload.
const CONTROL_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const CONTROL_IO_TIMEOUT: Duration = Duration::from_secs(30);
/// Sets per round trip when preloading.
const PRELOAD_BATCH: usize = 256;
/// Under TLS, the most request bytes per preload round trip: one TLS record's plaintext
/// (16 KiB) less room for headers. memcached 1.6.18 `-Z` (Debian's) stops reading when
/// several records arrive in one segment and the rest sits decrypted-pending in OpenSSL
/// with no readiness event left to wake it, so a bigger batch stalls the preload.
const PRELOAD_TLS_BATCH_BYTES: usize = 15 * 1024;
/// A set's request line without key and value (`set  0 0 <len> <exptime>\r\n` + `\r\n`).
const SET_OVERHEAD_BYTES: usize = 48;
/// How often the progress bar is redrawn.
const PROGRESS_INTERVAL: Duration = Duration::from_millis(250);

/// Entry point of `cellcache bench`.
pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    match args.command {
        Some(BenchCommand::Plot(plot)) => return plot::run(plot),
        Some(BenchCommand::PlotAutoscale(a)) => return plot::autoscale::run(a),
        Some(BenchCommand::Capacity(cap)) => return capacity::run(cap),
        Some(BenchCommand::HitRatio(h)) => return hitratio::run(h),
        Some(BenchCommand::HitRatioPlot(p)) => return plot::hit_ratio::run(p),
        Some(BenchCommand::Compare(compare)) => return run_compare(*compare),
        Some(BenchCommand::Echo(echo)) => return echo::run(echo),
        None => {}
    }
    let servers = args::resolve_servers(&args.servers)?;
    let targets: Vec<(SocketAddr, String)> = servers
        .iter()
        .zip(&args.servers)
        .map(|(&addr, text)| (addr, tls::host_of(text).to_owned()))
        .collect();
    let show_progress = match args.progress {
        args::ProgressArg::Always => true,
        args::ProgressArg::Never => false,
        args::ProgressArg::Auto => std::io::stderr().is_terminal(),
    };
    let sampler = match args.server_pids.is_empty() {
        true => None,
        false => Some(
            server_cpu::CpuSampler::start(args.server_pids.clone())
                .context("starting the server CPU sampler")?,
        ),
    };
    let mut report = run_load_to(&targets, &args.load, show_progress)?;
    if let Some(sampler) = sampler {
        let samples = sampler.finish();
        let from = report.results.measure_started_unix_secs;
        match server_cpu::cpu_between(&samples, from, from + report.results.measured_secs) {
            Some(cpu) => {
                let replies = report.results.all.replies;
                report.server_cpu =
                    report::ServerCpuReport::new(args.server_pids.clone(), cpu, replies);
            }
            // A process gone, or a phase shorter than the samples cover: the run stands.
            None => eprintln!(
                "warning: the CPU time of --server-pid {:?} over the measured phase could not \
                 be read (a process exited, or the phase was shorter than {:?})",
                args.server_pids,
                server_cpu::SAMPLE_INTERVAL
            ),
        }
    }
    emit(&report, RunReport::table, args.json, args.output.as_deref())?;
    if let Some(dir) = &args.plot_dir {
        plot::render(
            &[(report.config.servers.join("+"), report.clone())],
            dir,
            None,
            "cellcache bench",
        )?;
    }
    Ok(())
}

/// Prints a report (its human summary, or its JSON) and optionally saves the JSON: the one
/// way every `bench` subcommand hands its result to the user.
pub(crate) fn emit<R: serde::Serialize>(
    report: &R,
    summary: impl FnOnce(&R) -> String,
    json: bool,
    output: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(report)?;
    if let Some(path) = output {
        std::fs::write(path, &text).with_context(|| format!("writing {}", path.display()))?;
    }
    if json {
        println!("{text}")
    } else {
        print!("{}", summary(report))
    }
    Ok(())
}

/// Preloads (if asked), runs one load phase against `servers` and returns its report. Under
/// `--tls` the default server name is each address's IP; see [`run_load_to`].
pub fn run_load(
    servers: &[SocketAddr],
    load: &LoadArgs,
    show_progress: bool,
) -> anyhow::Result<RunReport> {
    let targets: Vec<(SocketAddr, String)> =
        servers.iter().map(|a| (*a, a.ip().to_string())).collect();
    run_load_to(&targets, load, show_progress)
}

/// [`run_load`] against `(address, host as written)` pairs: the host is the default TLS
/// server name under `--tls`.
pub fn run_load_to(
    targets: &[(SocketAddr, String)],
    load: &LoadArgs,
    show_progress: bool,
) -> anyhow::Result<RunReport> {
    let servers: Vec<SocketAddr> = targets.iter().map(|(a, _)| *a).collect();
    let servers = &servers[..];
    let workload = Arc::new(load.workload()?);
    let tls = tls::TlsTarget::from_args(&load.tls, targets)?;
    let mut config = load.engine_config(servers.to_vec());
    config.tls = tls.clone();
    config.validate(&workload)?;
    let pool = Arc::new(ValuePool::new(
        workload.value_size.max(),
        &mut rand::thread_rng(),
    ));
    let mut versions = Vec::with_capacity(servers.len());
    let mut tls_report = None;
    for &addr in servers {
        let mut client = client::BlockingClient::connect_tls(
            addr,
            CONTROL_CONNECT_TIMEOUT,
            CONTROL_IO_TIMEOUT,
            tls.as_ref(),
        )?;
        versions.push(client.version()?);
        if tls_report.is_none() {
            tls_report = tls.as_ref().map(|t| t.report(client.tls_session()));
        }
    }
    let preloaded = if load.preload {
        preload(servers, &workload, &pool, tls.as_ref())?
    } else {
        0
    };
    let started_unix_secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let progress = Arc::new(Progress::default());
    let bar = show_progress.then(|| spawn_progress_bar(progress.clone(), &config));
    let result = engine::run(&config, workload.clone(), pool, progress.clone());
    progress.done.store(true, Ordering::Release);
    if let Some(bar) = bar {
        let _ = bar.join();
    }
    let result = result?;
    Ok(RunReport {
        schema: report::SCHEMA.to_owned(),
        tool_version: env!("CARGO_PKG_VERSION").to_owned(),
        started_unix_secs,
        command: std::env::args().collect(),
        machine: Machine::current(),
        server_versions: versions,
        config: RunConfigReport {
            servers: servers.iter().map(ToString::to_string).collect(),
            connections: config.connections,
            pipeline: config.pipeline,
            threads: config.threads,
            mode: config.mode,
            stop: config.stop,
            warmup_secs: config.warmup.as_secs_f64(),
            generator_cpus: config.cpus.clone(),
            seed: config.seed,
            tls: tls_report,
        },
        workload: WorkloadReport {
            key_count: workload.keys.count(),
            key_prefix: load.key_prefix.clone(),
            key_len: workload.keys.key_len(),
            popularity: workload.popularity,
            get_ratio: workload.get_ratio,
            multiget: workload.multiget,
            value_size: workload.value_size.to_string(),
            ttl_secs: workload.ttl_secs,
            set_on_miss: config.set_on_miss,
            preloaded,
            growth: workload.growth,
            key_hash_range: workload.keys.hash_range(),
        },
        results: report::results(&result),
        server_cpu: None,
    })
}

/// Writes every key once through every server (a cell forwards to the key's owner; separate
/// memcached servers each get the full key space). Returns the keys written per server.
fn preload(
    servers: &[SocketAddr],
    workload: &workload::Workload,
    pool: &ValuePool,
    tls: Option<&Arc<tls::TlsTarget>>,
) -> anyhow::Result<u64> {
    use rand::SeedableRng;
    let mut rng = rand::rngs::SmallRng::seed_from_u64(0);
    for &addr in servers {
        let mut client = client::BlockingClient::connect_tls(
            addr,
            CONTROL_CONNECT_TIMEOUT,
            CONTROL_IO_TIMEOUT,
            tls,
        )?;
        let items = (0..workload.keys.count()).map(|i| {
            (
                workload.keys.key(i),
                pool.value(workload.value_size.sample(&mut rng)),
            )
        });
        let batch = match tls {
            None => PRELOAD_BATCH,
            Some(_) => {
                let set_bytes =
                    workload.keys.key_len() + workload.value_size.max() + SET_OVERHEAD_BYTES;
                (PRELOAD_TLS_BATCH_BYTES / set_bytes).clamp(1, PRELOAD_BATCH)
            }
        };
        let (_, refused) = client.set_many(items, workload.ttl_secs, batch)?;
        if refused > 0 {
            anyhow::bail!("{addr}: {refused} preload sets were not stored");
        }
    }
    Ok(workload.keys.count())
}

/// A thread that redraws a one-line progress bar on stderr until the run is done.
fn spawn_progress_bar(
    progress: Arc<Progress>,
    config: &engine::EngineConfig,
) -> std::thread::JoinHandle<()> {
    const BAR_WIDTH: usize = 30;
    let warmup = config.warmup.as_secs_f64();
    let stop = config.stop;
    std::thread::spawn(move || {
        let mut stderr = std::io::stderr();
        let started = std::time::Instant::now();
        while !progress.done.load(Ordering::Acquire) {
            std::thread::sleep(PROGRESS_INTERVAL);
            let done = progress.completed.load(Ordering::Relaxed);
            let elapsed = started.elapsed().as_secs_f64();
            let measuring = (elapsed - warmup).max(0.0);
            let fraction = match stop {
                StopAfter::Duration { secs } => elapsed / (warmup + secs),
                StopAfter::Requests { count } => done as f64 / count as f64,
            }
            .clamp(0.0, 1.0);
            let filled = (fraction * BAR_WIDTH as f64) as usize;
            let phase = if elapsed < warmup {
                "warm-up"
            } else {
                "measure"
            };
            let _ = write!(
                stderr,
                "\r[{}{}] {:>3.0}% {phase} {:.1}s  {} done  {:.0} req/s   ",
                "#".repeat(filled),
                " ".repeat(BAR_WIDTH - filled),
                fraction * 100.0,
                elapsed,
                done,
                if measuring > 0.0 {
                    done as f64 / measuring
                } else {
                    0.0
                }
            );
            let _ = stderr.flush();
        }
        let _ = writeln!(stderr);
    })
}
