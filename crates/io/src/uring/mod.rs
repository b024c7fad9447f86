//! The `uring` engine: one io_uring per worker thread (thread-per-core), fed by an
//! acceptor ring that deals accepted sockets round-robin — the epoll engine's thread
//! model with readiness replaced by completions.
//!
//! Per worker: a submission/completion ring pair shared with the kernel (kevent's
//! argument: events delivered through memory both sides see, not one syscall per event),
//! one provided buffer ring registered with the kernel, and per connection one multishot
//! receive (armed once, completes once per arriving segment into a buffer the kernel picks
//! from the buffer ring) and at most one send in flight. Everything a turn of the loop
//! queued goes to the kernel in the one `io_uring_enter` that also waits for the next
//! completions, so a pipelining client costs one syscall per batch, not per request.
//!
//! Why an acceptor ring rather than an `SO_REUSEPORT` listener per worker: as in the epoll
//! engine, the reuseport hash can leave a worker idle when a client opens few connections,
//! and dealing round-robin keeps workers even; cellcache clients hold connections for a
//! long time, so the extra hop (a channel push and an eventfd write per accepted
//! connection) is off the request path. Its ring uses a multishot accept.
//!
//! Receive path: a completion names a provided buffer. When the connection has no leftover
//! input the session parses straight out of that buffer (no copy); only an unconsumed tail
//! is copied into the connection's input, and the buffer goes back to the ring at once.
//! Send path: sessions append to `output`; a send is issued from a second buffer,
//! `sending`, which the connection slot owns and nobody touches until the completion
//! arrives; the two are swapped when `sending` is done, so a session appending never moves
//! memory the kernel is reading. Plain `send` is used: `SendZc` pays a second completion
//! (the buffer-release notification) and page pinning per send, which only large sends can
//! repay; cache replies are mostly small, and SendZc was not measured here (see
//! docs/io-engines.md).
//!
//! Backpressure: while pending output is above the high mark the receive is cancelled
//! (a multishot receive cannot be paused) and re-armed when output drains.
//!
//! Ownership rule that makes the `unsafe` sound: every buffer handed to the kernel (the
//! send buffer, the provided buffers and their ring, the eventfd read buffer) is owned by
//! a structure that outlives the operation: a connection slot is freed only after the
//! completions of all its operations arrived (close = cancel, then wait), the buffer ring is
//! unregistered before it is freed, and when a worker cannot drain its ring it leaks these
//! buffers rather than free memory the kernel might still write.
//!
//! Notify and shutdown wake a worker through an eventfd read kept armed in its ring.
//!
//! Yielding (`Progress::yielded`, memcached's `-R`): a connection whose session stopped at
//! its per-event request limit with input left goes on the worker's ready queue and its
//! session is not run again (input that arrives meanwhile is only appended) until the
//! queue is drained, after the batch of completions in hand. No completion may ever come
//! for it — requests that produce no reply (`noreply`) leave nothing to send — so while the
//! queue is non-empty the worker submits without waiting for completions. Its replies so far
//! wait with it and leave in one send once its input is drained (or its output reaches the
//! high-water mark), not one send per yield.

mod conn;
mod probe;
mod ring;

pub use probe::{UringUnavailable, UringUnavailableCause, uring_support};

use crate::{
    Accepted, EngineConfig, EngineStats, IoEngineKind, IoError, Notify, Progress, RunningEngine,
    Service, Session, Shutdown,
};
use conn::Conn;
use crossbeam_channel::{Receiver, Sender};
use io_uring::{IoUring, cqueue, opcode, types};
use ring::{
    Op, ProvidedBuffers, WakeFd, WakeRead, decode, new_ring, push, submit, user_data, wait,
};
use std::collections::VecDeque;
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// How long a ring waits for completions before running housekeeping (idle sweep,
/// shutdown deadline).
const HOUSEKEEPING_TICK: Duration = Duration::from_millis(500);
/// After an accept error that ended the multishot accept (e.g. EMFILE), wait this long
/// before arming it again, so a persistent error does not spin.
const ACCEPT_RETRY_DELAY: Duration = Duration::from_millis(100);
/// Waits for outstanding completions (cancelled operations) when a ring is torn down;
/// past it the buffers those operations use are leaked rather than freed.
pub(super) const DRAIN_WAITS: usize = 20;
/// Submission queue entries of the acceptor's ring: it has at most two operations.
pub(super) const ACCEPTOR_RING_ENTRIES: u32 = 8;
/// Buffer group id of a worker's provided buffer ring (one group per ring).
pub(super) const BUFFER_GROUP: u16 = 0;

