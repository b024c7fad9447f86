//! Dropping what this cell no longer holds, in the background.
//!
//! Each installed map says what the cell must hold ([`Output::Holdings`]: its range, its
//! backup copies, the parts shifting to it); anything else in the store may go. Walking the
//! whole store under its lock at the map's installation stalled the cell at every change
//! of the ring: at a division's flip, 25–70 ms during which every request of the cell and
//! the ring driver (its heartbeats, lease release and map confirmation, which the new
//! master's first lease waits for) stood still. The walk now runs here, a slab per step
//! ([`Store::drop_step`]), yielding between steps.
//!
//! Invariant: an item is removed only under its shard's lock while the installed map is
//! the one the holdings were computed for (`still`, checked under that lock, compares
//! [`Cluster::epoch`]), so every step removes exactly what a trim at the installation of
//! the current map would remove, among the items present — never a write accepted under a
//! newer map. A newer map stops the pass; its own holdings start the next one, from the
//! start of the store (they may drop what the stopped pass had walked past).
//!
//! [`Output::Holdings`]: cellcache_cluster::Output::Holdings
//! [`Store::drop_step`]: cellcache_store::Store::drop_step

use std::sync::{Arc, Weak};

use cellcache_cluster::HashRange;
use cellcache_store::{DropStep, ScanCursor};
use parking_lot::Mutex;
use tokio::sync::Notify;

use super::Cluster;

/// What the installed map says this cell must hold, and which passes are owed.
#[derive(Default)]
pub(super) struct Trim {
    wanted: Mutex<Wanted>,
    wake: Notify,
}

#[derive(Default, Clone)]
struct Wanted {
    /// The map the holdings belong to.
    epoch: u64,
    /// The ranges not held (gaps between the held ones); `None`: keep everything (a cell
    /// that is not yet active keeps what its parent streams).
    drop: Option<Arc<[HashRange]>>,
    /// Bumped with every new holdings; a pass runs for one generation.
    generation: u64,
}

impl Trim {
    /// Records the holdings of the map of `epoch` (older ones than recorded are ignored:
    /// outputs of two installations may be processed out of order) and wakes the trimmer.
    pub(super) fn hold(&self, epoch: u64, master: Option<HashRange>, backups: Vec<HashRange>) {
        let mut w = self.wanted.lock();
        if epoch < w.epoch {
            return;
        }
        w.epoch = epoch;
        w.drop = master.map(|m| {
            let keep: Vec<HashRange> = std::iter::once(m).chain(backups).collect();
            HashRange::gaps(&keep).into()
        });
        w.generation += 1;
        drop(w);
        self.wake.notify_one();
    }

    fn wanted(&self) -> Wanted {
        self.wanted.lock().clone()
    }
}

/// The trimmer task: one pass per new holdings, for as long as the cell lives.
pub(super) async fn run(trim: Arc<Trim>, cluster: Weak<Cluster>) {
    let mut done = 0;
    loop {
        trim.wake.notified().await;
        let w = trim.wanted();
        if w.generation == done {
            continue;
        }
        done = w.generation;
        let Some(gaps) = w.drop.filter(|g| !g.is_empty()) else {
            continue;
        };
        let Some(cl) = cluster.upgrade() else { return };
        let (dropped, complete) = pass(&trim, &cl, w.epoch, w.generation, &gaps).await;
        drop(cl);
        if dropped > 0 {
            tracing::info!(
                dropped,
                epoch = w.epoch,
                complete,
                "items outside this cell's ranges dropped"
            );
        }
    }
}

/// Walks the store once, dropping keys in `gaps` while the map of `epoch` is installed and
/// no newer holdings arrived. Returns what it dropped and whether it walked to the end.
async fn pass(
    trim: &Trim,
    cl: &Cluster,
    epoch: u64,
    generation: u64,
    gaps: &[HashRange],
) -> (usize, bool) {
    let store = &cl.cell.store;
    let drop = |h: u64| gaps.iter().any(|g| g.contains(h));
    let still = || cl.epoch() == epoch;
    let mut cursor = ScanCursor::START;
    let mut dropped = 0;
    loop {
        if trim.wanted.lock().generation != generation {
            return (dropped, false);
        }
        match store.drop_step(cursor, &drop, &still) {
            DropStep::Dropped { dropped: n, next } => {
                dropped += n;
                match next {
                    Some(c) => cursor = c,
                    None => return (dropped, true),
                }
            }
            DropStep::Stale | DropStep::Done => return (dropped, false),
        }
        tokio::task::yield_now().await;
    }
}
