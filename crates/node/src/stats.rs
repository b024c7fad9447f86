//! `stats` replies. Field names are memcached's wherever the meaning matches, so existing
//! dashboards and client libraries read them unchanged; cellcache's own fields follow.
//! cellcache has no slab classes (items of every size share slabs), so `stats items` and
//! `stats slabs` report the whole arena as class 1 (docs/protocol.md).

use crate::cell::{Cell, VERSION};
use cellcache_proto::StatsGroup;
use std::fmt::Display;

fn stat(out: &mut Vec<u8>, name: &str, value: impl Display) {
    out.extend_from_slice(format!("STAT {name} {value}\r\n").as_bytes());
}

pub fn reply(cell: &Cell, group: &StatsGroup<'_>, now: u32, out: &mut Vec<u8>) {
    match group {
        // `stats cell`: this cell's own figures (in a ring, `stats` is the whole ring's).
        StatsGroup::General | StatsGroup::Other(b"cell") => general(cell, now, out),
        StatsGroup::Settings => settings(cell, out),
        StatsGroup::Items => items(cell, out),
        StatsGroup::Slabs => slabs(cell, out),
        StatsGroup::Sizes => stat(out, "sizes_status", "disabled"),
        StatsGroup::Conns => cell.conns.write_stats(now, cell.uptime_secs(), out),
        StatsGroup::Reset => {
            // What memcached's stats reset clears: the command, connection, traffic and
            // item counters, and the detail table; gauges (items, bytes, connections) stay.
            cell.counters.reset();
            cell.store.reset_stats();
            if let Some(e) = cell.engine_stats.get() {
                e.reset();
            }
            cell.detail.clear();
            out.extend_from_slice(b"RESET\r\n");
            return;
        }
        StatsGroup::Other(args) if args.starts_with(b"detail") => {
            detail(cell, args, out);
            return;
        }
        StatsGroup::Other(args) if args.starts_with(b"cachedump") => {
            cachedump(cell, args, now, out);
            return;
        }
        StatsGroup::Other(_) => {
            out.extend_from_slice(b"ERROR\r\n");
            return;
        }
    }
    out.extend_from_slice(b"END\r\n");
}

