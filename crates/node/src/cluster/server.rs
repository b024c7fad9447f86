//! The peer listener: inbound connections from other cells.
//!
//! Each connection starts with the sender's `Hello`. A fenced sender (removed from the
//! ring) gets only the map, so it learns it was removed; its other requests are refused,
//! but Raft's RPCs while the consensus group still counts it a member.
//! Frames are then handled in arrival order on the connection's reader: forwarded requests
//! execute inline (so one sender's pipeline executes in order; only a write's wait for its
//! backups, and retries, continue asynchronously) if the sender is a cell of this cell's
//! map, replication records are applied inline (the stream's order is the master's; what is
//! accepted of them is [`super::receive`]'s), ring messages step the ring; consensus traffic
//! runs as tasks. A map a peer pushes is never installed, only taken as a hint to catch up. Replies go through the connection's writer task, tagged
//! with the request's id and this cell's epoch.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::transport::PeerStream;
use cellcache_cluster::wire::{self, FrameKind};
use cellcache_cluster::{CellId, RingMessage};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use super::Cluster;
use super::handshake;
use super::link::{Budget, OwnedFrame, read_frames};
use super::route::{self, Ctx, Reply};

/// The frames a connection owes its peer, (kind, request id, payload), queued for the
/// connection's writer and counted against its [`Budget`]: past the budget the connection's
/// reader waits (see [`read_frames`]), so a peer that sends requests but does not read the
/// replies stops being read instead of growing the queue.
#[derive(Clone)]
struct Replies {
    tx: mpsc::UnboundedSender<(FrameKind, u64, Vec<u8>)>,
    budget: Arc<Budget>,
}

impl Replies {
    fn send(&self, kind: FrameKind, id: u64, payload: Vec<u8>) {
        let n = payload.len();
        self.budget.take(n);
        if self.tx.send((kind, id, payload)).is_err() {
            self.budget.release(n);
        }
    }
}

/// One forwarded request in progress: counted while it lives, so a reply callback that is
/// dropped uncalled gives its place back too.
struct InProgress(Arc<AtomicUsize>);

