//! The request path of a ring: which cell answers a request, forwarding to it, and holding a
//! write's reply until its backups applied it.
//!
//! [`dispatch`] takes one complete request (its raw bytes) and calls `done` exactly once
//! with the reply. It never blocks: local work runs inline, forwarded work is handed to the
//! owner's [`super::link::Link`] with a callback, and retries are timers on the peer
//! runtime. Submissions to one link happen in the caller's order, so a pipeline of requests
//! for one master arrives there in order, and the master executes forwarded requests in
//! arrival order (see `server`).
//!
//! A request forwarded by another cell is never forwarded again: the master serves it,
//! answers `Refused` when its map says another cell owns a key (the sender refreshes its map
//! and re-routes), or, past the deadline, a retryable `SERVER_ERROR`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cellcache_cluster::CellId;
use cellcache_cluster::wire::FrameKind;
use cellcache_proto::{Parsed, Request, lines, parse};

use super::Cluster;
use super::order::{PARK_RETRY, Parked};
use super::repl::{self, Captured, Positions, WaitError};
use super::split::{Gather, split_get};
use crate::counters::LocalCounters;
use crate::local::Flow;

/// The outcome of a dispatched request.
#[derive(Debug)]
pub enum Reply {
    /// memcached reply bytes (possibly empty for `noreply`).
    Bytes(Vec<u8>),
    /// Only for forwarded requests: this cell does not master a key (reason for logs).
    Refused(String),
}

pub type Done = Box<dyn FnOnce(Reply) + Send>;

/// The retryable error a client sees when no master could be reached in time.
pub const UNAVAILABLE: &[u8] = lines::SERVER_ERROR_UNAVAILABLE;
/// The error a client sees when the master it forwarded a write to was lost before
/// answering: the write may have been applied (and replicated) or not.
pub const MASTER_LOST: &[u8] = lines::SERVER_ERROR_MASTER_LOST;
/// The error a client sees when a write could not be confirmed on its backups.
pub const UNREPLICATED: &[u8] = lines::SERVER_ERROR_UNREPLICATED;
/// The error a client sees from a cell removed from the ring (declared dead while it was
/// paused or cut off): it serves no key any more, at once rather than after a timeout.
pub const FENCED: &[u8] = lines::SERVER_ERROR_FENCED;

/// How a dispatch was started.
#[derive(Debug, Clone, Copy)]
pub struct Ctx {
    /// The request came from another cell: never forward it again.
    pub forwarded: bool,
    /// The sender's map epoch (forwarded requests).
    pub from_epoch: u64,
    pub deadline: Instant,
    /// Its place among parked requests, once parked (see [`super::order`]).
    pub parked: Option<u64>,
}

/// Where a request must run.
#[derive(Debug, PartialEq, Eq)]
pub enum Placement {
    /// No key (version, stats…), or a forwarded flush: this cell.
    NoKeys,
    /// Every key is mastered here and may be served now.
    Local,
    /// Every key is mastered here but may not be served yet (lease, map confirmation).
    Wait,
    /// Every key is mastered by that cell.
    Remote(CellId),
    /// Keys of several masters (multi-key get): the owner of each key, `None` for here.
    Split(Vec<Option<CellId>>),
    /// `flush_all` or `stats reset` from a client: every cell.
    Broadcast,
    /// `stats` or `stats cells` from a client: every cell's figures, gathered.
    Stats(super::stats::Kind),
    /// This cell was removed from the ring: it serves no key.
    Fenced,
}

/// The key hashes of a request, `None` when it has no key.
pub fn key_hashes(req: &Request<'_>) -> Option<Vec<u64>> {
    let mut buf: cellcache_proto::meta::BinaryKeyBuf =
        [0; std::mem::size_of::<cellcache_proto::meta::BinaryKeyBuf>()];
    let one = |k: &[u8]| Some(vec![cellcache_store::key_hash(k)]);
    match req {
        Request::Retrieve(r) => Some(r.keys.iter().map(cellcache_store::key_hash).collect()),
        Request::Store(s) => one(s.key),
        Request::Delete { key, .. }
        | Request::Arithmetic { key, .. }
        | Request::Touch { key, .. } => one(key),
        Request::MetaGet { key, .. }
        | Request::MetaSet { key, .. }
        | Request::MetaDelete { key, .. }
        | Request::MetaArithmetic { key, .. }
        | Request::MetaDebug { key } => one(key.binary(&mut buf)),
        _ => None,
    }
}

