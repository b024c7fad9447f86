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
use crate::wire::{self, Expect, ParseLimits, Parsed, Reply};
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
        .map_err(|e| EngineError::Config(e.to_string()))?;
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

/// One request waiting for its reply.
#[derive(Debug, Clone, Copy)]
struct InFlight {
    op: OpKind,
    keys: u32,
    /// The first (for set-on-miss, the only) key.
    key: u64,
    intended_ns: u64,
    measured: bool,
}

struct Conn {
    stream: TcpStream,
    out: Vec<u8>,
    out_pos: usize,
    buf: Vec<u8>,
    start: usize,
    filled: usize,
    in_flight: VecDeque<InFlight>,
    alive: bool,
}

/// Read-buffer size and growth step.
const READ_CHUNK_BYTES: usize = 64 * 1024;
/// Longest the event loop sleeps, so progress and deadlines are checked regularly.
const POLL_SLICE: Duration = Duration::from_millis(50);
/// Poll events handled per wake-up.
const EVENTS_CAPACITY: usize = 1024;

struct ThreadOutcome {
    stats: ThreadStats,
    cpu_ns: u64,
    connections_failed: u64,
}

struct Worker {
    config: EngineConfig,
    index: usize,
    gen_: RequestGen,
    /// Measured requests this thread may still send (request-count runs).
    quota: Option<u64>,
    progress: Arc<Progress>,
    stats: ThreadStats,
    conns: Vec<Conn>,
    backlog: VecDeque<u64>,
    fills: VecDeque<u64>,
    cursor: usize,
    measure_start_ns: u64,
    issue_end_ns: u64,
    connections_failed: u64,
    completed: u64,
    /// Open loop on Linux: wakes the poll just before the next arrival.
    #[cfg(target_os = "linux")]
    timer: Option<crate::timer::WakeTimer>,
}

/// Poll token of the wake timer (connections use their index).
const TIMER_TOKEN: Token = Token(usize::MAX - 1);

impl Worker {
    fn new(
        config: EngineConfig,
        index: usize,
        gen_: RequestGen,
        quota: Option<u64>,
        progress: Arc<Progress>,
    ) -> Self {
        let measure_start_ns = config.warmup.as_nanos() as u64;
        let issue_end_ns = match config.stop {
            StopAfter::Duration { secs } => measure_start_ns + (secs * 1e9) as u64,
            StopAfter::Requests { .. } => u64::MAX,
        };
        Self {
            config,
            index,
            gen_,
            quota,
            progress,
            stats: ThreadStats::default(),
            conns: Vec::new(),
            backlog: VecDeque::new(),
            fills: VecDeque::new(),
            cursor: 0,
            measure_start_ns,
            issue_end_ns,
            connections_failed: 0,
            completed: 0,
            #[cfg(target_os = "linux")]
            timer: None,
        }
    }

    fn run(
        mut self,
        addrs: Vec<SocketAddr>,
        barrier: &Barrier,
        epoch_cell: &std::sync::OnceLock<Instant>,
    ) -> Result<ThreadOutcome, EngineError> {
        // Connect and pin before the barrier, so set-up time is not part of the run; the
        // barrier is always reached, even on error, so the other threads are not stuck.
        let setup = self.setup(&addrs);
        barrier.wait();
        barrier.wait();
        let (poll, epoch) = match (setup, epoch_cell.get()) {
            (Ok(poll), Some(&epoch)) => (poll, epoch),
            (Err(e), _) => return Err(e),
            (Ok(_), None) => return Err(EngineError::Config("run clock was not started".into())),
        };
        let cpu_start = affinity::thread_cpu_ns();
        self.event_loop(poll, epoch)?;
        Ok(ThreadOutcome {
            stats: self.stats,
            cpu_ns: affinity::thread_cpu_ns().saturating_sub(cpu_start),
            connections_failed: self.connections_failed,
        })
    }