/// Starts the acceptor ring on `bound` and `config.worker_threads()` worker rings.
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
        let ring = new_ring(config.uring_queue_entries).map_err(IoError::Poll)?;
        let bufs = ProvidedBuffers::new(
            &ring,
            config.uring_provided_buffers,
            config.read_chunk_bytes,
            BUFFER_GROUP,
        )
        .map_err(IoError::Poll)?;
        let wake = Arc::new(WakeFd::new().map_err(IoError::Poll)?);
        {
            let wake = wake.clone();
            shutdown.register_fn(move || wake.kick());
        }
        let (tx, rx) = crossbeam_channel::unbounded();
        let (notify_tx, notify_rx) = crossbeam_channel::unbounded();
        inboxes.push((tx, wake.clone()));
        let worker = Worker {
            id,
            ring,
            bufs,
            conns: slab::Slab::new(),
            next_generation: 0,
            wake: WakeRead {
                wake,
                buf: Box::new([0; 8]),
                armed: false,
            },
            inbox: rx,
            notify_tx,
            notify_rx,
            completions: Vec::new(),
            ready: VecDeque::new(),
            config: config.clone(),
            service: service.clone(),
            stats: stats.clone(),
            shutdown: shutdown.clone(),
        };
        threads.push(
            std::thread::Builder::new()
                .name(format!("cellcache-uring-{id}"))
                .spawn(move || worker.run())
                .map_err(IoError::Spawn)?,
        );
    }
    // One acceptor ring and thread per listener, all dealing to the same workers.
    for (listener, listening) in bound {
        let wake = Arc::new(WakeFd::new().map_err(IoError::Poll)?);
        {
            let wake = wake.clone();
            shutdown.register_fn(move || wake.kick());
        }
        let acceptor = Acceptor {
            ring: new_ring(ACCEPTOR_RING_ENTRIES).map_err(IoError::Poll)?,
            listener,
            listener_addr: listening.addr,
            wake: WakeRead {
                wake,
                buf: Box::new([0; 8]),
                armed: false,
            },
            accept_armed: false,
            retry_at: None,
            workers: inboxes.clone(),
            next: 0,
            config: config.clone(),
            stats: stats.clone(),
            shutdown: shutdown.clone(),
        };
        threads.push(
            std::thread::Builder::new()
                .name("cellcache-uring-accept".into())
                .spawn(move || acceptor.run())
                .map_err(IoError::Spawn)?,
        );
        let addr = listening.addr;
        tracing::info!(%addr, workers = config.worker_threads(), engine = "uring", "listening");
    }
    Ok(RunningEngine {
        engine: IoEngineKind::Uring,
        local_addr,
        listeners,
        stats,
        threads,
    })
}

/// A worker's inbox for accepted sockets and the eventfd that makes it look.
type WorkerInbox = (Sender<(TcpStream, Accepted)>, Arc<WakeFd>);

struct Acceptor {
    ring: IoUring,
    listener: TcpListener,
    /// The listener's bound address, passed to each connection's session.
    listener_addr: SocketAddr,
    wake: WakeRead,
    accept_armed: bool,
    /// When to re-arm an accept that ended in an error.
    retry_at: Option<Instant>,
    workers: Vec<WorkerInbox>,
    next: usize,
    config: EngineConfig,
    stats: Arc<EngineStats>,
    shutdown: Shutdown,
}

