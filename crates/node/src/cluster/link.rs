//! Outbound inter-cell links: one persistent, pipelined TCP connection per peer.
//!
//! A [`Link`] is a queue in front of a connection task on the cell's peer runtime. Any
//! thread (an I/O engine worker included) may submit a frame without blocking: requests
//! carry a completion callback, called with the peer's reply (matched by `request_id`) or
//! with the reason the link failed; one-way frames (ring messages) carry none. The task
//! connects on demand, sends `Hello` first, then writes queued frames in submission order,
//! batching whatever is queued into one write. If the connection fails, every request still
//! waiting gets [`LinkError::Lost`] and the next submission reconnects; while the peer is
//! unreachable, submissions fail fast for `RECONNECT_BACKOFF` instead of each paying a
//! connect timeout. A peer that stops answering without closing the connection (paused,
//! or cut off by a partition: no FIN, no RST) is noticed by its overdue replies: when a
//! request has waited `reply_timeout`, the connection is dropped and every request still
//! waiting fails, so callers re-route instead of waiting for TCP to give up — except what
//! may have reached the peer and must not run twice ([`LinkError::may_have_arrived`]).
//! A request may also carry its own deadline ([`Link::request_until`]): past it, the
//! request alone fails with [`LinkError::GaveUp`] (its late reply, if any, is dropped) and
//! the connection stays — how a forwarded request gives up on a master that holds it too
//! long, without a timer of its own.
//!
//! Every queue is bounded in bytes by a [`Budget`] (`cluster.peer_queue_bytes_max`): a
//! link whose queue is full refuses a request at once ([`LinkError::Busy`], never sent, so
//! the caller may route it again) and drops a one-way frame (heartbeats and map pushes are
//! repeated or fetched); the peer listener uses one for the replies it owes a connection.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use cellcache_cluster::wire::{self, Decoded, FrameKind, WireConfig};
use cellcache_cluster::{CellId, wire::payload};
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use super::handshake::HandshakeError;
use super::transport::{PeerAuth, PeerStream};

/// After a failed connect, submissions fail at once for this long.
const RECONNECT_BACKOFF: Duration = Duration::from_millis(100);

/// A forwarded request given up at its deadline is answered at most this fraction of
/// `cluster.request_timeout_ms` late: the links check their waiting requests that often.
const GIVE_UP_CHECKS_PER_TIMEOUT: u64 = 10;

/// A frame with its payload owned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedFrame {
    pub kind: FrameKind,
    pub epoch: u64,
    pub request_id: u64,
    pub payload: Vec<u8>,
}

impl OwnedFrame {
    pub fn from_frame(f: &wire::Frame<'_>) -> OwnedFrame {
        OwnedFrame {
            kind: f.kind,
            epoch: f.epoch,
            request_id: f.request_id,
            payload: f.payload.to_vec(),
        }
    }
}

/// Why a request over a link got no reply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LinkError {
    #[error("peer {0} unreachable: {1}")]
    Unreachable(String, String),
    #[error("connection to peer lost")]
    Lost,
    #[error("peer {0} sent no reply within {1:?}: connection dropped")]
    Silent(String, Duration),
    #[error("frame refused by the codec: {0}")]
    Encode(String),
    #[error("peer {0}: {1} bytes already queued for it")]
    Busy(String, usize),
    #[error("no reply by the request's own deadline")]
    GaveUp,
}

impl LinkError {
    /// Whether the request may have reached the peer (and been applied there): it was
    /// written to a connection that was then lost, or left unanswered past the timeout.
    /// Such a request is safe to send again only if running it twice does no harm.
    pub fn may_have_arrived(&self) -> bool {
        matches!(
            self,
            LinkError::Lost | LinkError::Silent(..) | LinkError::GaveUp
        )
    }
}

/// Called once with a request's outcome, on the peer runtime.
pub type Reply = Box<dyn FnOnce(Result<OwnedFrame, LinkError>) + Send>;

