//! The flush loop: cuts batches from the write-back engine when they are due, applies each
//! to the backing store on the tier's runtime (at most `flush_batches_in_flight_max` at
//! once), and reports the answer back, releasing the write-through replies it made durable.
//!
//! A batch sent to the store is never abandoned while it may still be applied (no timeout
//! drops it): its keys' next writes wait for its answer, so a late commit can never land
//! after a newer one. A store that hangs therefore stalls flushing, and the dirty bound then
//! refuses writes; a store that fails answers errors, which back off and retry.

use super::Tier;
use cellcache_tier::Batch;
use std::sync::Arc;
use std::time::Duration;

/// Runs for the cell's life.
pub(super) async fn run(tier: Arc<Tier>) {
    loop {
        let (batch, next) = {
            let now = tier.now_ms();
            let mut engine = tier.engine.lock();
            let unix = u32::try_from(crate::cell::unix_now_secs()).unwrap_or(u32::MAX);
            let batch = engine.take_batch(now, unix);
            (batch, engine.next_due_ms())
        };
        if let Some(batch) = batch {
            tokio::spawn(send(tier.clone(), batch));
            continue;
        }
        let woken = tier.wake.notified();
        match next {
            Some(due) => {
                let wait = due.saturating_sub(tier.now_ms());
                let _ = tokio::time::timeout(Duration::from_millis(wait.max(1)), woken).await;
            }
            None => woken.await,
        }
    }
}

async fn send(tier: Arc<Tier>, batch: Batch) {
    let id = batch.id();
    let result = match &batch {
        Batch::Ops { ops, .. } => tier.store.apply(ops).await,
        Batch::Clear { .. } => tier.store.clear().await,
    };
    if let Err(e) = &result {
        tracing::warn!(
            backing_store = tier.store.describe(),
            error = crate::error_chain(e),
            "tier: a flush failed; retrying after a backoff (the data stays dirty)"
        );
    }
    let done = tier
        .engine
        .lock()
        .complete(id, result.is_ok(), tier.now_ms());
    for held in done.released {
        held.release();
    }
    tier.wake.notify_one();
}
