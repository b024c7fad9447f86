//! Model-based property test: the store against a plain map with cache semantics.
//!
//! Before every operation the test peeks at the key (without bumping it): the store must either
//! hold exactly what the model holds, or — only if the model holds it and the store has evicted
//! something — nothing, in which case the model forgets it too (an evicted key is simply
//! absent). A key the model lacks must never appear. Then both apply the operation and must
//! report the same outcome. Live switches of the eviction policy are among the operations: they
//! must change nothing a client can see. Multi-key gets go through `Store::read_many`, which
//! reads groups of keys ahead together; each key must get what a get of its own would.

use std::collections::HashMap;

use cellcache_store::*;
use proptest::prelude::*;

const START: u32 = 1_000_000;

#[derive(Debug, Clone)]
enum Op {
    Set {
        k: u8,
        v: Value,
        flags: u32,
        ttl: i64,
    },
    Add {
        k: u8,
        v: Value,
    },
    Replace {
        k: u8,
        v: Value,
    },
    Append {
        k: u8,
        v: Value,
    },
    Prepend {
        k: u8,
        v: Value,
    },
    Cas {
        k: u8,
        v: Value,
        correct: bool,
    },
    Delete {
        k: u8,
    },
    Incr {
        k: u8,
        d: u64,
    },
    Decr {
        k: u8,
        d: u64,
    },
    Touch {
        k: u8,
        ttl: i64,
    },
    /// A multi-key get through `Store::read_many` (groups read ahead together).
    GetMany {
        ks: Vec<u8>,
    },
    Get {
        k: u8,
    },
    Advance {
        secs: u32,
    },
    Flush {
        delay: u32,
    },
    /// Switch the store's eviction policy live (slab LRU or S3-FIFO); the model is unchanged.
    Switch {
        s3fifo: bool,
    },
}

#[derive(Debug, Clone)]
enum Value {
    Number(u64),
    Bytes(u8, usize),
}

impl Value {
    fn bytes(&self) -> Vec<u8> {
        match self {
            Value::Number(n) => n.to_string().into_bytes(),
            Value::Bytes(b, len) => vec![*b; *len],
        }
    }
}

fn value(max_len: usize) -> impl Strategy<Value = Value> {
    prop_oneof![
        prop_oneof![Just(0u64), Just(u64::MAX - 1), any::<u64>(), 0u64..100]
            .prop_map(Value::Number),
        (any::<u8>(), 0..max_len).prop_map(|(b, l)| Value::Bytes(b, l)),
    ]
}

fn ops(keys: u8, max_len: usize) -> impl Strategy<Value = Op> {
    let k = 0..keys;
    let ttl = prop_oneof![Just(0i64), Just(-1), 1i64..20];
    prop_oneof![
        6 => (k.clone(), value(max_len), any::<u32>(), ttl.clone()).prop_map(|(k, v, flags, ttl)| Op::Set { k, v, flags, ttl }),
        1 => (k.clone(), value(max_len)).prop_map(|(k, v)| Op::Add { k, v }),
        1 => (k.clone(), value(max_len)).prop_map(|(k, v)| Op::Replace { k, v }),
        1 => (k.clone(), value(max_len)).prop_map(|(k, v)| Op::Append { k, v }),
        1 => (k.clone(), value(max_len)).prop_map(|(k, v)| Op::Prepend { k, v }),
        2 => (k.clone(), value(max_len), any::<bool>()).prop_map(|(k, v, correct)| Op::Cas { k, v, correct }),
        1 => k.clone().prop_map(|k| Op::Delete { k }),
        2 => (k.clone(), prop_oneof![Just(1u64), Just(u64::MAX), any::<u64>()]).prop_map(|(k, d)| Op::Incr { k, d }),
        2 => (k.clone(), prop_oneof![Just(1u64), Just(u64::MAX), any::<u64>()]).prop_map(|(k, d)| Op::Decr { k, d }),
        1 => (k.clone(), ttl).prop_map(|(k, ttl)| Op::Touch { k, ttl }),
        4 => k.clone().prop_map(|k| Op::Get { k }),
        2 => proptest::collection::vec(k, 2..40).prop_map(|ks| Op::GetMany { ks }),
        1 => (0u32..8).prop_map(|secs| Op::Advance { secs }),
        1 => prop_oneof![Just(0u32), 1u32..10].prop_map(|delay| Op::Flush { delay }),
        1 => any::<bool>().prop_map(|s3fifo| Op::Switch { s3fifo }),
    ]
}

