//! Bounded concurrency stress: several threads mixing every operation on one store.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

use cellcache_store::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const NOW: u32 = 1_000_000;
const THREADS: usize = 4;
const OPS_PER_THREAD: usize = 20_000;
const KEYS_PER_THREAD: usize = 64;

fn config(layout: Layout, memory_limit_bytes: usize) -> StoreConfig {
    StoreConfig {
        memory_limit_bytes,
        slab_size_bytes: 16 << 10,
        item_size_max_bytes: 8 << 10,
        layout,
        ..StoreConfig::default()
    }
}

/// Each thread owns its keys and keeps its own model of them; with room for everything, no
/// update may be lost or reordered while other threads hammer the same shards.
fn owned_keys_lose_no_update(layout: Layout) {
    let store = Store::new(config(layout, 8 << 20)).unwrap();
    std::thread::scope(|scope| {
        for t in 0..THREADS {
            let store = &store;
            scope.spawn(move || {
                let mut rng = StdRng::seed_from_u64(t as u64);
                let mut model: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
                for _ in 0..OPS_PER_THREAD {
                    let k = format!("t{t}-k{}", rng.gen_range(0..KEYS_PER_THREAD)).into_bytes();
                    match rng.gen_range(0..8) {
                        0 | 1 => {
                            let v = rng.gen_range(0u64..1000).to_string().into_bytes();
                            assert!(matches!(
                                store.write(&WriteRequest::set(&k, &v), NOW),
                                Ok(WriteOutcome::Stored { .. })
                            ));
                            model.insert(k, v);
                        }
                        2 => {
                            let r = store.arith(&k, NOW, &ArithRequest::incr(3));
                            match model.get_mut(&k) {
                                Some(v) => {
                                    let n: u64 = std::str::from_utf8(v).unwrap().parse().unwrap();
                                    let Ok(ArithOutcome::Value { value, .. }) = r else {
                                        panic!("incr gave {r:?}")
                                    };
                                    assert_eq!(
                                        value,
                                        n + 3,
                                        "lost update on {}",
                                        String::from_utf8_lossy(&k)
                                    );
                                    *v = (n + 3).to_string().into_bytes();
                                }
                                None => assert_eq!(r, Ok(ArithOutcome::NotFound)),
                            }
                        }
                        3 => {
                            let r = store.delete(&k, NOW, DeleteOptions::default());
                            let want = if model.remove(&k).is_some() {
                                DeleteOutcome::Deleted
                            } else {
                                DeleteOutcome::NotFound
                            };
                            assert_eq!(r, want);
                        }
                        4 => {
                            // gets + cas round trip must succeed: nobody else writes this key.
                            if let Some(cas) = store.get(&k, NOW, |v| v.cas) {
                                let v = b"7".to_vec();
                                let w = WriteRequest {
                                    compare_cas: Some(cas),
                                    ..WriteRequest::set(&k, &v)
                                };
                                assert!(matches!(
                                    store.write(&w, NOW),
                                    Ok(WriteOutcome::Stored { .. })
                                ));
                                model.insert(k, v);
                            }
                        }
                        5 => {
                            let r = store.write(
                                &WriteRequest {
                                    mode: WriteMode::Append,
                                    ..WriteRequest::set(&k, b"0")
                                },
                                NOW,
                            );
                            match model.get_mut(&k) {
                                Some(v) if v.len() < 15 => {
                                    assert!(matches!(r, Ok(WriteOutcome::Stored { .. })));
                                    v.push(b'0');
                                }
                                Some(_) => {
                                    // Keep numbers parseable: reset long ones.
                                    assert!(matches!(r, Ok(WriteOutcome::Stored { .. })));
                                    store.write(&WriteRequest::set(&k, b"1"), NOW).unwrap();
                                    model.insert(k, b"1".to_vec());
                                }
                                None => assert_eq!(r, Ok(WriteOutcome::NotStored)),
                            }
                        }
                        6 => {
                            assert_eq!(
                                store.touch(&k, Expiry::at(NOW + 100_000), NOW),
                                model.contains_key(&k)
                            );
                        }
                        _ => {
                            let got = store.get(&k, NOW, |v| v.value.to_vec());
                            assert_eq!(
                                got.as_ref(),
                                model.get(&k),
                                "thread {t} key {}",
                                String::from_utf8_lossy(&k)
                            );
                        }
                    }
                }
                for (k, v) in &model {
                    assert_eq!(store.get(k, NOW, |x| x.value.to_vec()).as_ref(), Some(v));
                }
            });
        }
    });
    assert_eq!(store.stats().evicted_items, 0);
    store.check_invariants();
}

#[test]
fn owned_keys_lose_no_update_shared() {
    owned_keys_lose_no_update(Layout::Shared);
}

#[test]
fn owned_keys_lose_no_update_partitioned() {
    owned_keys_lose_no_update(Layout::Partitioned { shards: 3 });
}

/// A value that proves its own integrity: key, writer's version, filler, checksum.
fn make_value(key: &[u8], version: u64, len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    v.extend_from_slice(&version.to_le_bytes());
    while v.len() < len - 8 {
        v.push(key[v.len() % key.len()] ^ version as u8);
    }
    let sum = cellcache_store::key_hash(&[key, &v[..]].concat());
    v.extend_from_slice(&sum.to_le_bytes());
    v
}