impl Drop for InProgress {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What the frame handler keeps per connection of an identified sender.
struct PeerConn {
    replies: Replies,
    /// Forwarded requests of this connection in progress here (bounded by
    /// `peer_forwards_in_flight_max`).
    forwards: Arc<AtomicUsize>,
    /// This connection's number among the sender's replication-carrying connections, 0
    /// until it carries replication; see [`super::receive::Applied`].
    number: u64,
}

/// Accepts peer connections, at most `peer_connections_max` at once: past it a new
/// connection is closed at once (an idle flood cannot take every descriptor).
pub async fn accept_loop(cl: Arc<Cluster>, listener: TcpListener) {
    let slots = Arc::new(tokio::sync::Semaphore::new(cl.config.peer_connections_max));
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let Ok(slot) = slots.clone().try_acquire_owned() else {
                    cl.stats
                        .peer_connections_refused
                        .fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(%peer, "peer connection refused: cluster.peer_connections_max reached");
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let cl = cl.clone();
                tokio::spawn(async move {
                    connection(cl, stream, peer.to_string()).await;
                    drop(slot);
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "peer accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// One peer connection: its handshake (within `peer_handshake_timeout_ms`: TLS first when
/// `[cluster.tls]` is on, then with a cluster secret nothing is read before the peer proved
/// it holds it), then its frames.
async fn connection(cl: Arc<Cluster>, stream: TcpStream, peer: String) {
    let wire_cfg = cl.config.wire;
    let limit = Duration::from_millis(cl.config.peer_handshake_timeout_ms);
    let accepted = tokio::time::timeout(limit, async {
        let mut stream = cl.auth.server(stream).await?;
        let opening = handshake::accept(&mut stream, &wire_cfg, cl.auth.secret.as_ref()).await?;
        Ok::<_, handshake::HandshakeError>((stream, opening))
    })
    .await;
    let (stream, hello) = match accepted {
        Ok(Ok((stream, handshake::Opening::Cell(hello)))) => (stream, hello),
        Ok(Ok((stream, handshake::Opening::Operator(first)))) => {
            return operator(&cl, stream, first, &peer).await;
        }
        Ok(Err(e)) => {
            cl.stats
                .peer_handshakes_failed
                .fetch_add(1, Ordering::Relaxed);
            tracing::warn!(%peer, error = %e, "peer connection closed in its handshake");
            return;
        }
        Err(_) => {
            cl.stats
                .peer_handshakes_failed
                .fetch_add(1, Ordering::Relaxed);
            tracing::debug!(%peer, "peer handshake timed out: closing");
            return;
        }
    };
    if hello.ring != cl.ring_id {
        cl.foreign_hello(&hello, &peer);
        return;
    }
    let from = hello.cell;
    // A removed cell may only learn that it was removed: it gets the map (in which it is
    // fenced), and every other request is refused.
    let fenced = cl.lock_ring().map().is_fenced(&from);
    let (mut rd, mut wr) = tokio::io::split(stream);
    let (tx, mut rx) = mpsc::unbounded_channel::<(FrameKind, u64, Vec<u8>)>();
    let budget = Budget::new(cl.config.peer_queue_bytes_max);
    let tx = Replies {
        tx,
        budget: budget.clone(),
    };
    let epoch = cl.epoch.clone();
    let written = budget.clone();
    tokio::spawn(async move {
        let mut out = Vec::with_capacity(64 * 1024);
        while let Some((kind, id, payload)) = rx.recv().await {
            written.release(payload.len());
            let e = epoch.load(Ordering::Acquire);
            let _ = wire::encode(&wire_cfg, kind, e, id, &payload, &mut out);
            while out.len() < 256 * 1024 {
                match rx.try_recv() {
                    Ok((kind, id, payload)) => {
                        written.release(payload.len());
                        let _ = wire::encode(&wire_cfg, kind, e, id, &payload, &mut out);
                    }
                    Err(_) => break,
                }
            }
            if wr.write_all(&out).await.is_err() || wr.flush().await.is_err() {
                return;
            }
            out.clear();
        }
    });
    let mut conn = PeerConn {
        replies: tx,
        forwards: Arc::new(AtomicUsize::new(0)),
        number: 0,
    };
    read_frames(&mut rd, &wire_cfg, "listener", Some(&budget), |frame| {
        // A removed cell still in the consensus group (a leaving leader handing its vote
        // over) still reaches it; `group::handle` lets only Raft's own RPCs through.
        let consensus_member = || {
            frame.kind == FrameKind::Consensus
                && cl
                    .raft
                    .get()
                    .is_some_and(|r| super::group::in_the_group(r, &from))
        };
        if !fenced || consensus_member() {
            return on_frame(&cl, &from, &mut conn, frame);
        }
        let (kind, payload) = if frame.kind == FrameKind::MapRequest {
            (FrameKind::MapUpdate, cl.lock_ring().map().encode())
        } else {
            (
                FrameKind::Refused,
                b"fenced: removed from the ring".to_vec(),
            )
        };
        if frame.request_id != 0 {
            conn.replies.send(kind, frame.request_id, payload);
        }
        true
    })
    .await;
}

/// An operator's connection (it proved the ring's secret and sent a command instead of a
/// `Hello`): its `Control` commands, one at a time, each within the handshake timeout;
/// anything else closes it.
async fn operator(cl: &Arc<Cluster>, mut stream: PeerStream, first: OwnedFrame, peer: &str) {
    let wire_cfg = cl.config.wire;
    let limit = Duration::from_millis(cl.config.peer_handshake_timeout_ms);
    let mut next = Some(first);
    loop {
        let frame = match next.take() {
            Some(f) => f,
            None => {
                match tokio::time::timeout(limit, handshake::read_frame(&mut stream, &wire_cfg))
                    .await
                {
                    Ok(Ok(f)) => f,
                    _ => return,
                }
            }
        };
        if frame.kind != FrameKind::Control {
            return;
        }
        let line = String::from_utf8_lossy(&frame.payload).into_owned();
        tracing::info!(%peer, command = %line, "operator command");
        let reply = super::ext::run(cl.clone(), line).await;
        let written = handshake::write_frame_with_id(
            &mut stream,
            &wire_cfg,
            FrameKind::Control,
            frame.request_id,
            &reply,
        )
        .await;
        if written.is_err() {
            return;
        }
    }
}

/// Handles one frame of an identified, unfenced sender; `false` closes the connection (its
/// replication was superseded by a newer connection of the same sender, see
/// [`super::receive::Applied`]). The connection's number (`conn.number`) is taken at its
/// first replication frame accepted, so only a connection that carries replication
/// supersedes another (a sender's control link never does).
fn on_frame(cl: &Arc<Cluster>, from: &CellId, conn: &mut PeerConn, f: OwnedFrame) -> bool {
    let id = f.request_id;
    let tx = &conn.replies;
    match f.kind {
        FrameKind::Heartbeat | FrameKind::HeartbeatAck => match RingMessage::decode(&f.payload) {
            Ok(m) => cl.step(m),
            Err(e) => tracing::debug!(error = %e, "bad ring message"),
        },
        FrameKind::ForwardRequest => {
            if f.epoch > cl.epoch() {
                cl.catch_up();
            }
            if !cl.is_member(from) {
                // A cell not in this cell's map (one it does not know yet routes again).
                cl.stats.forward_not_member.fetch_add(1, Ordering::Relaxed);
                tx.send(FrameKind::Refused, id, b"not a cell of this map".to_vec());
                return true;
            }
            let in_progress = conn.forwards.fetch_add(1, Ordering::AcqRel);
            if in_progress >= cl.config.peer_forwards_in_flight_max {
                conn.forwards.fetch_sub(1, Ordering::AcqRel);
                cl.stats.peer_busy.fetch_add(1, Ordering::Relaxed);
                let why = format!("busy: {in_progress} forwarded requests in progress");
                tx.send(FrameKind::Refused, id, why.into_bytes());
                return true;
            }
            let in_progress = InProgress(conn.forwards.clone());
            let ctx = Ctx {
                forwarded: true,
                from_epoch: f.epoch,
                parked: None,
                deadline: Instant::now() + Duration::from_millis(cl.config.request_timeout_ms),
            };
            let tx = tx.clone();
            route::dispatch(
                cl,
                f.payload,
                ctx,
                Box::new(move |r| {
                    drop(in_progress);
                    match r {
                        Reply::Bytes(b) => tx.send(FrameKind::ForwardReply, id, b),
                        Reply::Refused(why) => tx.send(FrameKind::Refused, id, why.into_bytes()),
                    }
                }),
            );
        }
        FrameKind::Replicate | FrameKind::SnapshotChunk | FrameKind::SnapshotDone => {
            match super::receive::frame(cl, from, &mut conn.number, f) {
                super::receive::Answer::Reply(kind, payload) => tx.send(kind, id, payload),
                super::receive::Answer::Silent => {}
                super::receive::Answer::Close => return false,
            }
        }
        FrameKind::MapRequest => {
            let map = cl.lock_ring().map().encode();
            tx.send(FrameKind::MapUpdate, id, map);
        }
        // A map pushed by a peer is only a hint that a newer one may exist: maps take
        // effect from consensus (see `catch_up`), never from one peer's word.
        FrameKind::MapUpdate => {
            cl.stats.map_pushes_ignored.fetch_add(1, Ordering::Relaxed);
            cl.catch_up();
        }
        FrameKind::Consensus => {
            let tx = tx.clone();
            let cl = cl.clone();
            let from = from.clone();
            cl.handle.clone().spawn(async move {
                let reply = super::group::handle(cl, &from, f.payload).await;
                tx.send(FrameKind::Consensus, id, reply);
            });
        }
        FrameKind::Hello
        | FrameKind::ForwardReply
        | FrameKind::ReplicateAck
        | FrameKind::Refused => {}
        // The handshake is over: another one mid-connection is a confused or hostile peer;
        // operator commands come on their own connections.
        FrameKind::AuthInit
        | FrameKind::AuthChallenge
        | FrameKind::AuthResponse
        | FrameKind::Control => return false,
    }
    true
}
