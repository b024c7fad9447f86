//! The `threads` engine: a blocking OS thread per connection — the classic multi-threaded ("MT") server,
//! kept as the baseline the event-driven engines are measured against.
//!
//! An acceptor thread accepts and spawns one thread per connection; that thread owns the
//! socket and the session for the connection's whole life and does the classic
//! read → handle → write cycle. It is "blocking" in the sense of the MT model: the thread
//! sleeps in the kernel whenever its connection has nothing to do. It does not sleep in
//! `read(2)` itself but in `poll(2)` on two descriptors — the socket and a per-connection
//! eventfd — because a [`Notify`] from another thread (or shutdown) must be able to wake it;
//! a thread stuck in `read` could only be woken by a signal. Nothing busy-waits: with
//! nothing to do the thread is in `poll` with no timeout (or the idle timeout, or the
//! request timeout while part of a request is held).
//!
//! Per request at pipeline depth 1 that is `poll`, `read`, `write`: one syscall more than
//! a bare blocking server. When a read filled the whole chunk more input is probably
//! waiting, so the next read skips the `poll`. Writes are attempted directly and only a
//! full socket buffer leads to `poll(POLLOUT)`; a thread never reads while it holds
//! unwritten output, which is this engine's backpressure.
//!
//! A session that yields (`Progress::yielded`, memcached's `-R`) is handled like one whose
//! output is full: its replies are written, then its input is offered again at once, since
//! the thread has no other connection to let run.
//!
//! The acceptor waits in `poll(2)` on the listener and its own eventfd, so shutdown stops
//! it at once. On shutdown it closes the listener and joins every connection thread, each
//! of which answers what it already received, writes it (for at most the grace period)
//! and closes.
//!
//! Lock order: the shutdown waker registry, then `live` (the shutdown hook kicks every live
//! connection while holding both); connection threads and the acceptor take only `live`.

use crate::request::{Expiry, RequestClock};
use crate::{
    EngineConfig, EngineStats, IoEngineKind, IoError, Notify, RunningEngine, Service, Session,
    Shutdown,
};
use rustix::event::{EventfdFlags, PollFd, PollFlags, Timespec, eventfd, poll};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Starts the acceptor on `bound`; connection threads are spawned as clients come.
pub(crate) fn start<S: Service>(
    bound: Vec<(std::net::TcpListener, crate::Listening)>,
    config: &EngineConfig,
    service: Arc<S>,
    shutdown: Shutdown,
) -> Result<RunningEngine, IoError> {
    config.validate()?;
    let listeners: Vec<crate::Listening> = bound.iter().map(|(_, l)| *l).collect();
    let local_addr = listeners[0].addr;
    let stats = Arc::new(EngineStats::default());
    let mut threads = Vec::new();
    // One acceptor thread per listener, each with its own connection threads.
    for (listener, listening) in bound {
        let acceptor_wake = Arc::new(Signal::new().map_err(IoError::Poll)?);
        let live: Arc<Mutex<slab::Slab<Arc<Signal>>>> = Arc::default();
        {
            let (acceptor_wake, live) = (acceptor_wake.clone(), live.clone());
            shutdown.register_fn(move || {
                acceptor_wake.kick();
                let live = live.lock().unwrap_or_else(|e| e.into_inner());
                for (_, signal) in live.iter() {
                    signal.kick();
                }
            });
        }
        let acceptor = Acceptor {
            listener,
            listener_addr: listening.addr,
            wake: acceptor_wake,
            live,
            conns: Vec::new(),
            config: config.clone(),
            service: service.clone(),
            stats: stats.clone(),
            shutdown: shutdown.clone(),
        };
        threads.push(
            std::thread::Builder::new()
                .name("cellcache-accept".into())
                .spawn(move || acceptor.run())
                .map_err(IoError::Spawn)?,
        );
        let addr = listening.addr;
        tracing::info!(%addr, engine = "threads", "listening");
    }
    Ok(RunningEngine {
        engine: IoEngineKind::Threads,
        local_addr,
        listeners,
        stats,
        threads,
    })
}

/// An eventfd that wakes one thread out of `poll(2)`, plus a flag saying a [`Notify`]
/// (rather than only shutdown) fired, so the session's `on_notify` runs once per burst.
struct Signal {
    fd: OwnedFd,
    notified: AtomicBool,
}

impl Signal {
    fn new() -> io::Result<Self> {
        let fd = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
        Ok(Self {
            fd,
            notified: AtomicBool::new(false),
        })
    }