fn noreply(req: &Request<'_>) -> bool {
    match req {
        Request::Store(s) => s.noreply,
        Request::Delete { noreply, .. }
        | Request::Arithmetic { noreply, .. }
        | Request::Touch { noreply, .. }
        | Request::FlushAll { noreply, .. } => *noreply,
        _ => false,
    }
}

/// Decides where `req` runs under the installed map at `now_ms`.
pub fn place(cl: &Cluster, req: &Request<'_>, forwarded: bool) -> Placement {
    use super::stats::Kind;
    use cellcache_proto::StatsGroup;
    let whole_ring = match req {
        Request::FlushAll { .. } | Request::Stats(StatsGroup::Reset) => Some(Placement::Broadcast),
        Request::Stats(StatsGroup::General) => Some(Placement::Stats(Kind::Ring { own: false })),
        Request::Stats(StatsGroup::Other(b"cellcache")) => {
            Some(Placement::Stats(Kind::Ring { own: true }))
        }
        Request::Stats(StatsGroup::Other(b"cells")) => Some(Placement::Stats(Kind::Cells)),
        Request::Stats(StatsGroup::Items | StatsGroup::Slabs | StatsGroup::Sizes) => {
            Some(Placement::Stats(Kind::Merge))
        }
        Request::Stats(StatsGroup::Other(b"detail dump")) => Some(Placement::Stats(Kind::Merge)),
        Request::Stats(StatsGroup::Other(args)) if args.starts_with(b"cachedump ") => {
            Some(Placement::Stats(Kind::Merge))
        }
        Request::Stats(StatsGroup::Other(b"detail on" | b"detail off")) => {
            Some(Placement::Broadcast)
        }
        _ => None,
    };
    if let Some(p) = whole_ring {
        // A cell asked by another answers for itself.
        return if forwarded { Placement::NoKeys } else { p };
    }
    let Some(hashes) = key_hashes(req) else {
        return Placement::NoKeys;
    };
    let now = cl.now_ms();
    let ring = cl.lock_ring();
    if ring.is_fenced() {
        return Placement::Fenced;
    }
    let map = ring.map();
    let me = ring.id();
    if let Request::MetaGet { flags, .. } = req {
        // `mg … Y`: any copy will do (docs/protocol.md), this cell's if it has one.
        if flags.eventual && !ring.is_fenced() && map.holds_copy(me, hashes[0]) {
            return Placement::Local;
        }
    }
    // Per key, ownership is an identity test against this cell's entry of the same map and
    // servability one check of the whole master range: a multi-get of 100 keys spent a
    // quarter of the cell's CPU comparing cell ids key by key (docs/benchmarks/echo-limit.md).
    // (One key: one id comparison, as cheap as finding this cell's entry.)
    let many = hashes.len() > 1;
    let my_cell = if many { map.cell(me) } else { None };
    let mut whole_range_servable = None;
    let mut owners: Vec<Option<CellId>> = Vec::with_capacity(hashes.len());
    let mut all_servable = true;
    for &h in &hashes {
        let owner = map.owner(h);
        let mine = if many {
            my_cell.is_some_and(|c| std::ptr::eq(owner, c))
        } else {
            owner.id == *me
        };
        if mine {
            if all_servable {
                let whole = many
                    && *whole_range_servable
                        .get_or_insert_with(|| ring.can_serve_master_range(now));
                all_servable = whole || ring.can_serve(h, now);
            }
            owners.push(None);
        } else {
            owners.push(Some(owner.id.clone()));
        }
    }
    drop(ring);
    let first = owners[0].clone();
    if owners.iter().all(|o| *o == first) {
        match first {
            None if all_servable => Placement::Local,
            None => Placement::Wait,
            Some(o) => Placement::Remote(o),
        }
    } else {
        Placement::Split(owners)
    }
}

