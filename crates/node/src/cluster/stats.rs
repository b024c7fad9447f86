//! `stats` through a ring cell answers for the whole ring, as one memcached would.
//!
//! The entry cell asks every Active cell for `stats cell` (its own figures, the same lines a
//! single cell's `stats` gives, plus the items and bytes of the range it masters) and sums
//! them ([`aggregate`]):
//!
//! - counters (`cmd_*`, `*_hits`, `*_misses`, `bytes_read`, connections, `evictions`…) are
//!   sums: a request is counted once, by the cell that executed it (the master), never by the
//!   cell that forwarded it, and a backup applying a replicated write counts nothing;
//! - `curr_items` counts every item once: the sum of the items each cell holds in the range
//!   it masters (backup copies are left out); `bytes` is the master copies' share of each
//!   cell's bytes; `limit_maxbytes` is the memory for distinct items, the cells' limits over
//!   the copies of an item (the replication factor, or the cell count if smaller), so `bytes / limit_maxbytes` reads as a memcached user expects;
//! - identity and settings fields (`pid`, `uptime`, `time`, `version`, `pointer_size`,
//!   `max_connections`, `threads`, `rusage_*`, `cluster_cell`) are the entry cell's;
//! - `cluster_cells` is how many cells answered, `cluster_cells_unreachable` how many did not
//!   within the request timeout (their figures are missing from the sums).
//!
//! `stats` keeps memcached's fields of these sums ([`crate::stats::MEMCACHED_GENERAL`]),
//! `stats cellcache` the rest (cellcache's own, the `cluster_*` fields among them).
//!
//! `stats cell` is the entry cell alone; `stats cells` is every cell's `stats cell`, each
//! name prefixed with the cell's id and a colon (`STAT 2:curr_items 10`), as memcached's
//! `stats slabs` prefixes a class. `stats reset` resets every cell.
//!
//! `stats cell` counts the items of the master range exactly, by walking them under each
//! shard's lock (a full 64 MiB store: 128–216 ms, docs/store.md). What asks every cell
//! every second — the autoscaler, the ring view — asks `stats cell estimate` instead: the
//! same figures without the walk, the master copies' bytes estimated from the ranges' lengths
//! ([`master_bytes_estimate`]).

use cellcache_proto::lines;
use std::sync::Arc;
use std::time::Duration;

use cellcache_cluster::wire::FrameKind;
use cellcache_cluster::{CellId, CellState, HashRange};

use super::Cluster;
use super::route::{Done, Reply};

/// The request that asks one cell for its own figures.
pub const CELL_STATS: &[u8] = b"stats cell\r\n";
/// The same without walking the cell's items: `cluster_master_items` is left out and
/// `cluster_master_bytes_estimate` given instead (see [`master_bytes_estimate`]).
pub const CELL_ESTIMATE_STATS: &[u8] = b"stats cell estimate\r\n";
/// The `stats` group of [`CELL_ESTIMATE_STATS`].
pub const CELL_ESTIMATE_GROUP: &[u8] = b"cell estimate";

/// Fields that are the entry cell's, not a sum.
const ENTRY_FIELDS: &[&str] = &[
    "pid",
    "uptime",
    "time",
    "version",
    "libevent",
    "pointer_size",
    "hash_power_level",
    "max_connections",
    "threads",
    "rusage_user",
    "rusage_system",
    "cluster_cell",
    "cluster_epoch",
    "store_shards",
    "accepting_conns",
    "time_since_server_cert_refresh",
];

/// The range this cell masters, while it is an Active cell of its map.
fn master_range(cl: &Cluster) -> Option<HashRange> {
    let ring = cl.lock_ring();
    ring.map()
        .cell(&cl.me)
        .filter(|c| c.state == CellState::Active)
        .and_then(|c| c.range)
}

impl Cluster {
    /// The share of the key-hash space this cell masters (0 unless Active).
    pub fn master_range_share(&self) -> f64 {
        master_range(self).map_or(0.0, |r| r.len() as f64 / 2f64.powi(64))
    }
}

