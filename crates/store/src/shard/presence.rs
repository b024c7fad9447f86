//! Whether a key is live, without reading it: no counters, no fetched bit, no recency (the
//! cache tier asks before deciding whether a request must first load the key).

use super::*;

impl Shard {
    /// Whether `key` has a live, unexpired item (an expired one is reclaimed, as any lookup).
    pub fn contains(&mut self, hash: u64, key: &[u8], now: u32) -> bool {
        matches!(self.lookup_why(hash, key, now), Lookup::Live(..))
    }
}
