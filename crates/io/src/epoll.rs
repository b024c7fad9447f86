//! The `epoll` engine: one non-blocking, edge-triggered event loop per worker thread
//! (through mio, which is epoll on Linux), plus an acceptor thread that deals accepted
//! sockets to workers round-robin — memcached's thread model.
//!
//! Why an acceptor thread rather than `SO_REUSEPORT` listeners per worker: the kernel's
//! reuseport hash can put the few connections of a small client on one worker and leave
//! the others idle; dealing round-robin keeps workers evenly loaded at any connection count.
//!
//! Each connection is owned by one worker for its whole life, so sessions need no locks.
//! Edge-triggered readiness means a readable socket is read until it is drained: until
//! `WouldBlock`, or until a read returns less than the room it was given, which on a stream
//! socket means the receive queue is empty (epoll(7)); that saves the `EAGAIN` read per
//! request batch (measured in docs/io-engines.md). When the peer's FIN was reported, reads go
//! on to `WouldBlock`/EOF so the close is never missed. A connection that still has work
//! after `ROUNDS_PER_TURN` rounds goes on the worker's ready queue, so one busy pipelining
//! client cannot starve the others; so does one whose session yielded (`Progress::yielded`:
//! it ran its per-event request limit with input left), at once; its replies so far are
//! written with the next ones, once its input is drained or its output reaches the high-water
//! mark (one send per batch, not one per yield).

use crate::request::{Expiry, RequestClock};
use crate::{
    Accepted, EngineConfig, EngineStats, IoError, Notify, RunningEngine, Service, Session, Shutdown,
};
use crossbeam_channel::{Receiver, Sender};
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token, Waker};
use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Rounds of read → handle → write one connection gets before others are served.
const ROUNDS_PER_TURN: usize = 8;
/// Token of a worker's or the acceptor's waker; connections use slab keys below it.
const WAKER: Token = Token(usize::MAX);
/// Token of the listening socket in the acceptor's poll.
const LISTENER: Token = Token(usize::MAX - 1);
/// How often a worker wakes with nothing to do, to run the idle sweep and shutdown checks.
const HOUSEKEEPING_TICK: Duration = Duration::from_millis(500);

/// Starts the acceptor on `bound` and `config.worker_threads()` workers.
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
    let mut inboxes = Vec::new();
    for id in 0..config.worker_threads() {
        let poll = Poll::new().map_err(IoError::Poll)?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER).map_err(IoError::Poll)?);
        shutdown.register(waker.clone());
        let (tx, rx) = crossbeam_channel::unbounded();
        let (notify_tx, notify_rx) = crossbeam_channel::unbounded();
        inboxes.push((tx, waker.clone()));
        let worker = Worker {
            id,
            poll,
            inbox: rx,
            waker,
            notify_tx,
            notify_rx,
            conns: slab::Slab::new(),
            ready: VecDeque::new(),
            config: config.clone(),
            service: service.clone(),
            stats: stats.clone(),
            shutdown: shutdown.clone(),
        };
        let handle = std::thread::Builder::new()
            .name(format!("cellcache-worker-{id}"))
            .spawn(move || worker.run())
            .map_err(IoError::Spawn)?;
        threads.push(handle);
    }
    for (listener, listening) in bound {
        let acceptor = Acceptor::new(
            TcpListener::from_std(listener),
            listening.addr,
            inboxes.clone(),
            config.clone(),
            stats.clone(),
            &shutdown,
        )?;
        threads.push(
            std::thread::Builder::new()
                .name("cellcache-accept".into())
                .spawn(move || acceptor.run())
                .map_err(IoError::Spawn)?,
        );
        let addr = listening.addr;
        tracing::info!(%addr, workers = config.worker_threads(), engine = "epoll", "listening");
    }
    Ok(RunningEngine {
        engine: crate::IoEngineKind::Epoll,
        local_addr,
        listeners,
        stats,
        threads,
    })
}

/// A worker's inbox for accepted sockets and the waker that makes it look.
type WorkerInbox = (Sender<(TcpStream, Accepted)>, Arc<Waker>);

struct Acceptor {
    poll: Poll,
    listener: TcpListener,
    /// The listener's bound address, passed to each connection's session.
    listener_addr: SocketAddr,
    workers: Vec<WorkerInbox>,
    next: usize,
    config: EngineConfig,
    stats: Arc<EngineStats>,
    shutdown: Shutdown,
}

