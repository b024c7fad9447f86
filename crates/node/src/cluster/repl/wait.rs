//! Holding a `sync` write's reply until every target acknowledged its positions.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::{Positions, Replicator};

pub(super) struct Waiter {
    pub(super) positions: Positions,
    pub(super) deadline: Instant,
    pub(super) done: Box<dyn FnOnce(Result<(), WaitError>) + Send>,
}

/// Why a write's replication could not be confirmed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitError {
    /// A backup is unreachable (policy `refuse`).
    Unreachable,
    /// No acknowledgement within the request timeout.
    Timeout,
}

impl Replicator {
    /// Holds `done` until every position is acknowledged (or fails it, see [`WaitError`]).
    pub fn wait(
        &self,
        positions: Positions,
        timeout: Duration,
        done: Box<dyn FnOnce(Result<(), WaitError>) + Send>,
    ) {
        self.waiters.lock().push(Waiter {
            positions,
            deadline: Instant::now() + timeout,
            done,
        });
        self.check_waiters();
    }

    /// Completes the waiters whose positions are acknowledged, fails the expired or
    /// unreachable ones.
    pub fn check_waiters(&self) {
        let accept = self.policy().accept_unreachable;
        let now = Instant::now();
        let mut finished = Vec::new();
        {
            let mut waiters = self.waiters.lock();
            let mut i = 0;
            while i < waiters.len() {
                let w = &waiters[i];
                let mut outcome = Some(Ok(()));
                let mut unreplicated = false;
                for (t, seq) in &w.positions {
                    let st = t.state.lock();
                    if *seq <= st.rejected_upto {
                        tracing::warn!(to = %t.to, seq, "write not confirmed: its target refused it (it serves the key under a newer map)");
                        outcome = Some(Err(WaitError::Unreachable));
                        break;
                    }
                    if st.acked >= *seq {
                        continue;
                    }
                    if st.unreachable {
                        if accept {
                            unreplicated = true;
                            continue;
                        }
                        tracing::warn!(to = %t.to, seq, "write not confirmed: its target is unreachable (no_backup = refuse)");
                        outcome = Some(Err(WaitError::Unreachable));
                        break;
                    }
                    outcome = if now >= w.deadline {
                        tracing::warn!(to = %t.to, seq, acked = st.acked, "write not confirmed within the request timeout");
                        Some(Err(WaitError::Timeout))
                    } else {
                        None
                    };
                    break;
                }
                if let Some(o) = outcome {
                    if unreplicated && o.is_ok() {
                        self.unreplicated_acks.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!("write acknowledged without an unreachable backup");
                    }
                    let w = waiters.swap_remove(i);
                    finished.push((w.done, o));
                } else {
                    i += 1;
                }
            }
        }
        for (done, o) in finished {
            done(o);
        }
    }
}
