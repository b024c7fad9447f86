//! Server processes under a test's control (the process half of a nemesis): spawn a
//! `cellcache serve` (or `memcached`) child on a loopback port, wait until it answers,
//! `kill -9` it, pause it with `SIGSTOP`, resume it with `SIGCONT`, restart it with the same
//! command line. Every wait is bounded.
//!
//! Each server's stdout and stderr go to one log file (`<log dir>/<name>.log`, appended
//! across restarts with a marker line per start), so a failed test can be read
//! post mortem; a [`Server`] dropped while its thread panics prints its log path and
//! the log's tail.
//!
//! The `cellcache` binary is found by [`cellcache_binary`]: `$CELLCACHE_BIN` if set,
//! otherwise it is built once per test process with `cargo build -p cellcache` (Cargo does
//! not give one crate's tests the path of another crate's binary).

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error("building the cellcache binary failed: {0}")]
    Build(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("server {name} did not answer on {addr} within {waited:?}; log {log}:\n{tail}")]
    NotReady {
        name: String,
        addr: SocketAddr,
        waited: Duration,
        log: PathBuf,
        tail: String,
    },
    #[error("server {name} exited ({status}) while starting; log {log}:\n{tail}")]
    Exited {
        name: String,
        status: ExitStatus,
        log: PathBuf,
        tail: String,
    },
    #[error("server {name} is not running")]
    NotRunning { name: String },
    #[error("signal {signal} to server {name}: {source}")]
    Signal {
        name: String,
        signal: Signal,
        source: nix::Error,
    },
}

fn io_error(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ProcessError {
    let what = what.into();
    move |source| ProcessError::Io { what, source }
}

/// The workspace's root directory (two levels above this crate).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("crates/testkit sits two levels below the workspace root")
        .to_path_buf()
}

/// Cargo's target directory: `$CARGO_TARGET_DIR` or `<workspace>/target`.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

/// The `cellcache` binary: `$CELLCACHE_BIN`, or `target/debug/cellcache`, built with
/// `cargo build -p cellcache` first unless it is newer than every source file of the
/// workspace (decided once per process; later calls return the first result).
///
/// Why not always build: `cargo test --workspace` has just built the binary (the CLI's own
/// tests need it), with features unified across the workspace; `cargo build -p cellcache`
/// resolves features differently and would replace the file while those tests spawn it.
pub fn cellcache_binary() -> Result<PathBuf, ProcessError> {
    static BINARY: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BINARY
        .get_or_init(|| {
            if let Some(path) = std::env::var_os("CELLCACHE_BIN") {
                return Ok(PathBuf::from(path));
            }
            let binary = target_dir().join("debug").join("cellcache");
            let built = std::fs::metadata(&binary).and_then(|m| m.modified()).ok();
            let root = workspace_root();
            let mut newest_source = None;
            for path in [root.join("Cargo.toml"), root.join("Cargo.lock")] {
                newest_source =
                    newest_source.max(std::fs::metadata(path).and_then(|m| m.modified()).ok());
            }
            newest_source = newest_source.max(newest_modification(&root.join("crates")));
            if built.is_some() && built >= newest_source {
                return Ok(binary);
            }
            let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
            let output = Command::new(cargo)
                .args(["build", "--quiet", "-p", "cellcache"])
                .current_dir(&root)
                .output()
                .map_err(|e| format!("running cargo: {e}"))?;
            if !output.status.success() {
                return Err(String::from_utf8_lossy(&output.stderr).into_owned());
            }
            Ok(binary)
        })
        .clone()
        .map_err(ProcessError::Build)
}

/// The latest modification time of the `.rs` and `Cargo.toml` files under `dir`
/// (skipping build output and fuzz corpora).
fn newest_modification(dir: &Path) -> Option<std::time::SystemTime> {
    let mut newest = None;
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if path.is_dir() {
            if name != "target" && name != "corpus" && name != "artifacts" {
                newest = newest.max(newest_modification(&path));
            }
        } else if path.extension().is_some_and(|e| e == "rs") || name == "Cargo.toml" {
            newest = newest.max(entry.metadata().and_then(|m| m.modified()).ok());
        }
    }
    newest
}

/// A loopback port free at the time of the call.
pub fn free_port() -> Result<u16, ProcessError> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(io_error("binding a free port"))?;
    Ok(listener
        .local_addr()
        .map_err(io_error("reading a free port"))?
        .port())
}