#[derive(Debug, Clone, PartialEq)]
struct MItem {
    value: Vec<u8>,
    flags: u32,
    expiry: Expiry,
    cas: u64,
}

#[derive(Default)]
struct Model {
    items: HashMap<Vec<u8>, MItem>,
    flush_at: Option<u32>,
}

impl Model {
    fn settle(&mut self, now: u32) {
        if self.flush_at.is_some_and(|t| now >= t) {
            self.flush_at = None;
            self.items.clear();
        }
        self.items.retain(|_, i| !i.expiry.is_expired(now));
    }
}

fn key(k: u8) -> Vec<u8> {
    format!("key-{k:03}").into_bytes()
}

/// memcached's counter rule: decimal digits, optionally followed by spaces.
/// The number incr/decr reads, as memcached's `strtoull`: optional leading whitespace, an
/// optional `+` (or `-` with magnitude 0), digits, then the end or whitespace (anything after
/// that is ignored).
fn parse(v: &[u8]) -> Option<u64> {
    let space = |b: &u8| b" \t\n\x0b\x0c\r".contains(b);
    let v = &v[v.iter().position(|b| !space(b))?..];
    let (negative, v) = match v.first() {
        Some(b'-') => (true, &v[1..]),
        Some(b'+') => (false, &v[1..]),
        _ => (false, v),
    };
    let end = v
        .iter()
        .position(|b| !b.is_ascii_digit())
        .unwrap_or(v.len());
    if end == 0 || v.get(end).is_some_and(|b| !space(b)) {
        return None;
    }
    let n: u64 = std::str::from_utf8(&v[..end]).ok()?.parse().ok()?;
    (!negative || n == 0).then_some(n)
}

