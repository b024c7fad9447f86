//! The building blocks a cell switches live, while it serves (`ctl switch`, docs/switching.md):
//! one name per block, what it runs now and what it can be switched to, and the switch.
//!
//! | block | implementations | how the switch keeps every request whole |
//! |---|---|---|
//! | `eviction` | `lru`, `s3fifo` | each shard's policy metadata is translated under its lock ([`cellcache_store::Store::switch_eviction`]) |
//! | `layout` | `shared` or `partitioned`, as started | not switchable live: the running one is the only one listed |
//! | `write_policy` | `through`, `back` (a cell with a tier) | an atomic the next write reads; held replies keep waiting ([`crate::tier::Tier::set_policy`]) |
//! | `replication` | `sync`, `async` (a ring cell) | an atomic the next write reads; held replies keep waiting ([`crate::cluster::Cluster::set_replication`]) |
//!
//! A block a cell does not have (the write policy of a cell without a tier, replication of a
//! standalone cell) is listed as `none` with nothing available. The ring's cells are switched
//! one by one (each cell's admin plane) or all at once ([`switch_ring`], through the peer
//! plane's `switch` control command, which proves the ring's secret like every peer frame).

pub mod auto;

use std::sync::Arc;

use cellcache_store::Layout;

use crate::cell::Cell;
use crate::cluster::Cluster;
use crate::config::{ReplicationMode, WritePolicy};

/// The blocks, in the order they are listed.
pub const BLOCKS: [&str; 4] = ["eviction", "layout", "write_policy", "replication"];
/// The eviction policies a running cell switches between.
const EVICTION_AVAILABLE: [&str; 2] = ["lru", "s3fifo"];
/// What a block this cell does not have runs.
const NONE: &str = "none";

/// Why a switch did not happen (nothing changed).
#[derive(Debug, thiserror::Error)]
pub enum SwitchError {
    #[error("no block {0:?} (eviction, layout, write_policy, replication)")]
    NoBlock(String),
    #[error("{block} cannot be switched to {implementation:?} here (available: {available})")]
    Unavailable {
        block: &'static str,
        implementation: String,
        available: String,
    },
    #[error("eviction policy {0} refused: {1}")]
    Eviction(&'static str, cellcache_store::ConfigError),
    #[error("the switch did not finish: {0}")]
    Failed(String),
}

impl SwitchError {
    /// The reply line of the memcached-style control planes.
    pub fn reply(&self) -> Vec<u8> {
        match self {
            SwitchError::Failed(_) => format!("SERVER_ERROR {self}\r\n").into_bytes(),
            _ => format!("CLIENT_ERROR {self}\r\n").into_bytes(),
        }
    }
}

/// One block's state: what runs now and what it can be switched to.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BlockState {
    pub current: String,
    pub available: Vec<String>,
}

/// A block name as given: `write-policy` (the tier's first spelling) is `write_policy`.
fn canonical(block: &str) -> Option<&'static str> {
    let block = if block == "write-policy" {
        "write_policy"
    } else {
        block
    };
    BLOCKS.iter().copied().find(|b| *b == block)
}

fn layout_name(layout: Layout) -> &'static str {
    match layout {
        Layout::Shared => "shared",
        Layout::Partitioned { .. } => "partitioned",
    }
}

/// `block`'s state in this cell (`cluster`: the ring it is a member of, if any).
pub fn state(cell: &Cell, cluster: Option<&Cluster>, block: &str) -> Option<BlockState> {
    let owned = |current: &str, available: &[&str]| BlockState {
        current: current.to_string(),
        available: available.iter().map(|a| a.to_string()).collect(),
    };
    Some(match canonical(block)? {
        "eviction" => owned(cell.store.eviction().name(), &EVICTION_AVAILABLE),
        "layout" => {
            let current = layout_name(cell.store.config().layout);
            owned(current, &[current])
        }
        "write_policy" => match &cell.tier {
            Some(t) => owned(t.policy().name(), &["through", "back"]),
            None => owned(NONE, &[]),
        },
        _ => match cluster {
            Some(cl) => owned(cl.replication().name(), &["sync", "async"]),
            None => owned(NONE, &[]),
        },
    })
}

/// Every block of this cell: `{"eviction": {"current": "lru", "available": ["lru",
/// "s3fifo"]}, "layout": …, "write_policy": …, "replication": …}` (`ctl switch --list --json`).
pub fn list(cell: &Cell, cluster: Option<&Cluster>) -> serde_json::Value {
    let mut blocks = serde_json::Map::new();
    for block in BLOCKS {
        if let Some(s) = state(cell, cluster, block) {
            blocks.insert(block.to_string(), serde_json::json!(s));
        }
    }
    serde_json::Value::Object(blocks)
}

