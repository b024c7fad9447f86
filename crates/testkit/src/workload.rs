//! A threaded workload driver: client threads speak the plain memcached text protocol over
//! TCP to a list of servers and record every request and its outcome in a shared
//! [`Recorder`], ready for [`crate::history::check`].
//!
//! Each client thread is one sequential client; it picks its server round-robin per
//! request and keeps one connection per server. Outcomes map as the consistency contract
//! says (docs/consistency.md section 4): a reply is `Ok`; a refused connection (nothing
//! sent) or `ERROR`/`CLIENT_ERROR` is `Fail`; a timeout, a broken connection or
//! `SERVER_ERROR` is `Unknown`. After an `Unknown` the thread drops that connection and
//! continues under a fresh client id, because the old request may still take effect.
//!
//! Workload shapes: [`Shape::Registers`] writes unique values with `set` and reads with
//! `get`; [`Shape::AppendLogs`] creates every key with `set key ""` first, then appends
//! unique tokens and reads. [`Workload::finish`] stops the clients and reads every key
//! once more (retrying for a bounded time), so lost writes show up in the history even if
//! no client happened to read the key after the fault.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::history::append::TOKEN_END;
use crate::history::{ClientId, EventIndex, History, Op, Outcome, Recorder, Reply};

/// What the clients do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// `set` of unique values and `get`; `read_percent` of the operations are reads.
    Registers { read_percent: u8 },
    /// `append` of unique tokens (after `set key ""`) and `get`.
    AppendLogs { read_percent: u8 },
}

#[derive(Clone, Debug)]
pub struct WorkloadConfig {
    pub servers: Vec<SocketAddr>,
    /// Client threads.
    pub clients: usize,
    /// Keys `{key_prefix}0` .. `{key_prefix}{keys - 1}`; they must not exist before the run
    /// (the checker assumes every key starts absent).
    pub keys: usize,
    pub key_prefix: String,
    pub shape: Shape,
    /// Upper bound of operations per client thread (the run may be stopped earlier).
    pub ops_per_client: usize,
    /// Deadline of one request (connect, send, reply); past it the outcome is unknown.
    pub request_timeout: Duration,
    /// Pause between a client's operations (zero: as fast as the server answers).
    pub think_time: Duration,
    /// Attempts, per key, at the final read done by [`Workload::finish`] and at creating
    /// the keys of an append workload; one `request_timeout` apart at most.
    pub attempts_max: usize,
    pub seed: u64,
    /// Network namespace the clients run in (see [`crate::netns`]); `None` is the
    /// caller's own.
    pub netns: Option<String>,
}

impl WorkloadConfig {
    /// A small register workload against `servers` (4 clients, 8 keys, 200 ops each).
    /// The key prefix is unique to this call: the checker assumes every key starts absent.
    pub fn registers(servers: Vec<SocketAddr>) -> Self {
        Self {
            servers,
            clients: 4,
            keys: 8,
            key_prefix: format!("reg-{}-", run_tag()),
            shape: Shape::Registers { read_percent: 50 },
            ops_per_client: 200,
            request_timeout: Duration::from_millis(1000),
            think_time: Duration::ZERO,
            attempts_max: 40,
            seed: 1,
            netns: None,
        }
    }

    /// A small append workload against `servers` (4 clients, 4 keys, 200 ops each).
    pub fn append_logs(servers: Vec<SocketAddr>) -> Self {
        Self {
            keys: 4,
            key_prefix: format!("log-{}-", run_tag()),
            shape: Shape::AppendLogs { read_percent: 20 },
            ..Self::registers(servers)
        }
    }
}

/// A tag no other call returns, in this process or (by the clock) another one.
fn run_tag() -> String {
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    format!("{:x}{:x}", nanos, CALLS.fetch_add(1, Ordering::Relaxed))
}

#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    #[error("the workload needs at least one server, one client and one key")]
    Empty,
    #[error("entering the clients' network namespace: {0}")]
    Netns(#[from] crate::netns::NetnsError),
    #[error("could not create key {key} for the append workload: {outcome:?}")]
    Setup { key: String, outcome: Outcome },
}

/// Counts of a run, for the test's log and its sanity checks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    pub ok: u64,
    pub failed: u64,
    pub unknown: u64,
    /// Keys whose final read never got an answer within `attempts_max`.
    pub final_reads_missing: u64,
}

/// The result of [`Workload::finish`].
#[derive(Debug)]
pub struct Run {
    pub history: History,
    pub summary: Summary,
}