    /// Makes the eventfd readable. An error can only be a saturated counter (already
    /// readable), so it is ignored.
    fn kick(&self) {
        let _ = rustix::io::write(&self.fd, &1u64.to_ne_bytes());
    }

    /// A [`Notify`] fired: flag it, and write the eventfd only for the first of a burst.
    fn notify(&self) {
        if !self.notified.swap(true, Ordering::AcqRel) {
            self.kick();
        }
    }

    /// Resets the eventfd after `poll` reported it readable.
    fn drain(&self) {
        let mut buf = [0u8; 8];
        let _ = rustix::io::read(&self.fd, &mut buf);
    }
}

struct Acceptor<S> {
    listener: TcpListener,
    /// The listener's bound address, passed to each connection's session.
    listener_addr: SocketAddr,
    wake: Arc<Signal>,
    /// Wake-ups of live connection threads, for shutdown; a thread removes its own entry.
    live: Arc<Mutex<slab::Slab<Arc<Signal>>>>,
    conns: Vec<JoinHandle<()>>,
    config: EngineConfig,
    service: Arc<S>,
    stats: Arc<EngineStats>,
    shutdown: Shutdown,
}

impl<S: Service> Acceptor<S> {
    fn run(mut self) {
        while !self.shutdown.is_triggered() {
            let mut fds = [
                PollFd::new(&self.listener, PollFlags::IN),
                PollFd::new(&self.wake.fd, PollFlags::IN),
            ];
            match poll(&mut fds, None) {
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => {
                    tracing::error!(error = %e, "acceptor poll failed; no new connections");
                    break;
                }
            }
            if !fds[1].revents().is_empty() {
                self.wake.drain();
            }
            self.accept_all();
            // Reap threads of connections that have closed, so handles do not pile up.
            self.conns.retain(|h| !h.is_finished());
        }
        drop(self.listener);
        tracing::debug!("acceptor stopped; listener closed, joining connection threads");
        for handle in self.conns {
            if handle.join().is_err() {
                tracing::error!("a connection thread panicked");
            }
        }
    }

    fn accept_all(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((stream, peer)) => self.admit(stream, peer),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // EMFILE and friends: log; the next readiness retries.
                    tracing::warn!(error = %e, "accept failed");
                    return;
                }
            }
        }
    }

    fn admit(&mut self, mut stream: TcpStream, peer: SocketAddr) {
        let ip = peer.ip();
        if !self.stats.try_open(
            self.config.max_connections,
            ip,
            self.config.address_limit(ip),
        ) {
            crate::refuse(&mut stream, peer, &self.config, &self.stats);
            return;
        }
        let prepared = (|| {
            stream.set_nonblocking(true)?;
            if self.config.tcp_nodelay {
                stream.set_nodelay(true)?;
            }
            Signal::new().map(Arc::new)
        })();
        let signal = match prepared {
            Ok(signal) => signal,
            Err(e) => {
                tracing::warn!(%peer, error = %e, "cannot set up connection");
                self.stats.closed(ip);
                return;
            }
        };
        let slot = {
            let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
            live.insert(signal.clone())
        };
        let notify = {
            let signal = signal.clone();
            Notify::new(move || signal.notify())
        };
        let conn = Conn {
            ip,
            session: self.service.open(
                crate::Accepted {
                    peer,
                    listener: self.listener_addr,
                    fd: std::os::fd::AsRawFd::as_raw_fd(&stream),
                },
                notify,
            ),
            stream,
            signal,
            input: Vec::new(),
            input_start: 0,
            output: Vec::new(),
            unprocessed: false,
            held: false,
            eof: false,
            closing: false,
            last_read_filled: false,
            request: RequestClock::default(),
            config: self.config.clone(),
            stats: self.stats.clone(),
            shutdown: self.shutdown.clone(),
        };
        let live = self.live.clone();
        let spawned = std::thread::Builder::new()
            .name("cellcache-conn".into())
            .stack_size(self.config.connection_thread_stack_bytes)
            .spawn(move || {
                conn.run();
                live.lock().unwrap_or_else(|e| e.into_inner()).remove(slot);
            });
        match spawned {
            Ok(handle) => self.conns.push(handle),
            Err(e) => {
                // The closure (and with it the session) was dropped unrun: undo the count.
                tracing::warn!(%peer, error = %e, "cannot spawn connection thread");
                self.live
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(slot);
                self.stats.closed(ip);
            }
        }
    }
}

