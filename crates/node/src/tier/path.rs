//! One request of a cell with a tier: which of its keys must be loaded first, running it,
//! and when its reply may go.
//!
//! - A key that is loading holds every request for it until the load lands (so requests keep
//!   their order per key). A missing key is loaded before any request that needs its value
//!   (reads, and writes other than a plain `set`); the loads are single-flight
//!   ([`cellcache_tier::Flights`]), and the request runs again on the tier's runtime once all
//!   its keys landed.
//! - A request whose keys were all present runs at once. If one of them is gone afterwards
//!   (evicted between the check and the run, or deleted meanwhile) and the request changed
//!   nothing, its reply is dropped and it goes through the loads instead, so an eviction can
//!   never make a delete or an `append` miss what the backing store holds.
//! - Writes are refused with `SERVER_ERROR` while the dirty bytes are at their bound.
//! - Under write-through, a reply is held until the store has every version it wrote and
//!   the newest unconfirmed version of each of its keys (or `write_through_timeout_ms`
//!   passed: then `SERVER_ERROR`, the write stays dirty and is still flushed): no reply tells
//!   of a value that a crash could still take back, reads included.

use super::{Captured, Fill, Held, Job, Tier, capture};
use crate::cell::Cell;
use crate::config::WritePolicy;
use crate::counters::LocalCounters;
use crate::local::{Flow, execute};
use cellcache_proto::{Parsed, Request, StoreMode, parse};
use cellcache_store::{Expiry, FillOutcome};
use cellcache_tier::{Joined, Known};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

/// The reply of a write refused past the dirty bound.
pub const FULL: &[u8] = b"SERVER_ERROR tier: too much unflushed data, backing store behind\r\n";
/// The reply of a request whose key could not be loaded.
pub const LOAD_FAILED: &[u8] = b"SERVER_ERROR tier: loading from the backing store failed\r\n";
/// The reply of a write-through write the store did not confirm in time.
pub const NOT_CONFIRMED: &[u8] =
    b"SERVER_ERROR tier: the backing store did not confirm in time; a write may or may not be stored\r\n";

/// Where a request goes.
pub enum Route {
    /// Not the tier's business (no tier, or no key): run it as usual.
    Here,
    /// Answered now.
    Answered(Vec<u8>, Flow),
    /// Answered later through the connection's slot.
    Later(Later),
}

/// A reply that comes later: [`Later::start`] with the slot's fill.
pub struct Later(LaterKind);

