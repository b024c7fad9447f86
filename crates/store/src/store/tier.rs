//! What the cache tier (cellcache-tier, wired by the node) needs of the store beyond client
//! operations: a quiet presence check, and filling a key loaded from the backing store.
//!
//! A fill is not a client mutation, so it is not reported to the change feed (the tier
//! would otherwise write the loaded value back). It stores only if the key is absent and
//! the caller's `admit` agrees — `admit` runs under the key's shard lock, the lock under
//! which the change feed reports every client write of the key, so a caller that tracks
//! those writes (a load overtaken by one) decides atomically with respect to them.

use super::*;
use crate::shard::Ctx;

/// What [`Store::fill`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FillOutcome {
    /// Stored, with this CAS.
    Filled {
        /// CAS of the stored item.
        cas: u64,
    },
    /// The key was present already; nothing changed.
    Present,
    /// `admit` refused; nothing changed.
    Refused,
}

impl Store {
    /// Whether `key` is live now (no counters, no recency, not reported).
    pub fn contains(&self, key: &[u8], now: u32) -> bool {
        self.maybe_flush(now);
        let h = crate::key_hash(key);
        self.shard(h).lock().contains(h, key, now)
    }

    /// Stores `value` under `key` if it is absent and `admit()` (called under the shard
    /// lock) returns true; not reported to the change feed.
    pub fn fill(
        &self,
        key: &[u8],
        value: &[u8],
        flags: u32,
        expiry: Expiry,
        now: u32,
        admit: impl FnOnce() -> bool,
    ) -> Result<FillOutcome, StoreError> {
        self.maybe_flush(now);
        let h = crate::key_hash(key);
        let mut shard = self.shard(h).lock();
        if shard.contains(h, key, now) {
            return Ok(FillOutcome::Present);
        }
        if !admit() {
            return Ok(FillOutcome::Refused);
        }
        let quiet = Ctx {
            cas: &self.cas,
            seq: &self.seq,
            sink: None,
        };
        let request = WriteRequest {
            mode: WriteMode::Add,
            key,
            value,
            flags,
            expiry,
            compare_cas: None,
            new_cas: None,
            invalidate: false,
        };
        Ok(match shard.write(h, &request, now, &quiet)? {
            WriteOutcome::Stored { cas } => FillOutcome::Filled { cas },
            _ => FillOutcome::Present,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::feed::{Change, ChangeSink};
    use std::sync::atomic::AtomicUsize;

    #[derive(Default)]
    struct Count(AtomicUsize);
    impl ChangeSink for Count {
        fn record(&self, _: &Change<'_>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn store(sink: Arc<Count>) -> Store {
        let config = StoreConfig {
            memory_limit_bytes: 4 << 20,
            ..StoreConfig::default()
        };
        Store::with_change_sink(config, sink).expect("store")
    }

    #[test]
    fn a_fill_stores_only_into_absence_and_is_not_reported() {
        let sink = Arc::new(Count::default());
        let s = store(sink.clone());
        assert!(!s.contains(b"k", 1));
        assert_eq!(
            s.fill(b"k", b"v", 3, Expiry::NEVER, 1, || false),
            Ok(FillOutcome::Refused)
        );
        assert!(!s.contains(b"k", 1));
        assert!(matches!(
            s.fill(b"k", b"v", 3, Expiry::NEVER, 1, || true),
            Ok(FillOutcome::Filled { .. })
        ));
        assert_eq!(
            sink.0.load(Ordering::Relaxed),
            0,
            "a fill is not a client write"
        );
        assert!(s.contains(b"k", 1));
        assert_eq!(
            s.get(b"k", 1, |v| (v.value.to_vec(), v.flags)),
            Some((b"v".to_vec(), 3))
        );
        s.write(&WriteRequest::set(b"k", b"client"), 1)
            .expect("set");
        assert_eq!(sink.0.load(Ordering::Relaxed), 1);
        assert_eq!(
            s.fill(b"k", b"old", 0, Expiry::NEVER, 1, || panic!(
                "not asked: present"
            )),
            Ok(FillOutcome::Present)
        );
        assert_eq!(
            s.get(b"k", 1, |v| v.value.to_vec()),
            Some(b"client".to_vec())
        );
    }

    #[test]
    fn contains_counts_nothing() {
        let s = store(Arc::new(Count::default()));
        s.write(&WriteRequest::set(b"k", b"v"), 1).expect("set");
        assert!(s.contains(b"k", 1));
        assert!(!s.contains(b"j", 1));
        let stats = s.stats();
        assert_eq!((stats.get_hits, stats.get_misses), (0, 0));
    }
}
