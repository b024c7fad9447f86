//! The peer listener: inbound connections from other cells.
//!
//! Each connection starts with the sender's `Hello`. A fenced sender (removed from the
//! ring) gets only the map, so it learns it was removed; its other requests are refused.
//! Frames are then handled in arrival order on the connection's reader: forwarded requests
//! execute inline (so one sender's pipeline executes in order; only a write's wait for its
//! backups, and retries, continue asynchronously), replication records
//! are applied inline (the stream's order is the master's), ring messages step the ring;
//! consensus traffic runs as tasks. Replies go through the connection's writer task, tagged
//! with the request's id and this cell's epoch.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cellcache_cluster::wire::payload::{self, RangeSeq};
use cellcache_cluster::wire::{self, FrameKind};
use cellcache_cluster::{CellId, ClusterMap, HashRange, RingMessage};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use super::Cluster;
use super::link::{OwnedFrame, read_frames};
use super::route::{self, Ctx, Reply};

/// Frames to write back: (kind, request id, payload).
type Out = mpsc::UnboundedSender<(FrameKind, u64, Vec<u8>)>;

pub async fn accept_loop(cl: Arc<Cluster>, listener: TcpListener) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let _ = stream.set_nodelay(true);
                tokio::spawn(connection(cl.clone(), stream, peer.to_string()));
            }
            Err(e) => {
                tracing::warn!(error = %e, "peer accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

async fn connection(cl: Arc<Cluster>, stream: TcpStream, peer: String) {
    let (mut rd, mut wr) = stream.into_split();
    let (tx, mut rx) = mpsc::unbounded_channel::<(FrameKind, u64, Vec<u8>)>();
    let wire_cfg = cl.config.wire;
    let epoch = cl.epoch.clone();
    tokio::spawn(async move {
        let mut out = Vec::with_capacity(64 * 1024);
        while let Some((kind, id, payload)) = rx.recv().await {
            let e = epoch.load(std::sync::atomic::Ordering::Acquire);
            let _ = wire::encode(&wire_cfg, kind, e, id, &payload, &mut out);
            while out.len() < 256 * 1024 {
                match rx.try_recv() {
                    Ok((kind, id, payload)) => {
                        let _ = wire::encode(&wire_cfg, kind, e, id, &payload, &mut out);
                    }
                    Err(_) => break,
                }
            }
            if wr.write_all(&out).await.is_err() {
                return;
            }
            out.clear();
        }
    });
    let mut from: Option<CellId> = None;
    let mut fenced = false;
    let mut connection = 0;
    read_frames(&mut rd, &wire_cfg, "listener", |frame| {
        match &from {
            None => {
                let hello = (frame.kind == FrameKind::Hello)
                    .then(|| payload::decode_hello(&frame.payload).ok())
                    .flatten();
                let Some(hello) = hello else { return false };
                if hello.ring != cl.ring_id {
                    cl.foreign_hello(&hello, &peer);
                    return false;
                }
                fenced = cl.ring.lock().map().is_fenced(&hello.cell);
                from = Some(hello.cell);
            }
            // A removed cell may only learn that it was removed: it gets the
            // map (in which it is fenced), and every other request is refused.
            Some(_) if fenced => {
                let (kind, payload) = if frame.kind == FrameKind::MapRequest {
                    (FrameKind::MapUpdate, cl.ring.lock().map().encode())
                } else {
                    (
                        FrameKind::Refused,
                        b"fenced: removed from the ring".to_vec(),
                    )
                };
                if frame.request_id != 0 {
                    let _ = tx.send((kind, frame.request_id, payload));
                }
            }
            Some(sender) => return on_frame(&cl, sender, &mut connection, frame, &tx),
        }
        true
    })
    .await;
}

/// Handles one frame of an identified, unfenced sender; `false` closes the connection (its
/// replication was superseded by a newer connection of the same sender, see
/// [`super::Applied`]). `connection` is this connection's number among the sender's
/// replication-carrying connections, 0 until it carries replication: the number is taken at
/// its first replication frame, so only a connection that carries replication supersedes
/// another (a sender's control link never does).
fn on_frame(
    cl: &Arc<Cluster>,
    from: &CellId,
    connection: &mut u64,
    f: OwnedFrame,
    tx: &Out,
) -> bool {
    let id = f.request_id;
    match f.kind {
        FrameKind::Heartbeat | FrameKind::HeartbeatAck => match RingMessage::decode(&f.payload) {
            Ok(m) => cl.step(m),
            Err(e) => tracing::debug!(error = %e, "bad ring message"),
        },
        FrameKind::ForwardRequest => {
            if f.epoch > cl.epoch() {
                cl.fetch_map_from(from.clone());
            }
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
                    let _ = match r {
                        Reply::Bytes(b) => tx.send((FrameKind::ForwardReply, id, b)),
                        Reply::Refused(why) => tx.send((FrameKind::Refused, id, why.into_bytes())),
                    };
                }),
            );
        }
        FrameKind::Replicate | FrameKind::SnapshotChunk | FrameKind::SnapshotDone => {
            // The frame's epoch is the map its records were produced under.
            if f.epoch > cl.epoch() {
                // Decide under the sender's map: fetch it; the sender retries.
                cl.fetch_map_from(from.clone());
                let _ = tx.send((FrameKind::Refused, id, b"fetching the newer map".to_vec()));
                return true;
            }
            type Pick = Box<dyn Fn(u64) -> bool>;
            let (keep, flushable, serving): (Pick, Pick, bool) = {
                let ring = cl.ring.lock();
                let map = ring.map().clone();
                let now = cl.now_ms();
                // Fencing: records of an older map are refused once this cell serves any of
                // their keys as master (the sender was deposed; its write must not be
                // acknowledged, nor clobber newer writes). Before that, they are the tail of
                // a master whose lease this cell's serving waits for, and are kept.
                let serving = f.epoch < map.epoch()
                    && f.kind != FrameKind::SnapshotDone
                    && record_hashes(&f.payload)
                        .iter()
                        .any(|h| h.is_some_and(|h| ring.can_serve(h, now)));
                let me = cl.me.clone();
                let sender = from.clone();
                let child_of_sender = map.migrations().iter().any(|m| {
                    matches!(m, cellcache_cluster::Migration::Division { parent, child, .. } if *child == me && *parent == sender)
                });
                let holds = {
                    let (map, me) = (map.clone(), me.clone());
                    move |h| child_of_sender || map.holds_copy(&me, h)
                };
                // A replicated flush drops this cell's copies of the sender's range, never
                // keys it masters itself (a deposed sender's flush must not reach them).
                let flushable = {
                    let holds = holds.clone();
                    move |h| holds(h) && map.owner(h).id != me
                };
                (Box::new(holds), Box::new(flushable), serving)
            };
            if serving {
                cl.stats
                    .replicate_refused
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let _ = tx.send((FrameKind::Refused, id, b"stale epoch".to_vec()));
                return true;
            }
            let mut applied = cl.applied.lock();
            let lanes = applied.entry(from.clone()).or_default();
            if *connection == 0 {
                lanes.connection += 1;
                *connection = lanes.connection;
            } else if lanes.connection != *connection {
                tracing::debug!(peer = %from, "replication on a superseded connection: closing it");
                return false;
            }
            let super::Applied {
                live,
                snapshot,
                parts,
                ..
            } = lanes;
            let seq = if f.kind == FrameKind::Replicate {
                live
            } else {
                snapshot
            };
            let range = if f.kind == FrameKind::SnapshotDone {
                match RangeSeq::decode(&f.payload) {
                    Ok(d) => {
                        *seq = (*seq).max(d.seq);
                        let done = d.range;
                        let from = from.clone();
                        let cl2 = cl.clone();
                        let epoch = f.epoch;
                        cl.handle
                            .spawn(async move { cl2.resync_received(&from, done, epoch).await });
                        done
                    }
                    Err(_) => return true,
                }
            } else {
                match super::repl::apply_records(
                    &cl.cell.store,
                    &f.payload,
                    seq,
                    parts,
                    cl.config.replication_backlog_bytes_max,
                    cl.cell.now(),
                    keep,
                    |range, at| cl.flush_received(range, at, &flushable),
                ) {
                    Ok(rebuilt) => {
                        cl.stats
                            .values_rebuilt
                            .fetch_add(rebuilt, std::sync::atomic::Ordering::Relaxed);
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "bad replication payload");
                        return true;
                    }
                }
                HashRange::FULL
            };
            let mut ack = Vec::new();
            RangeSeq { range, seq: *seq }.encode(&mut ack);
            drop(applied);
            let _ = tx.send((FrameKind::ReplicateAck, id, ack));
        }
        FrameKind::MapRequest => {
            let map = cl.ring.lock().map().encode();
            let _ = tx.send((FrameKind::MapUpdate, id, map));
        }
        FrameKind::MapUpdate => {
            if let Ok(m) =
                ClusterMap::decode(&f.payload, cellcache_cluster::map::MAP_BYTES_MAX_DEFAULT)
            {
                cl.install_map(m);
            }
        }
        FrameKind::Consensus => {
            let tx = tx.clone();
            let cl = cl.clone();
            cl.handle.clone().spawn(async move {
                let reply = super::group::handle(cl, f.payload).await;
                let _ = tx.send((FrameKind::Consensus, id, reply));
            });
        }
        FrameKind::Hello
        | FrameKind::ForwardReply
        | FrameKind::ReplicateAck
        | FrameKind::Refused => {}
    }
    true
}

/// Key hashes of a replication payload's records (`None` for a flush).
fn record_hashes(payload: &[u8]) -> Vec<Option<u64>> {
    use cellcache_cluster::wire::payload::ReplicationRecord;
    ReplicationRecord::decode_all(payload)
        .filter_map(Result::ok)
        .map(|r| r.op.key().map(cellcache_store::key_hash))
        .collect()
}