/// Extra lines of a cell's `stats cell`: what it holds as master, counted item by item.
pub fn master_share(cl: &Cluster, out: &mut Vec<u8>) {
    let range = master_range(cl);
    let mut items = 0u64;
    if let Some(r) = range {
        cl.cell
            .store
            .for_each_in_range(r, cl.cell.now(), |_| items += 1);
    }
    out.extend_from_slice(format!("STAT cluster_master_items {items}\r\n").as_bytes());
    provisioned(cl, out);
}

fn provisioned(cl: &Cluster, out: &mut Vec<u8>) {
    let provisioned = u8::from(cl.cell.config.cluster.provisioned);
    out.extend_from_slice(format!("STAT cluster_provisioned {provisioned}\r\n").as_bytes());
}

/// The bytes of master copies among a cell's `bytes`, estimated without looking at an item:
/// keys hash uniformly over the ring (xxh3), so each range holds bytes in proportion to its
/// length, and a cell's bytes divide between the range it masters and the ranges it backs
/// up as their lengths do. `None` (not an Active cell): it masters nothing.
///
/// An estimate: a skewed key set, or items of a range not yet trimmed after a change, make
/// it off, which is what an autoscaling decision (a watermark, not a count) tolerates.
pub fn master_bytes_estimate(bytes: u64, master: Option<HashRange>, backups: &[HashRange]) -> u64 {
    let Some(master) = master else {
        return 0;
    };
    let held = master.len() + backups.iter().map(HashRange::len).sum::<u128>();
    // `held` is at least `master.len()`, which is at least 1: a range is never empty.
    (u128::from(bytes) * master.len() / held) as u64
}

/// Extra lines of a cell's `stats cell estimate`: its master copies' bytes, estimated from
/// its ranges' lengths ([`master_bytes_estimate`]); `bytes` is the cell's own.
fn master_share_estimate(cl: &Cluster, bytes: u64, out: &mut Vec<u8>) {
    let (master, backups) = {
        let ring = cl.lock_ring();
        let map = ring.map();
        let master = map
            .cell(&cl.me)
            .filter(|c| c.state == CellState::Active)
            .and_then(|c| c.range);
        let backups: Vec<HashRange> = map
            .backup_ranges(&cl.me)
            .into_iter()
            .map(|(_, r)| r)
            .collect();
        (master, backups)
    };
    let estimate = master_bytes_estimate(bytes, master, &backups);
    out.extend_from_slice(format!("STAT cluster_master_bytes_estimate {estimate}\r\n").as_bytes());
    provisioned(cl, out);
}

/// Parses `STAT name value` lines (up to `END`).
pub(crate) fn parse(reply: &[u8]) -> Option<Vec<(String, String)>> {
    let text = std::str::from_utf8(reply).ok()?;
    let mut out = Vec::new();
    for line in text.split("\r\n") {
        if line == "END" {
            return Some(out);
        }
        let mut w = line.splitn(3, ' ');
        if w.next() != Some("STAT") {
            return None;
        }
        out.push((w.next()?.to_string(), w.next().unwrap_or("").to_string()));
    }
    None
}

fn num(fields: &[(String, String)], name: &str) -> Option<f64> {
    fields
        .iter()
        .find(|(k, _)| k == name)
        .and_then(|(_, v)| v.parse().ok())
}

