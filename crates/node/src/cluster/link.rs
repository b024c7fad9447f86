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
}

impl LinkError {
    /// Whether the request may have reached the peer (and been applied there): it was
    /// written to a connection that was then lost, or left unanswered past the timeout.
    /// Such a request is safe to send again only if running it twice does no harm.
    pub fn may_have_arrived(&self) -> bool {
        matches!(self, LinkError::Lost | LinkError::Silent(..))
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
}

/// How long a link waits for a connection, its handshake, and a reply before it gives the
/// peer up; how many bytes it queues for the peer (see [`Budget`]); what guards each of its
/// connections ([`PeerAuth`]: TLS and the ring's secret, if any).
#[derive(Debug, Clone)]
pub struct LinkConfig {
    pub connect: Duration,
    pub handshake: Duration,
    pub reply: Duration,
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

    /// Queues `out` if the budget allows; otherwise hands it back.
    fn enqueue(&self, out: Outgoing) -> Result<(), (Outgoing, LinkError)> {
        let n = out.payload.len();
        if !self.budget.try_take(n) {
            let queued = self.budget.queued();
            return Err((out, LinkError::Busy(self.addr.clone(), queued)));
        }
        self.tx.send(out).map_err(|e| {
            self.budget.release(n);
            (e.0, LinkError::Lost)
        })
    }

    /// Submits a request; `reply` is called exactly once.
    pub fn request(&self, kind: FrameKind, payload: Vec<u8>, reply: Reply) {
        self.request_at(kind, None, payload, reply);
    }

    /// A request stamped with `epoch` (`None`: the current one when written).
    pub fn request_at(&self, kind: FrameKind, epoch: Option<u64>, payload: Vec<u8>, reply: Reply) {
        let out = Outgoing {
            kind,
            epoch,
            payload,
            reply: Some(reply),
        };
        if let Err((out, e)) = self.enqueue(out) {
            fail(out, e);
        }
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
        };
        if let Err((_, e)) = self.enqueue(out) {
            tracing::debug!(error = %e, ?kind, "one-way frame dropped");
        }
    }
}

/// Requests waiting for their reply, by request id, with the time they were queued. Lock
/// order: a leaf lock, see `Cluster` (a reply is taken out, then called).
type Pending = Arc<Mutex<HashMap<u64, (Instant, Reply)>>>;

