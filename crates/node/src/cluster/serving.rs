//! How long this cell, as a master, waited to serve its range after a map change, and for
//! what ([`Ring::serve_wait`]): one log line per wait, when it ends. After a division's or
//! a shift's flip, clients of the moved range wait this long: the wait is noted on every
//! tick (10 ms) and after every ring message, so its end (a grant arriving) is seen when it
//! comes. (Until that, waits were seen on ticks only and logged up to 10 ms long.)
//!
//! [`Ring::serve_wait`]: cellcache_cluster::Ring::serve_wait

use cellcache_cluster::ServeWait;

/// The ring driver's record of the current wait.
#[derive(Default)]
pub(super) struct WaitLog {
    /// The epoch waited under, since when (ms), and what was waited for last.
    current: Option<(u64, u64, ServeWait)>,
    /// The previous observation (ms): a tick or a ring message.
    last_seen_ms: u64,
}

impl WaitLog {
    /// Called on every tick and after every ring message with the installed map's epoch,
    /// when it was installed and what the ring says this cell waits for (`None`: it masters
    /// nothing).
    pub(super) fn note(
        &mut self,
        epoch: u64,
        installed_ms: u64,
        wait: Option<ServeWait>,
        now_ms: u64,
    ) {
        // A wait that starts with a new map started when the map was installed; one that
        // starts otherwise (a lease not renewed in time), at the earliest at the last observation.
        let began = if installed_ms >= self.last_seen_ms {
            installed_ms
        } else {
            self.last_seen_ms
        };
        self.last_seen_ms = now_ms;
        match wait {
            Some(w) if !w.serving() => match &mut self.current {
                Some((e, _, last)) if *e == epoch => *last = w,
                _ => self.current = Some((epoch, began, w)),
            },
            _ => {
                if let Some((e, since, last)) = self.current.take() {
                    tracing::debug!(
                        epoch = e,
                        waited_ms = now_ms.saturating_sub(since),
                        last = ?last,
                        "serving the master range"
                    );
                }
            }
        }
    }
}