impl Run {
    /// Checks the history; on failure writes it to `<log dir>/<name>.history` (one line
    /// per operation) and panics with the findings and that path.
    #[track_caller]
    pub fn assert_valid(&self, name: &str) {
        let report = crate::history::check(&self.history, crate::history::CheckConfig::default());
        if report.is_valid() {
            return;
        }
        let dir = crate::process::default_log_dir();
        let path = dir.join(format!("{name}.history"));
        let saved = std::fs::create_dir_all(&dir)
            .and_then(|()| self.history.write_to(&path))
            .map_or_else(
                |e| format!("(not saved: {e})"),
                |()| path.display().to_string(),
            );
        panic!(
            "history check failed ({:?}); history in {saved}\n{report}",
            self.summary
        );
    }
}

/// A running workload.
pub struct Workload {
    config: WorkloadConfig,
    recorder: Arc<Recorder>,
    stop: Arc<AtomicBool>,
    completed: Arc<AtomicU64>,
    next_client: Arc<AtomicU64>,
    threads: Vec<JoinHandle<()>>,
}

impl Workload {
    /// Creates the keys (append shape) and starts the client threads.
    pub fn start(config: WorkloadConfig) -> Result<Self, WorkloadError> {
        match config.netns.clone() {
            // threads spawned inside the namespace stay there
            Some(name) => crate::netns::in_namespace(&name, || Self::start_here(config))?,
            None => Self::start_here(config),
        }
    }

    fn start_here(config: WorkloadConfig) -> Result<Self, WorkloadError> {
        if config.servers.is_empty() || config.clients == 0 || config.keys == 0 {
            return Err(WorkloadError::Empty);
        }
        let recorder = Arc::new(Recorder::new());
        let next_client = Arc::new(AtomicU64::new(1));
        if let Shape::AppendLogs { .. } = config.shape {
            let mut client = Client::new(&config, 0, &recorder, &next_client);
            for key in 0..config.keys {
                let key = format!("{}{key}", config.key_prefix);
                let op = Op::Set {
                    key: key.clone(),
                    value: Vec::new(),
                };
                let outcome = client.until_answered(&op, config.attempts_max);
                if outcome != Outcome::Ok(Reply::Stored) {
                    return Err(WorkloadError::Setup { key, outcome });
                }
            }
        }
        let stop = Arc::new(AtomicBool::new(false));
        let completed = Arc::new(AtomicU64::new(0));
        let threads = (0..config.clients)
            .map(|thread| {
                let mut client = Client::new(&config, thread, &recorder, &next_client);
                let config = config.clone();
                let stop = stop.clone();
                let completed = completed.clone();
                std::thread::Builder::new()
                    .name(format!("workload-{thread}"))
                    .spawn(move || client.run(&config, &stop, &completed))
                    .expect("spawn a workload thread")
            })
            .collect();
        Ok(Self {
            config,
            recorder,
            stop,
            completed,
            next_client,
            threads,
        })
    }

    /// Operations completed so far (any outcome), to wait until load flows.
    pub fn completed(&self) -> u64 {
        self.completed.load(Ordering::Relaxed)
    }