impl Acceptor {
    fn new(
        mut listener: TcpListener,
        listener_addr: SocketAddr,
        workers: Vec<WorkerInbox>,
        config: EngineConfig,
        stats: Arc<EngineStats>,
        shutdown: &Shutdown,
    ) -> Result<Self, IoError> {
        let poll = Poll::new().map_err(IoError::Poll)?;
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)
            .map_err(IoError::Poll)?;
        shutdown.register(Arc::new(
            Waker::new(poll.registry(), WAKER).map_err(IoError::Poll)?,
        ));
        Ok(Self {
            poll,
            listener,
            listener_addr,
            workers,
            next: 0,
            config,
            stats,
            shutdown: shutdown.clone(),
        })
    }

    fn run(mut self) {
        let mut events = Events::with_capacity(16);
        while !self.shutdown.is_triggered() {
            if let Err(e) = self.poll.poll(&mut events, Some(HOUSEKEEPING_TICK)) {
                if e.kind() != io::ErrorKind::Interrupted {
                    tracing::error!(error = %e, "acceptor poll failed; no new connections");
                    return;
                }
            }
            self.accept_all();
        }
        tracing::debug!("acceptor stopped; listener closed");
    }

    fn accept_all(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((mut stream, peer)) => {
                    let ip = peer.ip();
                    let per_address = self.config.address_limit(ip);
                    if !self
                        .stats
                        .try_open(self.config.max_connections, ip, per_address)
                    {
                        crate::refuse(&mut stream, peer, &self.config, &self.stats);
                        continue;
                    }
                    if self.config.tcp_nodelay {
                        let _ = stream.set_nodelay(true);
                    }
                    let (tx, waker) = &self.workers[self.next % self.workers.len()];
                    self.next = self.next.wrapping_add(1);
                    let accepted = Accepted {
                        peer,
                        listener: self.listener_addr,
                        fd: stream.as_raw_fd(),
                    };
                    if tx.send((stream, accepted)).is_err() {
                        self.stats.closed(ip);
                        continue;
                    }
                    let _ = waker.wake();
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // EMFILE and friends: log and let the next readiness event retry.
                    tracing::warn!(error = %e, "accept failed");
                    return;
                }
            }
        }
    }
}

/// One client connection as a worker sees it.
struct Conn<S> {
    /// The client's address (the per-address connection limit's key).
    ip: std::net::IpAddr,
    stream: TcpStream,
    session: S,
    /// Received bytes live in `input[input_start..input_end]`; the rest of `input` is
    /// initialised spare room, so reads never re-zero memory.
    input: Vec<u8>,
    input_start: usize,
    input_end: usize,
    /// Replies wait in `output[output_start..]`.
    output: Vec<u8>,
    output_start: usize,
    /// Edge-triggered: the socket may hold unread bytes until it is known to be drained.
    readable: bool,
    /// The peer's FIN (or a hang-up) was reported: read to EOF, never stop at a short read,
    /// because no further edge will announce the close.
    read_closed: bool,
    /// Unconsumed input may hold a complete request the session has not seen yet.
    unprocessed: bool,
    /// The session holds input of its own not served yet (`Progress::buffered`, TLS).
    held: bool,
    /// The session yielded in the last `handle`: the turn ends after the write.
    yielded: bool,
    eof: bool,
    closing: bool,
    last_active: Instant,
    /// How long part of a request has been held (`request_timeout_secs`).
    request: RequestClock,
}

enum Next {
    Idle,
    MoreWork,
    Close,
}

impl<S: Session> Conn<S> {
    fn pending_output(&self) -> usize {
        self.output.len() - self.output_start
    }

    /// Input not served yet: unconsumed here, or held by the session.
    fn has_input(&self) -> bool {
        self.input_start < self.input_end || self.held
    }