/// Switches `block` of this cell to `implementation` while it serves; `Ok("eviction lru ->
/// s3fifo")`. Switching to what runs already is a switch that changes nothing.
pub async fn switch(
    cell: &Arc<Cell>,
    cluster: Option<&Cluster>,
    block: &str,
    implementation: &str,
) -> Result<String, SwitchError> {
    let name = canonical(block).ok_or_else(|| SwitchError::NoBlock(block.to_string()))?;
    let before = state(cell, cluster, name).ok_or_else(|| SwitchError::NoBlock(name.into()))?;
    if !before.available.iter().any(|a| a == implementation) {
        return Err(SwitchError::Unavailable {
            block: name,
            implementation: implementation.to_string(),
            available: if before.available.is_empty() {
                NONE.to_string()
            } else {
                before.available.join(", ")
            },
        });
    }
    match name {
        "eviction" => {
            let kind = cell
                .store
                .eviction_named(implementation)
                .ok_or_else(|| SwitchError::NoBlock(name.into()))?;
            // Each shard is translated under its own lock: off the caller's runtime thread.
            let cell = cell.clone();
            tokio::task::spawn_blocking(move || cell.store.switch_eviction(kind, cell.now()))
                .await
                .map_err(|e| SwitchError::Failed(e.to_string()))?
                .map_err(|e| SwitchError::Eviction(kind.name(), e))?;
        }
        "write_policy" => {
            let policy: WritePolicy = implementation
                .parse()
                .map_err(|_| SwitchError::NoBlock(name.into()))?;
            if let Some(t) = &cell.tier {
                t.set_policy(policy);
            }
        }
        "replication" => {
            if let (Some(cl), Some(mode)) = (cluster, ReplicationMode::from_name(implementation)) {
                cl.set_replication(mode);
            }
        }
        // `layout`: only the running one is available, so there is nothing to do.
        _ => {}
    }
    tracing::info!(
        block = name,
        from = before.current,
        to = implementation,
        "switched live"
    );
    Ok(format!("{name} {} -> {implementation}", before.current))
}

/// Switches `block` on every cell of the ring, this one first, the others through the peer
/// plane: `OK <switched> of <cells> cells` or, if some cell did not switch, `SERVER_ERROR
/// switched <n> of <cells> cells` (the cells that did keep the new implementation; run it
/// again to finish), then one `CELL <id> <reply>` line per cell.
pub async fn switch_ring(cl: &Arc<Cluster>, block: &str, implementation: &str) -> Vec<u8> {
    let mut out = String::new();
    let mut switched = 0;
    let mine = switch(cl.cell(), Some(cl), block, implementation).await;
    match &mine {
        Ok(line) => {
            switched += 1;
            out += &format!("CELL {} OK {line}\r\n", cl.me);
        }
        // Refused here (a block or implementation no cell has): refused everywhere.
        Err(e) => return e.reply(),
    }
    let peers = cl.peers();
    for (id, peer) in &peers {
        let reply = cl
            .operator_call(peer.clone(), format!("switch {block} {implementation}"))
            .await;
        let reply = match reply {
            Ok(r) => r.trim_end().to_string(),
            Err(e) => format!("SERVER_ERROR {e}"),
        };
        if reply.starts_with("OK") {
            switched += 1;
        }
        out += &format!("CELL {id} {reply}\r\n");
    }
    let cells = peers.len() + 1;
    let summary = if switched == cells {
        format!("OK {switched} of {cells} cells\r\n")
    } else {
        format!("SERVER_ERROR switched {switched} of {cells} cells\r\n")
    };
    (summary + &out).into_bytes()
}

/// The peer plane's `switch BLOCK IMPL` control command: this cell's switch, one line.
pub async fn control(cl: &Arc<Cluster>, block: &str, implementation: &str) -> Vec<u8> {
    match switch(cl.cell(), Some(cl), block, implementation).await {
        Ok(line) => format!("OK {line}\r\n").into_bytes(),
        Err(e) => e.reply(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_names_are_the_spec_names_and_the_old_spelling_still_works() {
        assert_eq!(canonical("write-policy"), Some("write_policy"));
        for b in BLOCKS {
            assert_eq!(canonical(b), Some(b));
        }
        assert_eq!(canonical("arena"), None);
        assert_eq!(canonical("Eviction"), None);
    }

    #[test]
    fn errors_are_protocol_lines() {
        let e = SwitchError::NoBlock("x".into()).reply();
        assert!(e.starts_with(b"CLIENT_ERROR ") && e.ends_with(b"\r\n"));
        let e = SwitchError::Failed("panicked".into()).reply();
        assert!(e.starts_with(b"SERVER_ERROR ") && e.ends_with(b"\r\n"));
    }
}