struct Outgoing {
    kind: FrameKind,
    /// Epoch to stamp instead of the current one (replication: the records' epoch).
    epoch: Option<u64>,
    payload: Vec<u8>,
    reply: Option<Reply>,
    /// Fail the request with [`LinkError::GaveUp`] if no reply came by then.
    give_up: Option<Instant>,
}

/// How long a link waits for a connection, its handshake, and a reply before it gives the
/// peer up; how many bytes it queues for the peer (see [`Budget`]); what guards each of its
/// connections ([`PeerAuth`]: TLS and the ring's secret, if any).
#[derive(Debug, Clone)]
pub struct LinkConfig {
    pub connect: Duration,
    pub handshake: Duration,
    pub reply: Duration,
    /// How often waiting requests are checked against their own deadlines
    /// ([`Link::request_until`]): how late, at most, one is given up.
    pub give_up_check: Duration,
    pub queue_bytes_max: usize,
    pub auth: PeerAuth,
}

/// Bytes queued between threads and not yet taken by the task that writes them: the bound
/// of a queue whose senders must never block (I/O workers, reply callbacks). One frame is
/// always accepted by an empty queue, whatever its size, so no frame is refused for good.
#[derive(Debug)]
pub struct Budget {
    queued: AtomicUsize,
    max: usize,
    drained: tokio::sync::Notify,
}

impl Budget {
    pub fn new(max: usize) -> Arc<Budget> {
        Arc::new(Budget {
            queued: AtomicUsize::new(0),
            max,
            drained: tokio::sync::Notify::new(),
        })
    }

    /// Takes `n` bytes if they fit (or the queue is empty); `false` leaves it unchanged.
    pub fn try_take(&self, n: usize) -> bool {
        self.queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| {
                (q == 0 || q.saturating_add(n) <= self.max).then_some(q.saturating_add(n))
            })
            .is_ok()
    }

    /// Takes `n` bytes even past the bound: for what must be queued (a reply owed), whose
    /// producer is throttled instead by [`Budget::below_max`].
    pub fn take(&self, n: usize) {
        self.queued.fetch_add(n, Ordering::AcqRel);
    }

    /// Gives back `n` bytes the writer took off the queue.
    pub fn release(&self, n: usize) {
        self.queued.fetch_sub(n, Ordering::AcqRel);
        self.drained.notify_one();
    }

    /// Bytes queued now.
    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::Acquire)
    }

    /// Waits until the queue is within its bound.
    pub async fn below_max(&self) {
        loop {
            let drained = self.drained.notified();
            if self.queued() <= self.max {
                return;
            }
            drained.await;
        }
    }
}

/// The sending half of one peer connection; see the module docs.
pub struct Link {
    pub to: CellId,
    pub addr: String,
    tx: mpsc::UnboundedSender<Outgoing>,
    budget: Arc<Budget>,
}

impl Link {
    /// Starts the connection task for `to` at `addr` on `rt`, which introduces itself with
    /// `hello`. Frames carry the epoch read from `epoch` when they are written.
    pub fn start(
        rt: &tokio::runtime::Handle,
        hello: payload::Hello,
        to: CellId,
        addr: String,
        wire: WireConfig,
        epoch: Arc<AtomicU64>,
        config: LinkConfig,
    ) -> Arc<Link> {
        let (tx, rx) = mpsc::unbounded_channel();
        let budget = Budget::new(config.queue_bytes_max);
        let task = Task {
            hello,
            addr: addr.clone(),
            wire,
            epoch,
            connect_timeout: config.connect,
            handshake_timeout: config.handshake,
            reply_timeout: config.reply,
            give_up_check: config.give_up_check,
            auth: config.auth,
            next_id: 1,
            budget: budget.clone(),
        };
        rt.spawn(task.run(rx));
        Arc::new(Link {
            to,
            addr,
            tx,
            budget,
        })
    }