/// The ring's `stats` from the entry cell's figures and every other answering cell's (see
/// the module docs); `unreachable` cells did not answer.
pub fn aggregate(
    entry: &[(String, String)],
    others: &[Vec<(String, String)>],
    replication_factor: u8,
    unreachable: usize,
) -> Vec<(String, String)> {
    let all: Vec<&[(String, String)]> = std::iter::once(entry)
        .chain(others.iter().map(Vec::as_slice))
        .collect();
    let sum = |name: &str| -> f64 { all.iter().filter_map(|f| num(f, name)).sum() };
    // Copies of each item: the replication factor, or fewer in a ring of fewer cells.
    let copies = f64::from(replication_factor.max(1)).min(all.len() as f64);
    let master_items = sum("cluster_master_items");
    // Each cell's bytes, scaled by the part of its items it masters.
    let master_bytes: f64 = all
        .iter()
        .map(|f| {
            let items = num(f, "curr_items").unwrap_or(0.0);
            let bytes = num(f, "bytes").unwrap_or(0.0);
            let mine = num(f, "cluster_master_items").unwrap_or(0.0);
            if items > 0.0 {
                bytes * mine / items
            } else {
                0.0
            }
        })
        .sum();
    let mut out = Vec::new();
    for (name, value) in entry {
        let v = match name.as_str() {
            n if ENTRY_FIELDS.contains(&n) => value.clone(),
            "curr_items" => format!("{master_items}"),
            "bytes" => format!("{}", master_bytes.round() as u64),
            "limit_maxbytes" => {
                format!("{}", (sum(name) / copies) as u64)
            }
            "cluster_master_items" | "cluster_provisioned" => continue,
            n => match value.parse::<f64>() {
                Ok(_) => {
                    let s = sum(n);
                    if value.contains('.') {
                        format!("{s:.6}")
                    } else {
                        format!("{}", s as u64)
                    }
                }
                Err(_) => value.clone(),
            },
        };
        out.push((name.clone(), v));
    }
    out.push(("cluster_cells".into(), all.len().to_string()));
    out.push(("cluster_cells_unreachable".into(), unreachable.to_string()));
    out
}

fn write(out: &mut Vec<u8>, prefix: &str, fields: &[(String, String)]) {
    for (k, v) in fields {
        out.extend_from_slice(format!("STAT {prefix}{k} {v}\r\n").as_bytes());
    }
}

/// Which answer a gather builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `stats` (`own` false: memcached's fields) or `stats cellcache` (`own` true:
    /// cellcache's own): the ring's sums.
    Ring { own: bool },
    /// `stats cells`: every cell's own figures, prefixed.
    Cells,
    /// `stats items`, `slabs`, `sizes`, `detail dump` or `cachedump`: the same request to
    /// every cell, the answers merged ([`merge_replies`]).
    Merge,
}

/// Fields of `stats items`/`stats slabs` that are a bound or an age, not an amount: the
/// ring's is the largest of the cells'.
fn is_max_field(name: &str) -> bool {
    let last = name.rsplit(':').next().unwrap_or(name);
    matches!(
        last,
        "age"
            | "age_hot"
            | "age_warm"
            | "evicted_time"
            | "slab_size"
            | "chunk_size"
            | "chunks_per_page"
            | "active_slabs"
    )
}

/// The slab class a per-class field belongs to (`items:3:number`, `3:total_pages`), for
/// ordering; fields of no class sort last.
fn class_of(name: &str) -> u64 {
    let mut parts = name.split(':');
    let first = parts.next().unwrap_or("");
    let n = if first == "items" {
        parts.next()
    } else {
        Some(first)
    };
    n.and_then(|n| n.parse().ok()).unwrap_or(u64::MAX)
}

/// Every cell's answer to the same stats group, merged by name: amounts are summed, bounds
/// and ages take the largest, text is the first cell's; per-class lines are ordered by class
/// as one memcached orders them.
pub fn merge(answers: &[Vec<(String, String)>]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for fields in answers {
        for (name, value) in fields {
            let Some(slot) = out.iter_mut().find(|(k, _)| k == name) else {
                out.push((name.clone(), value.clone()));
                continue;
            };
            if let (Ok(a), Ok(b)) = (slot.1.parse::<u64>(), value.parse::<u64>()) {
                slot.1 = if is_max_field(name) { a.max(b) } else { a + b }.to_string();
            }
        }
    }
    out.sort_by_key(|(k, _)| class_of(k));
    out
}