/// A free loopback port other than `taken`: a port found free earlier stays free until its
/// server binds it, and the kernel may hand it out again (a cell given one port for two
/// listeners bound its peer listener, joined the ring, then failed to bind its client port
/// and left the ring a member that never answers).
pub fn free_port_besides(taken: &[u16]) -> Result<u16, ProcessError> {
    loop {
        let p = free_port()?;
        if !taken.contains(&p) {
            return Ok(p);
        }
    }
}

/// Where logs of this test process go: `target/testkit-logs/<pid>`.
pub fn default_log_dir() -> PathBuf {
    target_dir()
        .join("testkit-logs")
        .join(std::process::id().to_string())
}

/// A directory for this test process's files named `name` (membership files, secrets,
/// certificates, databases), beside its logs: `target/testkit-logs/<pid>/<name>`, created if
/// missing. Under `target/`, not the system's temporary directory, which the suite would
/// otherwise fill with one directory per cell of every run.
pub fn scratch_dir(name: &str) -> PathBuf {
    let dir = default_log_dir().join(name);
    // An error shows when the caller writes into it.
    let _ = std::fs::create_dir_all(&dir);
    dir
}

/// How to start a server.
#[derive(Clone, Debug)]
pub struct ServerSpec {
    /// Names the log file and error messages.
    pub name: String,
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// Where it serves the memcached protocol (checked for readiness).
    pub addr: SocketAddr,
    pub log_dir: PathBuf,
    /// How long [`Server::start`] waits for the first answer.
    pub ready_timeout: Duration,
    /// Network namespace to run in (see [`crate::netns::Netns::place`]); `None` is the
    /// test's own.
    pub netns: Option<String>,
}

impl ServerSpec {
    /// `cellcache serve -l 127.0.0.1 -p <free port>`; add flags with [`ServerSpec::arg`].
    pub fn cellcache(name: &str) -> Result<Self, ProcessError> {
        let port = free_port()?;
        Ok(Self {
            name: name.to_owned(),
            program: cellcache_binary()?,
            args: ["serve", "-l", "127.0.0.1", "-p", &port.to_string()]
                .map(String::from)
                .to_vec(),
            // plain text logs: they are read in files, not on a terminal; a membership file
            // of its own (none left for a later run's address)
            env: vec![
                ("NO_COLOR".into(), "1".into()),
                (
                    "CELLCACHE_CLUSTER__STATE_DIR".into(),
                    default_log_dir()
                        .join(format!("state-{name}-{port}"))
                        .to_string_lossy()
                        .into_owned(),
                ),
            ],
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            log_dir: default_log_dir(),
            ready_timeout: Duration::from_secs(20),
            netns: None,
        })
    }

    /// Debian's `memcached -l 127.0.0.1 -p <free port>`.
    pub fn memcached(name: &str) -> Result<Self, ProcessError> {
        let port = free_port()?;
        Ok(Self {
            name: name.to_owned(),
            program: PathBuf::from("memcached"),
            // memcached refuses to run as root without -u, and ignores -u otherwise
            args: [
                "-l",
                "127.0.0.1",
                "-U",
                "0",
                "-u",
                "root",
                "-p",
                &port.to_string(),
            ]
            .map(String::from)
            .to_vec(),
            env: Vec::new(),
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            log_dir: default_log_dir(),
            ready_timeout: Duration::from_secs(10),
            netns: None,
        })
    }

    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.args.push(arg.into());
        self
    }

    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    pub fn log_path(&self) -> PathBuf {
        self.log_dir.join(format!("{}.log", self.name))
    }
}

/// A server child process. Killed (SIGKILL) when dropped.
pub struct Server {
    spec: ServerSpec,
    child: Option<Child>,
    starts: u32,
}

impl Server {
    /// Spawns the server and waits until it answers `version`.
    pub fn start(spec: ServerSpec) -> Result<Self, ProcessError> {
        let mut server = Self {
            spec,
            child: None,
            starts: 0,
        };
        server.spawn()?;
        Ok(server)
    }

    pub fn name(&self) -> &str {
        &self.spec.name
    }

    pub fn addr(&self) -> SocketAddr {
        self.spec.addr
    }