    /// Queues `out` if the budget allows; otherwise fails it (a request's reply is called
    /// with the reason, which is also returned).
    fn enqueue(&self, out: Outgoing) -> Result<(), LinkError> {
        let n = out.payload.len();
        if !self.budget.try_take(n) {
            let e = LinkError::Busy(self.addr.clone(), self.budget.queued());
            fail(out, e.clone());
            return Err(e);
        }
        self.tx.send(out).map_err(|e| {
            self.budget.release(n);
            fail(e.0, LinkError::Lost);
            LinkError::Lost
        })
    }

    /// Submits a request; `reply` is called exactly once.
    pub fn request(&self, kind: FrameKind, payload: Vec<u8>, reply: Reply) {
        self.request_at(kind, None, payload, reply);
    }

    /// A request that fails with [`LinkError::GaveUp`] if its reply has not come by
    /// `give_up` (noticed within [`LinkConfig::give_up_check`]; a request still waiting for
    /// the connection to be made is given up once that attempt ends).
    pub fn request_until(&self, kind: FrameKind, payload: Vec<u8>, give_up: Instant, reply: Reply) {
        self.submit(kind, None, payload, Some(give_up), reply);
    }

    /// A request stamped with `epoch` (`None`: the current one when written).
    pub fn request_at(&self, kind: FrameKind, epoch: Option<u64>, payload: Vec<u8>, reply: Reply) {
        self.submit(kind, epoch, payload, None, reply);
    }

    fn submit(
        &self,
        kind: FrameKind,
        epoch: Option<u64>,
        payload: Vec<u8>,
        give_up: Option<Instant>,
        reply: Reply,
    ) {
        let out = Outgoing {
            kind,
            epoch,
            payload,
            reply: Some(reply),
            give_up,
        };
        // A refusal has already answered the request.
        let _ = self.enqueue(out);
    }

    /// The same as [`Link::request`], awaited.
    pub async fn call(&self, kind: FrameKind, payload: Vec<u8>) -> Result<OwnedFrame, LinkError> {
        self.call_at(kind, None, payload).await
    }

    /// [`Link::call`] stamped with `epoch`.
    pub async fn call_at(
        &self,
        kind: FrameKind,
        epoch: Option<u64>,
        payload: Vec<u8>,
    ) -> Result<OwnedFrame, LinkError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.request_at(
            kind,
            epoch,
            payload,
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        );
        rx.await.unwrap_or(Err(LinkError::Lost))
    }

    /// Submits a one-way frame (no reply expected); dropped if the peer is unreachable or
    /// its queue is full.
    pub fn send(&self, kind: FrameKind, payload: Vec<u8>) {
        let out = Outgoing {
            kind,
            epoch: None,
            payload,
            reply: None,
            give_up: None,
        };
        if let Err(e) = self.enqueue(out) {
            tracing::debug!(error = %e, ?kind, "one-way frame dropped");
        }
    }
}

/// Requests waiting for their reply, by request id. Lock order: a leaf lock, see `Cluster`
/// (a reply is taken out, then called).
type Pending = Arc<Mutex<HashMap<u64, Waiting>>>;

/// A request written and not yet answered.
struct Waiting {
    /// When it was written.
    at: Instant,
    give_up: Option<Instant>,
    reply: Reply,
}

struct Task {
    hello: payload::Hello,
    addr: String,
    wire: WireConfig,
    epoch: Arc<AtomicU64>,
    connect_timeout: Duration,
    handshake_timeout: Duration,
    reply_timeout: Duration,
    give_up_check: Duration,
    auth: PeerAuth,
    next_id: u64,
    /// The link's queue bound: released as each frame is taken off the channel.
    budget: Arc<Budget>,
}