struct Task {
    hello: payload::Hello,
    addr: String,
    wire: WireConfig,
    epoch: Arc<AtomicU64>,
    connect_timeout: Duration,
    handshake_timeout: Duration,
    reply_timeout: Duration,
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
                let reply = reader_pending.lock().remove(&frame.request_id);
                if let Some((_, reply)) = reply {
                    reply(Ok(frame));
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
        // Checking a few times per timeout bounds how late an overdue reply is noticed.
        let mut overdue_check = tokio::time::interval(self.reply_timeout / 4);
        overdue_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failure = LinkError::Lost;
        loop {
            while out.len() < 256 * 1024 {
                match rx.try_recv() {
                    Ok(o) => {
                        self.budget.release(o.payload.len());
                        self.push(o, &mut out, &pending);
                    }
                    Err(_) => break,
                }
            }
            if !out.is_empty() {
                if wr.write_all(&out).await.is_err() || wr.flush().await.is_err() {
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
                    let oldest = pending.lock().values().map(|(at, _)| *at).min();
                    if oldest.is_some_and(|at| at.elapsed() >= self.reply_timeout) {
                        tracing::warn!(
                            peer = %self.addr,
                            timeout_ms = self.reply_timeout.as_millis() as u64,
                            "peer left a request unanswered: dropping the link"
                        );
                        failure = LinkError::Silent(self.addr.clone(), self.reply_timeout);
                        break;
                    }
                }
            }
        }
        let waiting: Vec<Reply> = pending.lock().drain().map(|(_, (_, r))| r).collect();
        for r in waiting {
            r(Err(failure.clone()));
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
                if let Some(r) = o.reply {
                    pending.lock().insert(id, (Instant::now(), r));
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
mod tests {
    use super::*;

    /// A one-thread runtime and a loopback listener on it (a peer the test plays), with
    /// its address.
    fn runtime_and_listener() -> (tokio::runtime::Runtime, tokio::net::TcpListener, String) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        (rt, listener, addr)
    }

    /// A link from cell 1 to cell 2 at `addr`, without a secret.
    fn test_link(
        rt: &tokio::runtime::Runtime,
        addr: String,
        reply: Duration,
        queue_bytes_max: usize,
    ) -> Arc<Link> {
        Link::start(
            rt.handle(),
            payload::Hello {
                cell: CellId::whole(1),
                ring: 1,
                client: "127.0.0.1:1".into(),
            },
            CellId::whole(2),
            addr,
            WireConfig::default(),
            Arc::new(AtomicU64::new(1)),
            LinkConfig {
                connect: Duration::from_secs(5),
                handshake: Duration::from_secs(5),
                reply,
                queue_bytes_max,
                auth: PeerAuth::default(),
            },
        )
    }

    /// A peer that accepts, reads everything and never answers (a paused or cut-off cell
    /// whose kernel still holds the connection): the request must fail once it is overdue,
    /// not wait for TCP to give up.
    #[test]
    fn a_silent_peer_fails_its_requests_after_the_reply_timeout() {
        let (rt, listener, addr) = runtime_and_listener();
        rt.spawn(async move {
            let mut held = Vec::new();
            while let Ok((mut stream, _)) = listener.accept().await {
                let (tx, rx) = tokio::sync::oneshot::channel::<()>();
                tokio::spawn(async move {
                    let mut sink = vec![0u8; 4096];
                    while let Ok(n) = stream.read(&mut sink).await {
                        if n == 0 {
                            break;
                        }
                    }
                    let _ = tx.send(());
                });
                held.push(rx);
            }
        });
        let link = test_link(&rt, addr, Duration::from_millis(200), 1 << 20);
        let outcome = rt.block_on(async {
            tokio::time::timeout(
                Duration::from_secs(30),
                link.call(FrameKind::ForwardRequest, b"get k\r\n".to_vec()),
            )
            .await
        });
        match outcome {
            Ok(Err(LinkError::Silent(_, waited))) => {
                assert_eq!(waited, Duration::from_millis(200))
            }
            other => panic!("expected the silent-peer failure, got {other:?}"),
        }
        // The next request opens a new connection (and fails the same way): the link recovers.
        let again = rt.block_on(async {
            tokio::time::timeout(
                Duration::from_secs(30),
                link.call(FrameKind::ForwardRequest, b"get k\r\n".to_vec()),
            )
            .await
        });
        assert!(matches!(again, Ok(Err(LinkError::Silent(..)))), "{again:?}");
    }

    #[test]
    fn a_budget_bounds_what_is_queued_but_always_takes_one_frame() {
        let b = Budget::new(100);
        assert!(b.try_take(500), "an empty queue takes any one frame");
        assert!(!b.try_take(1), "past the bound");
        b.release(500);
        assert!(b.try_take(60));
        assert!(b.try_take(40));
        assert!(!b.try_take(1));
        assert_eq!(b.queued(), 100);
        b.take(50);
        assert_eq!(
            b.queued(),
            150,
            "what must be queued is counted past the bound"
        );
        b.release(150);
        assert_eq!(b.queued(), 0);
    }

    #[test]
    fn below_max_waits_for_the_writer_to_drain() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let b = Budget::new(10);
        b.take(30);
        let waiter = b.clone();
        rt.block_on(async move {
            let wait = tokio::spawn(async move { waiter.below_max().await });
            tokio::task::yield_now().await;
            assert!(!wait.is_finished(), "over the bound: waits");
            b.release(15);
            tokio::task::yield_now().await;
            assert!(!wait.is_finished(), "still over the bound");
            b.release(10);
            tokio::time::timeout(Duration::from_secs(10), wait)
                .await
                .expect("woken once within the bound")
                .expect("the waiting task");
        });
    }

    /// A peer that accepts but never reads: the kernel's buffers fill, the link's writer
    /// blocks, and past `queue_bytes_max` new requests fail at once with `Busy` instead of
    /// queueing without end.
    #[test]
    fn a_peer_that_reads_nothing_gets_busy_requests_not_an_endless_queue() {
        let (rt, listener, addr) = runtime_and_listener();
        rt.spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                held.push(stream);
            }
        });
        const QUEUE_MAX: usize = 1 << 20;
        const FRAME: usize = 16 * 1024;
        let link = test_link(&rt, addr, Duration::from_secs(600), QUEUE_MAX);
        let busy = Arc::new(AtomicU64::new(0));
        let mut most_queued = 0;
        // 64 MiB offered, far past what loopback's socket buffers hold.
        for _ in 0..4_096 {
            let refused = busy.clone();
            link.request(
                FrameKind::ForwardRequest,
                vec![b'x'; FRAME],
                Box::new(move |r| {
                    if let Err(LinkError::Busy(..)) = r {
                        refused.fetch_add(1, Ordering::Relaxed);
                    }
                }),
            );
            most_queued = most_queued.max(link.budget.queued());
            if busy.load(Ordering::Relaxed) > 0 {
                break;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        assert!(busy.load(Ordering::Relaxed) > 0, "no request was refused");
        assert!(most_queued <= QUEUE_MAX, "{most_queued} bytes queued");
    }

    /// The peer listener's gate: while the replies a connection owes are queued past the
    /// bound, nothing more is read from it; once the writer drains them, reading resumes.
    #[test]
    fn read_frames_reads_nothing_while_its_gate_is_over_the_bound() {
        use tokio::io::AsyncWriteExt as _;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let (mut peer, mut rd) = tokio::io::duplex(64 * 1024);
            let owed = Budget::new(10);
            owed.take(100);
            let seen = Arc::new(AtomicU64::new(0));
            let (gate, count) = (owed.clone(), seen.clone());
            let reader = tokio::spawn(async move {
                read_frames(&mut rd, &WireConfig::default(), "test", Some(&gate), |_| {
                    count.fetch_add(1, Ordering::Relaxed);
                    true
                })
                .await;
            });
            let mut frame = Vec::new();
            wire::encode(
                &WireConfig::default(),
                FrameKind::Heartbeat,
                1,
                0,
                b"x",
                &mut frame,
            )
            .expect("a frame");
            peer.write_all(&frame).await.expect("written");
            tokio::time::sleep(Duration::from_millis(50)).await;
            assert_eq!(seen.load(Ordering::Relaxed), 0, "read past the bound");
            owed.release(100);
            tokio::time::timeout(Duration::from_secs(10), async {
                while seen.load(Ordering::Relaxed) == 0 {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            })
            .await
            .expect("the frame is read once the replies drained");
            drop(peer);
            reader.await.expect("the reader ends with the connection");
        });
    }
}