    /// Waits (bounded by `timeout`) until at least `count` operations completed; returns
    /// whether they did.
    pub fn wait_completed(&self, count: u64, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while self.completed() < count {
            if Instant::now() >= deadline || self.threads.iter().all(|t| t.is_finished()) {
                return self.completed() >= count;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        true
    }

    /// A mark in the history: operations whose invoke index is at or above it were sent
    /// after this call (see [`Recorder::events_recorded`]).
    pub fn mark(&self) -> EventIndex {
        self.recorder.events_recorded()
    }

    /// Asks the clients to stop after their current request.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Stops the clients, waits for them, reads every key once more and returns the history.
    pub fn finish(self) -> Run {
        self.stop();
        for thread in self.threads {
            // a panicking client thread leaves its last operation open: it counts as unknown
            let _ = thread.join();
        }
        let mut summary = Summary::default();
        let read_all = || final_reads(&self.config, &self.recorder, &self.next_client);
        summary.final_reads_missing = match &self.config.netns {
            Some(name) => crate::netns::in_namespace(name, read_all).unwrap_or_else(|error| {
                tracing::warn!(%error, "final reads impossible");
                self.config.keys as u64
            }),
            None => read_all(),
        };
        let history = Arc::into_inner(self.recorder)
            .map(Recorder::into_history)
            .expect("client threads are joined");
        for operation in history.operations().into_iter().flatten() {
            match operation.outcome {
                Outcome::Ok(_) => summary.ok += 1,
                Outcome::Fail(_) => summary.failed += 1,
                Outcome::Unknown(_) => summary.unknown += 1,
            }
        }
        Run { history, summary }
    }
}

/// Reads every key until it answers (bounded); returns how many never did.
fn final_reads(
    config: &WorkloadConfig,
    recorder: &Arc<Recorder>,
    next_client: &Arc<AtomicU64>,
) -> u64 {
    let mut reader = Client::new(config, 0, recorder, next_client);
    let mut missing = 0;
    for key in 0..config.keys {
        let op = Op::Get {
            key: format!("{}{key}", config.key_prefix),
        };
        if !matches!(
            reader.until_answered(&op, config.attempts_max),
            Outcome::Ok(_)
        ) {
            missing += 1;
        }
    }
    missing
}

/// Starts a workload, lets it run all its operations and finishes it.
pub fn run(config: WorkloadConfig) -> Result<Run, WorkloadError> {
    let workload = Workload::start(config)?;
    for thread in &workload.threads {
        while !thread.is_finished() {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    Ok(workload.finish())
}

/// One sequential client: its id, its connections and its position in the rotation.
struct Client {
    servers: Vec<SocketAddr>,
    connections: Vec<Option<Connection>>,
    turn: usize,
    id: ClientId,
    recorder: Arc<Recorder>,
    next_client: Arc<AtomicU64>,
    timeout: Duration,
    rng: StdRng,
    sequence: u64,
}

impl Client {
    fn new(
        config: &WorkloadConfig,
        thread: usize,
        recorder: &Arc<Recorder>,
        next_client: &Arc<AtomicU64>,
    ) -> Self {
        Self {
            servers: config.servers.clone(),
            connections: config.servers.iter().map(|_| None).collect(),
            turn: thread,
            id: next_client.fetch_add(1, Ordering::Relaxed),
            recorder: recorder.clone(),
            next_client: next_client.clone(),
            timeout: config.request_timeout,
            rng: StdRng::seed_from_u64(config.seed ^ (thread as u64).wrapping_mul(0x9e37_79b9)),
            sequence: 0,
        }
    }

    fn run(&mut self, config: &WorkloadConfig, stop: &AtomicBool, completed: &AtomicU64) {
        for _ in 0..config.ops_per_client {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let key = format!(
                "{}{}",
                config.key_prefix,
                self.rng.gen_range(0..config.keys)
            );
            let read_percent = match config.shape {
                Shape::Registers { read_percent } | Shape::AppendLogs { read_percent } => {
                    read_percent
                }
            };
            self.sequence += 1;
            let op = if self.rng.gen_range(0..100u8) < read_percent {
                Op::Get { key }
            } else if let Shape::Registers { .. } = config.shape {
                Op::Set {
                    key,
                    value: format!("{}.{}", self.id, self.sequence).into_bytes(),
                }
            } else {
                Op::Append {
                    key,
                    token: format!("{}.{}{}", self.id, self.sequence, TOKEN_END as char)
                        .into_bytes(),
                }
            };
            self.execute(&op);
            completed.fetch_add(1, Ordering::Relaxed);
            if !config.think_time.is_zero() {
                std::thread::sleep(config.think_time);
            }
        }
    }

    /// Repeats `op` until it gets a definite answer, at most `attempts` times.
    fn until_answered(&mut self, op: &Op, attempts: usize) -> Outcome {
        let mut outcome = Outcome::Fail("no attempt".into());
        for attempt in 0..attempts {
            outcome = self.execute(op);
            if matches!(outcome, Outcome::Ok(_)) {
                break;
            }
            if attempt + 1 < attempts {
                std::thread::sleep(self.timeout.min(Duration::from_millis(100)));
            }
        }
        outcome
    }

    /// Sends `op` to the next server in the rotation and records it.
    fn execute(&mut self, op: &Op) -> Outcome {
        let server = self.turn % self.servers.len();
        self.turn += 1;
        let at = self.recorder.invoke(self.id, op.clone());
        let deadline = Instant::now() + self.timeout;
        let outcome = match self.connection(server, deadline) {
            Err(error) => Outcome::Fail(format!("connect {}: {error}", self.servers[server])),
            Ok(connection) => match connection.request(op, deadline) {
                Ok(outcome) => outcome,
                Err(error) => {
                    self.connections[server] = None;
                    Outcome::Unknown(format!("{}: {error}", self.servers[server]))
                }
            },
        };
        self.recorder.complete(at, outcome.clone());
        if let Outcome::Unknown(_) = outcome {
            self.id = self.next_client.fetch_add(1, Ordering::Relaxed);
        }
        outcome
    }

    fn connection(&mut self, server: usize, deadline: Instant) -> io::Result<&mut Connection> {
        if self.connections[server].is_none() {
            let remaining = deadline.saturating_duration_since(Instant::now());
            let stream =
                TcpStream::connect_timeout(&self.servers[server], remaining.max(MIN_WAIT))?;
            stream.set_nodelay(true)?;
            self.connections[server] = Some(Connection {
                stream,
                buffer: Vec::new(),
                start: 0,
            });
        }
        Ok(self.connections[server]
            .as_mut()
            .expect("connection was just made"))
    }
}

/// Socket timeouts of zero mean "forever": never pass less than this.
const MIN_WAIT: Duration = Duration::from_millis(1);

struct Connection {
    stream: TcpStream,
    buffer: Vec<u8>,
    start: usize,
}

impl Connection {
    /// Sends one request and reads its reply. An `Err` leaves the connection out of step:
    /// the caller drops it and records the outcome as unknown.
    fn request(&mut self, op: &Op, deadline: Instant) -> io::Result<Outcome> {
        let mut request = Vec::new();
        match op {
            Op::Set { key, value } => {
                request.extend_from_slice(format!("set {key} 0 0 {}\r\n", value.len()).as_bytes());
                request.extend_from_slice(value);
                request.extend_from_slice(b"\r\n");
            }
            Op::Append { key, token } => {
                request
                    .extend_from_slice(format!("append {key} 0 0 {}\r\n", token.len()).as_bytes());
                request.extend_from_slice(token);
                request.extend_from_slice(b"\r\n");
            }
            Op::Get { key } => request.extend_from_slice(format!("get {key}\r\n").as_bytes()),
        }
        self.stream
            .set_write_timeout(Some(remaining(deadline)?.max(MIN_WAIT)))?;
        self.stream.write_all(&request)?;

        let line = self.line(deadline)?;
        if line.starts_with(b"SERVER_ERROR") {
            return Ok(Outcome::Unknown(
                String::from_utf8_lossy(&line).into_owned(),
            ));
        }
        if line.starts_with(b"CLIENT_ERROR") || line == b"ERROR" {
            return Ok(Outcome::Fail(String::from_utf8_lossy(&line).into_owned()));
        }
        match op {
            Op::Set { .. } | Op::Append { .. } => match &line[..] {
                b"STORED" => Ok(Outcome::Ok(Reply::Stored)),
                b"NOT_STORED" => Ok(Outcome::Ok(Reply::NotStored)),
                _ => Err(unexpected(&line)),
            },
            Op::Get { key } => {
                if line == b"END" {
                    return Ok(Outcome::Ok(Reply::Value(None)));
                }
                let header = std::str::from_utf8(&line).map_err(|_| unexpected(&line))?;
                let mut words = header.split(' ');
                let length = match (words.next(), words.next(), words.next(), words.next()) {
                    (Some("VALUE"), Some(k), Some(_flags), Some(length)) if k == key => {
                        length.parse::<usize>().map_err(|_| unexpected(&line))?
                    }
                    _ => return Err(unexpected(&line)),
                };
                let data = self.exact(length + 2, deadline)?;
                if !data.ends_with(b"\r\n") {
                    return Err(unexpected(&data));
                }
                let end = self.line(deadline)?;
                if end != b"END" {
                    return Err(unexpected(&end));
                }
                Ok(Outcome::Ok(Reply::Value(Some(data[..length].to_vec()))))
            }
        }
    }

    /// The next `\r\n`-terminated line, without the terminator.
    fn line(&mut self, deadline: Instant) -> io::Result<Vec<u8>> {
        loop {
            let pending = &self.buffer[self.start..];
            if let Some(at) = pending.windows(2).position(|w| w == b"\r\n") {
                let line = pending[..at].to_vec();
                self.start += at + 2;
                return Ok(line);
            }
            if pending.len() > LINE_BYTES_MAX {
                return Err(unexpected(b"reply line too long"));
            }
            self.fill(deadline)?;
        }
    }

    fn exact(&mut self, count: usize, deadline: Instant) -> io::Result<Vec<u8>> {
        while self.buffer.len() - self.start < count {
            self.fill(deadline)?;
        }
        let data = self.buffer[self.start..self.start + count].to_vec();
        self.start += count;
        Ok(data)
    }

    fn fill(&mut self, deadline: Instant) -> io::Result<()> {
        if self.start == self.buffer.len() {
            self.buffer.clear();
            self.start = 0;
        }
        self.stream
            .set_read_timeout(Some(remaining(deadline)?.max(MIN_WAIT)))?;
        let mut chunk = [0u8; 16 * 1024];
        let read = self.stream.read(&mut chunk)?;
        if read == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        self.buffer.extend_from_slice(&chunk[..read]);
        Ok(())
    }
}

/// Longest reply line accepted (the longest legitimate one is a `VALUE` header).
const LINE_BYTES_MAX: usize = 4096;

fn remaining(deadline: Instant) -> io::Result<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(io::Error::new(io::ErrorKind::TimedOut, "request deadline"));
    }
    Ok(left)
}

fn unexpected(bytes: &[u8]) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("unexpected reply {}", bytes.escape_ascii()),
    )
}