impl Task {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Outgoing>) {
        let mut failed_at: Option<(Instant, String)> = None;
        while let Some(first) = rx.recv().await {
            self.budget.release(first.payload.len());
            if let Some((at, why)) = &failed_at {
                if at.elapsed() < RECONNECT_BACKOFF {
                    fail(
                        first,
                        LinkError::Unreachable(self.addr.clone(), why.clone()),
                    );
                    continue;
                }
            }
            let stream =
                tokio::time::timeout(self.connect_timeout, TcpStream::connect(&self.addr)).await;
            let stream = match stream {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    failed_at = Some((Instant::now(), e.to_string()));
                    fail(
                        first,
                        LinkError::Unreachable(self.addr.clone(), e.to_string()),
                    );
                    continue;
                }
                Err(_) => {
                    failed_at = Some((Instant::now(), "connect timed out".into()));
                    let why = "connect timed out".to_string();
                    fail(first, LinkError::Unreachable(self.addr.clone(), why));
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            let proven = tokio::time::timeout(
                self.handshake_timeout,
                self.auth.connect(stream, &self.wire),
            )
            .await
            .unwrap_or(Err(HandshakeError::TimedOut));
            let stream = match proven {
                Ok(stream) => stream,
                Err(e) => {
                    if failed_at.is_none() {
                        tracing::warn!(peer = %self.addr, error = %e, "peer handshake failed");
                    }
                    let why = format!("handshake: {e}");
                    failed_at = Some((Instant::now(), why.clone()));
                    fail(first, LinkError::Unreachable(self.addr.clone(), why));
                    continue;
                }
            };
            failed_at = None;
            self.serve(stream, first, &mut rx).await;
        }
    }

    /// Runs one connection until it fails; every request left waiting then fails.
    async fn serve(
        &mut self,
        stream: PeerStream,
        first: Outgoing,
        rx: &mut mpsc::UnboundedReceiver<Outgoing>,
    ) {
        let (mut rd, mut wr) = tokio::io::split(stream);
        let pending: Pending = Arc::new(Mutex::new(HashMap::new()));
        let (closed_tx, mut closed_rx) = tokio::sync::oneshot::channel::<()>();
        let reader_pending = pending.clone();
        let wire = self.wire;
        tokio::spawn(async move {
            read_frames(&mut rd, &wire, "link", None, |frame| {
                let waiting = reader_pending.lock().remove(&frame.request_id);
                if let Some(w) = waiting {
                    (w.reply)(Ok(frame));
                }
                true
            })
            .await;
            let _ = closed_tx.send(());
        });
        let mut out = Vec::with_capacity(64 * 1024);
        let hello = payload::encode_hello(&self.hello);
        let epoch = self.epoch.load(Ordering::Acquire);
        let _ = wire::encode(&self.wire, FrameKind::Hello, epoch, 0, &hello, &mut out);
        self.push(first, &mut out, &pending);
        // Checking a few times per timeout bounds how late an overdue reply is noticed; the
        // requests' own deadlines are checked at least as often as asked.
        let mut overdue_check =
            tokio::time::interval((self.reply_timeout / 4).min(self.give_up_check));
        overdue_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failure = LinkError::Lost;
        // Taken off the channel while a write waited, not yet written (still counted in the
        // budget).
        let mut held: std::collections::VecDeque<Outgoing> = Default::default();
        loop {
            while out.len() < 256 * 1024 {
                if let Some(o) = held.pop_front() {
                    self.budget.release(o.payload.len());
                    self.push(o, &mut out, &pending);
                    continue;
                }
                match rx.try_recv() {
                    Ok(o) => {
                        self.budget.release(o.payload.len());
                        self.push(o, &mut out, &pending);
                    }
                    Err(_) => break,
                }
            }
            if !out.is_empty() {
                // A paused peer stops reading: the write then waits for good, so the checks
                // run beside it (a request still gives up, a silent peer is still dropped).
                let written = {
                    let write = async {
                        wr.write_all(&out).await?;
                        wr.flush().await
                    };
                    tokio::pin!(write);
                    loop {
                        tokio::select! {
                            r = &mut write => break r.map_err(|_| LinkError::Lost),
                            _ = overdue_check.tick() => {
                                if let Some(silent) = self.check(&pending) {
                                    break Err(silent);
                                }
                                self.give_up_held(rx, &mut held);
                            }
                        }
                    }
                };
                if let Err(e) = written {
                    failure = e;
                    break;
                }
                out.clear();
            }
            tokio::select! {
                o = rx.recv() => match o {
                    Some(o) => {
                        self.budget.release(o.payload.len());
                        self.push(o, &mut out, &pending);
                    }
                    None => break,
                },
                _ = &mut closed_rx => break,
                _ = overdue_check.tick() => {
                    if let Some(silent) = self.check(&pending) {
                        failure = silent;
                        break;
                    }
                }
            }
        }
        let waiting: Vec<Reply> = pending.lock().drain().map(|(_, w)| w.reply).collect();
        for r in waiting {
            r(Err(failure.clone()));
        }
        for o in held {
            self.budget.release(o.payload.len());
            fail(o, failure.clone());
        }
    }

