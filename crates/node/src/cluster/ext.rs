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
//! - `autoscale status|on|off`: this cell's autoscaling as JSON, or its switch (the admin
//!   plane's `ctl autoscale` asks the deciding cell, and switches every cell).
//! - `switch BLOCK IMPL`: switch one of this cell's building blocks live (`crate::blocks`;
//!   the admin plane's `ctl switch --ring` sends it to every cell).
//! - leave: begin a cell's absorption by its successor.
//! - shift: move a share of a cell's range to its neighbour (balancing by hand).
//! - ranges: items this cell holds per range it masters or backs up.
//! - peek: this cell's own copy of a key (master or backup), as `VALUE <key> <flags>
//!   <bytes> <cas>` … `END`, never forwarded (diagnostics, tests).

use cellcache_proto::lines;
use std::sync::Arc;

use cellcache_cluster::{CellAddress, CellId};

use super::Cluster;
use crate::cell::Cell;

/// Runs a `Control` command of the peer plane; the reply ends with `END\r\n` or is one
/// line.
pub async fn run(cl: Arc<Cluster>, line: String) -> Vec<u8> {
    let words: Vec<&str> = line.split_ascii_whitespace().collect();
    match words.as_slice() {
        ["cluster", "status"] => status_text(&cl).await.into_bytes(),
        ["autoscale", word] => super::autoscale::control(&cl, word),
        ["switch", block, implementation] => {
            crate::blocks::control(&cl, block, implementation).await
        }
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

impl Cluster {
    /// The cell this ring member is.
    pub fn cell(&self) -> &Arc<Cell> {
        &self.cell
    }

    /// Every other cell of the installed map, with its peer address.
    pub fn peers(&self) -> Vec<(CellId, String)> {
        self.lock_ring()
            .map()
            .cells()
            .iter()
            .filter(|c| c.id != self.me)
            .map(|c| (c.id.clone(), c.address.peer.clone()))
            .collect()
    }

    /// Sends the control command `line` to the cell whose peer address is `peer`, proving
    /// the ring's secret as every peer connection does, off the runtime's threads; its
    /// reply, or why there is none.
    pub async fn operator_call(&self, peer: String, line: String) -> Result<String, String> {
        let (auth, wire) = (self.auth.clone(), self.config.wire);
        let timeout = std::time::Duration::from_millis(self.config.request_timeout_ms);
        tokio::task::spawn_blocking(move || {
            super::handshake::operator_call(&peer, &auth, &wire, &line, timeout, None)
        })
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())
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

/// Begins a shift of `share` of `from`'s range to its neighbour `to` (ids as `status`
/// prints them): `OK <epoch>`.
pub async fn shift(cl: &Arc<Cluster>, from: &str, to: &str, share: f64) -> Vec<u8> {
    let (Ok(from), Ok(to)) = (from.parse::<CellId>(), to.parse::<CellId>()) else {
        return lines::CLIENT_ERROR_BAD_CELL_ID.to_vec();
    };
    if !(share > 0.0 && share < 1.0) {
        return b"CLIENT_ERROR share must be between 0 and 1\r\n".to_vec();
    }
    match cl.shift(from, to, share).await {
        Ok(map) => {
            let mut out = Vec::new();
            lines::write_ok_with(&mut out, map.epoch().to_string().as_bytes());
            out
        }
        Err(e) => server_error(&format!("shift refused: {e}")),
    }
}

/// `SERVER_ERROR <text>`.
fn server_error(text: &str) -> Vec<u8> {
    let mut out = Vec::new();
    cellcache_proto::Response::ServerError(text.as_bytes()).encode(&mut out);
    out
}

/// The ring as this cell sees it (`EPOCH …`, a `CELL` line per cell, `MIGRATION`s, `END`).
pub async fn status_text(cl: &Arc<Cluster>) -> String {
    super::view::gather(cl, super::view::Gather::Memory)
        .await
        .text()
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
