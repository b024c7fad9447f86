//! `stats` replies. Field names are memcached's wherever the meaning matches, so existing
//! dashboards and client libraries read them unchanged; cellcache's own fields follow.
//! cellcache has no slab classes (items of every size share slabs), so `stats items` and
//! `stats slabs` report the whole arena as class 1 (docs/protocol.md).

use crate::cell::{Cell, VERSION};
use cellcache_proto::{StatsGroup, lines};

/// Appends `STAT <name> <value>`.
pub(crate) use cellcache_proto::write_stat as stat;

/// Fields of a mechanism cellcache does not have: never happened, so 0.
fn zeros(out: &mut Vec<u8>, names: &[&str]) {
    for name in names {
        stat(out, name, 0);
    }
}

pub fn reply(cell: &Cell, group: &StatsGroup<'_>, now: u32, out: &mut Vec<u8>) {
    match group {
        StatsGroup::General => general(cell, now, out),
        StatsGroup::Other(b"cellcache") => own(cell, out),
        // `stats cell`: this cell's own figures, both kinds (in a ring, `stats` and `stats
        // cellcache` are the whole ring's).
        StatsGroup::Other(b"cell") => {
            general(cell, now, out);
            own(cell, out);
        }
        StatsGroup::Settings => settings(cell, out),
        StatsGroup::Items => items(cell, out),
        StatsGroup::Slabs => slabs(cell, out),
        StatsGroup::Sizes => stat(out, "sizes_status", "disabled"),
        StatsGroup::Conns => cell.conns.write_stats(now, cell.uptime_secs(), out),
        StatsGroup::Reset => {
            // What memcached's stats reset clears: the command, connection, traffic and
            // item counters, and the detail table; gauges (items, bytes, connections) stay.
            cell.counters.reset();
            cell.latency.reset();
            cell.store.reset_stats();
            if let Some(e) = cell.engine_stats.get() {
                e.reset();
            }
            if let Some(t) = cell.tls.get() {
                t.stats.reset();
            }
            cell.detail.clear();
            out.extend_from_slice(lines::RESET);
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
            out.extend_from_slice(lines::ERROR);
            return;
        }
    }
    out.extend_from_slice(lines::END);
}

/// The names of memcached 1.6's `stats`, in its order, as one started without the LRU
/// crawler and maintainer (`-o no_lru_crawler,no_lru_maintainer`) answers them: cellcache has
/// neither, nor memcached's segmented LRU, so the fields of those are absent here as there.
/// `stats` gives exactly these; cellcache's own figures are in `stats cellcache`.
pub const MEMCACHED_GENERAL: &[&str] = &[
    "pid",
    "uptime",
    "time",
    "version",
    "libevent",
    "pointer_size",
    "rusage_user",
    "rusage_system",
    "max_connections",
    "curr_connections",
    "total_connections",
    "rejected_connections",
    "connection_structures",
    "response_obj_oom",
    "response_obj_count",
    "response_obj_bytes",
    "read_buf_count",
    "read_buf_bytes",
    "read_buf_bytes_free",
    "read_buf_oom",
    "reserved_fds",
    "cmd_get",
    "cmd_set",
    "cmd_flush",
    "cmd_touch",
    "cmd_meta",
    "get_hits",
    "get_misses",
    "get_expired",
    "get_flushed",
    "delete_misses",
    "delete_hits",
    "incr_misses",
    "incr_hits",
    "decr_misses",
    "decr_hits",
    "cas_misses",
    "cas_hits",
    "cas_badval",
    "touch_hits",
    "touch_misses",
    "store_too_large",
    "store_no_memory",
    "auth_cmds",
    "auth_errors",
    "bytes_read",
    "bytes_written",
    "limit_maxbytes",
    "accepting_conns",
    "listen_disabled_num",
    "time_in_listen_disabled_us",
    "threads",
    "conn_yields",
    "hash_power_level",
    "hash_bytes",
    "hash_is_expanding",
    "slab_reassign_rescues",
    "slab_reassign_chunk_rescues",
    "slab_reassign_evictions_nomem",
    "slab_reassign_inline_reclaim",
    "slab_reassign_busy_items",
    "slab_reassign_busy_deletes",
    "slab_reassign_running",
    "slabs_moved",
    "malloc_fails",
    "log_worker_dropped",
    "log_worker_written",
    "log_watcher_skipped",
    "log_watcher_sent",
    "log_watchers",
    "unexpected_napi_ids",
    "round_robin_fallback",
    "bytes",
    "curr_items",
    "total_items",
    "slab_global_page_pool",
    "expired_unfetched",
    "evicted_unfetched",
    "evictions",
    "reclaimed",
    "crawler_reclaimed",
    "crawler_items_checked",
    "lrutail_reflocked",
];