    /// Gives up the requests past their own deadlines; `Some` when the oldest request left
    /// has waited the whole reply timeout: the peer is silent and the connection must go.
    fn check(&self, pending: &Pending) -> Option<LinkError> {
        give_up_expired(pending);
        let oldest = pending.lock().values().map(|w| w.at).min();
        if oldest.is_some_and(|at| at.elapsed() >= self.reply_timeout) {
            tracing::warn!(
                peer = %self.addr,
                timeout_ms = self.reply_timeout.as_millis() as u64,
                "peer left a request unanswered: dropping the link"
            );
            return Some(LinkError::Silent(self.addr.clone(), self.reply_timeout));
        }
        None
    }

    /// While a write waits: takes what is queued into `held` and gives up those past their
    /// deadlines, so a request queued behind a paused peer's full socket does not wait for
    /// the connection to fail.
    fn give_up_held(
        &self,
        rx: &mut mpsc::UnboundedReceiver<Outgoing>,
        held: &mut std::collections::VecDeque<Outgoing>,
    ) {
        while let Ok(o) = rx.try_recv() {
            held.push_back(o);
        }
        let now = Instant::now();
        for o in std::mem::take(held) {
            if o.give_up.is_some_and(|g| g <= now) {
                self.budget.release(o.payload.len());
                fail(o, LinkError::GaveUp);
            } else {
                held.push_back(o);
            }
        }
    }

    fn push(&mut self, o: Outgoing, out: &mut Vec<u8>, pending: &Pending) {
        let id = if o.reply.is_some() {
            self.next_id += 1;
            self.next_id
        } else {
            0
        };
        let epoch = o
            .epoch
            .unwrap_or_else(|| self.epoch.load(Ordering::Acquire));
        match wire::encode(&self.wire, o.kind, epoch, id, &o.payload, out) {
            Ok(()) => {
                if let Some(reply) = o.reply {
                    let waiting = Waiting {
                        at: Instant::now(),
                        give_up: o.give_up,
                        reply,
                    };
                    pending.lock().insert(id, waiting);
                }
            }
            Err(e) => {
                if let Some(r) = o.reply {
                    r(Err(LinkError::Encode(e.to_string())));
                }
            }
        }
    }
}

/// Reads frames from one peer connection until it closes, fails or sends a bad frame, or
/// `on_frame` returns `false`; each complete frame is handed over owned, in arrival order.
/// Both directions of the peer plane use it: a [`Link`] for replies, the peer listener for
/// requests. With a `gate`, nothing more is read while the gate's queue is over its bound
/// (the peer listener's replies owed: a peer that does not read them is not read either).
pub async fn read_frames(
    rd: &mut (impl tokio::io::AsyncRead + Unpin),
    wire: &WireConfig,
    side: &'static str,
    gate: Option<&Budget>,
    mut on_frame: impl FnMut(OwnedFrame) -> bool,
) {
    const READ_CHUNK_BYTES: usize = 64 * 1024;
    let mut buf: Vec<u8> = Vec::with_capacity(READ_CHUNK_BYTES);
    let mut chunk = vec![0u8; READ_CHUNK_BYTES];
    loop {
        if let Some(gate) = gate {
            gate.below_max().await;
        }
        let n = match rd.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        buf.extend_from_slice(&chunk[..n]);
        let mut at = 0;
        loop {
            match wire::decode(wire, &buf[at..]) {
                Ok(Decoded::Incomplete) => break,
                Ok(Decoded::Complete { frame, consumed }) => {
                    at += consumed;
                    if !on_frame(OwnedFrame::from_frame(&frame)) {
                        return;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, side, "bad frame from a peer: closing");
                    return;
                }
            }
        }
        buf.drain(..at);
    }
}

