//! Where a cell's ring membership lives: [`Slot`], held by the node and its connections.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::Mutex;

use super::Cluster;
use super::repl::Replicator;

/// A cell's ring membership, kept apart from the cell (which knows nothing of the ring) by
/// the node and its connections: empty until the cell bootstraps or joins a ring.
#[derive(Default)]
pub struct Slot {
    /// Set once, when the cell is a ring member.
    pub cluster: OnceLock<Arc<Cluster>>,
    /// The peer runtime, kept until the cell stops. Lock order: a leaf lock, see [`Cluster`].
    pub(super) runtime: Mutex<Option<tokio::runtime::Runtime>>,
    /// A standby cell's change sink, until `cluster invite` starts its membership. Lock
    /// order: a leaf lock, see [`Cluster`].
    pub(super) standby_repl: Mutex<Option<Arc<Replicator>>>,
}

impl Slot {
    /// The slot of a `serve --standby` cell, holding the change sink its membership will use.
    pub fn standby(repl: Arc<Replicator>) -> Slot {
        Slot {
            standby_repl: Mutex::new(Some(repl)),
            ..Slot::default()
        }
    }

    /// Stops the peer runtime (the cell is stopping).
    pub fn stop(&self) {
        let runtime = self.runtime.lock().take();
        if let Some(rt) = runtime {
            rt.shutdown_timeout(Duration::from_millis(500));
        }
    }
}