/// Every cell's answer to the same stats request merged into the ring's: `STAT` lines by
/// name ([`merge`]), `PREFIX` lines of `stats detail dump` by prefix (counts summed), `ITEM`
/// lines of `stats cachedump` once per key (a backup copy is the same item). An answer that
/// is not such lines (an error) is the entry cell's answer as it is.
pub fn merge_replies(entry: &[u8], others: &[Vec<u8>]) -> Vec<u8> {
    let lines = |reply: &[u8]| -> Option<Vec<String>> {
        let text = std::str::from_utf8(reply).ok()?.strip_suffix("END\r\n")?;
        Some(text.split_terminator("\r\n").map(str::to_string).collect())
    };
    let Some(first) = lines(entry) else {
        return entry.to_vec();
    };
    let all: Vec<Vec<String>> = std::iter::once(first)
        .chain(others.iter().filter_map(|o| lines(o)))
        .collect();
    let mut out = Vec::new();
    let kind = all
        .iter()
        .flatten()
        .next()
        .and_then(|l| l.split(' ').next());
    match kind {
        Some("STAT") => {
            let parsed: Vec<_> = all
                .iter()
                .map(|ls| {
                    let mut text = ls.join("\r\n");
                    text.push_str("\r\nEND\r\n");
                    parse(text.as_bytes()).unwrap_or_default()
                })
                .collect();
            write(&mut out, "", &merge(&parsed));
        }
        Some("PREFIX") => {
            // PREFIX <p> get N hit N set N del N
            let mut prefixes: Vec<(String, Vec<(String, u64)>)> = Vec::new();
            for line in all.iter().flatten() {
                let words: Vec<&str> = line.split(' ').collect();
                let Some(name) = words.get(1) else { continue };
                let counts: Vec<(String, u64)> = words[2..]
                    .chunks(2)
                    .map(|kv| {
                        (
                            kv[0].to_string(),
                            kv.get(1).and_then(|v| v.parse().ok()).unwrap_or(0),
                        )
                    })
                    .collect();
                match prefixes.iter_mut().find(|(p, _)| p == name) {
                    Some((_, sums)) => {
                        for ((_, sum), (_, n)) in sums.iter_mut().zip(&counts) {
                            *sum += n;
                        }
                    }
                    None => prefixes.push((name.to_string(), counts)),
                }
            }
            for (name, counts) in prefixes {
                out.extend_from_slice(format!("PREFIX {name}").as_bytes());
                for (k, n) in counts {
                    out.extend_from_slice(format!(" {k} {n}").as_bytes());
                }
                out.extend_from_slice(b"\r\n");
            }
        }
        Some(_) => {
            // ITEM <key> [...]: each item once.
            let mut seen = std::collections::HashSet::new();
            for line in all.iter().flatten() {
                let key = line.split(' ').nth(1).unwrap_or("");
                if seen.insert(key.to_string()) {
                    out.extend_from_slice(line.as_bytes());
                    out.extend_from_slice(b"\r\n");
                }
            }
        }
        None => {}
    }
    out.extend_from_slice(lines::END);
    out
}

/// Strips a stats answer's `END` line, if any.
fn without_end(mut reply: Vec<u8>) -> Vec<u8> {
    if reply.ends_with(lines::END) {
        reply.truncate(reply.len() - lines::END.len());
    }
    reply
}

