//! The request-completion timeout (`request_timeout_secs`), kept the same way by every
//! engine: how long a connection has held part of a request without completing it.
//!
//! A connection *holds part of a request* while the session has left some of its input
//! unconsumed: a request not complete yet (a `set` whose value has not all arrived, a line
//! without its end), or complete requests the session could not take yet (its replies are
//! not read, or forwarded ones are outstanding). The clock starts when input is left
//! unconsumed and restarts whenever the session consumes some of it; it stops when nothing
//! is left. Bytes arriving do not restart it: a client trickling one byte at a time
//! (slowloris) holds a connection — one of the `max_connections` slots — no longer than the
//! timeout, however slowly it sends. A connection with nothing pending is idle: only
//! `idle_timeout_secs` (off by default, as in memcached) closes it.

use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use crate::EngineStats;

/// Why an engine closes a connection in its housekeeping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Expiry {
    /// Nothing pending for `idle_timeout_secs`.
    Idle,
    /// Part of a request held for `request_timeout_secs`.
    Request,
}

impl Expiry {
    /// Counts the close in `stats` (`idle_kicks` or `request_timeouts`).
    pub(crate) fn count(self, stats: &EngineStats) {
        match self {
            Expiry::Idle => stats.idle_kicks.fetch_add(1, Relaxed),
            Expiry::Request => stats.request_timeouts.fetch_add(1, Relaxed),
        };
    }
}

/// Since when a connection has held unconsumed input without the session consuming any.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RequestClock {
    since: Option<Instant>,
}

impl RequestClock {
    /// Bytes arrived; `pending` unconsumed bytes are held now. Starts the clock if it was
    /// stopped (reads the time only then).
    pub(crate) fn received(&mut self, pending: usize) {
        if pending > 0 && self.since.is_none() {
            self.since = Some(Instant::now());
        }
    }

    /// The session was offered the input and consumed `consumed` bytes, leaving `pending`.
    pub(crate) fn offered(&mut self, consumed: usize, pending: usize) {
        if pending == 0 {
            self.since = None;
        } else if consumed > 0 || self.since.is_none() {
            self.since = Some(Instant::now());
        }
    }

    /// When the connection is to be closed under `limit` (`None`: nothing pending, or no
    /// timeout).
    pub(crate) fn deadline(&self, limit: Option<Duration>) -> Option<Instant> {
        Some(self.since? + limit?)
    }

    /// Whether the timeout `limit` passed by `now`.
    pub(crate) fn expired(&self, limit: Option<Duration>, now: Instant) -> bool {
        self.deadline(limit).is_some_and(|d| now >= d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMIT: Option<Duration> = Some(Duration::from_secs(30));

    #[test]
    fn the_clock_runs_only_while_input_is_left_unconsumed() {
        let mut c = RequestClock::default();
        assert_eq!(c.deadline(LIMIT), None, "nothing received");
        c.received(10);
        let started = c.deadline(LIMIT).expect("running");
        // More bytes of the same request do not restart it.
        c.received(20);
        assert_eq!(c.deadline(LIMIT), Some(started));
        // Nothing consumed: still the same request.
        c.offered(0, 20);
        assert_eq!(c.deadline(LIMIT), Some(started));
        assert!(!c.expired(LIMIT, started - Duration::from_millis(1)));
        assert!(c.expired(LIMIT, started));
        // A request completed and the rest of the input is the next one: restarted.
        std::thread::sleep(Duration::from_millis(2));
        c.offered(5, 15);
        assert!(c.deadline(LIMIT).expect("running") > started);
        // Everything consumed: stopped.
        c.offered(15, 0);
        assert_eq!(c.deadline(LIMIT), None);
        assert!(!c.expired(LIMIT, started + Duration::from_secs(3600)));
    }

    #[test]
    fn without_a_limit_nothing_expires() {
        let mut c = RequestClock::default();
        c.received(1);
        assert_eq!(c.deadline(None), None);
        assert!(!c.expired(None, Instant::now() + Duration::from_secs(3600)));
    }
}