/// Executes `req` here, recording the replication positions of its mutations.
fn execute_local(
    cl: &Cluster,
    req: &Request<'_>,
    now: u32,
    out: &mut Vec<u8>,
    counters: &mut LocalCounters,
) -> (Flow, Captured) {
    repl::capture(|| match req {
        // A ring cell flushes the range it masters, through its replication stream; the
        // store's own flush would wipe its backups' copies too (see `flush`).
        Request::FlushAll { delay, noreply } => {
            // -F and cmd_flush: decided and counted where the client's request enters (once
            // for the whole ring, see conn::Conn::run), not by each cell flushing its part.
            cl.flush_master_range(now, crate::local::flush_delay_secs(*delay, now));
            if !noreply {
                out.extend_from_slice(lines::OK);
            }
            Flow::Continue
        }
        // ElastiCache's auto discovery: the ring's Active cells, versioned by the map's epoch.
        Request::ConfigGetCluster => {
            let (epoch, cells) = cl.live_cells();
            crate::local::discovery_reply(epoch, &cells, out);
            Flow::Continue
        }
        // One cell's own figures, for a ring-wide `stats` (see `stats`).
        Request::Stats(cellcache_proto::StatsGroup::Other(b"cell")) => {
            super::stats::local_cell_stats(cl, out);
            Flow::Continue
        }
        // The same without walking the items, for what asks every second (autoscale).
        Request::Stats(cellcache_proto::StatsGroup::Other(super::stats::CELL_ESTIMATE_GROUP)) => {
            super::stats::local_cell_stats_estimate(cl, out);
            Flow::Continue
        }
        _ => crate::local::execute(&cl.cell, req, now, out, counters),
    })
}

/// What becomes of a locally executed request's reply.
enum After {
    /// Send it now.
    Now,
    /// Hold it until these positions are acknowledged.
    Wait(Positions),
    /// Replace it with `UNAVAILABLE`: the map moved between routing and execution, so the
    /// write landed outside this cell's master range and is not replicated. The map gate
    /// rules it out (see `Cluster::map_gate`); kept so that a regression fails requests
    /// retryably, counted (`cluster_stray_writes`), instead of acknowledging them.
    Stray,
    /// Run under a map that has since moved its key away, changing nothing: drop the
    /// reply and route the request again.
    Reroute,
}

/// Decides [`After`] for an execution of `req` placed here under map epoch `placed_at`.
fn after(
    cl: &Cluster,
    req: &Request<'_>,
    placed_at: u64,
    forwarded: bool,
    captured: Captured,
) -> After {
    if captured.stray {
        After::Stray
    } else if !captured.mutated
        && cl.epoch() != placed_at
        && key_hashes(req).is_some()
        && place(cl, req, forwarded) != Placement::Local
    {
        // Placed under the old map, run after the new one was installed: the new map's trim
        // may already have dropped the range this read (or a write that found nothing to
        // change: append to a missing key, delete of one) looked at, so its answer may be a
        // miss that is not true. It changed nothing, so running it again where the new map
        // sends it is safe. The epoch is stored before the trim runs, so a run after the
        // trim always sees the change. (Found by the division fault test: one `append`
        // answered NOT_STORED for a key that existed.) Since placement and execution
        // happen under the map gate this is a second line of defence: it finds nothing
        // unless the gate is bypassed.
        After::Reroute
    } else if !captured.positions.is_empty()
        && cl.replication() == crate::config::ReplicationMode::Sync
    {
        cl.stats
            .replies_held
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        After::Wait(captured.positions)
    } else {
        After::Now
    }
}

/// Holds `reply` until `positions` are acknowledged, then calls `done`.
pub fn reply_after_replication(
    cl: &Cluster,
    positions: Positions,
    reply: Vec<u8>,
    quiet: bool,
    done: Box<dyn FnOnce(Vec<u8>) + Send>,
) {
    let timeout = Duration::from_millis(cl.config.request_timeout_ms);
    cl.repl.wait(
        positions,
        timeout,
        Box::new(move |r: Result<(), WaitError>| match r {
            Ok(()) => done(reply),
            Err(_) if quiet => done(Vec::new()),
            Err(_) => done(UNREPLICATED.to_vec()),
        }),
    );
}

/// What [`here`] decided for a request.
pub enum Here {
    /// Executed here; its reply is in `out` and goes now.
    Answered(Flow),
    /// Executed here; its reply, taken out of `out`, goes once these replication positions
    /// are acknowledged ([`reply_after_replication`]; `quiet`: a `noreply` request).
    Held {
        flow: Flow,
        positions: Positions,
        reply: Vec<u8>,
        quiet: bool,
    },
    /// Run under a map that has since moved its key away, changing nothing: nothing was
    /// written to `out`; route the request again.
    Again,
    /// Not this cell's to run now: the rest of [`dispatch`] decides (forward, split, wait,
    /// broadcast, refuse).
    Elsewhere(Placement),
}