/// Asks every Active cell for its figures (this one locally) and answers `done`; `request`
/// is the client's (what [`Kind::Merge`] asks every cell).
pub fn gather(cl: &Arc<Cluster>, kind: Kind, request: Vec<u8>, done: Done) {
    let (others, rf): (Vec<CellId>, u8) = {
        let ring = cl.lock_ring();
        let map = ring.map();
        (
            map.active_cells()
                .map(|c| c.id.clone())
                .filter(|c| *c != cl.me)
                .collect(),
            map.replication_factor(),
        )
    };
    let mut mine = Vec::new();
    let request = match kind {
        Kind::Ring { .. } | Kind::Cells => {
            local_cell_stats(cl, &mut mine);
            CELL_STATS.to_vec()
        }
        Kind::Merge => {
            if let cellcache_proto::Parsed::Complete {
                request: cellcache_proto::Request::Stats(group),
                ..
            } = cellcache_proto::parse(&request, &cl.cell.limits)
            {
                crate::stats::reply(&cl.cell, &group, cl.cell.now(), &mut mine);
            }
            request
        }
    };
    let me = cl.me.clone();
    let timeout = Duration::from_millis(cl.config.request_timeout_ms);
    let cl2 = cl.clone();
    cl.handle.spawn(async move {
        let calls = others.into_iter().map(|id| {
            let link = cl2.link(&id);
            let request = request.clone();
            async move {
                let answer = match link {
                    Some(link) => {
                        let call = link.call(FrameKind::ForwardRequest, request);
                        match tokio::time::timeout(timeout, call).await {
                            Ok(Ok(f)) if f.kind == FrameKind::ForwardReply => Some(f.payload),
                            _ => None,
                        }
                    }
                    None => None,
                };
                (id, answer)
            }
        });
        // Every cell is asked at once; one that does not answer costs one timeout.
        let calls: Vec<_> = calls.map(tokio::spawn).collect();
        let mut answers = Vec::new();
        for call in calls {
            if let Ok(answer) = call.await {
                answers.push(answer);
            }
        }
        if kind == Kind::Merge {
            let others: Vec<_> = answers.into_iter().filter_map(|(_, a)| a).collect();
            done(Reply::Bytes(merge_replies(&mine, &others)));
            return;
        }
        let answers: Vec<_> = answers
            .into_iter()
            .map(|(id, a)| (id, a.and_then(|a| parse(&a))))
            .collect();
        let entry = parse(&mine).unwrap_or_default();
        let mut out = Vec::new();
        match kind {
            Kind::Ring { own } => {
                let unreachable = answers.iter().filter(|(_, a)| a.is_none()).count();
                let others: Vec<_> = answers.into_iter().filter_map(|(_, a)| a).collect();
                let mut ring = aggregate(&entry, &others, rf, unreachable);
                ring.retain(|(name, _)| crate::stats::is_memcached_general(name) != own);
                write(&mut out, "", &ring);
            }
            Kind::Cells => {
                write(&mut out, &format!("{me}:"), &entry);
                for (id, a) in answers {
                    match a {
                        Some(f) => write(&mut out, &format!("{id}:"), &f),
                        None => write(
                            &mut out,
                            &format!("{id}:"),
                            &[("unreachable".into(), "1".into())],
                        ),
                    }
                }
            }
            Kind::Merge => {}
        }
        out.extend_from_slice(lines::END);
        done(Reply::Bytes(out));
    });
}

/// This cell's own `stats cell` reply (its `stats` and `stats cellcache` lines, as a single
/// cell answers it), `END` included.
fn own_cell_stats(cl: &Cluster) -> Vec<u8> {
    let mut mine = Vec::new();
    crate::stats::reply(
        &cl.cell,
        &cellcache_proto::StatsGroup::Other(b"cell"),
        cl.cell.now(),
        &mut mine,
    );
    mine
}

/// This cell's `stats cell`: its `stats` and `stats cellcache` lines (the single cell's
/// answer to `stats cell`) and what it holds as master.
pub fn local_cell_stats(cl: &Cluster, out: &mut Vec<u8>) {
    let mine = own_cell_stats(cl);
    out.extend_from_slice(&without_end(mine));
    master_share(cl, out);
    out.extend_from_slice(lines::END);
}

