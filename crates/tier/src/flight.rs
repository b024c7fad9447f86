//! Single-flight loads: concurrent misses on one key cost one load from the backing store,
//! and a load that a client's write overtook is not filled into the cache.
//!
//! The node registers a load when a request misses (`join`: the first caller starts the
//! load, later ones only wait), tells every client change of a key (`overtake`, from the
//! change feed, under the store's shard lock), and when the store answers asks `overtaken`
//! under the same shard lock as the fill — so a value read from the store before a client
//! wrote the key never lands over that write. `land` hands back everything that waited.
//!
//! Negative results may be remembered for `negative_ms` (0: not at all): a key the store
//! did not have is then answered as a miss without asking the store again, until a client
//! changes it or the time runs out. Both maps are bounded (`loads_max`, `negative_keys_max`).

use std::collections::HashMap;
use std::sync::Arc;

/// What `join` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Joined {
    /// The caller's key had no load: the caller starts it.
    Started,
    /// A load was already running: the caller waits for it.
    Waiting,
}

/// A finished load's waiters.
#[derive(Debug)]
pub struct Landed<W> {
    /// Every waiter of the load, the starter first.
    pub waiters: Vec<W>,
    /// A client changed the key while it loaded.
    pub overtaken: bool,
}

struct Flight<W> {
    overtaken: bool,
    waiters: Vec<W>,
}

/// The loads in flight, and the keys known absent.
pub struct Flights<W> {
    loads: HashMap<Arc<[u8]>, Flight<W>>,
    loads_max: usize,
    negative: HashMap<Arc<[u8]>, u64>,
    negative_ms: u64,
    negative_keys_max: usize,
}

impl<W> Flights<W> {
    /// No loads; at most `loads_max` keys loading at once; absent keys remembered for
    /// `negative_ms` (0: never), at most `negative_keys_max` of them.
    pub fn new(loads_max: usize, negative_ms: u64, negative_keys_max: usize) -> Self {
        Flights {
            loads: HashMap::new(),
            loads_max,
            negative: HashMap::new(),
            negative_ms,
            negative_keys_max,
        }
    }

    /// Joins `key`'s load, starting it if there is none; gives `waiter` back when
    /// `loads_max` keys are loading already.
    pub fn join(&mut self, key: &[u8], waiter: W) -> Result<Joined, W> {
        if let Some(f) = self.loads.get_mut(key) {
            f.waiters.push(waiter);
            return Ok(Joined::Waiting);
        }
        if self.loads.len() >= self.loads_max {
            return Err(waiter);
        }
        self.loads.insert(
            Arc::from(key),
            Flight {
                overtaken: false,
                waiters: vec![waiter],
            },
        );
        Ok(Joined::Started)
    }

    /// Whether `key` is loading.
    pub fn loading(&self, key: &[u8]) -> bool {
        self.loads.contains_key(key)
    }

    /// Keys loading now.
    pub fn len(&self) -> usize {
        self.loads.len()
    }

    /// Whether nothing is loading.
    pub fn is_empty(&self) -> bool {
        self.loads.is_empty()
    }

    /// A client changed `key`: a load of it in flight must not fill, and it is no longer
    /// known absent.
    pub fn overtake(&mut self, key: &[u8]) {
        if let Some(f) = self.loads.get_mut(key) {
            f.overtaken = true;
        }
        self.negative.remove(key);
    }

    /// `flush_all`: every load in flight is overtaken, nothing is known absent any more
    /// (the store is being cleared: the engine answers every key absent until it is).
    pub fn overtake_all(&mut self) {
        for f in self.loads.values_mut() {
            f.overtaken = true;
        }
        self.negative.clear();
    }

    /// Whether a client changed `key` since its load started.
    pub fn overtaken(&self, key: &[u8]) -> bool {
        self.loads.get(key).is_some_and(|f| f.overtaken)
    }

    /// Ends `key`'s load, handing back its waiters.
    pub fn land(&mut self, key: &[u8]) -> Landed<W> {
        match self.loads.remove(key) {
            Some(f) => Landed {
                waiters: f.waiters,
                overtaken: f.overtaken,
            },
            None => Landed {
                waiters: Vec::new(),
                overtaken: false,
            },
        }
    }

    /// Remembers that the store has no `key` (if negative caching is on).
    pub fn remember_absent(&mut self, key: &[u8], now_ms: u64) {
        if self.negative_ms == 0 {
            return;
        }
        if self.negative.len() >= self.negative_keys_max {
            self.negative.retain(|_, until| *until > now_ms);
            if self.negative.len() >= self.negative_keys_max {
                return;
            }
        }
        self.negative
            .insert(Arc::from(key), now_ms + self.negative_ms);
    }

    /// Whether `key` is known absent at `now_ms`.
    pub fn known_absent(&self, key: &[u8], now_ms: u64) -> bool {
        self.negative.get(key).is_some_and(|until| *until > now_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concurrent_misses_share_one_load() {
        let mut f = Flights::new(10, 0, 10);
        assert_eq!(f.join(b"k", 1), Ok(Joined::Started));
        assert_eq!(f.join(b"k", 2), Ok(Joined::Waiting));
        assert_eq!(f.join(b"k", 3), Ok(Joined::Waiting));
        assert_eq!(f.join(b"other", 4), Ok(Joined::Started));
        let landed = f.land(b"k");
        assert_eq!(landed.waiters, vec![1, 2, 3]);
        assert!(!landed.overtaken);
        assert!(!f.loading(b"k"));
        assert!(f.loading(b"other"));
    }

    #[test]
    fn a_write_during_a_load_overtakes_it() {
        let mut f = Flights::new(10, 0, 10);
        f.join(b"k", ()).ok();
        f.overtake(b"other");
        assert!(!f.overtaken(b"k"));
        f.overtake(b"k");
        assert!(f.overtaken(b"k"));
        assert!(f.land(b"k").overtaken);
        f.join(b"k", ()).ok();
        assert!(!f.overtaken(b"k"), "a new load starts clean");
        f.overtake_all();
        assert!(f.overtaken(b"k"));
    }

    #[test]
    fn loads_are_bounded() {
        let mut f = Flights::new(1, 0, 10);
        assert_eq!(f.join(b"a", 1), Ok(Joined::Started));
        assert_eq!(f.join(b"b", 2), Err(2));
        assert_eq!(f.join(b"a", 3), Ok(Joined::Waiting));
    }

    #[test]
    fn negative_results_expire_and_writes_forget_them() {
        let mut off = Flights::<()>::new(1, 0, 10);
        off.remember_absent(b"k", 0);
        assert!(!off.known_absent(b"k", 0));
        let mut f = Flights::<()>::new(1, 100, 1);
        f.remember_absent(b"k", 1000);
        assert!(f.known_absent(b"k", 1099));
        assert!(!f.known_absent(b"k", 1100));
        f.remember_absent(b"j", 1000);
        assert!(
            !f.known_absent(b"j", 1000),
            "bounded: k still held the only place"
        );
        f.remember_absent(b"j", 1200);
        assert!(f.known_absent(b"j", 1200), "expired entries make room");
        f.overtake(b"j");
        assert!(!f.known_absent(b"j", 1200));
    }
}