    fn setup(&mut self, addrs: &[SocketAddr]) -> Result<Poll, EngineError> {
        if !self.config.cpus.is_empty() {
            affinity::pin_current_thread(&self.config.cpus).map_err(|source| EngineError::Pin {
                cpus: self.config.cpus.clone(),
                source,
            })?;
        }
        let poll = Poll::new().map_err(EngineError::Poll)?;
        #[cfg(target_os = "linux")]
        if matches!(self.config.mode, LoadMode::Open { .. }) {
            let timer = crate::timer::WakeTimer::new().map_err(EngineError::Poll)?;
            poll.registry()
                .register(
                    &mut mio::unix::SourceFd(&timer.raw_fd()),
                    TIMER_TOKEN,
                    Interest::READABLE,
                )
                .map_err(EngineError::Poll)?;
            self.timer = Some(timer);
        }
        for (i, &addr) in addrs.iter().enumerate() {
            let connect = |source| EngineError::Connect { addr, source };
            let std_stream =
                std::net::TcpStream::connect_timeout(&addr, self.config.connect_timeout)
                    .map_err(connect)?;
            std_stream.set_nodelay(true).map_err(connect)?;
            std_stream.set_nonblocking(true).map_err(connect)?;
            let mut stream = TcpStream::from_std(std_stream);
            poll.registry()
                .register(
                    &mut stream,
                    Token(i),
                    Interest::READABLE | Interest::WRITABLE,
                )
                .map_err(EngineError::Poll)?;
            self.conns.push(Conn {
                stream,
                out: Vec::with_capacity(READ_CHUNK_BYTES),
                out_pos: 0,
                buf: vec![0; READ_CHUNK_BYTES],
                start: 0,
                filled: 0,
                in_flight: VecDeque::with_capacity(self.config.pipeline),
                alive: true,
            });
        }
        Ok(poll)
    }

    fn event_loop(&mut self, mut poll: Poll, epoch: Instant) -> Result<(), EngineError> {
        let now_ns = || epoch.elapsed().as_nanos() as u64;
        let threads = self.config.threads as f64;
        let mut schedule = match self.config.mode {
            LoadMode::Open {
                rate_per_sec,
                arrival,
            } => {
                // Each thread takes an equal share of the rate; uniform schedules are staggered
                // so the threads' arrivals interleave evenly instead of coinciding.
                let share = rate_per_sec / threads;
                let offset = (1e9 / rate_per_sec * self.index as f64) as u64;
                Some(Schedule::new(
                    share,
                    arrival,
                    offset,
                    self.config.seed.wrapping_add(1_000 + self.index as u64),
                ))
            }
            LoadMode::Closed => None,
        };
        let mut events = Events::with_capacity(EVENTS_CAPACITY);
        let mut drain_deadline: Option<u64> = None;
        loop {
            let now = now_ns();
            let issuing =
                drain_deadline.is_none() && now < self.issue_end_ns && self.quota != Some(0);
            if issuing {
                match schedule.as_mut() {
                    None => self.fill_closed(now),
                    Some(s) => self.dispatch_open(s, now),
                }
            } else {
                if drain_deadline.is_none() {
                    drain_deadline =
                        Some(now.saturating_add(self.config.drain_timeout.as_nanos() as u64));
                }
                // Keep sending what arrived before the end; it is part of the measured load.
                self.dispatch_backlog(now);
            }
            self.flush_all();
            let outstanding = !self.backlog.is_empty()
                || self
                    .conns
                    .iter()
                    .any(|c| c.alive && !c.in_flight.is_empty());
            if let Some(deadline) = drain_deadline
                && (!outstanding || now >= deadline)
            {
                self.finish_drain();
                return Ok(());
            }
            if self.conns.iter().all(|c| !c.alive) {
                self.finish_drain();
                return Ok(());
            }
            let timeout = self.poll_timeout(schedule.as_ref(), now, issuing, drain_deadline);
            match poll.poll(&mut events, Some(timeout)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(EngineError::Poll(e)),
            }
            for event in events.iter() {
                if event.token() == TIMER_TOKEN {
                    #[cfg(target_os = "linux")]
                    if let Some(timer) = &self.timer {
                        timer.clear();
                    }
                    continue;
                }
                let i = event.token().0;
                if i >= self.conns.len() || !self.conns[i].alive {
                    continue;
                }
                if event.is_readable() || event.is_read_closed() || event.is_error() {
                    self.read_conn(i, &now_ns);
                }
                if event.is_writable() && self.conns[i].alive {
                    self.flush(i);
                }
            }
            self.progress
                .completed
                .fetch_add(std::mem::take(&mut self.completed), Ordering::Relaxed);
            self.progress.elapsed_ns.fetch_max(now, Ordering::Relaxed);
        }
    }