enum LaterKind {
    Hold {
        tier: Arc<Tier>,
        captured: Captured,
        reply: Vec<u8>,
    },
    Load {
        cell: Arc<Cell>,
        keys: Vec<Vec<u8>>,
        bytes: Vec<u8>,
    },
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Class {
    /// Reads the key's value (get, mg, me).
    Read,
    /// Writes without reading (`set`).
    Blind,
    /// Reads and writes (the rest).
    Update,
}

/// The request's keys and class, if it has keys.
fn classify(request: &Request<'_>) -> Option<(Class, Vec<Vec<u8>>, bool)> {
    let mut buf: cellcache_proto::meta::BinaryKeyBuf =
        [0; std::mem::size_of::<cellcache_proto::meta::BinaryKeyBuf>()];
    let one = |k: &[u8]| vec![k.to_vec()];
    Some(match request {
        Request::Retrieve(r) => {
            let class = match r.touch_exptime {
                Some(_) => Class::Update,
                None => Class::Read,
            };
            (class, r.keys.iter().map(<[u8]>::to_vec).collect(), false)
        }
        Request::Store(s) => {
            let class = match s.mode {
                StoreMode::Set => Class::Blind,
                _ => Class::Update,
            };
            (class, one(s.key), s.noreply)
        }
        Request::Delete { key, noreply, .. }
        | Request::Arithmetic { key, noreply, .. }
        | Request::Touch { key, noreply, .. } => (Class::Update, one(key), *noreply),
        Request::MetaGet { key, .. } | Request::MetaDebug { key } => {
            (Class::Read, one(key.binary(&mut buf)), false)
        }
        Request::MetaSet { key, .. }
        | Request::MetaDelete { key, .. }
        | Request::MetaArithmetic { key, .. } => (Class::Update, one(key.binary(&mut buf)), false),
        _ => return None,
    })
}

/// Decides and runs `request` (its wire form `bytes`) on a cell with a tier.
pub fn route(
    cell: &Arc<Cell>,
    request: &Request<'_>,
    bytes: &[u8],
    now: u32,
    counters: &mut LocalCounters,
) -> Route {
    let Some(tier) = cell.tier.as_ref() else {
        return Route::Here;
    };
    let Some((class, keys, noreply)) = classify(request) else {
        return Route::Here;
    };
    if class != Class::Read {
        let room = tier.engine.lock().has_room();
        if room.is_err() {
            tier.engine.lock().count_refused();
            let reply = if noreply { Vec::new() } else { FULL.to_vec() };
            return Route::Answered(reply, Flow::Continue);
        }
    }
    let now_ms = tier.now_ms();
    let must_load = |k: &Vec<u8>| {
        // The flights lock is released before the store is asked (lock order: shard first).
        let (loading, absent) = {
            let flights = tier.flights.lock();
            (flights.loading(k), flights.known_absent(k, now_ms))
        };
        loading || (class != Class::Blind && !absent && !cell.store.contains(k, now))
    };
    let need: Vec<Vec<u8>> = keys.iter().filter(|k| must_load(k)).cloned().collect();
    if !need.is_empty() {
        return later_load(cell, need, bytes);
    }
    let mut reply = Vec::new();
    let (flow, captured) = capture(|| execute(cell, request, now, &mut reply, counters));
    if class != Class::Blind && (class == Class::Read || captured.is_empty()) {
        let gone: Vec<Vec<u8>> = keys
            .iter()
            .filter(|k| {
                !cell.store.contains(k, now) && !tier.flights.lock().known_absent(k, now_ms)
            })
            .cloned()
            .collect();
        if !gone.is_empty() {
            return later_load(cell, gone, bytes);
        }
    }
    match hold(tier, &keys, captured, reply) {
        Ok(reply) => Route::Answered(reply, flow),
        Err(later) => Route::Later(later),
    }
}

fn later_load(cell: &Arc<Cell>, keys: Vec<Vec<u8>>, bytes: &[u8]) -> Route {
    Route::Later(Later(LaterKind::Load {
        cell: cell.clone(),
        keys,
        bytes: bytes.to_vec(),
    }))
}

/// The reply now, or (write-through) a hold until what the request wrote (`captured`) and
/// the newest unconfirmed version of each of its `keys` are durable: a reply never tells of
/// a value a crash could still take back — a read of a value not yet in the store waits for
/// it, as its writer does.
fn hold(
    tier: &Arc<Tier>,
    keys: &[Vec<u8>],
    mut captured: Captured,
    reply: Vec<u8>,
) -> Result<Vec<u8>, Later> {
    if tier.policy() == WritePolicy::Back {
        return Ok(reply);
    }
    {
        let engine = tier.engine.lock();
        for key in keys {
            if let Some(version) = engine.unconfirmed_version(key) {
                captured.push((Some(key.clone()), version));
            }
        }
    }
    if captured.is_empty() {
        return Ok(reply);
    }
    Err(Later(LaterKind::Hold {
        tier: tier.clone(),
        captured,
        reply,
    }))
}

impl Later {
    /// Starts waiting; `fill` gets the reply from whichever thread has it.
    pub fn start(self, fill: Fill) {
        match self.0 {
            LaterKind::Hold {
                tier,
                captured,
                reply,
            } => start_hold(&tier, captured, reply, fill),
            LaterKind::Load { cell, keys, bytes } => start_load(cell, keys, bytes, fill),
        }
    }
}

fn start_hold(tier: &Arc<Tier>, captured: Captured, reply: Vec<u8>, fill: Fill) {
    let held = Arc::new(Held {
        remaining: AtomicUsize::new(captured.len()),
        reply: parking_lot::Mutex::new(Some((reply, fill))),
    });
    let mut durable = 0;
    {
        let mut engine = tier.engine.lock();
        for (key, version) in captured {
            let key = key.unwrap_or_default();
            if engine.wait(&key, version, held.clone()).is_err() {
                durable += 1;
            }
        }
    }
    for _ in 0..durable {
        held.release();
    }
    let timeout = Duration::from_millis(tier.config.write_through_timeout_ms);
    let t = tier.clone();
    tier.runtime.spawn(async move {
        tokio::time::sleep(timeout).await;
        if held.expire(NOT_CONFIRMED) {
            t.counters
                .write_through_timeouts
                .fetch_add(1, Ordering::Relaxed);
        }
    });
}

fn start_load(cell: Arc<Cell>, keys: Vec<Vec<u8>>, bytes: Vec<u8>, fill: Fill) {
    let Some(tier) = cell.tier.clone() else {
        fill(LOAD_FAILED.to_vec());
        return;
    };
    let run_cell = cell.clone();
    let job = Arc::new(Job {
        remaining: AtomicUsize::new(keys.len()),
        failed: AtomicBool::new(false),
        run: parking_lot::Mutex::new(Some(Box::new(move |failed: bool| {
            if failed {
                fill(LOAD_FAILED.to_vec());
            } else {
                rerun(&run_cell, &bytes, fill);
            }
        }))),
    });
    for key in keys {
        let joined = tier.flights.lock().join(&key, job.clone());
        match joined {
            Ok(Joined::Started) => {
                tier.counters.loads.fetch_add(1, Ordering::Relaxed);
                tier.runtime.spawn(load(cell.clone(), tier.clone(), key));
            }
            Ok(Joined::Waiting) => {}
            Err(job) => {
                tier.counters.loads_refused.fetch_add(1, Ordering::Relaxed);
                job.landed(false);
            }
        }
    }
}

/// Runs a request again once its keys are loaded (on the tier's runtime).
fn rerun(cell: &Arc<Cell>, bytes: &[u8], fill: Fill) {
    let Some(tier) = cell.tier.as_ref() else {
        fill(LOAD_FAILED.to_vec());
        return;
    };
    let Parsed::Complete { request, .. } = parse(bytes, &cell.limits) else {
        // The bytes parsed once already: only a bug gets here.
        fill(LOAD_FAILED.to_vec());
        return;
    };
    let now = cell.now();
    let mut counters = LocalCounters::default();
    let mut reply = Vec::new();
    let (_, captured) = capture(|| execute(cell, &request, now, &mut reply, &mut counters));
    cell.counters.absorb(&mut counters);
    let keys = classify(&request)
        .map(|(_, keys, _)| keys)
        .unwrap_or_default();
    match hold(tier, &keys, captured, reply) {
        Ok(reply) => fill(reply),
        Err(later) => later.start(fill),
    }
}

/// Loads `key` and fills it into the cache unless a client wrote it meanwhile; then lets
/// every request waiting for it run.
async fn load(cell: Arc<Cell>, tier: Arc<Tier>, key: Vec<u8>) {
    let known = tier.engine.lock().known(&key);
    let timeout = Duration::from_millis(tier.config.load_timeout_ms);
    let loaded = match known {
        Known::Present(record) => {
            tier.counters.reinserted.fetch_add(1, Ordering::Relaxed);
            Ok(Some(record))
        }
        Known::Absent => Ok(None),
        Known::Store | Known::StoreWithExpiry(_) => {
            match tokio::time::timeout(timeout, tier.store.get(&key)).await {
                Ok(Ok(mut found)) => {
                    if let (Known::StoreWithExpiry(e), Some(r)) = (&known, found.as_mut()) {
                        r.expiry_unix = *e;
                    }
                    Ok(found)
                }
                Ok(Err(e)) => Err(crate::error_chain(&e)),
                Err(_) => Err(format!("no answer within {timeout:?}")),
            }
        }
    };
    let now = cell.now();
    let ok = match loaded {
        Ok(Some(record)) if !record.expired(now) => {
            tier.counters.load_hits.fetch_add(1, Ordering::Relaxed);
            let filled = cell.store.fill(
                &key,
                &record.value,
                record.flags,
                Expiry::at(record.expiry_unix),
                now,
                || !tier.flights.lock().overtaken(&key),
            );
            if matches!(filled, Ok(FillOutcome::Refused)) {
                tier.counters
                    .loads_overtaken
                    .fetch_add(1, Ordering::Relaxed);
            }
            true
        }
        Ok(_) => {
            tier.counters.load_misses.fetch_add(1, Ordering::Relaxed);
            let mut flights = tier.flights.lock();
            if !flights.overtaken(&key) {
                flights.remember_absent(&key, tier.now_ms());
            }
            true
        }
        Err(error) => {
            tier.counters.load_errors.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                backing_store = tier.store.describe(),
                error,
                "tier: a read-through load failed"
            );
            false
        }
    };
    let landed = tier.flights.lock().land(&key);
    for job in landed.waiters {
        job.landed(ok);
    }
}