impl Acceptor {
    fn run(mut self) {
        if let Err(e) = self.serve() {
            tracing::error!(error = %e, "acceptor ring failed; no new connections");
        }
        self.finish();
    }

    fn serve(&mut self) -> io::Result<()> {
        self.wake.arm(&mut self.ring)?;
        while !self.shutdown.is_triggered() {
            if !self.accept_armed && self.retry_at.is_none_or(|at| Instant::now() >= at) {
                self.arm_accept()?;
            }
            // Idle, the acceptor sleeps until a connection or the shutdown eventfd; it only
            // needs a short timeout while an accept retry is pending.
            let timeout = if self.retry_at.is_some() {
                ACCEPT_RETRY_DELAY
            } else {
                HOUSEKEEPING_TICK
            };
            wait(&self.ring, timeout)?;
            let completions: Vec<_> = self
                .ring
                .completion()
                .map(|c| (c.user_data(), c.result(), c.flags()))
                .collect();
            for (data, result, flags) in completions {
                match decode(data).2 {
                    Some(Op::Accept) => {
                        self.accept_armed = cqueue::more(flags);
                        self.accepted(result);
                        if !self.accept_armed && result < 0 {
                            self.retry_at = Some(Instant::now() + ACCEPT_RETRY_DELAY);
                        }
                    }
                    Some(Op::Wake) => {
                        self.wake.armed = false;
                        self.wake.arm(&mut self.ring)?;
                    }
                    _ => {}
                }
            }
        }
        Ok(())
    }

    fn arm_accept(&mut self) -> io::Result<()> {
        let accept = opcode::AcceptMulti::new(types::Fd(self.listener.as_raw_fd()))
            .flags(libc::SOCK_CLOEXEC)
            .build()
            .user_data(user_data(0, 0, Op::Accept));
        // SAFETY: a multishot accept without an address buffer refers to no memory.
        unsafe { push(&mut self.ring, &accept) }?;
        self.accept_armed = true;
        self.retry_at = None;
        Ok(())
    }

    fn accepted(&mut self, result: i32) {
        if result < 0 {
            let e = io::Error::from_raw_os_error(-result);
            tracing::warn!(error = %e, "accept failed");
            return;
        }
        // SAFETY: a successful accept completion's result is a new descriptor that nothing
        // else owns; wrapping it makes it closed exactly once.
        let mut stream = unsafe { TcpStream::from_raw_fd(result) };
        let Ok(peer) = stream.peer_addr() else {
            // The client is already gone.
            return;
        };
        let ip = peer.ip();
        if !self.stats.try_open(
            self.config.max_connections,
            ip,
            self.config.address_limit(ip),
        ) {
            // Non-blocking so the acceptor never waits.
            let _ = stream.set_nonblocking(true);
            crate::refuse(&mut stream, peer, &self.config, &self.stats);
            return;
        }
        if self.config.tcp_nodelay {
            let _ = stream.set_nodelay(true);
        }
        let (tx, wake) = &self.workers[self.next % self.workers.len()];
        self.next = self.next.wrapping_add(1);
        let accepted = Accepted {
            peer,
            listener: self.listener_addr,
            fd: stream.as_raw_fd(),
        };
        if tx.send((stream, accepted)).is_err() {
            self.stats.closed(ip);
            return;
        }
        wake.wake();
    }

