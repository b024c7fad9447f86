//! The write-back engine against a model, over random interleavings of writes, deletes,
//! `flush_all`, time, batches cut, and batches confirmed or failed in any order (SPEC T2).
//!
//! Checked at every step:
//! - the store never receives an older state of a key after a newer one (each applied op's
//!   version is above every version the store saw for that key, and above the last clear);
//! - what a reader sees after an eviction (the engine's [`Known`], else the store) is the
//!   newest acknowledged state of the key — the re-insertion path never serves an old value;
//! - every op sent is the key's newest recorded state when it was sent (coalescing);
//! - a write-through waiter is released only once the store holds its version or a newer
//!   state of its key;
//!
//! and after draining with a healthy store: the store holds exactly each key's newest state
//! and the engine holds no dirty bytes.

use cellcache_tier::{Batch, Known, Op, Record, WriteBack, WriteBackConfig};
use proptest::prelude::*;
use std::collections::HashMap;
use std::sync::Arc;

const KEYS: usize = 4;

/// A write-through writer waiting for its key's version to be durable.
type Waiter = (Vec<u8>, u64);

#[derive(Debug, Clone)]
enum Action {
    Write(usize),
    Delete(usize),
    Clear,
    Advance(u64),
    Take,
    Complete(usize, bool),
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        6 => (0..KEYS).prop_map(Action::Write),
        2 => (0..KEYS).prop_map(Action::Delete),
        1 => Just(Action::Clear),
        3 => (0u64..40).prop_map(Action::Advance),
        4 => Just(Action::Take),
        4 => (any::<usize>(), prop::bool::weighted(0.7)).prop_map(|(i, ok)| Action::Complete(i, ok)),
    ]
}

fn key(k: usize) -> Vec<u8> {
    format!("key{k}").into_bytes()
}

/// A key's state as the model knows it: `Some(value)` or absent, and its version.
#[derive(Debug, Clone, PartialEq, Eq)]
struct State {
    version: u64,
    value: Option<Vec<u8>>,
}

/// A batch in flight: its id, each op's key and version, and a clear's version.
type InFlight = (u64, Vec<(Vec<u8>, u64, Op)>, Option<u64>);

#[derive(Default)]
struct Model {
    /// Each key's newest acknowledged state.
    latest: HashMap<Vec<u8>, State>,
    /// What the simulated backing store holds.
    store: HashMap<Vec<u8>, State>,
    /// The version of the last clear the store applied (every later op must be above it).
    store_floor: u64,
    /// Batches in flight: id, and each op's key and version (or the clear's version).
    in_flight: Vec<InFlight>,
    version: u64,
    /// The version of the newest clear recorded.
    last_clear: u64,
    /// Waiters registered and not yet released.
    waiting: usize,
}

impl Model {
    fn visible(&self, wb: &WriteBack<Waiter>, k: &[u8]) -> Option<Vec<u8>> {
        match wb.known(k) {
            Known::Present(r) => Some(r.value.to_vec()),
            Known::Absent => None,
            Known::Store => self.store.get(k).and_then(|s| s.value.clone()),
            Known::StoreWithExpiry(_) => unreachable!("no touches in this model"),
        }
    }

    fn newest(&self, k: &[u8]) -> Option<Vec<u8>> {
        self.latest.get(k).and_then(|s| s.value.clone())
    }

    fn apply(&mut self, wb: &mut WriteBack<Waiter>, idx: usize, ok: bool, now: u64) {
        if self.in_flight.is_empty() {
            return;
        }
        let (id, ops, clear) = self.in_flight.remove(idx % self.in_flight.len());
        if ok {
            if let Some(v) = clear {
                self.store.clear();
                self.store_floor = self.store_floor.max(v);
            }
            for (k, version, op) in ops {
                let before = self.store.get(&k).map_or(0, |s| s.version);
                assert!(
                    version > before && version > self.store_floor,
                    "key {k:?}: version {version} applied after {before} (floor {})",
                    self.store_floor
                );
                let value = match op {
                    Op::Put(r) => Some(r.value.to_vec()),
                    Op::Delete => None,
                    Op::Touch { .. } => unreachable!("no touches in this model"),
                };
                self.store.insert(k, State { version, value });
            }
        }
        for (k, version) in wb.complete(id, ok, now).released {
            let stored = self
                .store
                .get(&k)
                .map_or(0, |s| s.version)
                .max(self.store_floor);
            assert!(
                stored >= version,
                "{k:?} released at {version}, store at {stored}"
            );
            self.waiting -= 1;
        }
    }