fn general(cell: &Cell, now: u32, out: &mut Vec<u8>) {
    let c = cell.counters.snapshot();
    let s = cell.store.stats();
    let e = cell
        .engine_stats
        .get()
        .map(|e| e.snapshot())
        .unwrap_or_default();
    stat(out, "pid", std::process::id());
    stat(out, "uptime", cell.uptime_secs());
    stat(out, "time", now);
    stat(out, "version", VERSION);
    stat(out, "pointer_size", usize::BITS);
    stat(out, "max_connections", cell.config.io.max_connections);
    stat(out, "curr_connections", e.curr_connections);
    stat(out, "total_connections", e.total_connections);
    stat(out, "rejected_connections", e.rejected_connections);
    // cellcache never stops listening at the connection limit (it answers the extra
    // connection with an error and closes it), so these read as memcached's when it did not.
    stat(out, "listen_disabled_num", 0);
    stat(out, "time_in_listen_disabled_us", 0);
    stat(
        out,
        "accepting_conns",
        u8::from(!cell.shutdown.is_triggered()),
    );
    stat(out, "cmd_get", c.cmd_get);
    stat(out, "cmd_set", c.cmd_set);
    stat(out, "cmd_flush", c.cmd_flush);
    stat(out, "cmd_touch", c.cmd_touch);
    stat(out, "cmd_meta", c.cmd_meta);
    stat(out, "get_hits", c.get_hits);
    stat(out, "get_misses", c.get_misses);
    stat(out, "get_expired", c.get_expired);
    stat(out, "get_flushed", c.get_flushed);
    stat(out, "delete_misses", c.delete_misses);
    stat(out, "delete_hits", c.delete_hits);
    stat(out, "incr_misses", c.incr_misses);
    stat(out, "incr_hits", c.incr_hits);
    stat(out, "decr_misses", c.decr_misses);
    stat(out, "decr_hits", c.decr_hits);
    stat(out, "cas_misses", c.cas_misses);
    stat(out, "cas_hits", c.cas_hits);
    stat(out, "cas_badval", c.cas_badval);
    stat(out, "touch_hits", c.touch_hits);
    stat(out, "touch_misses", c.touch_misses);
    stat(out, "store_too_large", c.store_too_large);
    stat(out, "store_no_memory", c.store_no_memory);
    stat(out, "bytes_read", e.bytes_read);
    stat(out, "bytes_written", e.bytes_written);
    stat(out, "limit_maxbytes", s.memory_limit_bytes);
    stat(out, "threads", cell.config.io.worker_threads());
    stat(out, "bytes", s.bytes);
    stat(out, "curr_items", s.curr_items);
    stat(out, "total_items", s.total_items);
    stat(out, "expired_unfetched", s.expired_unfetched);
    stat(out, "evicted_unfetched", s.evicted_unfetched);
    stat(out, "evictions", s.evicted_items);
    stat(out, "reclaimed", s.reclaimed);
    // cellcache's own
    stat(out, "protocol_errors", c.protocol_errors);
    stat(out, "idle_kicks", e.idle_kicks);
    stat(out, "slabs_evicted", s.evicted_slabs);
    stat(out, "dead_bytes", s.dead_bytes);
    stat(out, "compactions", s.compactions);
    stat(out, "compacted_bytes", s.compacted_bytes);
    stat(out, "arena_bytes", s.arena_bytes);
    stat(out, "index_bytes", s.index_bytes);
    stat(out, "index_slots", s.index_slots);
    stat(out, "index_full_evictions", s.index_full_evictions);
    stat(out, "slabs_free", s.slabs_free);
    stat(out, "slabs_partial", s.slabs_partial);
    stat(out, "slabs_full", s.slabs_full);
    stat(out, "store_shards", s.shards);
    if let Some(cl) = cell.cluster.get() {
        use std::sync::atomic::Ordering::Relaxed;
        stat(out, "cluster_cell", &cl.me);
        stat(out, "cluster_epoch", cl.epoch());
        stat(
            out,
            "cluster_maps_installed",
            cl.stats.maps_installed.load(Relaxed),
        );
        stat(out, "cluster_forwarded", cl.stats.forwarded.load(Relaxed));
        stat(
            out,
            "cluster_suspicions_refuted",
            cl.stats.suspicions_refuted.load(Relaxed),
        );
        stat(
            out,
            "cluster_forward_refused",
            cl.stats.refused.load(Relaxed),
        );
        stat(
            out,
            "cluster_unavailable",
            cl.stats.unavailable.load(Relaxed),
        );
        stat(
            out,
            "cluster_replicate_refused",
            cl.stats.replicate_refused.load(Relaxed),
        );
        stat(
            out,
            "cluster_handoff_streams",
            cl.stats.handoff_streams.load(Relaxed),
        );
        stat(
            out,
            "cluster_resync_streams",
            cl.stats.resync_streams.load(Relaxed),
        );
        stat(
            out,
            "cluster_values_rebuilt",
            cl.stats.values_rebuilt.load(Relaxed),
        );
        stat(out, "cluster_flushes", cl.stats.flushes.load(Relaxed));
        stat(
            out,
            "cluster_flushes_applied",
            cl.stats.flushes_applied.load(Relaxed),
        );
        stat(
            out,
            "cluster_replication_bytes_sent",
            cl.repl.bytes_sent.load(Relaxed),
        );
        stat(
            out,
            "cluster_unreplicated_acks",
            cl.repl.unreplicated_acks.load(Relaxed),
        );
    }
}