fn run(config: StoreConfig, ops: Vec<Op>, may_evict: bool) -> Result<(), TestCaseError> {
    let item_size_max = config.item_size_max_bytes;
    let store = Store::new(config).unwrap();
    let mut model = Model::default();
    let mut now = START;
    let mut last_cas = 0u64;
    for op in ops {
        model.settle(now);
        // Every op names one key (Advance/Flush use key 0 for the peek).
        let k = match &op {
            Op::Set { k, .. }
            | Op::Add { k, .. }
            | Op::Replace { k, .. }
            | Op::Append { k, .. }
            | Op::Prepend { k, .. }
            | Op::Cas { k, .. }
            | Op::Delete { k }
            | Op::Incr { k, .. }
            | Op::Decr { k, .. }
            | Op::Touch { k, .. }
            | Op::Get { k } => *k,
            Op::GetMany { ks } => ks[0],
            Op::Advance { .. } | Op::Flush { .. } | Op::Switch { .. } => 0,
        };
        let kb = key(k);
        let quiet = ReadOptions {
            no_bump: true,
            ..Default::default()
        };
        let peeked = match &op {
            Op::GetMany { ks } => ks.clone(),
            _ => vec![k],
        };
        for k in peeked {
            let kb = key(k);
            let seen = store.read(&kb, now, quiet, |v| MItem {
                value: v.value.to_vec(),
                flags: v.flags,
                expiry: v.expiry,
                cas: v.cas,
            });
            match (&seen, model.items.get(&kb)) {
                (Some(s), Some(m)) => prop_assert_eq!(s, m, "key {} differs", k),
                (Some(s), None) => prop_assert!(false, "key {} resurrected as {:?}", k, s),
                (None, Some(_)) => {
                    prop_assert!(
                        may_evict && store.stats().evicted_items > 0,
                        "key {} lost without eviction",
                        k
                    );
                    model.items.remove(&kb);
                }
                (None, None) => {}
            }
        }
        let present = model.items.get(&kb).cloned();
        match op.clone() {
            Op::Set { v, flags, ttl, .. } => {
                let v = v.bytes();
                let expiry = Expiry::from_protocol(ttl, now);
                let r = store.write(
                    &WriteRequest {
                        flags,
                        expiry,
                        ..WriteRequest::set(&kb, &v)
                    },
                    now,
                );
                let Ok(WriteOutcome::Stored { cas }) = r else {
                    return Err(TestCaseError::fail(format!("set {r:?}")));
                };
                prop_assert!(cas > last_cas);
                last_cas = cas;
                model.items.insert(
                    kb.clone(),
                    MItem {
                        value: v,
                        flags,
                        expiry,
                        cas,
                    },
                );
            }
            Op::Add { v, .. }
            | Op::Replace { v, .. }
            | Op::Append { v, .. }
            | Op::Prepend { v, .. } => {
                let mode = match op {
                    Op::Add { .. } => WriteMode::Add,
                    Op::Replace { .. } => WriteMode::Replace,
                    Op::Append { .. } => WriteMode::Append,
                    _ => WriteMode::Prepend,
                };
                let v = v.bytes();
                let r = store.write(
                    &WriteRequest {
                        mode,
                        flags: 5,
                        ..WriteRequest::set(&kb, &v)
                    },
                    now,
                );
                let should_store = (mode == WriteMode::Add) != present.is_some();
                if !should_store {
                    prop_assert_eq!(r, Ok(WriteOutcome::NotStored));
                    continue;
                }
                if let (WriteMode::Append | WriteMode::Prepend, Some(p)) = (mode, &present) {
                    let len = item_size_bytes(kb.len(), p.value.len() + v.len(), p.flags, true);
                    if len > item_size_max {
                        prop_assert_eq!(
                            r,
                            Err(StoreError::TooLarge {
                                len,
                                max: item_size_max
                            })
                        );
                        continue;
                    }
                }
                let Ok(WriteOutcome::Stored { cas }) = r else {
                    return Err(TestCaseError::fail(format!("{mode:?} {r:?}")));
                };
                prop_assert!(cas > last_cas);
                last_cas = cas;
                let new = match (mode, present) {
                    (WriteMode::Append, Some(p)) => MItem {
                        value: [p.value, v].concat(),
                        cas,
                        ..p
                    },
                    (WriteMode::Prepend, Some(p)) => MItem {
                        value: [v, p.value].concat(),
                        cas,
                        ..p
                    },
                    _ => MItem {
                        value: v,
                        flags: 5,
                        expiry: Expiry::NEVER,
                        cas,
                    },
                };
                model.items.insert(kb.clone(), new);
            }
            Op::Cas { v, correct, .. } => {
                let v = v.bytes();
                let expected = match (&present, correct) {
                    (Some(p), true) => p.cas,
                    (Some(p), false) => p.cas + 1000,
                    (None, _) => 1,
                };
                let r = store.write(
                    &WriteRequest {
                        compare_cas: Some(expected),
                        ..WriteRequest::set(&kb, &v)
                    },
                    now,
                );
                match (&present, correct) {
                    (None, _) => prop_assert_eq!(r, Ok(WriteOutcome::NotFound)),
                    (Some(_), false) => prop_assert_eq!(r, Ok(WriteOutcome::Exists)),
                    (Some(_), true) => {
                        let Ok(WriteOutcome::Stored { cas }) = r else {
                            return Err(TestCaseError::fail(format!("cas {r:?}")));
                        };
                        last_cas = cas;
                        model.items.insert(
                            kb.clone(),
                            MItem {
                                value: v,
                                flags: 0,
                                expiry: Expiry::NEVER,
                                cas,
                            },
                        );
                    }
                }
            }
            Op::Delete { .. } => {
                let r = store.delete(&kb, now, DeleteOptions::default());
                prop_assert_eq!(
                    r,
                    if present.is_some() {
                        DeleteOutcome::Deleted
                    } else {
                        DeleteOutcome::NotFound
                    }
                );
                model.items.remove(&kb);
            }
            Op::Incr { d, .. } | Op::Decr { d, .. } => {
                let decrement = matches!(op, Op::Decr { .. });
                let req = if decrement {
                    ArithRequest::decr(d)
                } else {
                    ArithRequest::incr(d)
                };
                let r = store.arith(&kb, now, &req);
                match present {
                    None => prop_assert_eq!(r, Ok(ArithOutcome::NotFound)),
                    Some(p) => match parse(&p.value) {
                        None => prop_assert_eq!(r, Err(StoreError::NonNumeric)),
                        Some(n) => {
                            let want = if decrement {
                                n.saturating_sub(d)
                            } else {
                                n.wrapping_add(d)
                            };
                            let Ok(ArithOutcome::Value { value, cas, .. }) = r else {
                                return Err(TestCaseError::fail(format!("arith {r:?}")));
                            };
                            prop_assert_eq!(value, want);
                            last_cas = cas;
                            // memcached pads a shorter result with spaces to the old length
                            let mut value = want.to_string().into_bytes();
                            if value.len() < p.value.len() {
                                value.resize(p.value.len(), b' ');
                            }
                            model.items.insert(kb.clone(), MItem { value, cas, ..p });
                        }
                    },
                }
            }
            Op::Touch { ttl, .. } => {
                let expiry = Expiry::from_protocol(ttl, now);
                prop_assert_eq!(store.touch(&kb, expiry, now), present.is_some());
                if let Some(p) = present {
                    model.items.insert(kb.clone(), MItem { expiry, ..p });
                }
            }
            Op::Get { .. } => {
                let got = store.get(&kb, now, |v| v.value.to_vec());
                prop_assert_eq!(got, present.map(|p| p.value));
            }
            Op::GetMany { ks } => {
                let keys: Vec<Vec<u8>> = ks.iter().map(|&k| key(k)).collect();
                let refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
                let mut got = vec![None; refs.len()];
                let mut calls = 0;
                store.read_many(&refs, now, ReadOptions::default(), |i, item| {
                    assert_eq!(i, calls, "answers in the keys' order");
                    calls += 1;
                    got[i] = item.map(|v| v.value.to_vec());
                });
                prop_assert_eq!(calls, refs.len(), "one answer per key");
                let want: Vec<Option<Vec<u8>>> = keys
                    .iter()
                    .map(|kb| model.items.get(kb).map(|m| m.value.clone()))
                    .collect();
                prop_assert_eq!(got, want);
            }
            Op::Advance { secs } => now += secs,
            Op::Switch { s3fifo } => {
                let kind = if s3fifo {
                    EvictionPolicyKind::S3FIFO
                } else {
                    EvictionPolicyKind::SlabLru
                };
                store.switch_eviction(kind, now).unwrap();
                prop_assert_eq!(store.eviction(), kind);
                store.check_invariants();
            }
            Op::Flush { delay } => {
                store.flush_all(now, delay);
                if delay == 0 {
                    model.items.clear();
                    model.flush_at = None;
                } else {
                    model.flush_at = Some(now + delay);
                }
            }
        }
    }
    store.check_invariants();
    Ok(())
}

