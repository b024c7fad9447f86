//! Executes a parsed request against this cell's store and composes the reply.
//!
//! Values are copied exactly once: from the store, inside its read callback (the shard
//! lock is held, so the slab cannot be reused under us), straight into the connection's
//! output buffer after the `VALUE` header. Cache outcomes map to memcached's reply words;
//! operating failures to `SERVER_ERROR`; nothing here can fail on client input, because
//! the parser has already bounded and validated it.

use crate::cell::{Cell, VERSION};
use crate::counters::LocalCounters;
use crate::detail::DetailOp;
use crate::outcome::{appended_too_large_is_not_stored, cas_out, store_compare, store_error_line};
use cellcache_proto::{
    ArithmeticOp, Request, Response, Retrieve, Store as StoreCmd, StoreMode, lines,
};
use cellcache_store::{
    ArithOutcome, ArithRequest, DeleteOptions, DeleteOutcome, Expiry, ReadOptions, WriteMode,
    WriteOutcome, WriteRequest,
};

/// What the connection does after a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Continue,
    /// Close once the output is written (`quit`, `shutdown`).
    Close,
}

/// Executes one request. `now` is the batch's clock reading (unix seconds).
pub fn execute(
    cell: &Cell,
    request: &Request<'_>,
    now: u32,
    out: &mut Vec<u8>,
    counters: &mut LocalCounters,
) -> Flow {
    match request {
        Request::Retrieve(r) => retrieve(cell, r, now, out, counters),
        Request::Store(s) => store(cell, s, now, out, counters),
        Request::Delete { key, noreply } => {
            cell.detail.record(key, DetailOp::Delete);
            let reply: &[u8] = match cell.store.delete(key, now, DeleteOptions::default()) {
                DeleteOutcome::Deleted => {
                    counters.delete_hits += 1;
                    lines::DELETED
                }
                DeleteOutcome::NotFound | DeleteOutcome::Exists => {
                    counters.delete_misses += 1;
                    lines::NOT_FOUND
                }
            };
            reply_unless(*noreply, out, reply);
        }
        Request::Arithmetic {
            op,
            key,
            delta,
            noreply,
        } => arithmetic(cell, *op, key, *delta, *noreply, now, out, counters),
        Request::Touch {
            key,
            exptime,
            noreply,
        } => {
            counters.cmd_touch += 1;
            let hit = cell
                .store
                .touch(key, Expiry::from_protocol(*exptime, now), now);
            if hit {
                counters.touch_hits += 1;
            } else {
                counters.touch_misses += 1;
            }
            reply_unless(
                *noreply,
                out,
                if hit {
                    lines::TOUCHED
                } else {
                    lines::NOT_FOUND
                },
            );
        }
        Request::FlushAll { delay, noreply } => {
            if flush_allowed(cell, *noreply, out) {
                counters.cmd_flush += 1;
                cell.store.flush_all(now, flush_delay_secs(*delay, now));
                reply_unless(*noreply, out, lines::OK);
            }
        }
        Request::Version => {
            Response::Version(VERSION.as_bytes()).encode(out);
        }
        // A cell outside a ring: itself, at version 1 (a ring's cells answer in `cluster`).
        Request::ConfigGetCluster => {
            let here = cell.config.server.addrs()[0];
            let me = crate::cluster::view::LiveCell {
                id: "1".into(),
                host: here.ip().to_string(),
                ip: Some(here.ip()),
                port: here.port(),
            };
            discovery_reply(1, &[me], out);
        }
        Request::RefreshCerts { noreply } => {
            // memcached's replies: OK, or an error line (also without -Z).
            let reply = match cell.tls.get() {
                None => b"Error TLS not enabled\r\n".to_vec(),
                Some(tls) => match tls.certs.refresh() {
                    Ok(()) => {
                        tracing::info!("refresh_certs: certificates read again");
                        lines::OK.to_vec()
                    }
                    Err(e) => {
                        let why = crate::error_chain(&e);
                        tracing::warn!(error = %why, "refresh_certs failed; the certificates in use stay");
                        format!("Error refreshing the certificates: {why}\r\n").into_bytes()
                    }
                },
            };
            reply_unless(*noreply, out, &reply);
        }
        Request::Verbosity { level, noreply } => {
            cell.verbosity
                .store(*level, std::sync::atomic::Ordering::Relaxed);
            reply_unless(*noreply, out, lines::OK);
        }
        Request::Stats(group) => crate::stats::reply(cell, group, now, out),
        Request::Quit => return Flow::Close,
        Request::Shutdown { .. } => {
            if !cell.config.server.shutdown_command {
                out.extend_from_slice(lines::ERROR_SHUTDOWN_DISABLED);
                return Flow::Continue;
            }
            tracing::info!("shutdown command received: stopping the cell");
            cell.shutdown.trigger();
            return Flow::Close;
        }
        Request::Admin(admin) => {
            out.extend_from_slice(admin_reply(cell, admin));
        }
        Request::CacheMemlimit { megabytes, noreply } if *megabytes < CACHE_MEMLIMIT_MIN_MB => {
            reply_unless(*noreply, out, lines::MEMLIMIT_TOO_SMALL);
        }
        Request::CacheMemlimit { megabytes, noreply } => {
            let reply: &[u8] = match cell
                .store
                .set_memory_limit((*megabytes as usize).saturating_mul(1 << 20), now)
            {
                Ok(()) => lines::OK,
                Err(_) => lines::CLIENT_ERROR_MEMLIMIT_ABOVE_ARENA,
            };
            reply_unless(*noreply, out, reply);
        }
        Request::MetaGet { .. }
        | Request::MetaSet { .. }
        | Request::MetaDelete { .. }
        | Request::MetaArithmetic { .. }
        | Request::MetaNoop
        | Request::MetaDebug { .. } => crate::meta::execute(cell, request, now, out, counters),
    }
    Flow::Continue
}