    /// Cancels the accept and the wake read and waits for their completions, closing any
    /// socket accepted meanwhile; leaks the wake buffer if the ring cannot be drained.
    fn finish(mut self) {
        for (armed, op) in [(self.accept_armed, Op::Accept), (self.wake.armed, Op::Wake)] {
            if armed {
                let cancel = opcode::AsyncCancel::new(user_data(0, 0, op))
                    .build()
                    .user_data(user_data(0, 0, Op::Cancel));
                // SAFETY: a cancel refers to no memory.
                if unsafe { push(&mut self.ring, &cancel) }.is_err() {
                    break;
                }
            }
        }
        for _ in 0..DRAIN_WAITS {
            if !self.accept_armed && !self.wake.armed {
                break;
            }
            if wait(&self.ring, HOUSEKEEPING_TICK).is_err() {
                break;
            }
            let completions: Vec<_> = self
                .ring
                .completion()
                .map(|c| (c.user_data(), c.result(), c.flags()))
                .collect();
            for (data, result, flags) in completions {
                match decode(data).2 {
                    Some(Op::Accept) => {
                        self.accept_armed = cqueue::more(flags);
                        if result >= 0 {
                            // SAFETY: a fresh descriptor from accept, owned by nobody else.
                            drop(unsafe { OwnedFd::from_raw_fd(result) });
                        }
                    }
                    Some(Op::Wake) => self.wake.armed = false,
                    _ => {}
                }
            }
        }
        if self.wake.armed {
            tracing::error!("acceptor ring did not drain; leaking its wake buffer");
            std::mem::forget(std::mem::replace(&mut self.wake.buf, Box::new([0; 8])));
        }
        tracing::debug!("acceptor stopped; listener closed");
    }
}

struct Worker<S: Service> {
    id: usize,
    ring: IoUring,
    bufs: ProvidedBuffers,
    conns: slab::Slab<Conn<S::Session>>,
    next_generation: u32,
    wake: WakeRead,
    inbox: Receiver<(TcpStream, Accepted)>,
    /// (slot, generation) of connections whose [`Notify`] fired.
    notify_tx: Sender<(usize, u32)>,
    notify_rx: Receiver<(usize, u32)>,
    /// Reused buffer for one batch of completions.
    completions: Vec<(u64, i32, u32)>,
    /// (slot, generation) of connections whose session yielded, run again after the
    /// current batch of completions (fairness; see the module doc).
    ready: VecDeque<(usize, u32)>,
    config: EngineConfig,
    service: Arc<S>,
    stats: Arc<EngineStats>,
    shutdown: Shutdown,
}

impl<S: Service> Worker<S> {
    fn run(mut self) {
        if let Err(e) = self.serve() {
            tracing::error!(worker = self.id, error = %e, "io_uring worker failed; closing its connections");
            self.abandon_all();
        }
        self.finish();
    }

    fn serve(&mut self) -> io::Result<()> {
        self.wake.arm(&mut self.ring)?;
        let mut last_sweep = Instant::now();
        let mut stop_deadline: Option<Instant> = None;
        let mut forced = false;
        loop {
            if self.shutdown.is_triggered() {
                let deadline = match stop_deadline {
                    Some(deadline) => deadline,
                    None => {
                        // Stop reading; let every connection finish what it received.
                        self.adopt_new()?;
                        let keys: Vec<usize> = self.conns.iter().map(|(k, _)| k).collect();
                        for key in keys {
                            self.advance(key)?;
                        }
                        *stop_deadline.insert(Instant::now() + self.config.shutdown_grace())
                    }
                };
                if self.conns.is_empty() {
                    return Ok(());
                }
                if !forced && Instant::now() >= deadline {
                    forced = true;
                    self.abandon_all();
                }
                if forced && Instant::now() >= deadline + self.config.shutdown_grace() {
                    return Err(io::Error::other("cancelled operations did not complete"));
                }
            }
            if self.ready.is_empty() {
                wait(&self.ring, HOUSEKEEPING_TICK)?;
            } else {
                // Yielded connections are waiting: never sleep on a completion that may
                // not come.
                submit(&self.ring)?;
            }
            self.completions.clear();
            self.completions.extend(
                self.ring
                    .completion()
                    .map(|c| (c.user_data(), c.result(), c.flags())),
            );
            let completions = std::mem::take(&mut self.completions);
            for &(data, result, flags) in &completions {
                self.complete(data, result, flags)?;
            }
            self.completions = completions;
            self.run_yielded()?;
            if last_sweep.elapsed() >= HOUSEKEEPING_TICK {
                self.housekeeping()?;
                last_sweep = Instant::now();
            }
        }
    }

