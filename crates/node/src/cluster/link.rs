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
//! waiting fails, so callers re-route instead of waiting for TCP to give up.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cellcache_cluster::wire::{self, Decoded, FrameKind, WireConfig};
use cellcache_cluster::{CellId, wire::payload};
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

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

/// How long a link waits for a connection, and for a reply before it gives the peer up.
#[derive(Debug, Clone, Copy)]
pub struct LinkTimeouts {
    pub connect: Duration,
    pub reply: Duration,
}

/// The sending half of one peer connection; see the module docs.
pub struct Link {
    pub to: CellId,
    pub addr: String,
    tx: mpsc::UnboundedSender<Outgoing>,
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
        timeouts: LinkTimeouts,
    ) -> Arc<Link> {
        let (tx, rx) = mpsc::unbounded_channel();
        let task = Task {
            hello,
            addr: addr.clone(),
            wire,
            epoch,
            connect_timeout: timeouts.connect,
            reply_timeout: timeouts.reply,
            next_id: 1,
        };
        rt.spawn(task.run(rx));
        Arc::new(Link { to, addr, tx })
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
        if let Err(e) = self.tx.send(out) {
            if let Some(r) = e.0.reply {
                r(Err(LinkError::Lost));
            }
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

    /// Submits a one-way frame (no reply expected); dropped if the peer is unreachable.
    pub fn send(&self, kind: FrameKind, payload: Vec<u8>) {
        let _ = self.tx.send(Outgoing {
            kind,
            epoch: None,
            payload,
            reply: None,
        });
    }
}

/// Requests waiting for their reply, by request id, with the time they were queued.
type Pending = Arc<Mutex<HashMap<u64, (Instant, Reply)>>>;

struct Task {
    hello: payload::Hello,
    addr: String,
    wire: WireConfig,
    epoch: Arc<AtomicU64>,
    connect_timeout: Duration,
    reply_timeout: Duration,
    next_id: u64,
}

impl Task {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Outgoing>) {
        let mut failed_at: Option<(Instant, String)> = None;
        while let Some(first) = rx.recv().await {
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
            failed_at = None;
            let _ = stream.set_nodelay(true);
            self.serve(stream, first, &mut rx).await;
        }
    }

    /// Runs one connection until it fails; every request left waiting then fails.
    async fn serve(
        &mut self,
        stream: TcpStream,
        first: Outgoing,
        rx: &mut mpsc::UnboundedReceiver<Outgoing>,
    ) {
        let (mut rd, mut wr) = stream.into_split();
        let pending: Pending = Arc::new(Mutex::new(HashMap::new()));
        let (closed_tx, mut closed_rx) = tokio::sync::oneshot::channel::<()>();
        let reader_pending = pending.clone();
        let wire = self.wire;
        tokio::spawn(async move {
            read_frames(&mut rd, &wire, "link", |frame| {
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
                    Ok(o) => self.push(o, &mut out, &pending),
                    Err(_) => break,
                }
            }
            if !out.is_empty() {
                if wr.write_all(&out).await.is_err() {
                    break;
                }
                out.clear();
            }
            tokio::select! {
                o = rx.recv() => match o {
                    Some(o) => self.push(o, &mut out, &pending),
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
/// requests.
pub async fn read_frames(
    rd: &mut (impl tokio::io::AsyncRead + Unpin),
    wire: &WireConfig,
    side: &'static str,
    mut on_frame: impl FnMut(OwnedFrame) -> bool,
) {
    const READ_CHUNK_BYTES: usize = 64 * 1024;
    let mut buf: Vec<u8> = Vec::with_capacity(READ_CHUNK_BYTES);
    let mut chunk = vec![0u8; READ_CHUNK_BYTES];
    loop {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer that accepts, reads everything and never answers (a paused or cut-off cell
    /// whose kernel still holds the connection): the request must fail once it is overdue,
    /// not wait for TCP to give up.
    #[test]
    fn a_silent_peer_fails_its_requests_after_the_reply_timeout() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
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
        let link = Link::start(
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
            LinkTimeouts {
                connect: Duration::from_secs(5),
                reply: Duration::from_millis(200),
            },
        );
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
}