fn settings(cell: &Cell, out: &mut Vec<u8>) {
    let c = &cell.config;
    let st = cell.store.config();
    stat(out, "maxbytes", st.memory_limit_bytes);
    stat(out, "maxconns", c.io.max_connections);
    stat(out, "tcpport", c.server.port);
    stat(out, "udpport", 0);
    stat(out, "inter", &c.server.listen);
    // No unix socket and no SASL in cellcache: memcached's values when they are off.
    stat(out, "domain_socket", "NULL");
    stat(out, "auth_enabled_sasl", "no");
    stat(out, "num_threads", c.io.worker_threads());
    stat(
        out,
        "verbosity",
        cell.verbosity.load(std::sync::atomic::Ordering::Relaxed),
    );
    let on_off = |b: bool| if b { "on" } else { "off" };
    let yes_no = |b: bool| if b { "yes" } else { "no" };
    stat(out, "evictions", on_off(st.evictions));
    stat(out, "cas_enabled", yes_no(st.cas_enabled));
    stat(
        out,
        "binding_protocol",
        c.server.binding_protocol.memcached_name(),
    );
    stat(out, "flush_enabled", yes_no(c.server.flush_enabled));
    stat(out, "item_size_max", st.item_size_max_bytes);
    stat(out, "tcp_backlog", c.io.listen_backlog);
    stat(out, "stat_key_prefix", char::from(cell.detail.delimiter()));
    stat(out, "detail_enabled", yes_no(cell.detail.enabled()));
    stat(out, "dump_enabled", "yes");
    stat(out, "slab_page_size", st.slab_size_bytes);
    stat(out, "idle_timeout", c.io.idle_timeout_secs);
    stat(
        out,
        "shutdown_command",
        if c.server.shutdown_command {
            "yes"
        } else {
            "no"
        },
    );
    stat(
        out,
        "io_engine",
        format!("{:?}", c.server.io_engine).to_lowercase(),
    );
    stat(out, "store_layout", format!("{:?}", st.layout));
    stat(out, "eviction_policy", format!("{:?}", st.eviction));
    stat(out, "key_bytes_max", cell.limits.key_bytes_max);
    stat(out, "line_bytes_max", cell.limits.line_bytes_max);
    stat(out, "keys_per_get_max", cell.limits.keys_per_get_max);
}

fn items(cell: &Cell, out: &mut Vec<u8>) {
    let s = cell.store.stats();
    if s.curr_items == 0 {
        return;
    }
    stat(out, "items:1:number", s.curr_items);
    stat(out, "items:1:evicted", s.evicted_items);
    stat(out, "items:1:evicted_unfetched", s.evicted_unfetched);
    stat(out, "items:1:expired_unfetched", s.expired_unfetched);
    stat(out, "items:1:reclaimed", s.reclaimed);
    stat(
        out,
        "items:1:outofmemory",
        cell.counters.snapshot().store_no_memory,
    );
}

fn slabs(cell: &Cell, out: &mut Vec<u8>) {
    let s = cell.store.stats();
    let st = cell.store.config();
    let total = s.slabs_free + s.slabs_partial + s.slabs_full;
    stat(out, "1:slab_size", st.slab_size_bytes);
    stat(out, "1:total_pages", total);
    stat(out, "1:free_pages", s.slabs_free);
    stat(out, "1:partial_pages", s.slabs_partial);
    stat(out, "1:full_pages", s.slabs_full);
    // memcached's per-class command counts: class 1 holds every item, so the cell's totals.
    let c = cell.counters.snapshot();
    stat(out, "1:get_hits", c.get_hits);
    stat(out, "1:cmd_set", c.cmd_set);
    stat(out, "1:delete_hits", c.delete_hits);
    stat(out, "1:incr_hits", c.incr_hits);
    stat(out, "1:decr_hits", c.decr_hits);
    stat(out, "1:cas_hits", c.cas_hits);
    stat(out, "1:cas_badval", c.cas_badval);
    stat(out, "1:touch_hits", c.touch_hits);
    stat(out, "1:live_bytes", s.bytes);
    stat(out, "1:dead_bytes", s.dead_bytes);
    stat(out, "active_slabs", 1);
    stat(out, "total_malloced", s.arena_bytes + s.index_bytes);
}

