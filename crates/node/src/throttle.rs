//! A limit on how fast one client address may guess passwords (`server.auth_failures_max`
//! failed logins per `server.auth_failure_window_secs`).
//!
//! The first failed login of an address opens its window; once the address has failed
//! `max` times in it, every further login from it is refused *without being checked* until
//! the window ends — a right password included, so guessing gains nothing — and counted
//! (`auth_throttled` in `stats cellcache`). The window then closes and the count starts
//! over. A successful login does not clear an address's failures: a client that knows one
//! password must not unlock guesses at another.
//!
//! Memory is bounded: at most `addresses_max` addresses are tracked. When the table is full,
//! addresses whose window ended are forgotten; if none has, a new address is not tracked
//! (and not limited) until one ends, and this is logged.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Failed logins per client address; shared by every connection of the cell.
#[derive(Debug)]
pub struct LoginThrottle {
    /// Failures that lock an address out; 0: no limit.
    max: u32,
    window: Duration,
    addresses_max: usize,
    /// Per address: when its window opened, and its failures in it.
    failures: Mutex<HashMap<IpAddr, (Instant, u32)>>,
}

impl LoginThrottle {
    pub fn new(max: u32, window: Duration, addresses_max: usize) -> Self {
        Self {
            max,
            window,
            addresses_max,
            failures: Mutex::default(),
        }
    }

    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, (Instant, u32)>> {
        self.failures.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a login from `ip` may be checked now (false: refuse it unchecked).
    pub fn allows(&self, ip: IpAddr, now: Instant) -> bool {
        if self.max == 0 {
            return true;
        }
        let mut table = self.table();
        match table.get(&ip) {
            Some(&(opened, _)) if now.saturating_duration_since(opened) >= self.window => {
                table.remove(&ip);
                true
            }
            Some(&(_, failed)) => failed < self.max,
            None => true,
        }
    }

    /// A login from `ip` failed.
    pub fn failed(&self, ip: IpAddr, now: Instant) {
        if self.max == 0 {
            return;
        }
        let mut table = self.table();
        if !table.contains_key(&ip) && table.len() >= self.addresses_max {
            let window = self.window;
            table.retain(|_, &mut (opened, _)| now.saturating_duration_since(opened) < window);
            if table.len() >= self.addresses_max {
                tracing::warn!(
                    tracked = table.len(),
                    "login throttle full (server.auth_throttle_addresses_max): {ip} is not limited"
                );
                return;
            }
        }
        let entry = table.entry(ip).or_insert((now, 0));
        if now.saturating_duration_since(entry.0) >= self.window {
            *entry = (now, 0);
        }
        entry.1 = entry.1.saturating_add(1);
    }

    /// Addresses tracked now.
    pub fn tracked(&self) -> usize {
        self.table().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 1));
    const B: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 2));
    const C: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 3));
    const WINDOW: Duration = Duration::from_secs(60);

    #[test]
    fn an_address_is_locked_out_for_the_rest_of_its_window() {
        let t = LoginThrottle::new(3, WINDOW, 100);
        let start = Instant::now();
        for i in 0..3 {
            assert!(t.allows(A, start), "attempt {i}");
            t.failed(A, start + Duration::from_secs(i));
        }
        assert!(!t.allows(A, start + Duration::from_secs(10)));
        assert!(
            t.allows(B, start + Duration::from_secs(10)),
            "others are not"
        );
        assert!(!t.allows(A, start + WINDOW - Duration::from_millis(1)));
        assert!(t.allows(A, start + WINDOW), "the window ended");
        assert_eq!(t.tracked(), 0);
    }

    #[test]
    fn failures_of_an_old_window_do_not_count() {
        let t = LoginThrottle::new(2, WINDOW, 100);
        let start = Instant::now();
        t.failed(A, start);
        t.failed(A, start + WINDOW);
        assert!(t.allows(A, start + WINDOW), "one failure in the new window");
        t.failed(A, start + WINDOW);
        assert!(!t.allows(A, start + WINDOW));
    }

    #[test]
    fn the_table_is_bounded() {
        let t = LoginThrottle::new(1, WINDOW, 2);
        let start = Instant::now();
        t.failed(A, start);
        t.failed(B, start);
        t.failed(C, start);
        assert_eq!(t.tracked(), 2, "a full table tracks no new address");
        assert!(t.allows(C, start));
        // Once a window ended, its address makes room.
        t.failed(C, start + WINDOW);
        assert!(!t.allows(C, start + WINDOW));
        assert!(t.tracked() <= 2);
    }

    #[test]
    fn zero_means_no_limit() {
        let t = LoginThrottle::new(0, WINDOW, 2);
        let now = Instant::now();
        for _ in 0..100 {
            t.failed(A, now);
        }
        assert!(t.allows(A, now));
        assert_eq!(t.tracked(), 0);
    }
}
