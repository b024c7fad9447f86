//! I/O engines: the part of a cell that moves bytes between sockets and sessions.
//!
//! An engine accepts connections, reads what clients send, hands it to a [`Session`] and
//! writes back whatever the session produced. It knows nothing of the memcached protocol,
//! the store or the cluster: the node crate implements [`Service`]/[`Session`] and every
//! engine drives the same implementation, so engines can be compared (and swapped) with
//! the protocol and store code held constant.
//!
//! Guarantees every engine gives a session:
//! - `on_input` sees the connection's unconsumed bytes in order, never more than
//!   [`EngineConfig::input_buffer_max_bytes`]; a client that sends more without the session
//!   consuming it is disconnected (the session's parser bounds every frame well below that).
//! - Backpressure: while a connection's pending output is above
//!   [`EngineConfig::output_buffer_high_bytes`] the engine stops reading from it, so a client
//!   that does not read its replies cannot make the cell buffer without bound.
//! - Event-loop workers (`epoll`, `uring`) never block: every wait is the engine's poll or
//!   ring. The `threads` engine blocks by design, but only a connection's own thread, and
//!   only in `poll(2)` on that connection plus its wake-up eventfd.
//! - `on_input`, `on_notify` and `on_close` of one session run on one thread, never
//!   concurrently; `on_close` runs exactly once.
//! - Yielding: a session that returns [`Progress::yielded`] is offered its unconsumed input
//!   again without any new byte or notify arriving, after the worker has served the other
//!   connections that were ready (`epoll`: the back of the worker's ready queue; `uring`: a
//!   ready queue drained after each batch of completions, the ring not blocking while it
//!   is non-empty; `threads`: at once, since the thread serves no one else). Output
//!   produced before the yield is written meanwhile.
//! - A connection that holds part of a request (input the session left unconsumed) for
//!   [`EngineConfig::request_timeout_secs`] without the session consuming any of it is
//!   closed (see `request`); one with nothing pending is closed only after
//!   [`EngineConfig::idle_timeout_secs`]. Both are checked every few hundred milliseconds.
//! - After [`Shutdown::trigger`] no new connection is accepted, input already received is
//!   still offered to sessions and the replies written (for at most
//!   [`EngineConfig::shutdown_grace_millis`]), then every connection is closed.
//!
//! [`start`] picks the engine named by an [`IoEngineKind`]; `docs/io-engines.md` explains
//! how the engines differ and what each costs per request.
//!
//! `unsafe` is denied everywhere but in [`uring`], where buffers are lent to the kernel.

#![deny(unsafe_code)]

mod config;
pub mod epoll;
mod request;
mod stats;
pub mod threads;
pub mod tls;
#[allow(unsafe_code)]
pub mod uring;

pub use config::{EngineConfig, IoEngineKind};
pub use stats::{EngineStats, EngineStatsSnapshot};
pub use uring::{UringUnavailable, UringUnavailableCause, uring_support};

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// What a session wants after handling a batch of input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Progress {
    /// Bytes of the input the session consumed; the engine drops them.
    pub consumed: usize,
    /// The session stopped early because its output reached the budget it was given; call
    /// again once output has drained even if no new input arrives.
    pub output_full: bool,
    /// Close the connection once pending output has been written (e.g. `quit`, or a
    /// protocol error after which the stream cannot be resynchronised).
    pub close: bool,
    /// The session stopped after its per-event request limit with input left: end this
    /// connection's turn, serve others, then offer the input again without waiting for
    /// new bytes (memcached's `-R`).
    pub yielded: bool,
    /// For a session that takes input into a buffer of its own before serving it (the
    /// TLS layer, which must decrypt whole records): what it holds, since the engine sees
    /// all of it consumed. `None` for sessions that leave what they have not served with
    /// the engine.
    pub buffered: Option<Buffered>,
}

/// Input a session holds itself (see [`Progress::buffered`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Buffered {
    /// The session it serves consumed some of that input in this call (the request clock
    /// restarts, as when `consumed > 0` for a session without a buffer).
    pub progressed: bool,
    /// Input it has not served is left (part of a request, an unfinished handshake, or
    /// requests waiting for room): the engine offers input again — with no new bytes if
    /// it has none — whenever it would for input of its own, and the request clock runs.
    pub pending: bool,
}

