//! The measurement engine: a few OS threads, each driving many non-blocking connections with
//! its own `mio` event loop.
//!
//! Why mio and not tokio: the generator's job is to keep timestamps honest and its own cost
//! low. One thread owning its connections, its request stream, its schedule and its histograms
//! needs no locks, no task wake-ups and no work stealing between "intended time" and "written";
//! the open-loop deadline is just the poll timeout. tokio would add a scheduler whose delays
//! land inside the measured latency.
//!
//! Closed loop: every connection keeps `pipeline` requests in flight; a reply frees a slot that
//! is refilled at once (the intended time of a closed-loop request is the moment it is sent).
//! Open loop: a [`Schedule`] says when each request should be sent; a due request goes to a
//! connection with a free slot, or waits in a bounded backlog (its latency still counts from its
//! intended time), or is counted as dropped when the backlog is full.
//!
//! Accounting guarantee: for every operation kind, `sent = replies + errors` once the run is
//! over. Requests still unanswered at the end of the drain are counted as `timeout` errors, and
//! the in-flight requests of a connection that fails are counted as `connection` or `protocol`
//! errors. Nothing is silently lost. Requests whose intended time falls in the warm-up phase
//! are counted only in `warmup_sent`.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::affinity;
use crate::schedule::{Arrival, Schedule, latency_ns};
use crate::stats::ThreadStats;
use crate::wire::ParseLimits;
use crate::workload::values::ValuePool;
use crate::workload::{OpKind, RequestGen, Workload};

/// Closed or open loop.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum LoadMode {
    /// Each connection keeps `pipeline` requests in flight.
    Closed,
    /// Requests arrive at `rate_per_sec` (all threads together) following `arrival`.
    Open { rate_per_sec: f64, arrival: Arrival },
}

/// When the measured phase ends.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopAfter {
    /// After this long (measured phase only; warm-up comes before).
    Duration { secs: f64 },
    /// After this many measured requests have been sent.
    Requests { count: u64 },
}

/// Tunables of the engine. Defaults are documented on each field.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct EngineConfig {
    /// Servers; connection `i` goes to server `i % servers.len()`.
    pub servers: Vec<SocketAddr>,
    /// Total connections over all threads and servers. Default 4.
    pub connections: usize,
    /// Requests in flight per connection. Default 1.
    pub pipeline: usize,
    /// Generator threads. Default 1.
    pub threads: usize,
    pub mode: LoadMode,
    pub stop: StopAfter,
    /// Warm-up before measurement starts. Default 0.
    pub warmup: Duration,
    /// How long to wait for outstanding replies after the last send. Default 5 s.
    pub drain_timeout: Duration,
    /// Open loop: a send more than this after its intended time is counted as late. Default 1 ms.
    pub late_threshold: Duration,
    /// Open loop: due requests waiting for a free connection slot, per thread. Default 100 000.
    pub backlog_max: usize,
    /// Open loop: when the next arrival is closer than this, busy-poll instead of sleeping.
    /// The sleep before it ends on a timerfd (microsecond resolution) on Linux; elsewhere on
    /// epoll's millisecond timeout, where 1 ms is the right value. Default 100 µs.
    pub spin_threshold: Duration,
    /// TCP connect timeout. Default 2 s.
    pub connect_timeout: Duration,
    /// Cores to pin generator threads to (empty = no pinning).
    pub cpus: Vec<usize>,
    /// Cache-aside: a get that misses is followed by a set of the same key on the same
    /// connection (takes the place of the next generated request). Needs multiget = 1.
    pub set_on_miss: bool,
    /// Seed of every random stream (thread `i` uses `seed + i`).
    pub seed: u64,
    pub limits: ParseLimits,
    /// TLS to every server (`--tls`); `None` = plain TCP. The handshake is done while
    /// connecting, before the run's clock starts.
    #[serde(skip)]
    pub tls: Option<Arc<crate::tls::TlsTarget>>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            servers: Vec::new(),
            connections: 4,
            pipeline: 1,
            threads: 1,
            mode: LoadMode::Closed,
            stop: StopAfter::Duration { secs: 10.0 },
            warmup: Duration::ZERO,
            drain_timeout: Duration::from_secs(5),
            late_threshold: Duration::from_millis(1),
            backlog_max: 100_000,
            spin_threshold: Duration::from_micros(100),
            connect_timeout: Duration::from_secs(2),
            cpus: Vec::new(),
            set_on_miss: false,
            seed: 1,
            limits: ParseLimits::default(),
            tls: None,
        }
    }
}