    fn poll_timeout(
        &self,
        schedule: Option<&Schedule>,
        now: u64,
        issuing: bool,
        drain_deadline: Option<u64>,
    ) -> Duration {
        let mut wake = now + POLL_SLICE.as_nanos() as u64;
        if issuing {
            wake = wake.min(self.issue_end_ns);
            if let Some(s) = schedule {
                let next = s.peek_ns();
                let spin = self.config.spin_threshold.as_nanos() as u64;
                if next <= now.saturating_add(spin) {
                    return Duration::ZERO;
                }
                let wake_for_arrival = next - spin;
                #[cfg(target_os = "linux")]
                if let Some(timer) = &self.timer
                    && wake_for_arrival < wake
                    && timer
                        .arm(Duration::from_nanos(wake_for_arrival - now))
                        .is_ok()
                {
                    // The timer wakes the poll precisely; the poll timeout stays a backstop.
                    return Duration::from_nanos(wake.saturating_sub(now));
                }
                // Without a timer, wake a spin-threshold early: epoll rounds up to milliseconds.
                wake = wake.min(wake_for_arrival);
            }
        }
        if let Some(deadline) = drain_deadline {
            wake = wake.min(deadline);
        }
        Duration::from_nanos(wake.saturating_sub(now))
    }

    /// Closed loop: top every live connection up to the pipeline depth.
    fn fill_closed(&mut self, now: u64) {
        for i in 0..self.conns.len() {
            while self.conns[i].alive
                && self.conns[i].in_flight.len() < self.config.pipeline
                && self.quota != Some(0)
            {
                self.issue(i, now, now, false);
            }
        }
    }

    /// Open loop: hand every due arrival to a free slot, else to the backlog.
    fn dispatch_open(&mut self, schedule: &mut Schedule, now: u64) {
        self.dispatch_backlog(now);
        while now < self.issue_end_ns
            && self.quota != Some(0)
            && let Some(intended) = schedule.next_due(now)
        {
            if intended >= self.issue_end_ns {
                break;
            }
            if self.quota.is_some() && intended >= self.measure_start_ns {
                // Reserve quota at arrival time so backlogged arrivals are not over-issued.
                self.quota = self.quota.map(|q| q - 1);
            }
            match self.free_conn() {
                Some(i) if self.backlog.is_empty() => self.issue(i, intended, now, false),
                _ if self.backlog.len() < self.config.backlog_max => {
                    self.backlog.push_back(intended)
                }
                _ => {
                    if intended >= self.measure_start_ns {
                        self.stats.dropped += 1;
                    }
                }
            }
        }
    }

    fn dispatch_backlog(&mut self, now: u64) {
        while !self.backlog.is_empty() {
            let Some(i) = self.free_conn() else { break };
            if let Some(intended) = self.backlog.pop_front() {
                self.issue(i, intended, now, true);
            }
        }
    }

    /// A live connection with a free pipeline slot, round-robin.
    fn free_conn(&mut self) -> Option<usize> {
        let n = self.conns.len();
        for step in 0..n {
            let i = (self.cursor + step) % n;
            let c = &self.conns[i];
            if c.alive && c.in_flight.len() < self.config.pipeline {
                self.cursor = (i + 1) % n;
                return Some(i);
            }
        }
        None
    }