/// Fails every waiting request whose own deadline has passed; the connection stays.
fn give_up_expired(pending: &Pending) {
    let now = Instant::now();
    let expired: Vec<Reply> = {
        let mut p = pending.lock();
        let ids: Vec<u64> = p
            .iter()
            .filter(|(_, w)| w.give_up.is_some_and(|g| g <= now))
            .map(|(id, _)| *id)
            .collect();
        ids.iter()
            .filter_map(|id| p.remove(id))
            .map(|w| w.reply)
            .collect()
    };
    for reply in expired {
        reply(Err(LinkError::GaveUp));
    }
}

fn fail(o: Outgoing, e: LinkError) {
    if let Some(r) = o.reply {
        r(Err(e));
    }
}

/// A cell's links to its peers, made on first use from the map.
impl super::Cluster {
    /// The control link to `to`: forwarded requests, ring messages, consensus, maps.
    /// `None` if `to` is not a live cell of the installed map.
    pub fn link(&self, to: &CellId) -> Option<Arc<Link>> {
        self.link_on(to, Channel::Control)
    }

    /// The bulk link to `to`: replication and snapshot streams, so that a busy stream never
    /// queues a forwarded request, a heartbeat or a lease grant behind its chunks.
    pub fn bulk_link(&self, to: &CellId) -> Option<Arc<Link>> {
        self.link_on(to, Channel::Bulk)
    }

    /// The link to `to` on `channel`, created on first use from its address in the map.
    /// None for a cell the map no longer has or declared dead: its address may now belong
    /// to a new process (a restarted cell rejoins as a new cell at the same address), which
    /// must never be taken for the old one; the fault tests found a consensus leader
    /// replicating its log to such a process as if it were the departed member, and
    /// panicking on its empty log.
    fn link_on(&self, to: &CellId, channel: Channel) -> Option<Arc<Link>> {
        let addr = {
            let ring = self.lock_ring();
            ring.map()
                .cell(to)
                .filter(|c| c.state != cellcache_cluster::CellState::Dead)
                .map(|c| c.address.peer.clone())
        };
        let mut links = self.links.lock();
        let key = (to.clone(), channel);
        let Some(addr) = addr else {
            links.retain(|(c, _), _| c != to);
            return None;
        };
        if let Some(l) = links.get(&key) {
            if l.addr == addr {
                return Some(l.clone());
            }
        }
        let link = Link::start(
            &self.handle,
            cellcache_cluster::wire::payload::Hello {
                cell: self.me.clone(),
                ring: self.ring_id,
                client: self.address.client.clone(),
            },
            to.clone(),
            addr,
            self.config.wire,
            self.epoch.clone(),
            LinkConfig {
                connect: Duration::from_millis(self.config.peer_connect_timeout_ms),
                handshake: Duration::from_millis(self.config.peer_handshake_timeout_ms),
                reply: Duration::from_millis(self.config.peer_reply_timeout_ms),
                give_up_check: Duration::from_millis(
                    (self.config.request_timeout_ms / GIVE_UP_CHECKS_PER_TIMEOUT).max(1),
                ),
                queue_bytes_max: self.config.peer_queue_bytes_max,
                auth: self.auth.clone(),
            },
        );
        links.insert(key, link.clone());
        Some(link)
    }
}

/// The two connections a cell keeps to each peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Channel {
    /// Requests, replies, ring messages, consensus: small frames that must not wait.
    Control,
    /// Replication and snapshot streams: throughput, one batch in flight per target.
    Bulk,
}

#[cfg(test)]
#[path = "link_tests.rs"]
mod tests;