/// The words of a `stats` argument string (memcached splits on runs of spaces).
fn words(args: &[u8]) -> impl Iterator<Item = &[u8]> {
    args.split(|&b| b == b' ').filter(|w| !w.is_empty())
}

/// `stats detail on|off|dump`, answered as memcached 1.6.18 (words after the first
/// are ignored, as there).
fn detail(cell: &Cell, args: &[u8], out: &mut Vec<u8>) {
    let mut w = words(args);
    if w.next() != Some(&b"detail"[..]) {
        out.extend_from_slice(b"ERROR\r\n");
        return;
    }
    match w.next() {
        Some(b"on") => {
            cell.detail.set_enabled(true);
            out.extend_from_slice(b"OK\r\n");
        }
        Some(b"off") => {
            cell.detail.set_enabled(false);
            out.extend_from_slice(b"OK\r\n");
        }
        Some(b"dump") => cell.detail.dump(out),
        _ => out.extend_from_slice(b"CLIENT_ERROR usage: stats detail on|off|dump\r\n"),
    }
}

/// memcached's number of slab class ids: `stats cachedump` of a class id at or above it is
/// "Illegal slab id"; below it, a class other than cellcache's single one is empty.
const SLAB_CLASS_IDS: u32 = 64;
/// memcached stops a cachedump at 2 MiB of output; so does cellcache.
const CACHEDUMP_BYTES_MAX: usize = 2 << 20;

/// `stats cachedump <class> <limit>`: `ITEM <key> [<bytes> b; <exptime> s]` per live item
/// (exptime an absolute unix time, 0 for none), at most `limit` (0: all) and at most
/// [`CACHEDUMP_BYTES_MAX`] bytes, then `END`. cellcache's arena is class 1; the walk goes
/// slab by slab, one shard lock per slab, in arena order (memcached walks an LRU).
fn cachedump(cell: &Cell, args: &[u8], now: u32, out: &mut Vec<u8>) {
    let mut w = words(args);
    if w.next() != Some(&b"cachedump"[..]) {
        out.extend_from_slice(b"ERROR\r\n");
        return;
    }
    let (Some(class), Some(limit)) = (w.next(), w.next()) else {
        out.extend_from_slice(b"CLIENT_ERROR bad command line\r\n");
        return;
    };
    let number = |t: &[u8]| std::str::from_utf8(t).ok()?.parse::<u32>().ok();
    let (Some(class), Some(limit)) = (number(class), number(limit)) else {
        out.extend_from_slice(b"CLIENT_ERROR bad command line format\r\n");
        return;
    };
    if class >= SLAB_CLASS_IDS {
        out.extend_from_slice(b"CLIENT_ERROR Illegal slab id\r\n");
        return;
    }
    if class == 1 {
        let limit = if limit == 0 {
            usize::MAX
        } else {
            limit as usize
        };
        let start = out.len();
        let mut shown = 0usize;
        let mut cursor = Some(cellcache_store::ScanCursor::START);
        while let Some(at) = cursor {
            if shown >= limit {
                break;
            }
            cursor = cell
                .store
                .scan_range(cellcache_store::HashRange::FULL, now, at, |item| {
                    let line_bytes = item.key.len() + 40;
                    if shown >= limit || out.len() - start + line_bytes > CACHEDUMP_BYTES_MAX {
                        shown = limit;
                        return;
                    }
                    shown += 1;
                    out.extend_from_slice(b"ITEM ");
                    out.extend_from_slice(item.key);
                    // Never expiring is 0 in memcached's dump, as in the store.
                    let exptime = item.expiry.as_unix_secs();
                    out.extend_from_slice(
                        format!(" [{} b; {} s]\r\n", item.value.len(), exptime).as_bytes(),
                    );
                });
        }
    }
    out.extend_from_slice(b"END\r\n");
}