impl Progress {
    /// Everything consumed, and close the connection once pending output is written.
    pub fn closing(consumed: usize) -> Self {
        Self {
            consumed,
            close: true,
            ..Self::default()
        }
    }

    /// The session holds input of its own not served yet ([`Buffered::pending`]).
    pub(crate) fn holds_input(&self) -> bool {
        self.buffered.is_some_and(|b| b.pending)
    }

    /// What the request clock sees of this call, given the bytes the engine saw consumed
    /// and those it still holds: `(consumed, pending)` for [`request::RequestClock::offered`].
    pub(crate) fn for_clock(&self, consumed: usize, unconsumed: usize) -> (usize, usize) {
        match self.buffered {
            None => (consumed, unconsumed),
            Some(b) => (
                usize::from(b.progressed),
                unconsumed + usize::from(b.pending),
            ),
        }
    }
}

/// One client connection's protocol state. Owned by exactly one worker thread.
pub trait Session: Send + 'static {
    /// Handles as much of `input` as forms complete requests, appending replies to
    /// `output`. Should stop once `output.len() >= output_budget` (setting `output_full`);
    /// may stop earlier to let other connections run (setting `yielded`).
    fn on_input(&mut self, input: &[u8], output: &mut Vec<u8>, output_budget: usize) -> Progress;

    /// Called on the owning worker after the session's [`Notify`] fired on any thread:
    /// append output that became ready meanwhile (e.g. replies forwarded from another
    /// cell). The engine then offers unconsumed input to `on_input` again, so a session
    /// may leave input unconsumed while it waits. A notify may be spurious.
    fn on_notify(&mut self, output: &mut Vec<u8>, output_budget: usize) -> Progress {
        let _ = (output, output_budget);
        Progress::default()
    }

    /// Called once when the connection closes, for whatever reason.
    fn on_close(&mut self) {}
}

/// What an engine knows of a connection it accepted, given to [`Service::open`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Accepted {
    /// The client's address.
    pub peer: SocketAddr,
    /// The address of the listener that accepted it (as bound: `0.0.0.0:11211` stays so).
    pub listener: SocketAddr,
    /// The connection's socket descriptor (memcached names connections by it in
    /// `stats conns`); only for reporting, never to act on the socket.
    pub fd: i32,
}

/// One listening socket of a running engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listening {
    /// Its bound address (the port resolved when 0 was asked).
    pub addr: SocketAddr,
    /// Its descriptor, for reporting (`stats conns`).
    pub fd: i32,
}

/// Creates a [`Session`] for each accepted connection. Shared by all workers.
pub trait Service: Send + Sync + 'static {
    type Session: Session;
    fn open(&self, conn: Accepted, notify: Notify) -> Self::Session;
}

/// Wakes one connection's session from any thread (see [`Session::on_notify`]).
#[derive(Clone)]
pub struct Notify {
    inner: Arc<dyn Fn() + Send + Sync>,
}

impl Notify {
    /// Wraps the engine-specific way of scheduling `on_notify` on the owning worker.
    pub fn new(f: impl Fn() + Send + Sync + 'static) -> Self {
        Self { inner: Arc::new(f) }
    }

    /// A notify that does nothing, for sessions driven outside an engine (tests).
    pub fn noop() -> Self {
        Self::new(|| {})
    }

    pub fn notify(&self) {
        (self.inner)()
    }
}

impl std::fmt::Debug for Notify {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Notify")
    }
}