/// The one place where a request is placed and, if it is this cell's, executed into `out`
/// and its reply given its fate: now, held for the backups, replaced (a write that landed
/// outside the range this cell masters by the time it ran), or dropped to route again.
/// A client's connection ([`crate::conn`]) calls it on its own thread, writing straight
/// into its output; [`dispatch`] for everything else. `trim` runs on the reply before its
/// fate is decided (a connection drops a batch's `END`).
#[allow(clippy::too_many_arguments)]
pub fn here(
    cl: &Cluster,
    request: &Request<'_>,
    forwarded: bool,
    parked: Option<u64>,
    now: u32,
    out: &mut Vec<u8>,
    counters: &mut LocalCounters,
    trim: impl FnOnce(&mut Vec<u8>, usize),
) -> Here {
    // Placed and run under one map (see `Cluster::map_gate`).
    let gate = cl.map_gate.read();
    let placed_at = cl.epoch();
    let placement = place_in_order(cl, request, forwarded, parked);
    if !matches!(placement, Placement::NoKeys | Placement::Local) {
        return Here::Elsewhere(placement);
    }
    let start = out.len();
    let (flow, captured) = execute_local(cl, request, now, out, counters);
    drop(gate);
    trim(out, start);
    let quiet = noreply(request);
    match after(cl, request, placed_at, forwarded, captured) {
        After::Now => Here::Answered(flow),
        After::Stray => {
            cl.stats
                .stray_writes
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tracing::warn!(
                placed_at,
                epoch = cl.epoch(),
                "a write ran outside this cell's master range (the map moved under it)"
            );
            out.truncate(start);
            if !quiet {
                out.extend_from_slice(UNAVAILABLE);
            }
            Here::Answered(flow)
        }
        After::Wait(positions) => Here::Held {
            flow,
            positions,
            reply: out.split_off(start),
            quiet,
        },
        After::Reroute => {
            out.truncate(start);
            Here::Again
        }
    }
}

/// Routes one complete request; see the module docs.
pub fn dispatch(cl: &Arc<Cluster>, bytes: Vec<u8>, ctx: Ctx, done: Done) {
    let parsed = parse(&bytes, &cl.cell.limits);
    let Parsed::Complete { request, .. } = parsed else {
        done(Reply::Bytes(lines::SERVER_ERROR_UNPARSABLE_ROUTED.to_vec()));
        return;
    };
    let quiet = noreply(&request);
    let mut out = Vec::new();
    let mut counters = LocalCounters::default();
    let now = cl.cell.now();
    let decided = here(
        cl,
        &request,
        ctx.forwarded,
        ctx.parked,
        now,
        &mut out,
        &mut counters,
        |_, _| {},
    );
    cl.cell.counters.absorb(&mut counters);
    let placement = match decided {
        Here::Answered(_) => return done(Reply::Bytes(out)),
        Here::Held {
            positions,
            reply,
            quiet,
            ..
        } => {
            let done = Box::new(move |b| done(Reply::Bytes(b)));
            return reply_after_replication(cl, positions, reply, quiet, done);
        }
        Here::Again => return dispatch(cl, bytes, ctx, done),
        Here::Elsewhere(placement) => placement,
    };
    match placement {
        // `here` ran these
        Placement::NoKeys | Placement::Local => {
            done(Reply::Bytes(UNAVAILABLE.to_vec()));
        }
        Placement::Wait => retry_later(cl, bytes, ctx, quiet, done),
        Placement::Fenced if ctx.forwarded => done(Reply::Refused("removed from the ring".into())),
        Placement::Fenced => done(Reply::Bytes(if quiet {
            Vec::new()
        } else {
            FENCED.to_vec()
        })),
        Placement::Remote(owner) if ctx.forwarded => {
            if ctx.from_epoch > cl.epoch() {
                // The sender knows a newer map: catch up, then decide again.
                retry_later(cl, bytes, ctx, quiet, done);
            } else {
                done(Reply::Refused(format!("not the master: {owner} is")));
            }
        }
        Placement::Remote(owner) => {
            let retry_safe = matches!(request, Request::Retrieve(_) | Request::MetaDebug { .. });
            let keys = key_hashes(&request).unwrap_or_default();
            forward(cl, owner, bytes, keys, ctx, quiet, retry_safe, done);
        }
        Placement::Split(_) if ctx.forwarded => {
            done(Reply::Refused("keys of several masters".into()));
        }
        Placement::Split(owners) => {
            let Request::Retrieve(r) = &request else {
                done(Reply::Bytes(UNAVAILABLE.to_vec()));
                return;
            };
            let keys: Vec<Vec<u8>> = r.keys.iter().map(|k| k.to_vec()).collect();
            split_get(cl, r.return_cas, r.touch_exptime, keys, owners, ctx, done);
        }
        Placement::Broadcast => {
            broadcast(cl, bytes, ctx, quiet, done);
        }
        Placement::Stats(kind) => super::stats::gather(cl, kind, bytes, done),
    }
}