    fn complete(&mut self, data: u64, result: i32, flags: u32) -> io::Result<()> {
        let (key, generation, op) = decode(data);
        match op {
            Some(Op::Wake) => {
                self.wake.armed = false;
                self.wake.wake.pending.store(false, Ordering::Release);
                self.wake.arm(&mut self.ring)?;
                self.adopt_new()?;
                self.run_notified()?;
            }
            Some(Op::Recv) => self.received(key, generation, result, flags)?,
            Some(Op::Send) => self.sent(key, generation, result)?,
            Some(Op::Cancel | Op::Accept) | None => {}
        }
        Ok(())
    }

    fn received(&mut self, key: usize, generation: u32, result: i32, flags: u32) -> io::Result<()> {
        let buffer = cqueue::buffer_select(flags);
        let Self {
            conns,
            bufs,
            config,
            stats,
            ready,
            ..
        } = self;
        let Some(conn) = conns.get_mut(key).filter(|c| c.generation == generation) else {
            // Cannot happen (slots outlive their operations), but never lose a buffer.
            if let Some(bid) = buffer {
                bufs.recycle(bid);
            }
            return Ok(());
        };
        conn.recv_armed = cqueue::more(flags);
        if !conn.recv_armed {
            conn.recv_cancelled = false;
        }
        match result {
            n if n > 0 => {
                let len = n as usize;
                stats.bytes_read.fetch_add(len as u64, Ordering::Relaxed);
                match buffer {
                    Some(bid) => {
                        // SAFETY: `bid` and `len` come from this completion and the buffer
                        // is recycled only after the borrow ends.
                        match unsafe { bufs.received(bid, len) } {
                            Some(data) => {
                                if conn.receive(data, config) {
                                    ready.push_back((key, generation));
                                }
                            }
                            None => conn.dead = true,
                        }
                        bufs.recycle(bid);
                    }
                    None => conn.dead = true,
                }
                if !conn.dead && conn.input.len() - conn.input_start > config.input_buffer_max_bytes
                {
                    stats.input_overflows.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!("client exceeded input_buffer_max_bytes; disconnecting");
                    conn.dead = true;
                }
            }
            0 => conn.eof = true,
            n if n == -libc::ENOBUFS || n == -libc::ECANCELED => {
                // Out of buffers (re-armed below once they are back) or our own cancel.
                if let Some(bid) = buffer {
                    bufs.recycle(bid);
                }
            }
            _ => conn.dead = true,
        }
        self.advance(key)
    }

    fn sent(&mut self, key: usize, generation: u32, result: i32) -> io::Result<()> {
        let Some(conn) = self
            .conns
            .get_mut(key)
            .filter(|c| c.generation == generation)
        else {
            return Ok(());
        };
        conn.send_inflight = false;
        conn.send_cancelled = false;
        if result > 0 {
            let n = result as usize;
            conn.sent = (conn.sent + n).min(conn.sending.len());
            self.stats
                .bytes_written
                .fetch_add(n as u64, Ordering::Relaxed);
        } else {
            conn.dead = true;
        }
        self.advance(key)
    }