/// Errors an engine reports at start or while running.
#[derive(Debug, thiserror::Error)]
pub enum IoError {
    #[error("cannot bind or configure listener on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot start worker thread: {0}")]
    Spawn(std::io::Error),
    #[error("event loop failed: {0}")]
    Poll(std::io::Error),
    #[error("invalid engine configuration: {0}")]
    Config(String),
    #[error(transparent)]
    UringUnavailable(#[from] UringUnavailable),
}

/// Starts the engine `kind` listening on every address of `addrs` (memcached's repeated
/// `-l`; at least one): [`bind`] then [`serve`]. `Auto` resolves to `uring` when
/// [`uring_support`] succeeds and to `epoll` otherwise, logging which and why; the engine
/// that actually runs is [`RunningEngine::engine`]. Each listener has its own acceptor
/// thread dealing its connections to the same workers. An address that cannot be bound —
/// including one given twice ("Address already in use", as memcached) — fails the whole
/// start.
pub fn start<S: Service>(
    kind: IoEngineKind,
    addrs: &[SocketAddr],
    config: &EngineConfig,
    service: Arc<S>,
    shutdown: Shutdown,
) -> Result<RunningEngine, IoError> {
    serve(bind(kind, addrs, config)?, config, service, shutdown)
}

/// Client sockets bound and listening, not yet accepted on, and the engine (never `Auto`)
/// that will serve them. Connections that arrive before [`serve`] wait in the kernel's
/// backlog (`listen_backlog`). Listening at once is what makes the ports this cell's: a
/// socket that is only bound, with `SO_REUSEADDR`, looks free to another process binding
/// the same way (memcached's own test harness finds free ports so), which could then take
/// it. A cell that must own its ports before it announces them (a ring member, whose
/// address goes into the ring's map) binds first and serves later.
#[derive(Debug)]
pub struct Bound {
    kind: IoEngineKind,
    sockets: Vec<(std::net::TcpListener, Listening)>,
}

impl Bound {
    /// The first socket's address (the port resolved when 0 was asked).
    pub fn local_addr(&self) -> SocketAddr {
        self.sockets[0].1.addr
    }

    /// The engine that will serve these sockets.
    pub fn engine(&self) -> IoEngineKind {
        self.kind
    }
}

/// Resolves the engine `kind` (see [`resolve`]) and binds a listening socket to every
/// address of `addrs` (at least one, in order) with `SO_REUSEADDR` and
/// `config.listen_backlog`, in the blocking mode that engine accepts in; nothing accepts
/// yet.
pub fn bind(
    kind: IoEngineKind,
    addrs: &[SocketAddr],
    config: &EngineConfig,
) -> Result<Bound, IoError> {
    use std::os::fd::AsRawFd;
    if addrs.is_empty() {
        return Err(IoError::Config("no address to listen on".into()));
    }
    config.validate()?;
    let kind = resolve(kind)?;
    // The io_uring acceptor waits in the kernel; the other engines' acceptors poll.
    let nonblocking = kind != IoEngineKind::Uring;
    let backlog = i32::try_from(config.listen_backlog).unwrap_or(i32::MAX);
    let sockets = addrs
        .iter()
        .map(|&addr| {
            let err = |source| IoError::Listen { addr, source };
            let socket = socket2::Socket::new(
                socket2::Domain::for_address(addr),
                socket2::Type::STREAM,
                Some(socket2::Protocol::TCP),
            )
            .map_err(err)?;
            socket.set_reuse_address(true).map_err(err)?;
            socket.bind(&addr.into()).map_err(err)?;
            socket.listen(backlog).map_err(err)?;
            socket.set_nonblocking(nonblocking).map_err(err)?;
            let local = socket
                .local_addr()
                .map_err(err)?
                .as_socket()
                .ok_or_else(|| err(std::io::Error::other("bound to a non-IP address")))?;
            let fd = socket.as_raw_fd();
            Ok((socket.into(), Listening { addr: local, fd }))
        })
        .collect::<Result<Vec<_>, IoError>>()?;
    Ok(Bound { kind, sockets })
}

/// Starts the engine `bound` was bound for, accepting on its listeners.
pub fn serve<S: Service>(
    bound: Bound,
    config: &EngineConfig,
    service: Arc<S>,
    shutdown: Shutdown,
) -> Result<RunningEngine, IoError> {
    let listeners = bound.sockets;
    match bound.kind {
        IoEngineKind::Threads => threads::start(listeners, config, service, shutdown),
        IoEngineKind::Uring => uring::start(listeners, config, service, shutdown),
        IoEngineKind::Epoll | IoEngineKind::Auto => {
            epoll::start(listeners, config, service, shutdown)
        }
    }
}

/// The engine `kind` stands for on this kernel: never `Auto`. Fails only when `uring` is
/// asked for explicitly and the kernel does not allow it.
pub fn resolve(kind: IoEngineKind) -> Result<IoEngineKind, IoError> {
    match kind {
        IoEngineKind::Auto => match uring_support() {
            Ok(()) => {
                tracing::info!(engine = "uring", "io_engine = auto: io_uring is available");
                Ok(IoEngineKind::Uring)
            }
            Err(why) => {
                tracing::warn!(engine = "epoll", reason = %why, "io_engine = auto: io_uring unavailable, using epoll");
                Ok(IoEngineKind::Epoll)
            }
        },
        IoEngineKind::Uring => {
            uring_support()?;
            Ok(IoEngineKind::Uring)
        }
        other => Ok(other),
    }
}

/// Reply memcached sends to a client refused for the connection limit.
const TOO_MANY_CONNECTIONS: &[u8] = b"ERROR Too many open connections\r\n";

/// Refuses a client past a connection limit (`try_open` said no, and counted it): answers
/// memcached's error, best effort (the socket is fresh and non-blocking writes are fine: the
/// short reply fits), and closes it on drop. Logged at the 1st, 2nd, 4th, 8th… refusal, so
/// a flood of connections cannot flood the log.
pub(crate) fn refuse(
    mut stream: impl std::io::Write,
    peer: SocketAddr,
    config: &EngineConfig,
    stats: &EngineStats,
) {
    let _ = stream.write(TOO_MANY_CONNECTIONS);
    let refused = stats.rejected_connections.load(Ordering::Relaxed);
    if refused.is_power_of_two() {
        let per_address = config.address_limit(peer.ip());
        tracing::warn!(
            %peer,
            max = config.max_connections,
            per_address,
            refused,
            "connection refused: limit reached (rejected_connections counts every one)"
        );
    }
}

/// A one-way flag every engine thread checks. [`Shutdown::trigger`] (e.g. from a SIGTERM
/// handler's thread) sets it and runs the wake-up hooks engines registered, so sleeping
/// loops and connection threads notice at once.
#[derive(Clone, Default)]
pub struct Shutdown {
    flag: Arc<AtomicBool>,
    wakers: Arc<std::sync::Mutex<Vec<Waker>>>,
}

/// How an engine thread asks to be woken from its wait when shutdown is triggered.
type Waker = Arc<dyn Fn() + Send + Sync>;

impl Shutdown {
    pub fn new() -> Self {
        Self::default()
    }