    /// Encodes one request on connection `i`. `intended` is when it should have been sent.
    /// `from_backlog` says whether the request waited for a free slot; a late send that did
    /// not is the generator's own lag (it was descheduled or too busy).
    fn issue(&mut self, i: usize, intended: u64, now: u64, from_backlog: bool) {
        let measured = intended >= self.measure_start_ns;
        let fill = self.fills.pop_front();
        let conn = &mut self.conns[i];
        let gen_ = &mut self.gen_;
        let (op, keys, key) = match fill.map_or_else(|| gen_.next_op(), |_| OpKind::Set) {
            OpKind::Get => {
                let n = gen_.workload().multiget;
                let mut first = 0;
                wire::encode_get_with(&mut conn.out, n, |k, out| {
                    let key = gen_.next_key();
                    if k == 0 {
                        first = key;
                    }
                    gen_.workload().keys.write_key(key, out);
                });
                (OpKind::Get, n as u32, first)
            }
            OpKind::Set => {
                // A read-through fill sets the key that missed; otherwise draw one.
                let key = fill.unwrap_or_else(|| gen_.next_key());
                let len = gen_.next_value_len();
                let (workload, value) = (gen_.workload(), gen_.pool().value(len));
                wire::encode_set_with(
                    &mut conn.out,
                    |out| workload.keys.write_key(key, out),
                    0,
                    workload.ttl_secs,
                    value,
                );
                (OpKind::Set, 1, key)
            }
        };
        conn.in_flight.push_back(InFlight {
            op,
            keys,
            key,
            intended_ns: intended,
            measured,
        });
        if measured {
            self.stats.op(op).sent += 1;
            if self.config.mode != LoadMode::Closed
                && now.saturating_sub(intended) > self.config.late_threshold.as_nanos() as u64
            {
                self.stats.late_sends += 1;
                if !from_backlog {
                    self.stats.late_sends_generator += 1;
                }
            }
            if let (Some(q), LoadMode::Closed) = (self.quota.as_mut(), self.config.mode) {
                *q -= 1;
            }
        } else {
            self.stats.warmup_sent += 1;
        }
    }

    fn flush_all(&mut self) {
        for i in 0..self.conns.len() {
            if self.conns[i].alive && self.conns[i].out_pos < self.conns[i].out.len() {
                self.flush(i);
            }
        }
    }

    fn flush(&mut self, i: usize) {
        let conn = &mut self.conns[i];
        while conn.out_pos < conn.out.len() {
            match conn.stream.write(&conn.out[conn.out_pos..]) {
                Ok(0) => return self.fail(i, "connection"),
                Ok(n) => conn.out_pos += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return self.fail(i, "connection"),
            }
        }
        conn.out.clear();
        conn.out_pos = 0;
    }