    /// Moves connection `key` forward after anything changed: runs the session, issues the
    /// next send, arms or cancels the receive, and closes and frees the slot when done.
    fn advance(&mut self, key: usize) -> io::Result<()> {
        let stopping = self.shutdown.is_triggered();
        let Some(conn) = self.conns.get_mut(key) else {
            return Ok(());
        };
        let fd = types::Fd(conn.stream.as_raw_fd());
        let generation = conn.generation;
        if !conn.closed && conn.handle(&self.config) {
            self.ready.push_back((key, generation));
        }
        // A yielded connection's replies wait for its next turns (under the output
        // high-water mark, which stops its session before it is reached): one send once its
        // input is drained, not one per yield.
        let holding = conn.yielded && conn.has_room(&self.config);
        if !conn.closed && !conn.dead && !conn.send_inflight && !holding {
            if conn.sent == conn.sending.len() {
                conn.sending.clear();
                conn.sent = 0;
                std::mem::swap(&mut conn.sending, &mut conn.output);
            }
            if conn.sent < conn.sending.len() {
                let rest = &conn.sending[conn.sent..];
                let len = u32::try_from(rest.len()).unwrap_or(u32::MAX);
                let send = opcode::Send::new(fd, rest.as_ptr(), len)
                    .flags(libc::MSG_NOSIGNAL)
                    .build()
                    .user_data(user_data(key, generation, Op::Send));
                // SAFETY: `sending` is owned by the slot, which is not freed while
                // `send_inflight`, and is neither written nor reallocated until the
                // send's completion clears `send_inflight` (sessions write `output`).
                unsafe { push(&mut self.ring, &send) }?;
                conn.send_inflight = true;
            }
        }
        let want_recv = !conn.closed
            && !conn.dead
            && !conn.eof
            && !conn.closing
            && !stopping
            && conn.has_room(&self.config);
        if want_recv && !conn.recv_armed {
            let recv = opcode::RecvMulti::new(fd, BUFFER_GROUP)
                .build()
                .user_data(user_data(key, generation, Op::Recv));
            // SAFETY: the receive writes only into provided buffers, owned by `self.bufs`,
            // which stays registered until every receive's final completion was reaped.
            unsafe { push(&mut self.ring, &recv) }?;
            conn.recv_armed = true;
            conn.recv_cancelled = false;
        }
        let flushed = !conn.send_inflight && conn.pending_output() == 0;
        let done = conn.dead
            || (flushed && (conn.closing || ((conn.eof || stopping) && !conn.unprocessed)));
        if done && !conn.closed {
            conn.closed = true;
            conn.session.on_close();
            self.stats.closed(conn.ip);
        }
        let mut cancels = Vec::new();
        if conn.recv_armed && !conn.recv_cancelled && (conn.closed || !want_recv) {
            conn.recv_cancelled = true;
            cancels.push(user_data(key, generation, Op::Recv));
        }
        if conn.send_inflight && !conn.send_cancelled && conn.closed {
            conn.send_cancelled = true;
            cancels.push(user_data(key, generation, Op::Send));
        }
        let free = conn.closed && !conn.recv_armed && !conn.send_inflight;
        for target in cancels {
            let cancel = opcode::AsyncCancel::new(target)
                .build()
                .user_data(user_data(key, generation, Op::Cancel));
            // SAFETY: a cancel refers to no memory.
            unsafe { push(&mut self.ring, &cancel) }?;
        }
        if free {
            // No operation references the slot any more: closing the socket is safe.
            self.conns.remove(key);
        }
        Ok(())
    }

    fn adopt_new(&mut self) -> io::Result<()> {
        while let Ok((stream, accepted)) = self.inbox.try_recv() {
            if self.shutdown.is_triggered() {
                self.stats.closed(accepted.peer.ip());
                continue;
            }
            let key = self.conns.vacant_key();
            let generation = self.next_generation;
            self.next_generation = self.next_generation.wrapping_add(1) & 0xFF_FFFF;
            let notify = {
                let (tx, wake) = (self.notify_tx.clone(), self.wake.wake.clone());
                Notify::new(move || {
                    if tx.send((key, generation)).is_ok() {
                        wake.wake();
                    }
                })
            };
            let ip = accepted.peer.ip();
            let session = self.service.open(accepted, notify);
            self.conns
                .insert(Conn::new(stream, ip, session, generation));
            self.advance(key)?;
        }
        Ok(())
    }

