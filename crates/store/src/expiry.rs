//! Expiry times as the store keeps them.
//!
//! The store never reads a clock: every operation receives `now` in unix seconds. An item's
//! expiry is an absolute unix second, or "never". An item is expired when its expiry is not
//! "never" and `expiry <= now`, so callers must pass `now >= 1`.

/// Protocol exptimes up to this many seconds are relative to `now`; larger ones are absolute
/// unix times (memcached's `REALTIME_MAXDELTA`, 30 days).
pub const RELATIVE_EXPTIME_MAX_SECS: i64 = 60 * 60 * 24 * 30;

/// An absolute expiry time, or never.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Expiry(u32);

impl Expiry {
    /// Never expires.
    pub const NEVER: Expiry = Expiry(0);
    /// Expired at any `now >= 1` (used for negative protocol exptimes).
    pub const ALREADY: Expiry = Expiry(1);

    /// Converts a protocol exptime as memcached reads it: 0 never; 1..=30 days relative to
    /// `now`; larger is an absolute unix time; negative is already expired.
    pub fn from_protocol(exptime: i64, now: u32) -> Expiry {
        if exptime == 0 {
            Expiry::NEVER
        } else if exptime < 0 {
            Expiry::ALREADY
        } else if exptime <= RELATIVE_EXPTIME_MAX_SECS {
            Expiry::at((i64::from(now) + exptime).min(i64::from(u32::MAX)) as u32)
        } else {
            Expiry::at(exptime.min(i64::from(u32::MAX)) as u32)
        }
    }

    /// Expires at absolute unix second `secs`; `0` means never.
    pub fn at(secs: u32) -> Expiry {
        Expiry(secs)
    }

    /// The raw stored value: absolute unix seconds, 0 = never.
    pub fn as_unix_secs(self) -> u32 {
        self.0
    }

    /// Whether this is "never".
    pub fn is_never(self) -> bool {
        self.0 == 0
    }

    /// Whether an item with this expiry is invalid at `now`.
    pub fn is_expired(self, now: u32) -> bool {
        self.0 != 0 && self.0 <= now
    }

    /// Seconds left at `now` (`None` = never expires, `Some(0)` = expired).
    pub fn remaining_secs(self, now: u32) -> Option<u32> {
        if self.0 == 0 {
            None
        } else {
            Some(self.0.saturating_sub(now))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocol_conversion_follows_d3() {
        let now = 1_000_000_000;
        assert_eq!(Expiry::from_protocol(0, now), Expiry::NEVER);
        assert!(Expiry::from_protocol(-1, now).is_expired(now));
        assert_eq!(Expiry::from_protocol(10, now).as_unix_secs(), now + 10);
        assert_eq!(
            Expiry::from_protocol(RELATIVE_EXPTIME_MAX_SECS, now).as_unix_secs(),
            now + RELATIVE_EXPTIME_MAX_SECS as u32
        );
        let abs = RELATIVE_EXPTIME_MAX_SECS + 1;
        assert_eq!(Expiry::from_protocol(abs, now).as_unix_secs(), abs as u32);
        assert!(Expiry::from_protocol(abs, now).is_expired(now));
        assert_eq!(
            Expiry::from_protocol(i64::MAX, now).as_unix_secs(),
            u32::MAX
        );
        assert_eq!(
            Expiry::from_protocol(5, now).remaining_secs(now + 2),
            Some(3)
        );
    }
}
