//! Connection and traffic counters kept by the engines, read by `stats` and `/metrics`.
//!
//! Plain relaxed atomics: each counter is monotonic or a gauge, readers only need a
//! recent value, and no decision is taken on them except the connection limit, whose
//! check-and-increment is a single `fetch_add` (see [`EngineStats::try_open`]).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};

#[derive(Debug, Default)]
pub struct EngineStats {
    pub curr_connections: AtomicUsize,
    pub total_connections: AtomicU64,
    pub rejected_connections: AtomicU64,
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
    pub idle_kicks: AtomicU64,
    /// Connections closed for holding part of a request past `request_timeout_secs`.
    pub request_timeouts: AtomicU64,
    pub input_overflows: AtomicU64,
}

/// A point-in-time copy of [`EngineStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineStatsSnapshot {
    pub curr_connections: usize,
    pub total_connections: u64,
    pub rejected_connections: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub idle_kicks: u64,
    pub request_timeouts: u64,
    pub input_overflows: u64,
}

impl EngineStats {
    /// Counts a new connection if fewer than `max` are open; false means reject it.
    pub fn try_open(&self, max: usize) -> bool {
        let before = self.curr_connections.fetch_add(1, Relaxed);
        if before >= max {
            self.curr_connections.fetch_sub(1, Relaxed);
            self.rejected_connections.fetch_add(1, Relaxed);
            return false;
        }
        self.total_connections.fetch_add(1, Relaxed);
        true
    }

    /// `stats reset`: zeroes the counters memcached's resets (`total_connections`,
    /// `rejected_connections`, `bytes_read`, `bytes_written`, …); `curr_connections` is a
    /// gauge and stays.
    pub fn reset(&self) {
        self.total_connections.store(0, Relaxed);
        self.rejected_connections.store(0, Relaxed);
        self.bytes_read.store(0, Relaxed);
        self.bytes_written.store(0, Relaxed);
        self.idle_kicks.store(0, Relaxed);
        self.request_timeouts.store(0, Relaxed);
        self.input_overflows.store(0, Relaxed);
    }

    pub fn closed(&self) {
        self.curr_connections.fetch_sub(1, Relaxed);
    }

    pub fn snapshot(&self) -> EngineStatsSnapshot {
        EngineStatsSnapshot {
            curr_connections: self.curr_connections.load(Relaxed),
            total_connections: self.total_connections.load(Relaxed),
            rejected_connections: self.rejected_connections.load(Relaxed),
            bytes_read: self.bytes_read.load(Relaxed),
            bytes_written: self.bytes_written.load(Relaxed),
            idle_kicks: self.idle_kicks.load(Relaxed),
            request_timeouts: self.request_timeouts.load(Relaxed),
            input_overflows: self.input_overflows.load(Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_limit_is_exact() {
        let s = EngineStats::default();
        assert!(s.try_open(2));
        assert!(s.try_open(2));
        assert!(!s.try_open(2));
        s.closed();
        assert!(s.try_open(2));
        let snap = s.snapshot();
        assert_eq!(snap.curr_connections, 2);
        assert_eq!(snap.total_connections, 3);
        assert_eq!(snap.rejected_connections, 1);
        s.reset();
        let snap = s.snapshot();
        assert_eq!(snap.curr_connections, 2, "a gauge survives stats reset");
        assert_eq!((snap.total_connections, snap.rejected_connections), (0, 0));
    }
}