    pub fn spec(&self) -> &ServerSpec {
        &self.spec
    }

    pub fn log_path(&self) -> PathBuf {
        self.spec.log_path()
    }

    /// The process id while a child exists (running or paused).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the child is alive (a paused child is alive).
    pub fn is_running(&mut self) -> bool {
        match &mut self.child {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// `kill -9`, then reaps the child. Returns its exit status.
    pub fn kill9(&mut self) -> Result<ExitStatus, ProcessError> {
        let mut child = self.child.take().ok_or_else(|| ProcessError::NotRunning {
            name: self.spec.name.clone(),
        })?;
        // Child::kill sends SIGKILL; a stopped process dies from it too
        let _ = child.kill();
        let status = child
            .wait()
            .map_err(io_error(format!("reaping {}", self.spec.name)))?;
        self.log_marker(&format!("killed with SIGKILL: {status}"));
        tracing::info!(server = %self.spec.name, "killed with SIGKILL");
        Ok(status)
    }

    /// Asks the server to stop (SIGTERM) and waits up to `timeout`, then kills it.
    pub fn terminate(&mut self, timeout: Duration) -> Result<ExitStatus, ProcessError> {
        self.signal(Signal::SIGCONT)?;
        self.signal(Signal::SIGTERM)?;
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(child) = &mut self.child
                && let Ok(Some(status)) = child.try_wait()
            {
                self.child = None;
                self.log_marker(&format!("exited after SIGTERM: {status}"));
                return Ok(status);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.kill9()
    }

    /// `SIGSTOP`: the process freezes; its sockets stay open and the kernel keeps
    /// accepting connections into the backlog, as with a GC pause or a frozen VM.
    ///
    /// Returns once every thread of the process is stopped (`kill` only queues the signal;
    /// a thread already running could otherwise still answer a request sent right after).
    pub fn pause(&self) -> Result<(), ProcessError> {
        self.signal(Signal::SIGSTOP)?;
        let pid = self.pid().unwrap_or_default();
        let deadline = Instant::now() + Duration::from_secs(5);
        while !all_threads_stopped(pid) {
            if Instant::now() >= deadline {
                return Err(ProcessError::Io {
                    what: format!("waiting for {} to stop", self.spec.name),
                    source: std::io::ErrorKind::TimedOut.into(),
                });
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        tracing::info!(server = %self.spec.name, "paused with SIGSTOP");
        Ok(())
    }

    /// `SIGCONT` after [`Server::pause`].
    pub fn resume(&self) -> Result<(), ProcessError> {
        self.signal(Signal::SIGCONT)?;
        tracing::info!(server = %self.spec.name, "resumed with SIGCONT");
        Ok(())
    }

    /// Kills the server if it runs, then starts it again with the same command line and
    /// waits until it answers.
    pub fn restart(&mut self) -> Result<(), ProcessError> {
        if self.child.is_some() {
            self.kill9()?;
        }
        self.wait_port_free(self.spec.ready_timeout)?;
        self.spawn()
    }

    /// Waits until the server's port can be bound again. A killed process's listening
    /// socket can outlive it briefly: sockets registered with io_uring are released by the
    /// kernel's deferred ring teardown, after the process is reaped.
    fn wait_port_free(&self, timeout: Duration) -> Result<(), ProcessError> {
        let addr = self.spec.addr;
        let bindable = || TcpListener::bind(addr).is_ok();
        let started = Instant::now();
        loop {
            let free = match &self.spec.netns {
                Some(name) => crate::netns::in_namespace(name, bindable).unwrap_or(false),
                None => bindable(),
            };
            if free {
                tracing::debug!(server = %self.spec.name, waited = ?started.elapsed(), "port free");
                return Ok(());
            }
            if started.elapsed() >= timeout {
                return Err(ProcessError::Io {
                    what: format!("waiting for {addr} to be free for {}", self.spec.name),
                    source: std::io::ErrorKind::AddrInUse.into(),
                });
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Replaces the command line used by the next [`Server::restart`] (a restarted cell
    /// may need `--join` where the first start bootstrapped).
    pub fn set_args(&mut self, args: Vec<String>) {
        self.spec.args = args;
    }

    /// Sends `signal` to the child.
    pub fn signal(&self, signal: Signal) -> Result<(), ProcessError> {
        let pid = self.pid().ok_or_else(|| ProcessError::NotRunning {
            name: self.spec.name.clone(),
        })?;
        kill(Pid::from_raw(pid as i32), signal).map_err(|source| ProcessError::Signal {
            name: self.spec.name.clone(),
            signal,
            source,
        })
    }

    /// Waits until the server answers `version`, at most `timeout`.
    pub fn wait_ready(&mut self, timeout: Duration) -> Result<(), ProcessError> {
        let deadline = Instant::now() + timeout;
        loop {
            let probe = || answers_version(self.spec.addr, Duration::from_millis(500));
            let answered = match &self.spec.netns {
                Some(name) => crate::netns::in_namespace(name, probe).unwrap_or(false),
                None => probe(),
            };
            if answered {
                return Ok(());
            }
            if let Some(child) = &mut self.child
                && let Ok(Some(status)) = child.try_wait()
            {
                self.child = None;
                return Err(ProcessError::Exited {
                    name: self.spec.name.clone(),
                    status,
                    log: self.log_path(),
                    tail: self.log_tail(40),
                });
            }
            if Instant::now() >= deadline {
                return Err(ProcessError::NotReady {
                    name: self.spec.name.clone(),
                    addr: self.spec.addr,
                    waited: timeout,
                    log: self.log_path(),
                    tail: self.log_tail(40),
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The whole log (all starts).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// The last `lines` lines of the log.
    pub fn log_tail(&self, lines: usize) -> String {
        let log = self.log();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    fn spawn(&mut self) -> Result<(), ProcessError> {
        std::fs::create_dir_all(&self.spec.log_dir).map_err(io_error(format!(
            "creating {}",
            self.spec.log_dir.display()
        )))?;
        self.starts += 1;
        self.log_marker(&format!(
            "start {}: {} {}",
            self.starts,
            self.spec.program.display(),
            self.spec.args.join(" ")
        ));
        let log = self.open_log()?;
        let log_err = log
            .try_clone()
            .map_err(io_error("duplicating the log handle"))?;
        let mut command = match &self.spec.netns {
            // `ip netns exec` execs the program, so the child's pid is the server's own
            Some(name) => {
                let mut command = Command::new("ip");
                command
                    .args(["netns", "exec", name])
                    .arg(&self.spec.program);
                command
            }
            None => Command::new(&self.spec.program),
        };
        let child = command
            .args(&self.spec.args)
            .envs(self.spec.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .spawn()
            .map_err(io_error(format!(
                "spawning {} ({})",
                self.spec.name,
                self.spec.program.display()
            )))?;
        tracing::info!(server = %self.spec.name, pid = child.id(), addr = %self.spec.addr, "started");
        self.child = Some(child);
        self.wait_ready(self.spec.ready_timeout)
    }

    fn open_log(&self) -> Result<File, ProcessError> {
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .map_err(io_error(format!("opening {}", self.log_path().display())))
    }

    fn log_marker(&self, text: &str) {
        if let Ok(mut log) = self.open_log() {
            let _ = writeln!(log, "=== testkit: {text}");
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "server {} log: {}\n--- last lines ---\n{}\n---",
                self.spec.name,
                self.log_path().display(),
                self.log_tail(30)
            );
        }
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Whether every user thread of process `pid` is in the stopped state (`T` in
/// `/proc/<pid>/task/<tid>/stat`).
fn all_threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    let mut any = false;
    for task in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue; // the thread exited meanwhile
        };
        // the state follows the command name, which is in parentheses and may hold spaces
        let Some((name, rest)) = stat.rsplit_once(") ") else {
            continue;
        };
        // io_uring's kernel workers (iou-wrk, iou-sqp) run no user code, so they cannot
        // answer a request; whether they show as stopped is the kernel's business
        if name.contains("(iou-") {
            continue;
        }
        let state = rest.chars().next();
        if !matches!(state, Some('T' | 't')) {
            return false;
        }
        any = true;
    }
    any
}

/// Whether a memcached-protocol server at `addr` answers `version` within `timeout`.
pub fn answers_version(addr: SocketAddr, timeout: Duration) -> bool {
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, timeout) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(timeout));
    let _ = stream.set_write_timeout(Some(timeout));
    if stream.write_all(b"version\r\n").is_err() {
        return false;
    }
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line).is_ok() && line.starts_with("VERSION")
}