    /// Gives the connections that yielded before this point their next turn, in the order
    /// they yielded; one that yields again waits for the next round.
    fn run_yielded(&mut self) -> io::Result<()> {
        for _ in 0..self.ready.len() {
            let Some((key, generation)) = self.ready.pop_front() else {
                break;
            };
            let Some(conn) = self
                .conns
                .get_mut(key)
                .filter(|c| c.generation == generation && !c.closed)
            else {
                continue;
            };
            conn.yielded = false;
            self.advance(key)?;
        }
        Ok(())
    }

    /// Lets notified sessions emit what became ready. Stale entries (closed connection,
    /// reused slot) are skipped by the generation check.
    fn run_notified(&mut self) -> io::Result<()> {
        while let Ok((key, generation)) = self.notify_rx.try_recv() {
            let budget = self.config.output_buffer_high_bytes;
            let Some(conn) = self
                .conns
                .get_mut(key)
                .filter(|c| c.generation == generation && !c.closed)
            else {
                continue;
            };
            let progress = conn.session.on_notify(&mut conn.output, budget);
            conn.closing |= progress.close;
            conn.held = progress.holds_input();
            conn.unprocessed = conn.has_input();
            self.advance(key)?;
        }
        Ok(())
    }

    fn housekeeping(&mut self) -> io::Result<()> {
        let keep = self.config.idle_buffer_keep_bytes;
        let now = Instant::now();
        let mut expired = Vec::new();
        for (key, conn) in self.conns.iter_mut() {
            conn.shrink_if_idle(keep);
            if let Some(why) = conn.expired(&self.config, now) {
                conn.dead = true;
                expired.push((key, why));
            }
        }
        for (key, why) in expired {
            why.count(&self.stats);
            self.advance(key)?;
        }
        Ok(())
    }

    /// Marks every connection dead (close without writing more) and issues the cancels.
    fn abandon_all(&mut self) {
        let keys: Vec<usize> = self.conns.iter().map(|(k, _)| k).collect();
        for key in keys {
            if let Some(conn) = self.conns.get_mut(key) {
                conn.dead = true;
            }
            if let Err(e) = self.advance(key) {
                tracing::error!(worker = self.id, error = %e, "cannot cancel a connection's operations");
            }
        }
    }

    /// Cancels the wake read, waits until no operation is in flight, then releases the
    /// provided buffers. Whatever the kernel may still use after the wait is leaked.
    fn finish(mut self) {
        if self.wake.armed {
            let cancel = opcode::AsyncCancel::new(user_data(0, 0, Op::Wake))
                .build()
                .user_data(user_data(0, 0, Op::Cancel));
            // SAFETY: a cancel refers to no memory.
            if let Err(e) = unsafe { push(&mut self.ring, &cancel) } {
                tracing::error!(worker = self.id, error = %e, "cannot cancel the wake read");
            }
        }
        for _ in 0..DRAIN_WAITS {
            if self.conns.is_empty() && !self.wake.armed {
                break;
            }
            if wait(&self.ring, HOUSEKEEPING_TICK).is_err() {
                break;
            }
            self.completions.clear();
            self.completions.extend(
                self.ring
                    .completion()
                    .map(|c| (c.user_data(), c.result(), c.flags())),
            );
            let completions = std::mem::take(&mut self.completions);
            for &(data, result, flags) in &completions {
                if decode(data).2 == Some(Op::Wake) {
                    self.wake.armed = false;
                } else if self.complete(data, result, flags).is_err() {
                    break;
                }
            }
        }
        if self.conns.is_empty() && !self.wake.armed {
            self.bufs.unregister(&self.ring);
        } else {
            tracing::error!(
                worker = self.id,
                connections = self.conns.len(),
                "io_uring operations still in flight at exit; leaking their buffers"
            );
            std::mem::forget(std::mem::take(&mut self.conns));
            std::mem::forget(std::mem::replace(&mut self.wake.buf, Box::new([0; 8])));
        }
        tracing::debug!(worker = self.id, "worker stopped");
    }
}