    fn read_conn(&mut self, i: usize, now_ns: &impl Fn() -> u64) {
        loop {
            let conn = &mut self.conns[i];
            if conn.filled == conn.buf.len() {
                if conn.start > 0 {
                    conn.buf.copy_within(conn.start..conn.filled, 0);
                    conn.filled -= conn.start;
                    conn.start = 0;
                } else {
                    // One reply larger than the buffer: grow. Bounded by the parse limits,
                    // which reject any reply line or value beyond them.
                    let len = conn.buf.len();
                    conn.buf.resize(len * 2, 0);
                }
            }
            match conn.stream.read(&mut conn.buf[conn.filled..]) {
                Ok(0) => return self.fail(i, "connection"),
                Ok(n) => {
                    conn.filled += n;
                    if !self.parse_replies(i, now_ns()) {
                        return;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return self.fail(i, "connection"),
            }
        }
    }

    /// Consumes every complete reply in the buffer. Returns false if the connection failed.
    fn parse_replies(&mut self, i: usize, now: u64) -> bool {
        loop {
            let conn = &mut self.conns[i];
            let Some(&front) = conn.in_flight.front() else {
                if conn.start < conn.filled {
                    // Bytes nobody asked for: the stream is out of sync.
                    self.fail(i, "protocol");
                    return false;
                }
                break;
            };
            let expect = match front.op {
                OpKind::Get => Expect::Retrieval,
                OpKind::Set => Expect::Storage,
            };
            let outcome = match wire::parse_reply(
                &conn.buf[conn.start..conn.filled],
                expect,
                &self.config.limits,
            ) {
                Ok(Parsed::Incomplete) => break,
                Err(_) => {
                    self.fail(i, "protocol");
                    return false;
                }
                Ok(Parsed::Complete { reply, consumed }) => {
                    conn.start += consumed;
                    classify(&reply)
                }
            };
            conn.in_flight.pop_front();
            self.completed += u64::from(front.measured);
            self.record(front, outcome, now);
        }
        let conn = &mut self.conns[i];
        if conn.start == conn.filled {
            conn.start = 0;
            conn.filled = 0;
        }
        true
    }

    fn record(&mut self, req: InFlight, outcome: Outcome, now: u64) {
        if let Outcome::Hits(0) = outcome
            && self.config.set_on_miss
            && req.op == OpKind::Get
            && self.fills.len() < self.config.backlog_max
        {
            self.fills.push_back(req.key);
        }
        if !req.measured {
            return;
        }
        let since_start = now.saturating_sub(self.measure_start_ns);
        let stats = self.stats.op(req.op);
        match outcome {
            Outcome::Error(kind) => return self.stats.error(req.op, kind),
            Outcome::Hits(hits) => {
                stats.hits += hits as u64;
                stats.misses += u64::from(req.keys).saturating_sub(hits as u64);
            }
            Outcome::Stored => {}
            Outcome::NotStored => stats.not_stored += 1,
        }
        stats.replies += 1;
        stats.latency.record(latency_ns(req.intended_ns, now));
        self.stats.tick(since_start);
    }

    /// Marks connection `i` dead and counts everything it had in flight as errors of `kind`.
    fn fail(&mut self, i: usize, kind: &'static str) {
        let conn = &mut self.conns[i];
        if !conn.alive {
            return;
        }
        conn.alive = false;
        self.connections_failed += 1;
        let lost: Vec<InFlight> = conn.in_flight.drain(..).collect();
        for req in lost {
            if req.measured {
                self.completed += 1;
                self.stats.error(req.op, kind);
            }
        }
    }

    /// End of the run: whatever is still unanswered is a timeout; backlog never sent is dropped.
    fn finish_drain(&mut self) {
        for i in 0..self.conns.len() {
            let lost: Vec<InFlight> = self.conns[i].in_flight.drain(..).collect();
            for req in lost {
                if req.measured {
                    self.stats.error(req.op, "timeout");
                }
            }
        }
        let never_sent = self
            .backlog
            .drain(..)
            .filter(|&t| t >= self.measure_start_ns)
            .count();
        self.stats.dropped += never_sent as u64;
        self.progress
            .completed
            .fetch_add(std::mem::take(&mut self.completed), Ordering::Relaxed);
    }
}

/// What a reply means for the statistics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Hits(usize),
    Stored,
    NotStored,
    Error(&'static str),
}

fn classify(reply: &Reply<'_>) -> Outcome {
    match reply {
        Reply::Values(v) => Outcome::Hits(v.count()),
        Reply::Stored => Outcome::Stored,
        Reply::NotStored | Reply::Exists | Reply::NotFound => Outcome::NotStored,
        Reply::Error => Outcome::Error("error"),
        Reply::ClientError(_) => Outcome::Error("client_error"),
        Reply::ServerError(_) => Outcome::Error("server_error"),
        Reply::Version(_) | Reply::Stats(_) => Outcome::Error("unexpected_reply"),
    }
}