    fn flush(&mut self, stats: &EngineStats) -> io::Result<bool> {
        let mut wrote = false;
        while self.output_start < self.output.len() {
            match self.stream.write(&self.output[self.output_start..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    self.output_start += n;
                    stats
                        .bytes_written
                        .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
                    wrote = true;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
        if self.output_start == self.output.len() {
            self.output.clear();
            self.output_start = 0;
        }
        Ok(wrote)
    }

    /// Reads one chunk. Returns bytes read (0 on would-block or EOF).
    fn read_chunk(&mut self, config: &EngineConfig, stats: &EngineStats) -> io::Result<usize> {
        if self.input_start == self.input_end {
            self.input_start = 0;
            self.input_end = 0;
        } else if self.input_start > 0
            && self.input.len() - self.input_end < config.read_chunk_bytes
        {
            self.input.copy_within(self.input_start..self.input_end, 0);
            self.input_end -= self.input_start;
            self.input_start = 0;
        }
        if self.input.len() - self.input_end < config.read_chunk_bytes {
            self.input
                .resize(self.input_end + config.read_chunk_bytes, 0);
        }
        loop {
            match self.stream.read(&mut self.input[self.input_end..]) {
                Ok(0) => {
                    self.eof = true;
                    return Ok(0);
                }
                Ok(n) => {
                    // A short read drained the receive queue: whatever arrives later raises
                    // a new edge, so the `EAGAIN` read can be skipped.
                    if n < self.input.len() - self.input_end && !self.read_closed {
                        self.readable = false;
                    }
                    self.input_end += n;
                    stats
                        .bytes_read
                        .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.readable = false;
                    return Ok(0);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }

    fn handle(&mut self, config: &EngineConfig) {
        let budget = config.output_buffer_high_bytes;
        let progress = self.session.on_input(
            &self.input[self.input_start..self.input_end],
            &mut self.output,
            budget,
        );
        let consumed = progress.consumed;
        debug_assert!(consumed <= self.input_end - self.input_start);
        self.input_start += consumed.min(self.input_end - self.input_start);
        self.held = progress.holds_input();
        let (served, pending) = progress.for_clock(consumed, self.input_end - self.input_start);
        self.request.offered(served, pending);
        self.unprocessed = progress.output_full || progress.yielded;
        self.yielded = progress.yielded;
        if progress.close {
            self.closing = true;
        }
    }

    /// Runs handle → write → read rounds until the connection has nothing left to do
    /// right now, or its turn is over (after `ROUNDS_PER_TURN` rounds, or at once when the
    /// session yielded). Replies are written as soon as they are produced, before the next
    /// read, so no read syscall delays them.
    fn drive(&mut self, config: &EngineConfig, stats: &EngineStats, stopping: bool) -> Next {
        for _ in 0..ROUNDS_PER_TURN {
            let mut progressed = false;
            let room = self.pending_output() < config.output_buffer_high_bytes;
            if room && self.unprocessed && !self.closing && self.has_input() {
                let before = (self.input_start, self.output.len());
                self.handle(config);
                progressed |= before != (self.input_start, self.output.len());
            }
            if self.yielded && !self.closing {
                // The rest of its input waits until the other ready connections had their
                // turn. Its replies wait with it (under the output high-water mark, which
                // stops the session before it is reached): written once the input is
                // drained, in one send instead of one per yield.
                self.yielded = false;
                return Next::MoreWork;
            }
            match self.flush(stats) {
                Ok(wrote) => progressed |= wrote,
                Err(_) => return Next::Close,
            }
            let room = self.pending_output() < config.output_buffer_high_bytes;
            if self.closing || (stopping && !self.unprocessed) || (self.eof && !self.unprocessed) {
                return match self.flush(stats) {
                    Ok(_) if self.pending_output() == 0 => Next::Close,
                    Ok(_) => Next::Idle,
                    Err(_) => Next::Close,
                };
            }
            if room && self.readable && !self.eof && !stopping {
                match self.read_chunk(config, stats) {
                    Ok(n) if n > 0 => {
                        self.unprocessed = true;
                        self.last_active = Instant::now();
                        self.request.received(self.input_end - self.input_start);
                        progressed = true;
                    }
                    Ok(_) => progressed |= self.eof,
                    Err(_) => return Next::Close,
                }
                if self.eof {
                    self.unprocessed = self.has_input();
                }
                if self.input_end - self.input_start > config.input_buffer_max_bytes {
                    stats
                        .input_overflows
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    tracing::warn!("client exceeded input_buffer_max_bytes; disconnecting");
                    return Next::Close;
                }
            }
            if !progressed {
                return Next::Idle;
            }
        }
        Next::MoreWork
    }

    fn shrink_if_idle(&mut self, keep: usize) {
        if self.input_start == self.input_end && self.input.len() > keep {
            self.input = Vec::new();
            self.input_start = 0;
            self.input_end = 0;
        }
        if self.output.is_empty() && self.output.capacity() > keep {
            self.output = Vec::new();
        }
    }
}

struct Worker<S: Service> {
    id: usize,
    poll: Poll,
    inbox: Receiver<(TcpStream, Accepted)>,
    waker: Arc<Waker>,
    /// Keys of connections whose [`Notify`] fired; drained on every wake.
    notify_tx: Sender<usize>,
    notify_rx: Receiver<usize>,
    conns: slab::Slab<Conn<S::Session>>,
    /// Connections whose turn ended with work left (fairness queue).
    ready: VecDeque<usize>,
    config: EngineConfig,
    service: Arc<S>,
    stats: Arc<EngineStats>,
    shutdown: Shutdown,
}

impl<S: Service> Worker<S> {
    fn run(mut self) {
        let mut events = Events::with_capacity(self.config.events_per_poll);
        let mut last_sweep = Instant::now();
        let mut stop_deadline: Option<Instant> = None;
        loop {
            let timeout = if self.ready.is_empty() {
                Some(HOUSEKEEPING_TICK)
            } else {
                Some(Duration::ZERO)
            };
            if let Err(e) = self.poll.poll(&mut events, timeout) {
                if e.kind() != io::ErrorKind::Interrupted {
                    tracing::error!(worker = self.id, error = %e, "poll failed; worker exits");
                    break;
                }
            }
            let stopping = self.shutdown.is_triggered();
            for event in events.iter() {
                match event.token() {
                    WAKER => {
                        self.adopt_new();
                        self.run_notified(stopping);
                    }
                    Token(key) => {
                        if let Some(conn) = self.conns.get_mut(key) {
                            conn.readable |= event.is_readable() || event.is_read_closed();
                            conn.read_closed |= event.is_read_closed();
                            self.turn(key, stopping);
                        }
                    }
                }
            }
            for _ in 0..self.ready.len() {
                if let Some(key) = self.ready.pop_front() {
                    if self.conns.contains(key) {
                        self.turn(key, stopping);
                    }
                }
            }
            if stopping {
                let deadline = *stop_deadline.get_or_insert_with(|| {
                    // Give every connection one turn to finish what it already received.
                    let keys: Vec<usize> = self.conns.iter().map(|(k, _)| k).collect();
                    for key in keys {
                        self.turn(key, true);
                    }
                    Instant::now() + self.config.shutdown_grace()
                });
                if self.conns.is_empty() || Instant::now() >= deadline {
                    break;
                }
            }
            if last_sweep.elapsed() >= HOUSEKEEPING_TICK {
                self.housekeeping();
                last_sweep = Instant::now();
            }
        }
        let keys: Vec<usize> = self.conns.iter().map(|(k, _)| k).collect();
        for key in keys {
            self.close(key);
        }
        tracing::debug!(worker = self.id, "worker stopped");
    }

    fn adopt_new(&mut self) {
        while let Ok((mut stream, accepted)) = self.inbox.try_recv() {
            let peer = accepted.peer;
            if self.shutdown.is_triggered() {
                self.stats.closed(peer.ip());
                continue;
            }
            let key = self.conns.vacant_key();
            let notify = self.notify_for(key);
            if let Err(e) = self.poll.registry().register(
                &mut stream,
                Token(key),
                Interest::READABLE | Interest::WRITABLE,
            ) {
                tracing::warn!(%peer, error = %e, "cannot register connection");
                self.stats.closed(peer.ip());
                continue;
            }
            self.conns.insert(Conn {
                stream,
                ip: peer.ip(),
                session: self.service.open(accepted, notify),
                input: Vec::new(),
                input_start: 0,
                input_end: 0,
                output: Vec::new(),
                output_start: 0,
                readable: true,
                read_closed: false,
                unprocessed: false,
                held: false,
                yielded: false,
                eof: false,
                closing: false,
                last_active: Instant::now(),
                request: RequestClock::default(),
            });
            self.turn(key, false);
        }
    }

    fn notify_for(&self, key: usize) -> Notify {
        let tx = self.notify_tx.clone();
        let waker = self.waker.clone();
        Notify::new(move || {
            if tx.send(key).is_ok() {
                let _ = waker.wake();
            }
        })
    }

    /// Lets notified sessions emit what became ready, then gives them a turn.
    /// A key may be stale (its connection closed, the slot reused): `on_notify` must
    /// tolerate spurious calls, so that is harmless.
    fn run_notified(&mut self, stopping: bool) {
        while let Ok(key) = self.notify_rx.try_recv() {
            let budget = self.config.output_buffer_high_bytes;
            let Some(conn) = self.conns.get_mut(key) else {
                continue;
            };
            let progress = conn.session.on_notify(&mut conn.output, budget);
            conn.closing |= progress.close;
            conn.held = progress.holds_input();
            conn.unprocessed = conn.has_input();
            self.turn(key, stopping);
        }
    }

    fn turn(&mut self, key: usize, stopping: bool) {
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        match conn.drive(&self.config, &self.stats, stopping) {
            Next::Idle => {}
            Next::MoreWork => self.ready.push_back(key),
            Next::Close => self.close(key),
        }
    }

    fn close(&mut self, key: usize) {
        if self.conns.contains(key) {
            let mut conn = self.conns.remove(key);
            let _ = self.poll.registry().deregister(&mut conn.stream);
            conn.session.on_close();
            self.stats.closed(conn.ip);
        }
    }

    fn housekeeping(&mut self) {
        let keep = self.config.idle_buffer_keep_bytes;
        let idle_limit = self.config.idle_timeout();
        let request_limit = self.config.request_timeout();
        let now = Instant::now();
        let mut expired = Vec::new();
        for (key, conn) in self.conns.iter_mut() {
            conn.shrink_if_idle(keep);
            if conn.request.expired(request_limit, now) {
                expired.push((key, Expiry::Request));
            } else if let Some(limit) = idle_limit {
                if conn.last_active.elapsed() >= limit && conn.pending_output() == 0 {
                    expired.push((key, Expiry::Idle));
                }
            }
        }
        for (key, why) in expired {
            why.count(&self.stats);
            self.close(key);
        }
    }
}