    /// Asks every engine thread to stop accepting, finish in-flight requests and exit.
    pub fn trigger(&self) {
        self.flag.store(true, Ordering::Release);
        let wakers = self.wakers.lock().unwrap_or_else(|e| e.into_inner());
        for waker in wakers.iter() {
            waker();
        }
    }

    pub fn is_triggered(&self) -> bool {
        self.flag.load(Ordering::Acquire)
    }

    pub(crate) fn register(&self, waker: Arc<mio::Waker>) {
        // A failed wake means the loop is already gone; nothing to do.
        self.register_fn(move || drop(waker.wake()));
    }

    /// Registers a wake-up hook; runs it at once if shutdown was already triggered. The
    /// hook must not block: it runs under the registry lock on the triggering thread.
    pub(crate) fn register_fn(&self, waker: impl Fn() + Send + Sync + 'static) {
        let waker: Waker = Arc::new(waker);
        let mut wakers = self.wakers.lock().unwrap_or_else(|e| e.into_inner());
        wakers.push(waker.clone());
        if self.is_triggered() {
            waker();
        }
    }
}

/// A running engine: its bound address and the threads to join.
pub struct RunningEngine {
    /// The engine that runs (resolved: never [`IoEngineKind::Auto`]).
    pub engine: IoEngineKind,
    /// The first listener's address (the one clients of a single `-l` use).
    pub local_addr: SocketAddr,
    /// Every listener, in the order the addresses were given.
    pub listeners: Vec<Listening>,
    pub stats: Arc<EngineStats>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl RunningEngine {
    /// Waits until every engine thread has exited (after [`Shutdown::trigger`]).
    pub fn join(self) {
        for t in self.threads {
            if t.join().is_err() {
                tracing::error!("an engine thread panicked");
            }
        }
    }
}
