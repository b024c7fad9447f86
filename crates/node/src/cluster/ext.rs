//! The ring's operator commands, shared by the two planes that carry them: the admin
//! plane (`crate::admin`: status, ranges, peek, leave for `cellcache ctl`) and the peer
//! plane's `Control` frames (`cluster status`, `cluster join`, sent by cells after proving
//! the ring's secret: a restarted cell asking whether its ring is alive, a new cell asking
//! to be admitted). The memcached port carries none of them.
//!
//! - `cluster status`: the ring as this cell sees it, one `CELL` line per cell with its
//!   memory (asked of each cell), then `END`.
//! - `cluster join <client-addr> <peer-addr> [parent-id]`: admit a new cell as a division of
//!   `parent` (default: the cell with the largest range); answers `JOINED <len>` and the map.
//! - leave: begin a cell's absorption by its successor.
//! - ranges: items this cell holds per range it masters or backs up.
//! - peek: this cell's own copy of a key (master or backup), as `VALUE <key> <flags>
//!   <bytes> <cas>` … `END`, never forwarded (diagnostics, tests).

use cellcache_proto::lines;
use std::sync::Arc;
use std::time::Duration;

use cellcache_cluster::wire::FrameKind;
use cellcache_cluster::{CellAddress, CellId, CellState, Migration};

use super::Cluster;
use crate::cell::Cell;

/// Runs a `Control` command of the peer plane; the reply ends with `END\r\n` or is one
/// line.
pub async fn run(cl: Arc<Cluster>, line: String) -> Vec<u8> {
    let words: Vec<&str> = line.split_ascii_whitespace().collect();
    match words.as_slice() {
        ["cluster", "status"] => status_text(&cl).await.into_bytes(),
        ["cluster", "join", client, peer, rest @ ..] if rest.len() <= 1 => {
            let parent = match rest.first().map(|p| p.parse::<CellId>()) {
                None => None,
                Some(Ok(p)) => Some(p),
                Some(Err(_)) => return lines::CLIENT_ERROR_BAD_CELL_ID.to_vec(),
            };
            let address = CellAddress {
                client: client.to_string(),
                peer: peer.to_string(),
            };
            match cl.admit(address, parent).await {
                Ok(map) => {
                    let body = map.encode();
                    let mut out = format!("JOINED {}\r\n", body.len()).into_bytes();
                    out.extend_from_slice(&body);
                    out.extend_from_slice(b"\r\n");
                    out
                }
                Err(e) => server_error(&format!("join refused: {e}")),
            }
        }
        _ => b"CLIENT_ERROR unknown cluster command (status, join)\r\n".to_vec(),
    }
}

/// This cell's own copy of `key`, if any (never forwarded).
pub fn peek(cell: &Cell, key: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    cell.store.get(key, cell.now(), |item| {
        cellcache_proto::write_value_header(
            &mut out,
            key,
            item.flags,
            item.value.len(),
            Some(item.cas),
        );
        out.extend_from_slice(item.value);
        cellcache_proto::write_value_end(&mut out);
    });
    out.extend_from_slice(lines::END);
    out
}

/// Begins the absorption of `cell` (an id as `status` prints it): `OK <epoch>`.
pub async fn leave(cl: &Arc<Cluster>, cell: &str) -> Vec<u8> {
    match cell.parse::<CellId>() {
        Ok(id) => match cl.leave(id).await {
            Ok(map) => {
                let mut out = Vec::new();
                lines::write_ok_with(&mut out, map.epoch().to_string().as_bytes());
                out
            }
            Err(e) => server_error(&format!("leave refused: {e}")),
        },
        Err(_) => lines::CLIENT_ERROR_BAD_CELL_ID.to_vec(),
    }
}

/// `SERVER_ERROR <text>`.
fn server_error(text: &str) -> Vec<u8> {
    let mut out = Vec::new();
    cellcache_proto::Response::ServerError(text.as_bytes()).encode(&mut out);
    out
}

/// `STAT name value` lines of a `stats` reply, as (name, value).
fn stat<'a>(reply: &'a str, name: &str) -> Option<&'a str> {
    reply.lines().find_map(|l| {
        let mut w = l.split(' ');
        (w.next() == Some("STAT") && w.next() == Some(name))
            .then(|| w.next())
            .flatten()
    })
}