/// Why a run could not start or be carried out.
#[derive(Debug, Error)]
pub enum EngineError {
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("connecting to {addr}: {source}")]
    Connect { addr: SocketAddr, source: io::Error },
    #[error("TLS handshake with {addr}: {source}")]
    Handshake { addr: SocketAddr, source: io::Error },
    #[error("event loop: {0}")]
    Poll(io::Error),
    #[error("pinning generator thread to cores {cpus:?}: {source}")]
    Pin { cpus: Vec<usize>, source: io::Error },
    #[error("generator thread panicked")]
    ThreadPanicked,
}

/// Live counters the caller may read while the run goes on (for a progress bar).
#[derive(Debug, Default)]
pub struct Progress {
    /// Measured requests finished so far (replies and errors; warm-up excluded).
    pub completed: AtomicU64,
    /// Nanoseconds since the run's clock started, as last seen by a thread.
    pub elapsed_ns: AtomicU64,
    /// Set when every thread has finished.
    pub done: AtomicBool,
}

/// What the engine measured.
#[derive(Debug, Clone)]
pub struct EngineResult {
    pub stats: ThreadStats,
    /// Wall-clock time (seconds since the Unix epoch) at which the measured phase began:
    /// the run's clock start plus the warm-up. Second `i` of the timelines is
    /// `[start + i, start + i + 1)`.
    pub measure_started_unix_secs: f64,
    /// Length of the measured phase: from its start to the last measured reply.
    pub measured_secs: f64,
    /// Wall time of the whole run, warm-up and drain included.
    pub wall_secs: f64,
    /// CPU time of the generator threads (user + system), seconds, whole run.
    pub generator_cpu_secs: f64,
    /// Busiest generator thread's CPU time over the run's wall time (1.0 = saturated).
    pub generator_busiest_thread_utilization: f64,
    /// Connections that failed during the run.
    pub connections_failed: u64,
}

impl EngineConfig {
    /// Checks the relations between fields.
    pub fn validate(&self, workload: &Workload) -> Result<(), EngineError> {
        let bad = |m: &str| Err(EngineError::Config(m.to_owned()));
        if self.servers.is_empty() {
            return bad("at least one server is needed");
        }
        if self.connections == 0 || self.pipeline == 0 || self.threads == 0 {
            return bad("connections, pipeline and threads must be at least 1");
        }
        if self.threads > self.connections {
            return bad("more threads than connections");
        }
        if let LoadMode::Open { rate_per_sec, .. } = self.mode
            && !(rate_per_sec.is_finite() && rate_per_sec > 0.0)
        {
            return bad("the arrival rate must be a positive number");
        }
        match self.stop {
            StopAfter::Duration { secs } if !(secs.is_finite() && secs > 0.0) => {
                return bad("duration must be positive");
            }
            StopAfter::Requests { count: 0 } => return bad("request count must be at least 1"),
            _ => {}
        }
        if !(0.0..=1.0).contains(&workload.get_ratio) {
            return bad("get ratio must be within 0..=1");
        }
        if workload.multiget == 0 {
            return bad("multi-get size must be at least 1");
        }
        if self.set_on_miss && workload.multiget != 1 {
            return bad("--set-on-miss needs --multiget 1");
        }
        if workload.growth.is_some() {
            if self.set_on_miss {
                return bad("--grow and --set-on-miss do not mix (a fill would undo a delete)");
            }
            if workload.multiget != 1 {
                return bad("--grow needs --multiget 1 (each get's key holds its delete back)");
            }
            if workload.popularity != crate::workload::Popularity::Uniform {
                return bad("--grow reads live keys uniformly: use --popularity uniform");
            }
        }
        Ok(())
    }
}