fn roomy() -> StoreConfig {
    StoreConfig {
        memory_limit_bytes: 512 << 10,
        slab_size_bytes: 8 << 10,
        item_size_max_bytes: 4 << 10,
        ..StoreConfig::default()
    }
}

fn tight(compaction_dead_permille: u32, eviction: EvictionPolicyKind) -> StoreConfig {
    StoreConfig {
        memory_limit_bytes: 40 << 10,
        slab_size_bytes: 4 << 10,
        item_size_max_bytes: 2 << 10,
        compaction_dead_permille,
        eviction,
        ..StoreConfig::default()
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Enough room: the store must match the model exactly, never evicting.
    #[test]
    fn matches_model_without_pressure(ops in proptest::collection::vec(ops(12, 64), 1..200)) {
        run(roomy(), ops, false)?;
    }

    /// The same with a partitioned layout: sharding must be invisible to clients.
    #[test]
    fn matches_model_partitioned(ops in proptest::collection::vec(ops(12, 64), 1..200)) {
        let config = StoreConfig { layout: Layout::Partitioned { shards: 3 }, memory_limit_bytes: 1536 << 10, ..roomy() };
        run(config, ops, false)?;
    }

    /// Far more data than fits: keys may vanish (evicted) but never come back wrong or stale.
    #[test]
    fn matches_model_under_eviction(
        ops in proptest::collection::vec(ops(60, 1500), 1..300),
        compaction in prop_oneof![Just(200u32), Just(1000)],
        policy in prop_oneof![
            Just(EvictionPolicyKind::SlabLru),
            Just(EvictionPolicyKind::LeastLiveOfLru { candidates: 3 }),
            Just(EvictionPolicyKind::SecondChanceFifo),
            Just(EvictionPolicyKind::S3FIFO),
        ],
    ) {
        run(tight(compaction, policy), ops, true)?;
    }
}