/// One connection, owned by its thread.
struct Conn<S> {
    /// The client's address (the per-address connection limit's key).
    ip: std::net::IpAddr,
    stream: TcpStream,
    session: S,
    signal: Arc<Signal>,
    /// Received, unconsumed bytes are `input[input_start..]`.
    input: Vec<u8>,
    input_start: usize,
    /// Replies not yet written; always empty when the thread reads.
    output: Vec<u8>,
    /// Input may hold a request the session has not been offered yet.
    unprocessed: bool,
    /// The session holds input of its own not served yet (`Progress::buffered`, TLS).
    held: bool,
    eof: bool,
    closing: bool,
    /// The last read filled its whole chunk: more is probably waiting, skip the `poll`.
    last_read_filled: bool,
    /// How long part of a request has been held (`request_timeout_secs`).
    request: RequestClock,
    config: EngineConfig,
    stats: Arc<EngineStats>,
    shutdown: Shutdown,
}

/// Why a connection's wait for input ended.
enum Woken {
    Readable,
    Signalled,
    /// Closed by a timeout, counted as this.
    Expired(Expiry),
}

impl<S: Session> Conn<S> {
    fn run(mut self) {
        if let Err(e) = self.serve() {
            tracing::debug!(error = %e, "connection ended with an error");
        }
        self.session.on_close();
        self.stats.closed(self.ip);
    }

    /// Input not served yet: unconsumed here, or held by the session.
    fn has_input(&self) -> bool {
        self.input_start < self.input.len() || self.held
    }

    /// The connection's life; returns when it should close (the socket closes on drop).
    fn serve(&mut self) -> io::Result<()> {
        let budget = self.config.output_buffer_high_bytes;
        loop {
            let stopping = self.shutdown.is_triggered();
            if self.signal.notified.swap(false, Ordering::AcqRel) {
                let progress = self.session.on_notify(&mut self.output, budget);
                self.closing |= progress.close;
                self.held = progress.holds_input();
                self.unprocessed = self.has_input();
            }
            if self.unprocessed && !self.closing && self.has_input() {
                let progress = self.session.on_input(
                    &self.input[self.input_start..],
                    &mut self.output,
                    budget,
                );
                let consumed = progress.consumed;
                self.input_start += consumed.min(self.input.len() - self.input_start);
                self.held = progress.holds_input();
                let (served, pending) =
                    progress.for_clock(consumed, self.input.len() - self.input_start);
                self.request.offered(served, pending);
                // A yield needs no turn-taking here (this thread serves no other
                // connection): like a full output, write what was produced and go on.
                self.unprocessed = progress.output_full || progress.yielded;
                self.closing |= progress.close;
            } else {
                self.unprocessed = false;
            }
            // MT model: everything produced is written before reading more.
            self.write_all_output(stopping)?;
            if self.closing || ((stopping || self.eof) && !self.unprocessed) {
                return Ok(());
            }
            if self.unprocessed {
                continue;
            }
            match self.wait_readable()? {
                Woken::Readable => self.read_chunk()?,
                Woken::Signalled => {}
                Woken::Expired(why) => {
                    why.count(&self.stats);
                    return Ok(());
                }
            }
        }
    }

