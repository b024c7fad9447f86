//! Connection and traffic counters kept by the engines, read by `stats` and `/metrics`.
//!
//! Plain relaxed atomics: each counter is monotonic or a gauge, readers only need a
//! recent value, and no decision is taken on them except the connection limit, whose
//! check-and-increment is a single `fetch_add` (see [`EngineStats::try_open`]), and the
//! per-address limit, a map under a lock taken only when a connection opens or closes.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
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
    /// Connections refused because their address held `connections_per_address_max`
    /// (also counted in `rejected_connections`).
    pub address_refusals: AtomicU64,
    /// Open connections per client address, for the addresses the per-address limit
    /// applies to (`EngineConfig::address_limit`).
    per_address: Mutex<HashMap<IpAddr, usize>>,
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
    pub address_refusals: u64,
}

impl EngineStats {
    /// Counts a new connection from `ip` if fewer than `max` are open and, when
    /// `per_address` is given, fewer than that many from `ip`; false means reject it. An
    /// admitted connection is released with [`Self::closed`] and the same address.
    pub fn try_open(&self, max: usize, ip: IpAddr, per_address: Option<usize>) -> bool {
        let before = self.curr_connections.fetch_add(1, Relaxed);
        if before >= max {
            self.curr_connections.fetch_sub(1, Relaxed);
            self.rejected_connections.fetch_add(1, Relaxed);
            return false;
        }
        if let Some(limit) = per_address {
            let mut open = self.per_address.lock().unwrap_or_else(|e| e.into_inner());
            let n = open.entry(ip).or_insert(0);
            if *n >= limit {
                drop(open);
                self.curr_connections.fetch_sub(1, Relaxed);
                self.rejected_connections.fetch_add(1, Relaxed);
                self.address_refusals.fetch_add(1, Relaxed);
                return false;
            }
            *n += 1;
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
        self.address_refusals.store(0, Relaxed);
    }

    /// A connection [`Self::try_open`] admitted from `ip` closed.
    pub fn closed(&self, ip: IpAddr) {
        self.curr_connections.fetch_sub(1, Relaxed);
        let mut open = self.per_address.lock().unwrap_or_else(|e| e.into_inner());
        // Only addresses the per-address limit applies to are in the map.
        if let Some(n) = open.get_mut(&ip) {
            *n -= 1;
            if *n == 0 {
                open.remove(&ip);
            }
        }
    }

    /// Client addresses holding connections under the per-address limit.
    pub fn addresses_tracked(&self) -> usize {
        self.per_address
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
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
            address_refusals: self.address_refusals.load(Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 1));
    const B: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 2));

    #[test]
    fn connection_limit_is_exact() {
        let s = EngineStats::default();
        assert!(s.try_open(2, A, None));
        assert!(s.try_open(2, A, None));
        assert!(!s.try_open(2, A, None));
        s.closed(A);
        assert!(s.try_open(2, A, None));
        let snap = s.snapshot();
        assert_eq!(snap.curr_connections, 2);
        assert_eq!(snap.total_connections, 3);
        assert_eq!(snap.rejected_connections, 1);
        s.reset();
        let snap = s.snapshot();
        assert_eq!(snap.curr_connections, 2, "a gauge survives stats reset");
        assert_eq!((snap.total_connections, snap.rejected_connections), (0, 0));
    }

    #[test]
    fn one_address_cannot_take_every_slot() {
        let s = EngineStats::default();
        assert!(s.try_open(10, A, Some(2)));
        assert!(s.try_open(10, A, Some(2)));
        assert!(!s.try_open(10, A, Some(2)), "a third from A");
        assert!(s.try_open(10, B, Some(2)), "B has its own share");
        let snap = s.snapshot();
        assert_eq!((snap.curr_connections, snap.rejected_connections), (3, 1));
        assert_eq!(snap.address_refusals, 1);
        s.closed(A);
        assert!(s.try_open(10, A, Some(2)), "a closed one frees A's share");
        s.closed(A);
        s.closed(A);
        s.closed(B);
        assert_eq!(
            s.addresses_tracked(),
            0,
            "no address kept once its connections closed"
        );
        assert_eq!(s.snapshot().curr_connections, 0);
    }
}