/// This cell's `stats cell estimate`: [`local_cell_stats`] but for the walk, the master
/// copies' bytes estimated ([`master_bytes_estimate`]) instead of their items counted.
pub fn local_cell_stats_estimate(cl: &Cluster, out: &mut Vec<u8>) {
    let mine = own_cell_stats(cl);
    let bytes = parse(&mine)
        .and_then(|f| num(&f, "bytes"))
        .map_or(0, |b| b as u64);
    out.extend_from_slice(&without_end(mine));
    master_share_estimate(cl, bytes, out);
    out.extend_from_slice(lines::END);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(items: u64, mine: u64, bytes: u64, hits: u64, pid: u32) -> Vec<(String, String)> {
        [
            ("pid", pid.to_string()),
            ("version", "1.6.21-cellcache".into()),
            ("get_hits", hits.to_string()),
            ("curr_items", items.to_string()),
            ("bytes", bytes.to_string()),
            ("limit_maxbytes", "1000".into()),
            ("rusage_user", "0.500000".into()),
            ("cluster_master_items", mine.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    #[test]
    fn a_ring_counts_each_item_once_and_sums_counters() {
        // Three cells, each holding 10 of its own and 10 backup copies.
        let entry = cell(20, 10, 200, 1, 7);
        let others = [cell(20, 10, 400, 2, 8), cell(20, 10, 600, 3, 9)];
        let got = aggregate(&entry, &others, 2, 0);
        let get = |n: &str| got.iter().find(|(k, _)| k == n).map(|(_, v)| v.as_str());
        assert_eq!(get("curr_items"), Some("30"));
        assert_eq!(get("bytes"), Some("600"), "half of each cell's bytes");
        assert_eq!(
            get("limit_maxbytes"),
            Some("1500"),
            "3 x 1000 over 2 copies"
        );
        assert_eq!(get("get_hits"), Some("6"));
        assert_eq!(get("pid"), Some("7"), "the entry cell's");
        assert_eq!(get("rusage_user"), Some("0.500000"));
        assert_eq!(get("version"), Some("1.6.21-cellcache"));
        assert_eq!(get("cluster_cells"), Some("3"));
        assert_eq!(get("cluster_master_items"), None);
        // A ring of one holds one copy: its limit is its own.
        let alone = aggregate(&cell(5, 5, 50, 0, 7), &[], 2, 0);
        assert!(alone.contains(&("limit_maxbytes".into(), "1000".into())));
    }

    #[test]
    fn per_class_groups_sum_amounts_and_keep_bounds() {
        let f = |v: &[(&str, &str)]| -> Vec<(String, String)> {
            v.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let a = f(&[
            ("items:5:number", "3"),
            ("items:5:age", "10"),
            ("items:5:evicted", "1"),
        ]);
        let b = f(&[
            ("items:2:number", "4"),
            ("items:5:number", "2"),
            ("items:5:age", "30"),
        ]);
        let got = merge(&[a, b]);
        let names: Vec<_> = got.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            names,
            [
                "items:2:number",
                "items:5:number",
                "items:5:age",
                "items:5:evicted"
            ]
        );
        assert_eq!(got[1].1, "5", "amounts add up");
        assert_eq!(got[2].1, "30", "the oldest item's age");
        let slabs = merge(&[
            f(&[
                ("1:chunk_size", "96"),
                ("1:total_pages", "2"),
                ("active_slabs", "1"),
            ]),
            f(&[
                ("1:chunk_size", "96"),
                ("1:total_pages", "3"),
                ("active_slabs", "1"),
            ]),
        ]);
        assert_eq!(slabs[0].1, "96", "a class's chunk size is not a sum");
        assert_eq!(slabs[1].1, "5");
        assert_eq!(slabs[2], ("active_slabs".to_string(), "1".to_string()));
    }

    #[test]
    fn detail_dumps_sum_per_prefix_and_cachedumps_list_each_item_once() {
        let a =
            b"PREFIX user get 3 hit 1 set 2 del 0\r\nPREFIX x get 1 hit 1 set 1 del 1\r\nEND\r\n";
        let b = b"PREFIX user get 1 hit 1 set 0 del 4\r\nEND\r\n".to_vec();
        assert_eq!(
            merge_replies(a, &[b]),
            b"PREFIX user get 4 hit 2 set 2 del 4\r\nPREFIX x get 1 hit 1 set 1 del 1\r\nEND\r\n"
        );
        let a = b"ITEM k1 [1 b; 0 s]\r\nITEM k2 [1 b; 0 s]\r\nEND\r\n";
        let b = b"ITEM k2 [1 b; 0 s]\r\nITEM k3 [2 b; 0 s]\r\nEND\r\n".to_vec();
        assert_eq!(
            merge_replies(a, &[b]),
            b"ITEM k1 [1 b; 0 s]\r\nITEM k2 [1 b; 0 s]\r\nITEM k3 [2 b; 0 s]\r\nEND\r\n"
        );
        assert_eq!(
            merge_replies(b"ERROR\r\n", &[b"END\r\n".to_vec()]),
            b"ERROR\r\n"
        );
        let stat = merge_replies(
            b"STAT items:1:number 2\r\nEND\r\n",
            &[b"STAT items:1:number 3\r\nEND\r\n".to_vec()],
        );
        assert_eq!(stat, b"STAT items:1:number 5\r\nEND\r\n");
    }

    #[test]
    fn the_master_share_of_bytes_follows_the_ranges_lengths() {
        let quarter = 1u64 << 62;
        // Not an Active cell: it masters nothing.
        assert_eq!(master_bytes_estimate(1000, None, &[]), 0);
        // A ring of one: everything it holds it masters.
        assert_eq!(
            master_bytes_estimate(1000, Some(HashRange::FULL), &[]),
            1000
        );
        // Two cells, two copies: each masters one half and backs up the other.
        let low = HashRange::new(0, 2 * quarter - 1);
        let high = HashRange::new(2 * quarter, u64::MAX);
        assert_eq!(master_bytes_estimate(1000, Some(low), &[high]), 500);
        // Masters a half and backs up a quarter: two thirds of its bytes are its own.
        let last = HashRange::new(3 * quarter, u64::MAX);
        assert_eq!(master_bytes_estimate(900, Some(low), &[last]), 600);
        // Masters a quarter and backs up a half (a wrapping one): a third.
        let wrapping = HashRange::new(3 * quarter, quarter - 1);
        let second = HashRange::new(quarter, 2 * quarter - 1);
        assert_eq!(master_bytes_estimate(900, Some(second), &[wrapping]), 300);
        assert_eq!(master_bytes_estimate(0, Some(second), &[wrapping]), 0);
        assert_eq!(
            master_bytes_estimate(u64::MAX, Some(HashRange::FULL), &[]),
            u64::MAX,
            "no overflow"
        );
    }

    /// The estimate's premise, with the ring's own hash: real keys' bytes in a range are
    /// proportional to its length, so the estimate is close to the exact count.
    #[test]
    fn the_estimate_is_close_to_the_bytes_of_real_keys() {
        let quarter = 1u64 << 62;
        // A cell masters a half and backs up its predecessor's quarter.
        let master = HashRange::new(0, 2 * quarter - 1);
        let backup = HashRange::new(3 * quarter, u64::MAX);
        let (mut mine, mut held) = (0u64, 0u64);
        for i in 0..40_000u64 {
            let key = format!("grow{i}");
            let size = 900 + i % 200;
            let hash = cellcache_store::key_hash(key.as_bytes());
            if master.contains(hash) {
                mine += size;
                held += size;
            } else if backup.contains(hash) {
                held += size;
            }
        }
        let estimate = master_bytes_estimate(held, Some(master), &[backup]);
        let off = (estimate as f64 - mine as f64).abs() / mine as f64;
        assert!(
            off < 0.02,
            "estimate {estimate}, exact {mine}: {off:.3} off"
        );
    }

    #[test]
    fn stat_lines_parse_and_garbage_does_not() {
        assert_eq!(
            parse(b"STAT a 1\r\nSTAT b x y\r\nEND\r\n").unwrap(),
            vec![("a".into(), "1".into()), ("b".into(), "x y".into())]
        );
        assert!(parse(b"SERVER_ERROR no\r\n").is_none());
        assert!(parse(b"STAT a 1\r\n").is_none(), "no END");
    }
}