    fn take(&mut self, wb: &mut WriteBack<Waiter>, now: u64) -> bool {
        let Some(batch) = wb.take_batch(now, 1) else {
            return false;
        };
        match batch {
            Batch::Clear { id } => self.in_flight.push((id, Vec::new(), Some(self.last_clear))),
            Batch::Ops { id, ops } => {
                let mut sent = Vec::new();
                for (k, op) in ops {
                    let state = self
                        .latest
                        .get(&*k)
                        .cloned()
                        .expect("sent a key never written");
                    let expected = match &state.value {
                        Some(v) => Op::Put(Record {
                            value: Arc::from(v.as_slice()),
                            flags: 0,
                            expiry_unix: 0,
                        }),
                        None => Op::Delete,
                    };
                    assert_eq!(op, expected, "an op sent is the key's newest state");
                    sent.push((k.to_vec(), state.version, op));
                }
                self.in_flight.push((id, sent, None));
            }
        }
        true
    }
}

fn run(actions: Vec<Action>, batches_in_flight_max: usize) {
    let mut wb = WriteBack::<Waiter>::new(WriteBackConfig {
        window_ms: 20,
        dirty_bytes_max: usize::MAX,
        batch_items_max: 3,
        batch_bytes_max: 1 << 20,
        batches_in_flight_max,
        items_per_sec_max: 0,
        backoff_initial_ms: 5,
        backoff_max_ms: 20,
    });
    let mut m = Model::default();
    let mut now = 0u64;
    for a in actions {
        match a {
            Action::Write(k) => {
                m.version += 1;
                let value = format!("v{}", m.version).into_bytes();
                let op = Op::Put(Record {
                    value: Arc::from(value.as_slice()),
                    flags: 0,
                    expiry_unix: 0,
                });
                wb.record(&key(k), op, m.version, now);
                assert_eq!(wb.wait(&key(k), m.version, (key(k), m.version)), Ok(()));
                m.waiting += 1;
                m.latest.insert(
                    key(k),
                    State {
                        version: m.version,
                        value: Some(value),
                    },
                );
            }
            Action::Delete(k) => {
                m.version += 1;
                wb.record(&key(k), Op::Delete, m.version, now);
                m.latest.insert(
                    key(k),
                    State {
                        version: m.version,
                        value: None,
                    },
                );
            }
            Action::Clear => {
                m.version += 1;
                m.last_clear = m.version;
                wb.record_clear(m.version);
                for s in m.latest.values_mut() {
                    *s = State {
                        version: m.version,
                        value: None,
                    };
                }
            }
            Action::Advance(ms) => now += ms,
            Action::Take => {
                m.take(&mut wb, now);
            }
            Action::Complete(i, ok) => m.apply(&mut wb, i, ok, now),
        }
        for k in 0..KEYS {
            assert_eq!(
                m.visible(&wb, &key(k)),
                m.newest(&key(k)),
                "key{k} as a reader sees it"
            );
        }
    }
    // Drain with a healthy store; every round either sends, confirms, or moves time.
    for _ in 0..10_000 {
        if wb.is_clean() && m.in_flight.is_empty() {
            break;
        }
        if !m.in_flight.is_empty() {
            m.apply(&mut wb, 0, true, now);
        } else if !m.take(&mut wb, now) {
            now += 5;
        }
    }
    assert!(wb.is_clean(), "drained");
    assert_eq!(m.waiting, 0, "every waiter released");
    assert_eq!(wb.stats().dirty_bytes, 0);
    for k in 0..KEYS {
        let stored = m.store.get(&key(k)).and_then(|s| s.value.clone());
        assert_eq!(
            stored,
            m.newest(&key(k)),
            "key{k} in the store after draining"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn the_store_never_goes_back_in_time(actions in prop::collection::vec(action(), 1..200)) {
        run(actions, 3);
    }

    #[test]
    fn one_batch_at_a_time_too(actions in prop::collection::vec(action(), 1..200)) {
        run(actions, 1);
    }
}