/// memcached refuses `cache_memlimit` below 8 MB with its own reply word.
const CACHE_MEMLIMIT_MIN_MB: u64 = 8;

/// cellcache has one arena (reported as slab class 1, docs/protocol.md) and no LRU crawler:
/// each command gets the answer memcached 1.6.18 gives when its mechanism has nothing to do.
fn admin_reply(cell: &Cell, admin: &cellcache_proto::Admin) -> &'static [u8] {
    use cellcache_proto::Admin;
    match admin {
        // A setting of memcached's slab mover; there are no classes to move pages between.
        Admin::SlabsAutomove(_) => lines::OK,
        Admin::SlabsReassign {
            source,
            destination,
        } if source == destination => lines::SLABS_REASSIGN_SAME,
        // Class 1 is the only one, so any reassignment names a class that does not exist.
        Admin::SlabsReassign { .. } => lines::SLABS_REASSIGN_BAD_CLASS,
        Admin::LruCrawlerRun => lines::CLIENT_ERROR_LRU_CRAWLER_DISABLED,
        Admin::LruCrawlerEnable => lines::ERROR_LRU_CRAWLER_THREAD,
        Admin::LruCrawlerDisable | Admin::LruCrawlerSetting => lines::OK,
        Admin::ShutdownInvalidMode if cell.config.server.shutdown_command => {
            lines::CLIENT_ERROR_INVALID_SHUTDOWN_MODE
        }
        Admin::ShutdownInvalidMode => lines::ERROR_SHUTDOWN_DISABLED,
    }
}

/// ElastiCache's answer to `config get cluster`: `CONFIG cluster 0 <len>`, then `<len>`
/// bytes — the configuration's version and a line of `host|ip|port` per cell, each line
/// ending in `\n` — then `\r\n` and `END`. Auto-discovering clients poll it and follow the
/// version.
/// A cell advertised by a host name has an empty ip.
pub fn discovery_reply(version: u64, cells: &[crate::cluster::view::LiveCell], out: &mut Vec<u8>) {
    let nodes: Vec<String> = cells
        .iter()
        .map(|c| {
            let ip = c.ip.map_or(String::new(), |ip| ip.to_string());
            format!("{}|{ip}|{}", c.host, c.port)
        })
        .collect();
    let body = format!("{version}\n{}\n", nodes.join(" "));
    out.extend_from_slice(format!("CONFIG cluster 0 {}\r\n", body.len()).as_bytes());
    out.extend_from_slice(body.as_bytes());
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(lines::END);
}

fn reply_unless(noreply: bool, out: &mut Vec<u8>, line: &[u8]) {
    if !noreply {
        out.extend_from_slice(line);
    }
}

/// memcached `-F` (`server.flush_enabled = false`): `flush_all` is refused with
/// `CLIENT_ERROR flush_all not allowed` (silently with `noreply`), as memcached 1.6.18
/// answers. Writes the refusal and returns false when refused. The ring's `flush_all`
/// (cluster::route) asks the same question.
pub(crate) fn flush_allowed(cell: &Cell, noreply: bool, out: &mut Vec<u8>) -> bool {
    if cell.config.server.flush_enabled {
        return true;
    }
    reply_unless(noreply, out, lines::CLIENT_ERROR_FLUSH_DISABLED);
    false
}

/// memcached's `flush_all` argument: seconds from now, or an absolute unix time when
/// larger than 30 days; negative or 0 means now.
pub(crate) fn flush_delay_secs(delay: Option<i64>, now: u32) -> u32 {
    match delay {
        None => 0,
        Some(d) if d <= 0 => 0,
        Some(d) => {
            let at = Expiry::from_protocol(d, now).as_unix_secs();
            at.saturating_sub(now)
        }
    }
}