/// The keys of one forwarded request, in flight until [`Flight::end`]. Lock order: a leaf
/// lock, see `Cluster`.
#[derive(Clone)]
struct Flight(Arc<parking_lot::Mutex<Option<Vec<u64>>>>);

impl Flight {
    fn new(keys: Vec<u64>) -> Flight {
        Flight(Arc::new(parking_lot::Mutex::new(Some(keys))))
    }

    /// Ends the flight once, whichever of the reply and the watchdog comes first. After a
    /// reply (`answered`) the requests that waited for it are routed again at once, in a
    /// task of their own (a link that is down fails a request inside `forward`, which must
    /// not route the parked ones from within); after a failure they wait for their timer,
    /// as the failed request does.
    fn end(&self, cl: &Arc<Cluster>, answered: bool) {
        let Some(keys) = self.0.lock().take() else {
            return;
        };
        if cl.order.flight_end(&keys) && answered {
            let cl = cl.clone();
            cl.handle.clone().spawn(async move { route_parked(&cl) });
        }
    }
}

/// Forwards to `owner`. A request that may have reached it (the connection was lost after
/// sending, or the master left it unanswered past the link's timeout) is tried again only
/// if `retry_safe` (a read): the fault tests found an `append` applied twice when the
/// master died after applying and replicating it but before answering, and the retry ran
/// again on its promoted backup; and again when a cut link left an applied `append`
/// unanswered and the retry reached the same master by the healed link.
///
/// Until it is answered, its `keys` are in flight (see [`super::order`]).
#[allow(clippy::too_many_arguments)]
fn forward(
    cl: &Arc<Cluster>,
    owner: CellId,
    bytes: Vec<u8>,
    keys: Vec<u64>,
    ctx: Ctx,
    quiet: bool,
    retry_safe: bool,
    done: Done,
) {
    let Some(link) = cl.link(&owner) else {
        retry_later(cl, bytes, ctx, quiet, done);
        return;
    };
    cl.order.flight_start(&owner, &keys);
    let flight = Flight::new(keys);
    cl.stats
        .forwarded
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    // A master that never answers (paused, or gone from the network without a reset) must
    // not hold the client forever: past the deadline plus one more timeout, the link gives
    // the request up and the client gets the retryable error.
    let give_up =
        ctx.deadline.max(Instant::now()) + Duration::from_millis(cl.config.request_timeout_ms);
    let cl2 = cl.clone();
    let resend = bytes.clone();
    link.request_until(
        FrameKind::ForwardRequest,
        bytes,
        give_up,
        Box::new(move |r| {
            let answered = matches!(&r, Ok(f) if f.kind == FrameKind::ForwardReply);
            match r {
                Ok(f) if f.kind == FrameKind::ForwardReply => done(Reply::Bytes(f.payload)),
                Ok(f) => {
                    // Refused: the owner has another map. Fetch the newer one, route again.
                    cl2.stats
                        .refused
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if f.epoch > cl2.epoch() {
                        cl2.catch_up();
                    }
                    retry_later(&cl2, resend, ctx, quiet, done);
                }
                Err(super::link::LinkError::GaveUp) => unavailable(&cl2, quiet, done),
                Err(e) if e.may_have_arrived() && !retry_safe => done(Reply::Bytes(if quiet {
                    Vec::new()
                } else {
                    MASTER_LOST.to_vec()
                })),
                Err(e) => {
                    if let super::link::LinkError::Busy(..) = e {
                        cl2.stats
                            .peer_busy
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    retry_later(&cl2, resend, ctx, quiet, done)
                }
            }
            // Parked first (a retry), released after: nothing for its keys slips between.
            flight.end(&cl2, answered);
        }),
    );
}

/// A request that touches every key and so keeps its place among all others (see
/// [`super::order`]).
fn is_barrier(req: &Request<'_>) -> bool {
    matches!(req, Request::FlushAll { .. })
}

/// [`place`], or [`Placement::Wait`] when an earlier request for one of its keys must go
/// first (see [`super::order`]); `parked` is the request's place if it was parked before.
fn place_in_order(
    cl: &Cluster,
    req: &Request<'_>,
    forwarded: bool,
    parked: Option<u64>,
) -> Placement {
    let placement = place(cl, req, forwarded);
    if !cl.order.busy() {
        return placement;
    }
    if is_barrier(req) && !forwarded {
        return if cl.order.barrier_must_wait(parked) {
            Placement::Wait
        } else {
            placement
        };
    }
    let Some(hashes) = key_hashes(req) else {
        return placement;
    };
    let to = match &placement {
        Placement::Remote(owner) => Some(owner),
        _ => None,
    };
    if cl.order.must_wait(&hashes, to, parked) {
        Placement::Wait
    } else {
        placement
    }
}

/// Answers the retryable "no master available" error (nothing, for a quiet request).
fn unavailable(cl: &Cluster, quiet: bool, done: Done) {
    cl.stats
        .unavailable
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    done(Reply::Bytes(if quiet {
        Vec::new()
    } else {
        UNAVAILABLE.to_vec()
    }));
}

/// Parks a request to be routed again shortly (see [`Parked`]), or gives up with the
/// retryable error after its deadline.
fn retry_later(cl: &Arc<Cluster>, bytes: Vec<u8>, ctx: Ctx, quiet: bool, done: Done) {
    if Instant::now() >= ctx.deadline {
        unavailable(cl, quiet, done);
        return;
    }
    let (hashes, barrier) = match parse(&bytes, &cl.cell.limits) {
        Parsed::Complete { request, .. } => (
            key_hashes(&request).unwrap_or_default(),
            is_barrier(&request) && !ctx.forwarded,
        ),
        _ => (Vec::new(), false),
    };
    let first = cl.order.park(Parked {
        bytes,
        hashes,
        barrier,
        ctx,
        done,
    });
    if first {
        let cl = cl.clone();
        cl.handle.clone().spawn(async move {
            tokio::time::sleep(PARK_RETRY).await;
            route_parked(&cl);
        });
    }
}

/// Routes the parked requests again, oldest first (see [`super::order`]); a request that
/// must wait again is parked anew with its place. One pass at a time: a call during a pass
/// makes that pass go once more.
fn route_parked(cl: &Arc<Cluster>) {
    if cl.order.begin_pass().is_none() {
        return;
    }
    while let Some(batch) = cl.order.next_batch() {
        for p in batch {
            dispatch(cl, p.bytes, p.ctx, p.done);
            cl.order.routed(&p.hashes, p.barrier);
        }
    }
}

/// `flush_all` or `stats reset` from a client: every Active cell runs it (a flush, each
/// for its master range, replicated to its backups). The answer is this cell's, or the
/// first other answer that differs from it (an error).
fn broadcast(cl: &Arc<Cluster>, bytes: Vec<u8>, ctx: Ctx, quiet: bool, done: Done) {
    let others: Vec<CellId> = {
        let ring = cl.lock_ring();
        let me = ring.id().clone();
        ring.map()
            .active_cells()
            .map(|c| c.id.clone())
            .filter(|c| *c != me)
            .collect()
    };
    let gather = Gather::new(others.len() + 1, move |mut parts: Vec<Vec<u8>>| {
        let failed = parts[1..]
            .iter()
            .position(|p| *p != parts[0] && !p.is_empty());
        done(Reply::Bytes(match failed {
            _ if quiet => Vec::new(),
            Some(i) => std::mem::take(&mut parts[i + 1]),
            None => std::mem::take(&mut parts[0]),
        }))
    });
    for (i, o) in others.into_iter().enumerate() {
        let g = gather.clone();
        match cl.link(&o) {
            Some(link) => link.request(
                FrameKind::ForwardRequest,
                bytes.clone(),
                Box::new(move |r| {
                    g.put(
                        i + 1,
                        match r {
                            Ok(f) if f.kind == FrameKind::ForwardReply => f.payload,
                            _ => UNAVAILABLE.to_vec(),
                        },
                    )
                }),
            ),
            None => g.put(i + 1, UNAVAILABLE.to_vec()),
        }
    }
    let local = Ctx {
        forwarded: true,
        ..ctx
    };
    let g = gather.clone();
    dispatch(
        cl,
        bytes,
        local,
        Box::new(move |r| {
            g.put(
                0,
                match r {
                    Reply::Bytes(b) => b,
                    Reply::Refused(_) => UNAVAILABLE.to_vec(),
                },
            )
        }),
    );
}