/// Runs one load phase (warm-up + measurement + drain) and returns the merged statistics.
pub fn run(
    config: &EngineConfig,
    workload: Arc<Workload>,
    pool: Arc<ValuePool>,
    progress: Arc<Progress>,
) -> Result<EngineResult, EngineError> {
    config.validate(&workload)?;
    let threads = config.threads;
    let barrier = Arc::new(Barrier::new(threads + 1));
    let epoch_cell: Arc<std::sync::OnceLock<Instant>> = Arc::new(std::sync::OnceLock::new());
    let mut handles = Vec::with_capacity(threads);
    for t in 0..threads {
        let conns: Vec<SocketAddr> = (0..config.connections)
            .filter(|c| c % threads == t)
            .map(|c| config.servers[c % config.servers.len()])
            .collect();
        let requests = match config.stop {
            StopAfter::Requests { count } => {
                Some(count / threads as u64 + u64::from((t as u64) < count % threads as u64))
            }
            StopAfter::Duration { .. } => None,
        };
        let gen_ = RequestGen::new(
            workload.clone(),
            pool.clone(),
            config.seed.wrapping_add(t as u64),
        )
        .map_err(|e| EngineError::Config(e.to_string()))?
        .for_thread(t, threads, config.warmup.as_nanos() as u64);
        let worker = Worker::new(config.clone(), t, gen_, requests, progress.clone());
        let barrier = barrier.clone();
        let epoch_cell = epoch_cell.clone();
        let handle = std::thread::Builder::new()
            .name(format!("bench-{t}"))
            .spawn(move || worker.run(conns, &barrier, &epoch_cell))
            .map_err(|e| EngineError::Config(format!("spawning thread: {e}")))?;
        handles.push(handle);
    }
    // All threads connect, then start the clock together so their schedules line up.
    barrier.wait();
    let epoch = Instant::now();
    let epoch_unix_secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let _ = epoch_cell.set(epoch);
    barrier.wait();
    let mut merged = ThreadStats::default();
    let mut first_error = None;
    let (mut cpu_ns, mut busiest_ns, mut failed) = (0u64, 0u64, 0u64);
    for handle in handles {
        match handle.join() {
            Ok(Ok(outcome)) => {
                merged.merge(&outcome.stats);
                cpu_ns += outcome.cpu_ns;
                busiest_ns = busiest_ns.max(outcome.cpu_ns);
                failed += outcome.connections_failed;
            }
            Ok(Err(e)) => first_error = first_error.or(Some(e)),
            Err(_) => first_error = first_error.or(Some(EngineError::ThreadPanicked)),
        }
    }
    progress.done.store(true, Ordering::Release);
    if let Some(e) = first_error {
        return Err(e);
    }
    let wall = epoch.elapsed().as_secs_f64();
    let measured_secs = match config.stop {
        StopAfter::Duration { secs } => (merged.last_reply_ns as f64 / 1e9).max(secs),
        StopAfter::Requests { .. } => merged.last_reply_ns as f64 / 1e9,
    };
    Ok(EngineResult {
        stats: merged,
        measure_started_unix_secs: epoch_unix_secs + config.warmup.as_secs_f64(),
        measured_secs,
        wall_secs: wall,
        generator_cpu_secs: cpu_ns as f64 / 1e9,
        generator_busiest_thread_utilization: if wall > 0.0 {
            busiest_ns as f64 / 1e9 / wall
        } else {
            0.0
        },
        connections_failed: failed,
    })
}

mod worker;
use worker::Worker;