/// memcached's field between `auth_errors` and `bytes_read` when an idle timeout is set
/// (`-o idle_timeout`): connections closed for idling.
pub const IDLE_KICKS: &str = "idle_kicks";

/// memcached's fields after `log_watchers` with TLS (`-Z`).
pub const TLS_GENERAL: &[&str] = &["ssl_handshake_errors", "time_since_server_cert_refresh"];

/// Whether `name` is one of memcached's general `stats` fields.
pub fn is_memcached_general(name: &str) -> bool {
    name == IDLE_KICKS || MEMCACHED_GENERAL.contains(&name) || TLS_GENERAL.contains(&name)
}

/// CPU time as memcached prints it (`seconds.microseconds`).
fn cpu_secs(t: nix::sys::time::TimeVal) -> String {
    format!("{}.{:06}", t.tv_sec(), t.tv_usec())
}

/// `stats`: memcached's fields ([`MEMCACHED_GENERAL`]), each with cellcache's value of the
/// same thing. Where cellcache has no such mechanism the value is what memcached reports when
/// the event never happened (docs/protocol.md, "stats" lists each one).
fn general(cell: &Cell, now: u32, out: &mut Vec<u8>) {
    let c = cell.counters.snapshot();
    let s = cell.store.stats();
    let e = cell
        .engine_stats
        .get()
        .map(|e| e.snapshot())
        .unwrap_or_default();
    let usage = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF).ok();
    let engine = cell
        .engine
        .get()
        .map_or_else(|| "none".to_string(), |k| format!("{k:?}").to_lowercase());
    stat(out, "pid", std::process::id());
    stat(out, "uptime", cell.uptime_secs());
    stat(out, "time", now);
    stat(out, "version", VERSION);
    // No libevent: the I/O engine in its place.
    stat(out, "libevent", engine);
    stat(out, "pointer_size", usize::BITS);
    stat(
        out,
        "rusage_user",
        usage.map_or_else(|| "0.000000".into(), |u| cpu_secs(u.user_time())),
    );
    stat(
        out,
        "rusage_system",
        usage.map_or_else(|| "0.000000".into(), |u| cpu_secs(u.system_time())),
    );
    stat(out, "max_connections", cell.config.io.max_connections);
    stat(out, "curr_connections", e.curr_connections);
    stat(out, "total_connections", e.total_connections);
    stat(out, "rejected_connections", e.rejected_connections);
    // One connection state per open connection, freed when it closes.
    stat(out, "connection_structures", e.curr_connections);
    // memcached's response objects and read-buffer cache: cellcache has neither (each
    // connection owns its buffers), so none are counted.
    zeros(
        out,
        &[
            "response_obj_oom",
            "response_obj_count",
            "response_obj_bytes",
            "read_buf_count",
            "read_buf_bytes",
            "read_buf_bytes_free",
            "read_buf_oom",
        ],
    );
    // No descriptors are held back from the -c client connections.
    stat(out, "reserved_fds", 0);
    stat(out, "cmd_get", c.cmd_get);
    stat(out, "cmd_set", c.cmd_set);
    stat(out, "cmd_flush", c.cmd_flush);
    stat(out, "cmd_touch", c.cmd_touch);
    stat(out, "cmd_meta", c.cmd_meta);
    stat(out, "get_hits", c.get_hits);
    stat(out, "get_misses", c.get_misses);
    stat(out, "get_expired", s.get_expired);
    // flush_all drops every item at once, so no fetch ever finds a flushed item.
    stat(out, "get_flushed", 0);
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
    // Logins (text) and SASL authentications, as memcached counts them: each checked
    // attempt, and those that failed.
    stat(out, "auth_cmds", c.auth_cmds);
    stat(out, "auth_errors", c.auth_errors);
    if cell.config.io.idle_timeout_secs > 0 {
        // As memcached: only with an idle timeout.
        stat(out, IDLE_KICKS, e.idle_kicks);
    }
    // Under TLS, what clients sent and were sent as memcached counts it: before encryption.
    let (read, written) = match cell.tls.get() {
        Some(t) => (
            t.stats
                .bytes_read
                .load(std::sync::atomic::Ordering::Relaxed),
            t.stats
                .bytes_written
                .load(std::sync::atomic::Ordering::Relaxed),
        ),
        None => (e.bytes_read, e.bytes_written),
    };
    stat(out, "bytes_read", read);
    stat(out, "bytes_written", written);
    stat(out, "limit_maxbytes", s.memory_limit_bytes);
    stat(
        out,
        "accepting_conns",
        u8::from(!cell.shutdown.is_triggered()),
    );
    // cellcache never stops listening at the connection limit (it answers the extra
    // connection with an error and closes it), so these read as memcached's when it did not.
    stat(out, "listen_disabled_num", 0);
    stat(out, "time_in_listen_disabled_us", 0);
    stat(out, "threads", cell.config.io.worker_threads());
    stat(out, "conn_yields", c.conn_yields);
    // The index: its slots as a power of two, its bytes; it never grows (sized at start).
    stat(
        out,
        "hash_power_level",
        s.index_slots.max(1).next_power_of_two().trailing_zeros(),
    );
    stat(out, "hash_bytes", s.index_bytes);
    stat(out, "hash_is_expanding", 0);
    // Slabs hold items of every size, so no slab is ever moved between classes.
    zeros(
        out,
        &[
            "slab_reassign_rescues",
            "slab_reassign_chunk_rescues",
            "slab_reassign_evictions_nomem",
            "slab_reassign_inline_reclaim",
            "slab_reassign_busy_items",
            "slab_reassign_busy_deletes",
            "slab_reassign_running",
            "slabs_moved",
        ],
    );
    // The store is allocated once, at start.
    stat(out, "malloc_fails", 0);
    // No `watch` log stream; no NAPI-id thread assignment.
    zeros(
        out,
        &[
            "log_worker_dropped",
            "log_worker_written",
            "log_watcher_skipped",
            "log_watcher_sent",
            "log_watchers",
        ],
    );
    // memcached with -Z adds these two here.
    if let Some(tls) = cell.tls.get() {
        stat(
            out,
            "ssl_handshake_errors",
            tls.stats
                .handshake_errors
                .load(std::sync::atomic::Ordering::Relaxed),
        );
        stat(
            out,
            "time_since_server_cert_refresh",
            tls.certs.since_refresh().as_secs(),
        );
    }
    zeros(out, &["unexpected_napi_ids", "round_robin_fallback"]);
    stat(out, "bytes", s.bytes);
    stat(out, "curr_items", s.curr_items);
    stat(out, "total_items", s.total_items);
    // memcached's global pool of free pages: cellcache's free slabs.
    stat(out, "slab_global_page_pool", s.slabs_free);
    stat(out, "expired_unfetched", s.expired_unfetched);
    stat(out, "evicted_unfetched", s.evicted_unfetched);
    stat(out, "evictions", s.evicted_items);
    stat(out, "reclaimed", s.reclaimed);
    // No LRU crawler (expired items are reclaimed when found or when their slab is cleared,
    // counted in `reclaimed`); no reference counts on items.
    stat(out, "crawler_reclaimed", 0);
    stat(out, "crawler_items_checked", 0);
    stat(out, "lrutail_reflocked", 0);
}