    /// Waits until the socket is readable or the eventfd fires. Skips the wait when the
    /// previous read filled its chunk (data is probably queued already).
    fn wait_readable(&mut self) -> io::Result<Woken> {
        if std::mem::take(&mut self.last_read_filled) {
            return Ok(Woken::Readable);
        }
        self.shrink_if_idle();
        let idle_limit = self.config.idle_timeout();
        let request_deadline = self.request.deadline(self.config.request_timeout());
        let since = Instant::now();
        loop {
            let now = Instant::now();
            if request_deadline.is_some_and(|d| now >= d) {
                return Ok(Woken::Expired(Expiry::Request));
            }
            let idle_left = idle_limit.map(|limit| limit.saturating_sub(since.elapsed()));
            let request_left = request_deadline.map(|d| d.saturating_duration_since(now));
            let timeout = match (idle_left, request_left) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            }
            .map(timespec);
            let mut fds = [
                PollFd::new(&self.stream, PollFlags::IN),
                PollFd::new(&self.signal.fd, PollFlags::IN),
            ];
            match poll(&mut fds, timeout.as_ref()) {
                Ok(0) if idle_limit.is_some_and(|limit| since.elapsed() >= limit) => {
                    return Ok(Woken::Expired(Expiry::Idle));
                }
                Ok(0) | Err(rustix::io::Errno::INTR) => continue,
                Ok(_) => {}
                Err(e) => return Err(e.into()),
            }
            let signalled = !fds[1].revents().is_empty();
            let readable = !fds[0].revents().is_empty();
            if signalled {
                self.signal.drain();
                return Ok(Woken::Signalled);
            }
            if readable {
                return Ok(Woken::Readable);
            }
        }
    }

    fn read_chunk(&mut self) -> io::Result<()> {
        let chunk = self.config.read_chunk_bytes;
        if self.input_start == self.input.len() {
            self.input.clear();
            self.input_start = 0;
        } else if self.input_start > 0 && self.input.capacity() - self.input.len() < chunk {
            self.input.drain(..self.input_start);
            self.input_start = 0;
        }
        let end = self.input.len();
        self.input.resize(end + chunk, 0);
        let result = loop {
            match self.stream.read(&mut self.input[end..]) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                other => break other,
            }
        };
        let at_eof = matches!(result, Ok(0));
        let n = match result {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
            Err(e) => {
                self.input.truncate(end);
                return Err(e);
            }
        };
        self.input.truncate(end + n);
        self.eof |= at_eof;
        self.last_read_filled = n == chunk;
        if n > 0 {
            self.unprocessed = true;
            self.request.received(self.input.len() - self.input_start);
            self.stats.bytes_read.fetch_add(n as u64, Ordering::Relaxed);
        }
        if self.eof {
            self.unprocessed = self.has_input();
        }
        if self.input.len() - self.input_start > self.config.input_buffer_max_bytes {
            self.stats.input_overflows.fetch_add(1, Ordering::Relaxed);
            tracing::warn!("client exceeded input_buffer_max_bytes; disconnecting");
            return Err(io::Error::other("input buffer limit exceeded"));
        }
        Ok(())
    }

    /// Writes all pending output, sleeping in `poll(POLLOUT)` while the socket buffer is
    /// full. Once shutdown is triggered it gives up after the grace period; while part of a
    /// request is held, at the request timeout (the client does not read its replies).
    fn write_all_output(&mut self, stopping: bool) -> io::Result<()> {
        let mut written = 0;
        let request_deadline = self.request.deadline(self.config.request_timeout());
        let mut deadline = stopping.then(|| Instant::now() + self.config.shutdown_grace());
        let result = loop {
            if written == self.output.len() {
                break Ok(());
            }
            match self.stream.write(&self.output[written..]) {
                Ok(0) => break Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    written += n;
                    self.stats
                        .bytes_written
                        .fetch_add(n as u64, Ordering::Relaxed);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if deadline.is_none() && self.shutdown.is_triggered() {
                        deadline = Some(Instant::now() + self.config.shutdown_grace());
                    }
                    if request_deadline.is_some_and(|d| Instant::now() >= d) {
                        Expiry::Request.count(&self.stats);
                        break Err(io::Error::other(
                            "request timeout expired with output pending",
                        ));
                    }
                    let wake = match (deadline, request_deadline) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                    let timeout =
                        wake.map(|d| timespec(d.saturating_duration_since(Instant::now())));
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        break Err(io::Error::other(
                            "shutdown grace expired with output pending",
                        ));
                    }
                    let mut fds = [
                        PollFd::new(&self.stream, PollFlags::OUT),
                        PollFd::new(&self.signal.fd, PollFlags::IN),
                    ];
                    match poll(&mut fds, timeout.as_ref()) {
                        Ok(_) | Err(rustix::io::Errno::INTR) => {}
                        Err(e) => break Err(e.into()),
                    }
                    if !fds[1].revents().is_empty() {
                        // A notify or shutdown; `notified` stays set for the main loop.
                        self.signal.drain();
                    }
                }
                Err(e) => break Err(e),
            }
        };
        self.output.clear();
        result
    }

    fn shrink_if_idle(&mut self) {
        let keep = self.config.idle_buffer_keep_bytes;
        if self.input_start == self.input.len() && self.input.capacity() > keep {
            self.input = Vec::new();
            self.input_start = 0;
        }
        if self.output.capacity() > keep {
            self.output = Vec::new();
        }
    }
}

fn timespec(d: Duration) -> Timespec {
    Timespec {
        tv_sec: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        tv_nsec: i64::from(d.subsec_nanos()),
    }
}