/// The ring as this cell sees it (`EPOCH …`, a `CELL` line per cell, `MIGRATION`s, `END`).
pub async fn status_text(cl: &Arc<Cluster>) -> String {
    let map = cl.lock_ring().map().clone();
    let (voters, learners, leader) = match cl.raft.get() {
        Some(r) => {
            use cellcache_cluster::Consensus;
            let m = r.membership();
            let leader = r.leader().and_then(|l| cl.cell_of_raft_id(l));
            (m.voters, m.learners, leader)
        }
        None => Default::default(),
    };
    let mut out = format!(
        "EPOCH {} RF {} LEADER {} SELF {} RING {:x} PEERS {}\r\n",
        map.epoch(),
        map.replication_factor(),
        leader.map_or("-".to_string(), |l| l.to_string()),
        cl.me,
        map.ring(),
        // Said on every status: a ring without a secret or TLS is open to anyone on its
        // network.
        cl.auth.mode()
    );
    for c in map.cells() {
        let stats = if c.id == cl.me {
            let mut o = Vec::new();
            crate::stats::reply(
                &cl.cell,
                &cellcache_proto::StatsGroup::General,
                cl.cell.now(),
                &mut o,
            );
            Some(o)
        } else if let Some(link) = cl.link(&c.id) {
            let call = link.call(FrameKind::ForwardRequest, super::stats::CELL_STATS.to_vec());
            match tokio::time::timeout(Duration::from_millis(500), call).await {
                Ok(Ok(f)) if f.kind == FrameKind::ForwardReply => Some(f.payload),
                _ => None,
            }
        } else {
            None
        };
        let memory = stats
            .map(|s| {
                let s = String::from_utf8_lossy(&s).into_owned();
                format!(
                    "bytes={} limit={} items={}",
                    stat(&s, "bytes").unwrap_or("?"),
                    stat(&s, "limit_maxbytes").unwrap_or("?"),
                    stat(&s, "curr_items").unwrap_or("?")
                )
            })
            .unwrap_or_else(|| "unreachable".into());
        let role = if voters.contains(&c.id) {
            "voter"
        } else if learners.contains(&c.id) {
            "learner"
        } else {
            "none"
        };
        let state = match c.state {
            CellState::Joining => "joining",
            CellState::Active => "active",
            CellState::Leaving => "leaving",
            CellState::Dead => "dead",
        };
        let range = c.range.map_or("-".to_string(), |r| {
            format!("{:016x}-{:016x}", r.start, r.end)
        });
        out.push_str(&format!(
            "CELL {} {} client={} peer={} range={} role={} {}\r\n",
            c.id, state, c.address.client, c.address.peer, range, role, memory
        ));
    }
    for m in map.migrations() {
        match m {
            Migration::Division {
                parent,
                child,
                range,
                ..
            } => out.push_str(&format!(
                "MIGRATION division parent={parent} child={child} range={:016x}-{:016x}\r\n",
                range.start, range.end
            )),
            Migration::Absorption {
                departed,
                successor,
                range,
                ..
            } => out.push_str(&format!(
                "MIGRATION absorption departed={departed} successor={successor} range={:016x}-{:016x}\r\n",
                range.start, range.end
            )),
        }
    }
    out.push_str("END\r\n");
    out
}

/// Items held per range: the master range and each backed-up range.
pub fn ranges_text(cl: &Arc<Cluster>) -> String {
    let map = cl.lock_ring().map().clone();
    let mut out = String::new();
    let now = cl.cell.now();
    let count = |r: cellcache_cluster::HashRange| {
        let mut n = 0u64;
        cl.cell.store.for_each_in_range(r, now, |_| n += 1);
        n
    };
    if let Some(r) = map.cell(&cl.me).and_then(|c| c.range) {
        out.push_str(&format!(
            "RANGE master {} {:016x}-{:016x} {}\r\n",
            cl.me,
            r.start,
            r.end,
            count(r)
        ));
    }
    for (c, r) in map.backup_ranges(&cl.me) {
        out.push_str(&format!(
            "RANGE backup {} {:016x}-{:016x} {}\r\n",
            c.id,
            r.start,
            r.end,
            count(r)
        ));
    }
    out.push_str(&format!(
        "TOTAL {}\r\nEND\r\n",
        cl.cell.store.stats().curr_items
    ));
    out
}