fn check_value(key: &[u8], v: &[u8]) {
    assert!(v.len() >= 16, "short value");
    let (body, sum) = v.split_at(v.len() - 8);
    let want = cellcache_store::key_hash(&[key, body].concat());
    assert_eq!(
        u64::from_le_bytes(sum.try_into().unwrap()),
        want,
        "torn or foreign value for {}",
        String::from_utf8_lossy(key)
    );
}

/// Writers churn a store far too small for them, so slabs are evicted, compacted and reused
/// constantly, while readers on other threads copy values out: every value read must be whole
/// and belong to its key.
#[test]
fn readers_never_see_torn_values_while_slabs_are_reused() {
    let runs = [
        (Layout::Shared, EvictionPolicyKind::SlabLru),
        (
            Layout::Partitioned { shards: 2 },
            EvictionPolicyKind::SlabLru,
        ),
        (Layout::Shared, EvictionPolicyKind::SecondChanceFifo),
        (Layout::Shared, EvictionPolicyKind::S3FIFO),
        (
            Layout::Partitioned { shards: 2 },
            EvictionPolicyKind::S3FIFO,
        ),
    ];
    for (layout, eviction) in runs {
        let store = Store::new(StoreConfig {
            eviction,
            ..config(layout, 256 << 10)
        })
        .unwrap();
        let stop = AtomicBool::new(false);
        std::thread::scope(|scope| {
            for t in 0..2u64 {
                let (store, stop) = (&store, &stop);
                scope.spawn(move || {
                    let mut rng = StdRng::seed_from_u64(100 + t);
                    for i in 0..OPS_PER_THREAD as u64 {
                        let k = format!("k{}", rng.gen_range(0..2000)).into_bytes();
                        let v = make_value(&k, i, rng.gen_range(16..3000));
                        store.write(&WriteRequest::set(&k, &v), NOW).unwrap();
                        if i % 7 == 0 {
                            store.delete(&k, NOW, DeleteOptions::default());
                        }
                    }
                    stop.store(true, Ordering::Relaxed);
                });
            }
            for t in 0..2u64 {
                let (store, stop) = (&store, &stop);
                scope.spawn(move || {
                    let mut rng = StdRng::seed_from_u64(200 + t);
                    let mut checked = 0u64;
                    for _ in 0..OPS_PER_THREAD * 4 {
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                        let k = format!("k{}", rng.gen_range(0..2000)).into_bytes();
                        // Reads set fetched bits, so second-chance clearing keeps and moves items.
                        if let Some(v) = store.get(&k, NOW, |v| v.value.to_vec()) {
                            check_value(&k, &v);
                            checked += 1;
                        }
                    }
                    checked
                });
            }
        });
        let st = store.stats();
        assert!(
            st.evicted_slabs > 0,
            "the test must actually reuse slabs: {st:?}"
        );
        store.check_invariants();
    }
}

/// Live switches of the eviction policy, back and forth, while threads write versions of
/// their own keys into a store too small for them (so clearings, promotions and the ghost's
/// reservation all run): a read returns the latest version its thread wrote or nothing
/// (evicted), never an older one, and the store's invariants hold after every switch.
#[test]
fn switching_eviction_live_never_serves_a_stale_value() {
    const SWITCHES: usize = 100;
    for layout in [Layout::Shared, Layout::Partitioned { shards: 2 }] {
        let store = Store::new(config(layout, 512 << 10)).unwrap();
        let done = AtomicBool::new(false);
        let writes = std::sync::atomic::AtomicU64::new(0);
        std::thread::scope(|scope| {
            for t in 0..2u64 {
                let (store, done, writes) = (&store, &done, &writes);
                scope.spawn(move || {
                    let mut rng = StdRng::seed_from_u64(t);
                    let mut latest: HashMap<usize, u64> = HashMap::new();
                    let mut version = 0u64;
                    // Bounded: at most this many rounds even if the switches were slow.
                    for _ in 0..200_000 {
                        if done.load(Ordering::Relaxed) {
                            break;
                        }
                        let k = rng.gen_range(0..2_000usize);
                        let key = format!("t{t}-k{k}").into_bytes();
                        version += 1;
                        let value = format!("{version:0200}").into_bytes();
                        store.write(&WriteRequest::set(&key, &value), NOW).unwrap();
                        latest.insert(k, version);
                        writes.fetch_add(1, Ordering::Relaxed);
                        let k = rng.gen_range(0..2_000usize);
                        let key = format!("t{t}-k{k}").into_bytes();
                        let got = store.get(&key, NOW, |v| v.value.to_vec());
                        if let Some(v) = got {
                            let v: u64 = std::str::from_utf8(&v).unwrap().parse().unwrap();
                            assert_eq!(Some(&v), latest.get(&k), "stale or foreign value");
                        }
                    }
                });
            }
            for i in 0..SWITCHES {
                let kind = if i % 2 == 0 {
                    EvictionPolicyKind::S3FIFO
                } else {
                    EvictionPolicyKind::SlabLru
                };
                store.switch_eviction(kind, NOW).unwrap();
                store.check_invariants();
                // Let the writers make some progress between switches (bounded wait).
                let seen = writes.load(Ordering::Relaxed);
                for _ in 0..1_000_000 {
                    if writes.load(Ordering::Relaxed) >= seen + 300 {
                        break;
                    }
                    std::thread::yield_now();
                }
            }
            done.store(true, Ordering::Relaxed);
        });
        assert_eq!(store.eviction(), EvictionPolicyKind::SlabLru);
        assert!(
            store.stats().evicted_items > 0,
            "the store was under pressure"
        );
    }
}