/// `stats cellcache`: cellcache's own figures — the store's arena and index, and the
/// ring's when the cell is in one.
fn own(cell: &Cell, out: &mut Vec<u8>) {
    let c = cell.counters.snapshot();
    let s = cell.store.stats();
    let e = cell
        .engine_stats
        .get()
        .map(|e| e.snapshot())
        .unwrap_or_default();
    stat(out, "protocol_errors", c.protocol_errors);
    // Connections closed for holding part of a request past `io.request_timeout_secs`.
    stat(out, "request_timeouts", e.request_timeouts);
    // Logins refused unchecked: their address failed `server.auth_failures_max` times.
    stat(out, "auth_throttled", c.auth_throttled);
    // Connections refused because their address held `io.connections_per_address_max`.
    stat(out, "address_refusals", e.address_refusals);
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
    // The automatic policy's inputs and what it did (`[switching]`, docs/switching.md).
    stat(out, "ghost_hits", s.ghost_hits);
    stat(out, "auto_switch", u8::from(cell.auto_switch.enabled()));
    stat(out, "auto_switches", cell.auto_switch.switches());
    cell.latency.write_stats(out);
    if let Some(tier) = &cell.tier {
        tier.write_stats(out);
    }
    if let Some(ring) = cell.ring_figures.get() {
        ring.write_stats(out);
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
    // No unix socket in cellcache: memcached's value when it is off.
    stat(out, "domain_socket", "NULL");
    // One auth file (-Y) serves both: SASL on binary connections, the login on text ones;
    // memcached names the file, as here.
    let auth = cell.credentials.as_ref();
    stat(
        out,
        "auth_enabled_sasl",
        if auth.is_some() { "yes" } else { "no" },
    );
    stat(
        out,
        "auth_enabled_ascii",
        auth.map_or("no", crate::credentials::Credentials::path),
    );
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
    tls_settings(cell, out);
    stat(
        out,
        "io_engine",
        format!("{:?}", c.server.io_engine).to_lowercase(),
    );
    stat(out, "store_layout", format!("{:?}", st.layout));
    // The policy running now: a live switch (`ctl switch eviction`) changes it.
    stat(out, "eviction_policy", cell.store.eviction().name());
    stat(out, "key_bytes_max", cell.limits.key_bytes_max);
    stat(out, "line_bytes_max", cell.limits.line_bytes_max);
    stat(out, "keys_per_get_max", cell.limits.keys_per_get_max);
}

/// memcached's `ssl_*` settings (a memcached built with TLS, as Debian's, always lists
/// them), with cellcache's values.
fn tls_settings(cell: &Cell, out: &mut Vec<u8>) {
    let tls = &cell.config.server.tls;
    let path = |p: &str| {
        if p.is_empty() {
            "(null)".to_string()
        } else {
            p.to_string()
        }
    };
    stat(out, "ssl_enabled", if tls.enabled { "yes" } else { "no" });
    stat(out, "ssl_chain_cert", path(&tls.chain_cert));
    stat(out, "ssl_key", path(&tls.key));
    stat(out, "ssl_verify_mode", tls.verify_mode);
    // 1: PEM, the only format cellcache reads.
    stat(out, "ssl_keyformat", 1);
    // rustls's own cipher suites; memcached prints NULL when none were chosen.
    stat(out, "ssl_ciphers", "NULL");
    stat(
        out,
        "ssl_ca_cert",
        if tls.ca_cert.is_empty() {
            "NULL".to_string()
        } else {
            tls.ca_cert.clone()
        },
    );
    stat(out, "ssl_wbuf_size", 16384);
    stat(out, "ssl_session_cache", "no");
    stat(out, "ssl_kernel_tls", "no");
    stat(out, "ssl_min_version", &tls.min_version);
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
        out.extend_from_slice(lines::ERROR);
        return;
    }
    match w.next() {
        Some(b"on") => {
            cell.detail.set_enabled(true);
            out.extend_from_slice(lines::OK);
        }
        Some(b"off") => {
            cell.detail.set_enabled(false);
            out.extend_from_slice(lines::OK);
        }
        Some(b"dump") => cell.detail.dump(out),
        _ => out.extend_from_slice(lines::CLIENT_ERROR_STATS_DETAIL_USAGE),
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
        out.extend_from_slice(lines::ERROR);
        return;
    }
    let (Some(class), Some(limit)) = (w.next(), w.next()) else {
        out.extend_from_slice(lines::CLIENT_ERROR_BAD_COMMAND_LINE);
        return;
    };
    let number = |t: &[u8]| std::str::from_utf8(t).ok()?.parse::<u32>().ok();
    let (Some(class), Some(limit)) = (number(class), number(limit)) else {
        out.extend_from_slice(lines::CLIENT_ERROR_BAD_COMMAND_LINE_FORMAT);
        return;
    };
    if class >= SLAB_CLASS_IDS {
        out.extend_from_slice(lines::CLIENT_ERROR_ILLEGAL_SLAB_ID);
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
                    // Never expiring is 0 in memcached's dump, as in the store.
                    let exptime = item.expiry.as_unix_secs();
                    cellcache_proto::write_cachedump_item(
                        out,
                        item.key,
                        item.value.len() as u64,
                        u64::from(exptime),
                    );
                });
        }
    }
    out.extend_from_slice(lines::END);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::NodeConfig;

    fn cell() -> Cell {
        let mut config = NodeConfig::default();
        config.store.memory_limit_bytes = 8 << 20;
        let store = cellcache_store::Store::new(config.store.clone()).unwrap();
        let limits = config.protocol_limits();
        Cell::new(config, store, limits, cellcache_io::Shutdown::new())
    }

    fn names(reply: &[u8]) -> Vec<String> {
        std::str::from_utf8(reply)
            .unwrap()
            .lines()
            .filter_map(|l| l.strip_prefix("STAT "))
            .map(|l| l.split(' ').next().unwrap().to_string())
            .collect()
    }

    /// `stats` is memcached's list, in its order (memcached's own t/stats.t counts it);
    /// `stats cellcache` has none of those; `stats cell` is both.
    #[test]
    fn stats_has_memcacheds_fields_and_cellcache_its_own() {
        let cell = cell();
        let mut general_reply = Vec::new();
        reply(&cell, &StatsGroup::General, 0, &mut general_reply);
        assert_eq!(names(&general_reply), MEMCACHED_GENERAL);
        assert!(general_reply.ends_with(b"END\r\n"));
        let mut own_reply = Vec::new();
        reply(&cell, &StatsGroup::Other(b"cellcache"), 0, &mut own_reply);
        let own = names(&own_reply);
        assert!(own.contains(&"arena_bytes".to_string()), "{own:?}");
        assert!(own.iter().all(|n| !is_memcached_general(n)));
        let mut both = Vec::new();
        reply(&cell, &StatsGroup::Other(b"cell"), 0, &mut both);
        assert_eq!(names(&both).len(), MEMCACHED_GENERAL.len() + own.len());
    }
}