fn retrieve(
    cell: &Cell,
    r: &Retrieve<'_>,
    now: u32,
    out: &mut Vec<u8>,
    counters: &mut LocalCounters,
) {
    let opts = ReadOptions {
        touch: r.touch_exptime.map(|t| Expiry::from_protocol(t, now)),
        ..ReadOptions::default()
    };
    // Runs under the store's lock: the reply only; counting and `stats detail` after.
    let mut answer = |key: &[u8], item: cellcache_store::ItemView<'_>| {
        let cas = r.return_cas.then(|| cas_out(cell, item.cas));
        cellcache_proto::write_value_header(out, key, item.flags, item.value.len(), cas);
        out.extend_from_slice(item.value);
        cellcache_proto::write_value_end(out);
    };
    let mut count = |key: &[u8], hit: bool| {
        counters.cmd_get += 1;
        cell.detail.record(key, DetailOp::Get { hit });
        match (hit, opts.touch.is_some()) {
            (true, false) => counters.get_hits += 1,
            (false, false) => counters.get_misses += 1,
            (true, true) => {
                counters.cmd_touch += 1;
                counters.get_hits += 1;
                counters.touch_hits += 1;
            }
            (false, true) => {
                counters.cmd_touch += 1;
                counters.get_misses += 1;
                counters.touch_misses += 1;
            }
        }
    };
    if r.keys.len() > 1 {
        // Many keys: read together, so their cache misses overlap (Store::read_many).
        let keys: Vec<&[u8]> = r.keys.iter().collect();
        let mut hits = vec![false; keys.len()];
        cell.store.read_many(&keys, now, opts, |i, item| {
            if let Some(item) = item {
                hits[i] = true;
                answer(keys[i], item);
            }
        });
        for (key, hit) in keys.iter().zip(hits) {
            count(key, hit);
        }
    } else {
        for key in r.keys.iter() {
            let hit = cell.store.read(key, now, opts, |item| answer(key, item));
            count(key, hit.is_some());
        }
    }
    out.extend_from_slice(lines::END);
}

fn store(cell: &Cell, s: &StoreCmd<'_>, now: u32, out: &mut Vec<u8>, counters: &mut LocalCounters) {
    counters.cmd_set += 1;
    cell.detail.record(s.key, DetailOp::Set);
    let (mode, compare_cas) = match s.mode {
        StoreMode::Set => (WriteMode::Set, None),
        StoreMode::Add => (WriteMode::Add, None),
        StoreMode::Replace => (WriteMode::Replace, None),
        StoreMode::Append => (WriteMode::Append, None),
        StoreMode::Prepend => (WriteMode::Prepend, None),
        StoreMode::Cas { unique } => (WriteMode::Set, Some(unique)),
    };
    let req = WriteRequest {
        mode,
        key: s.key,
        value: s.value,
        flags: s.flags,
        expiry: Expiry::from_protocol(s.exptime, now),
        compare_cas: store_compare(cell, compare_cas),
        new_cas: None,
        invalidate: false,
    };
    let reply: &[u8] = match appended_too_large_is_not_stored(cell.store.write(&req, now), mode) {
        Ok(WriteOutcome::Stored { .. }) => {
            if compare_cas.is_some() {
                counters.cas_hits += 1;
            }
            lines::STORED
        }
        Ok(WriteOutcome::NotStored) => lines::NOT_STORED,
        Ok(WriteOutcome::Exists) => {
            counters.cas_badval += 1;
            lines::EXISTS
        }
        Ok(WriteOutcome::NotFound) => {
            counters.cas_misses += 1;
            lines::NOT_FOUND
        }
        Err(e) => store_error_line(e, counters),
    };
    reply_unless(s.noreply, out, reply);
}

#[allow(clippy::too_many_arguments)]
fn arithmetic(
    cell: &Cell,
    op: ArithmeticOp,
    key: &[u8],
    delta: u64,
    noreply: bool,
    now: u32,
    out: &mut Vec<u8>,
    counters: &mut LocalCounters,
) {
    let req = match op {
        ArithmeticOp::Incr => ArithRequest::incr(delta),
        ArithmeticOp::Decr => ArithRequest::decr(delta),
    };
    let (hits, misses) = match op {
        ArithmeticOp::Incr => (&mut counters.incr_hits, &mut counters.incr_misses),
        ArithmeticOp::Decr => (&mut counters.decr_hits, &mut counters.decr_misses),
    };
    match cell.store.arith(key, now, &req) {
        Ok(ArithOutcome::Value { value, .. }) => {
            *hits += 1;
            if !noreply {
                Response::Number(value).encode(out);
            }
        }
        Ok(ArithOutcome::NotFound | ArithOutcome::Exists) => {
            *misses += 1;
            reply_unless(noreply, out, lines::NOT_FOUND);
        }
        Err(e) => {
            let line = store_error_line(e, counters);
            reply_unless(noreply, out, line);
        }
    }
}
