//! Behaviour of each memcached operation on the store, one scenario per test.

use std::sync::{Arc, Mutex};

use cellcache_store::*;

const NOW: u32 = 1_000_000;

fn small_config() -> StoreConfig {
    StoreConfig {
        memory_limit_bytes: 256 << 10,
        slab_size_bytes: 16 << 10,
        item_size_max_bytes: 16 << 10,
        ..StoreConfig::default()
    }
}

fn store() -> Store {
    Store::new(small_config()).unwrap()
}

fn get(s: &Store, key: &[u8], now: u32) -> Option<(Vec<u8>, u32, u64)> {
    s.get(key, now, |v| (v.value.to_vec(), v.flags, v.cas))
}

fn set(s: &Store, key: &[u8], value: &[u8]) -> u64 {
    match s.write(&WriteRequest::set(key, value), NOW).unwrap() {
        WriteOutcome::Stored { cas } => cas,
        other => panic!("set gave {other:?}"),
    }
}

fn req<'a>(mode: WriteMode, key: &'a [u8], value: &'a [u8]) -> WriteRequest<'a> {
    WriteRequest {
        mode,
        ..WriteRequest::set(key, value)
    }
}

#[test]
fn set_get_overwrite_and_flags() {
    let s = store();
    assert_eq!(get(&s, b"a", NOW), None);
    let c1 = set(&s, b"a", b"one");
    let c2 = s
        .write(
            &WriteRequest {
                flags: 77,
                ..WriteRequest::set(b"a", b"two")
            },
            NOW,
        )
        .unwrap();
    let WriteOutcome::Stored { cas: c2 } = c2 else {
        panic!()
    };
    assert!(c2 > c1);
    assert_eq!(get(&s, b"a", NOW), Some((b"two".to_vec(), 77, c2)));
    assert_eq!(s.stats().curr_items, 1);
    s.check_invariants();
}

#[test]
fn add_replace_append_prepend() {
    let s = store();
    assert_eq!(
        s.write(&req(WriteMode::Replace, b"k", b"x"), NOW),
        Ok(WriteOutcome::NotStored)
    );
    assert_eq!(
        s.write(&req(WriteMode::Append, b"k", b"x"), NOW),
        Ok(WriteOutcome::NotStored)
    );
    assert!(matches!(
        s.write(&req(WriteMode::Add, b"k", b"mid"), NOW),
        Ok(WriteOutcome::Stored { .. })
    ));
    assert_eq!(
        s.write(&req(WriteMode::Add, b"k", b"other"), NOW),
        Ok(WriteOutcome::NotStored)
    );
    let with_flags = WriteRequest {
        flags: 9,
        ..req(WriteMode::Append, b"k", b">")
    };
    assert!(matches!(
        s.write(&with_flags, NOW),
        Ok(WriteOutcome::Stored { .. })
    ));
    assert!(matches!(
        s.write(&req(WriteMode::Prepend, b"k", b"<"), NOW),
        Ok(WriteOutcome::Stored { .. })
    ));
    // append/prepend keep the original flags (0), ignoring the request's.
    assert_eq!(
        get(&s, b"k", NOW).map(|(v, f, _)| (v, f)),
        Some((b"<mid>".to_vec(), 0))
    );
    assert!(matches!(
        s.write(&req(WriteMode::Replace, b"k", b"new"), NOW),
        Ok(WriteOutcome::Stored { .. })
    ));
    assert_eq!(get(&s, b"k", NOW).unwrap().0, b"new");
    s.check_invariants();
}

#[test]
fn compare_and_swap() {
    let s = store();
    let missing = WriteRequest {
        compare_cas: Some(1),
        ..WriteRequest::set(b"c", b"v")
    };
    assert_eq!(s.write(&missing, NOW), Ok(WriteOutcome::NotFound));
    let cas = set(&s, b"c", b"v1");
    let wrong = WriteRequest {
        compare_cas: Some(cas + 100),
        ..WriteRequest::set(b"c", b"v2")
    };
    assert_eq!(s.write(&wrong, NOW), Ok(WriteOutcome::Exists));
    let right = WriteRequest {
        compare_cas: Some(cas),
        ..WriteRequest::set(b"c", b"v2")
    };
    assert!(matches!(
        s.write(&right, NOW),
        Ok(WriteOutcome::Stored { .. })
    ));
    assert_eq!(s.write(&right, NOW), Ok(WriteOutcome::Exists));
    assert_eq!(get(&s, b"c", NOW).unwrap().0, b"v2");
}

#[test]
fn explicit_cas_is_stored_and_counter_stays_above() {
    let s = store();
    let big = 1u64 << 50;
    let w = WriteRequest {
        new_cas: Some(big),
        ..WriteRequest::set(b"r", b"v")
    };
    assert_eq!(s.write(&w, NOW), Ok(WriteOutcome::Stored { cas: big }));
    assert_eq!(get(&s, b"r", NOW).unwrap().2, big);
    let next = set(&s, b"other", b"v");
    assert!(next > big);
    // An explicit CAS far below the slab's base still round-trips.
    let w = WriteRequest {
        new_cas: Some(3),
        ..WriteRequest::set(b"low", b"v")
    };
    s.write(&w, NOW).unwrap();
    assert_eq!(get(&s, b"low", NOW).unwrap().2, 3);
}

#[test]
fn incr_decr_follow_memcached_rules() {
    let s = store();
    assert_eq!(
        s.arith(b"n", NOW, &ArithRequest::incr(1)),
        Ok(ArithOutcome::NotFound)
    );
    set(&s, b"n", b"18446744073709551614");
    let Ok(ArithOutcome::Value { value, .. }) = s.arith(b"n", NOW, &ArithRequest::incr(3)) else {
        panic!()
    };
    assert_eq!(value, 1, "incr wraps at 2^64");
    assert_eq!(
        get(&s, b"n", NOW).unwrap().0,
        b"1                   ",
        "a shorter result keeps the old length, space-padded (memcached 1.6.18 does this)"
    );
    let Ok(ArithOutcome::Value { value, .. }) = s.arith(b"n", NOW, &ArithRequest::decr(5)) else {
        panic!()
    };
    assert_eq!(value, 0, "decr floors at 0");
    set(&s, b"t", b"9");
    let Ok(ArithOutcome::Value { value, .. }) = s.arith(b"t", NOW, &ArithRequest::incr(1)) else {
        panic!()
    };
    assert_eq!(value, 10);
    assert_eq!(get(&s, b"t", NOW).unwrap().0, b"10");
    set(&s, b"s", b"abc");
    assert_eq!(
        s.arith(b"s", NOW, &ArithRequest::incr(1)),
        Err(StoreError::NonNumeric)
    );
    let viv = ArithRequest {
        autovivify: Some((40, Expiry::NEVER)),
        ..ArithRequest::incr(2)
    };
    let Ok(ArithOutcome::Value { value, created, .. }) = s.arith(b"v", NOW, &viv) else {
        panic!()
    };
    assert_eq!((value, created), (40, true), "vivified: created");
    let Ok(ArithOutcome::Value { value, created, .. }) = s.arith(b"v", NOW, &viv) else {
        panic!()
    };
    assert_eq!((value, created), (42, false), "then incremented");
    s.check_invariants();
}

#[test]
fn expiry_touch_and_gat() {
    let s = store();
    let w = WriteRequest {
        expiry: Expiry::from_protocol(10, NOW),
        ..WriteRequest::set(b"e", b"v")
    };
    s.write(&w, NOW).unwrap();
    assert!(get(&s, b"e", NOW + 9).is_some());
    assert!(get(&s, b"e", NOW + 10).is_none(), "expired at its second");
    assert_eq!(s.stats().reclaimed, 1);

    set(&s, b"t", b"v");
    assert!(
        s.touch(b"t", Expiry::from_protocol(5, NOW), NOW),
        "touch adds an expiry"
    );
    assert!(get(&s, b"t", NOW + 4).is_some());
    let gat = ReadOptions {
        touch: Some(Expiry::from_protocol(100, NOW + 4)),
        ..Default::default()
    };
    assert_eq!(
        s.read(b"t", NOW + 4, gat, |v| v.expiry.remaining_secs(NOW + 4)),
        Some(Some(100))
    );
    assert!(get(&s, b"t", NOW + 50).is_some());
    assert!(s.touch(b"t", Expiry::NEVER, NOW + 50));
    assert!(get(&s, b"t", NOW + 100_000).is_some());
    assert!(!s.touch(b"missing", Expiry::NEVER, NOW));

    let w = WriteRequest {
        expiry: Expiry::from_protocol(-1, NOW),
        ..WriteRequest::set(b"t", b"gone")
    };
    assert!(matches!(s.write(&w, NOW), Ok(WriteOutcome::Stored { .. })));
    assert!(
        get(&s, b"t", NOW).is_none(),
        "negative exptime stores an already-expired item"
    );
    s.check_invariants();
}

#[test]
fn flush_all_now_and_delayed() {
    let s = store();
    set(&s, b"a", b"1");
    s.flush_all(NOW, 0);
    assert!(get(&s, b"a", NOW).is_none());
    set(&s, b"b", b"2");
    s.flush_all(NOW, 10);
    assert!(get(&s, b"b", NOW + 9).is_some());
    assert!(get(&s, b"b", NOW + 10).is_none());
    set(&s, b"c", b"3");
    assert!(
        get(&s, b"c", NOW + 11).is_some(),
        "items stored after the flush moment live"
    );
    assert_eq!(s.stats().slabs_partial + s.stats().slabs_full, 1);
}

#[test]
fn too_large_and_bad_keys_are_typed_errors() {
    let s = store();
    // memcached's accounting: key + value + 59 (+ 4 with flags) <= item_size_max.
    let max = s.config().item_size_max_bytes;
    let value_max = max - 1 - ITEM_OVERHEAD_BYTES;
    assert_eq!(s.config().value_bytes_max(), value_max);
    let big = vec![7u8; value_max + 1];
    assert_eq!(
        s.write(&WriteRequest::set(b"k", &big), NOW),
        Err(StoreError::TooLarge { len: max + 1, max })
    );
    set(&s, b"k", &big[..value_max]);
    let flagged = WriteRequest {
        flags: 1,
        ..WriteRequest::set(b"k", &big[..value_max])
    };
    assert_eq!(
        s.write(&flagged, NOW),
        Err(StoreError::TooLarge { len: max + 4, max })
    );
    let flagged = WriteRequest {
        flags: 1,
        ..WriteRequest::set(b"k", &big[..value_max - ITEM_FLAGS_BYTES])
    };
    assert!(matches!(
        s.write(&flagged, NOW),
        Ok(WriteOutcome::Stored { .. })
    ));
    let ok = vec![7u8; max - KEY_LEN_MAX - ITEM_OVERHEAD_BYTES];
    let long_key = [b'k'; KEY_LEN_MAX];
    assert!(matches!(
        s.write(
            &WriteRequest::set(&long_key, &[ok.as_slice(), b"x"].concat()),
            NOW
        ),
        Err(StoreError::TooLarge { .. })
    ));
    assert!(matches!(
        s.write(&WriteRequest::set(&long_key, &ok), NOW),
        Ok(WriteOutcome::Stored { .. })
    ));
    assert_eq!(get(&s, &long_key, NOW).unwrap().0, ok);
    assert_eq!(
        s.write(&WriteRequest::set(b"", b"v"), NOW),
        Err(StoreError::KeyLength(0))
    );
    assert_eq!(
        s.write(&WriteRequest::set(&[b'k'; 251], b"v"), NOW),
        Err(StoreError::KeyLength(251))
    );
    set(&s, b"ap", &vec![1u8; max - 2 - ITEM_OVERHEAD_BYTES - 1]);
    assert!(matches!(
        s.write(&req(WriteMode::Append, b"ap", b"xy"), NOW),
        Err(StoreError::TooLarge { .. })
    ));
}

#[test]
fn config_validation_is_typed() {
    let bad = StoreConfig {
        item_size_max_bytes: 2 << 20,
        ..StoreConfig::default()
    };
    assert!(matches!(
        Store::new(bad),
        Err(ConfigError::ItemSizeMax { .. })
    ));
    let bad = StoreConfig {
        memory_limit_bytes: 1 << 20,
        ..StoreConfig::default()
    };
    assert!(matches!(
        Store::new(bad),
        Err(ConfigError::MemoryTooSmall { .. })
    ));
    let bad = StoreConfig {
        layout: Layout::Partitioned { shards: 0 },
        ..StoreConfig::default()
    };
    assert!(matches!(Store::new(bad), Err(ConfigError::Shards)));
    let bad = StoreConfig {
        compaction_dead_permille: 1001,
        ..StoreConfig::default()
    };
    assert!(matches!(
        Store::new(bad),
        Err(ConfigError::Compaction(1001))
    ));
}

#[test]
fn eviction_clears_least_recent_slab() {
    let s = store();
    let value = [5u8; 1000];
    // Keep key "hot" recently read while writing far more than fits.
    set(&s, b"hot", &value);
    for i in 0..2000u32 {
        set(&s, format!("key{i}").as_bytes(), &value);
        assert!(get(&s, b"hot", NOW).is_some(), "hot key evicted at {i}");
    }
    let st = s.stats();
    assert!(st.evicted_slabs > 0 && st.evicted_items > 0);
    // key0 shares the hot key's slab, which reads keep most recent: slab-level LRU keeps it.
    assert!(get(&s, b"key0", NOW).is_some());
    assert!(get(&s, b"key100", NOW).is_none());
    assert!(get(&s, b"key1999", NOW).is_some());
    s.check_invariants();
}

#[test]
fn compaction_reclaims_dead_space_without_losing_items() {
    let cfg = StoreConfig {
        compaction_dead_permille: 200,
        ..small_config()
    };
    let s = Store::new(cfg).unwrap();
    let value = [1u8; 200];
    // Overwrite a small working set again and again: old versions become dead bytes.
    for round in 0..200u32 {
        for k in 0..40u32 {
            let mut v = value;
            v[..4].copy_from_slice(&round.to_le_bytes());
            set(&s, format!("k{k}").as_bytes(), &v);
        }
    }
    let st = s.stats();
    assert_eq!(
        st.evicted_items, 0,
        "dead space must be reclaimed, not live items evicted: {st:?}"
    );
    for k in 0..40u32 {
        let v = get(&s, format!("k{k}").as_bytes(), NOW).unwrap().0;
        assert_eq!(&v[..4], &199u32.to_le_bytes());
    }
    s.check_invariants();
}

#[test]
fn compaction_moves_live_items_in_place() {
    // Few overwrites per slab: slabs keep some live items, so freeing them needs compaction.
    let cfg = StoreConfig {
        compaction_dead_permille: 300,
        ..small_config()
    };
    let s = Store::new(cfg).unwrap();
    let v = [3u8; 300];
    let mut live = Vec::new();
    for i in 0..1500u32 {
        let key = format!("i{i}");
        set(&s, key.as_bytes(), &v);
        // Delete two of every three keys shortly after writing them.
        if i % 3 != 0 {
            s.delete(key.as_bytes(), NOW, DeleteOptions::default());
        } else {
            live.push(key);
        }
    }
    let st = s.stats();
    assert!(st.compactions > 0, "{st:?}");
    assert_eq!(st.evicted_items, 0, "{st:?}");
    for k in &live {
        assert_eq!(get(&s, k.as_bytes(), NOW).unwrap().0, v);
    }
    s.check_invariants();
}

#[test]
fn second_policy_prefers_slabs_with_dead_space() {
    let cfg = StoreConfig {
        eviction: EvictionPolicyKind::LeastLiveOfLru { candidates: 4 },
        compaction_dead_permille: 1000,
        ..small_config()
    };
    let s = Store::new(cfg).unwrap();
    let v = [2u8; 500];
    for i in 0..3000u32 {
        set(&s, format!("x{i}").as_bytes(), &v);
        if i % 2 == 0 {
            s.delete(format!("x{i}").as_bytes(), NOW, DeleteOptions::default());
        }
    }
    assert!(s.stats().evicted_slabs > 0);
    assert!(get(&s, b"x2999", NOW).is_some());
    s.check_invariants();
}

#[test]
fn delete_with_cas_and_invalidate() {
    let s = store();
    let cas = set(&s, b"d", b"v");
    let wrong = DeleteOptions {
        compare_cas: Some(cas + 1),
        invalidate: false,
        new_cas: None,
    };
    assert_eq!(s.delete(b"d", NOW, wrong), DeleteOutcome::Exists);
    let inval = DeleteOptions {
        compare_cas: None,
        invalidate: true,
        new_cas: None,
    };
    assert_eq!(s.delete(b"d", NOW, inval), DeleteOutcome::Deleted);
    let claim = ReadOptions {
        claim_win: true,
        ..Default::default()
    };
    assert_eq!(
        s.read(b"d", NOW, claim, |v| (v.stale, v.won, v.win_token_taken)),
        Some((true, true, false))
    );
    assert_eq!(
        s.read(b"d", NOW, claim, |v| (v.stale, v.won, v.win_token_taken)),
        Some((true, false, true))
    );
    assert_eq!(
        s.delete(b"d", NOW, DeleteOptions::default()),
        DeleteOutcome::Deleted
    );
    assert_eq!(
        s.delete(b"d", NOW, DeleteOptions::default()),
        DeleteOutcome::NotFound
    );
    // ms with I: an older CAS still stores, marked stale.
    let cas = set(&s, b"m", b"v1");
    let w = WriteRequest {
        compare_cas: Some(cas - 1),
        invalidate: true,
        ..WriteRequest::set(b"m", b"v0")
    };
    assert!(matches!(s.write(&w, NOW), Ok(WriteOutcome::Stored { .. })));
    assert_eq!(
        s.get(b"m", NOW, |v| (v.value.to_vec(), v.stale)),
        Some((b"v0".to_vec(), true))
    );
}

/// memcached 1.6.18: `md k I` gives the stale item a new CAS (`mg k c` before and after
/// differ), or the `E` one; the old CAS no longer deletes it.
#[test]
fn invalidation_bumps_the_cas() {
    let s = store();
    let cas = set(&s, b"i", b"v");
    let inval = DeleteOptions {
        invalidate: true,
        ..DeleteOptions::default()
    };
    assert_eq!(s.delete(b"i", NOW, inval), DeleteOutcome::Deleted);
    let (stale_cas, stale, value) = s
        .get(b"i", NOW, |v| (v.cas, v.stale, v.value.to_vec()))
        .unwrap();
    assert!(stale_cas > cas, "{stale_cas} > {cas}");
    assert!(stale);
    assert_eq!(value, b"v");
    let old = DeleteOptions {
        compare_cas: Some(cas),
        ..DeleteOptions::default()
    };
    assert_eq!(s.delete(b"i", NOW, old), DeleteOutcome::Exists);
    let given = DeleteOptions {
        invalidate: true,
        new_cas: Some(stale_cas + 100),
        ..DeleteOptions::default()
    };
    assert_eq!(s.delete(b"i", NOW, given), DeleteOutcome::Deleted);
    assert_eq!(s.get(b"i", NOW, |v| v.cas), Some(stale_cas + 100));
}

/// memcached 1.6.18: `ms k I C<older>` over a stale item keeps its TTL and whether its win
/// token was handed out (`mg` then answers `Z X`, not a second `W`).
#[test]
fn stale_write_keeps_ttl_and_win_token() {
    let s = store();
    let w = WriteRequest {
        expiry: Expiry::at(NOW + 30),
        ..WriteRequest::set(b"k", b"v1")
    };
    let Ok(WriteOutcome::Stored { cas }) = s.write(&w, NOW) else {
        panic!("stored");
    };
    let inval = DeleteOptions {
        invalidate: true,
        ..DeleteOptions::default()
    };
    assert_eq!(s.delete(b"k", NOW, inval), DeleteOutcome::Deleted);
    let claim = ReadOptions {
        claim_win: true,
        ..Default::default()
    };
    assert_eq!(s.read(b"k", NOW, claim, |v| v.won), Some(true));
    let stale_write = WriteRequest {
        compare_cas: Some(cas),
        invalidate: true,
        expiry: Expiry::at(NOW + 500),
        ..WriteRequest::set(b"k", b"v2")
    };
    assert!(matches!(
        s.write(&stale_write, NOW),
        Ok(WriteOutcome::Stored { .. })
    ));
    assert_eq!(
        s.read(b"k", NOW, claim, |v| (
            v.value.to_vec(),
            v.stale,
            v.won,
            v.win_token_taken,
            v.expiry
        )),
        Some((b"v2".to_vec(), true, false, true, Expiry::at(NOW + 30)))
    );
}

#[test]
fn fetched_bit_and_slab_last_access() {
    let s = store();
    set(&s, b"f", b"v");
    assert_eq!(
        s.get(b"f", NOW + 5, |v| (
            v.fetched_before,
            v.slab_last_access_secs
        )),
        Some((false, NOW))
    );
    assert_eq!(
        s.get(b"f", NOW + 7, |v| (
            v.fetched_before,
            v.slab_last_access_secs
        )),
        Some((true, NOW + 5))
    );
    let quiet = ReadOptions {
        no_bump: true,
        ..Default::default()
    };
    assert_eq!(
        s.read(b"f", NOW + 9, quiet, |v| v.slab_last_access_secs),
        Some(NOW + 7)
    );
    assert_eq!(
        s.read(b"f", NOW + 9, quiet, |v| v.slab_last_access_secs),
        Some(NOW + 7)
    );
}

fn filled(layout: Layout) -> Store {
    let s = Store::new(StoreConfig {
        layout,
        memory_limit_bytes: 1 << 20,
        ..small_config()
    })
    .unwrap();
    for i in 0..500u32 {
        let key = format!("r{i}");
        let value = i.to_le_bytes();
        let w = WriteRequest {
            flags: i,
            expiry: Expiry::at(NOW + 1000 + i),
            ..WriteRequest::set(key.as_bytes(), &value)
        };
        s.write(&w, NOW).unwrap();
    }
    s
}

#[test]
fn range_enumerate_extract_drop_and_reinsert() {
    for layout in [Layout::Shared, Layout::Partitioned { shards: 3 }] {
        let s = filled(layout);
        let all = s.extract_range(HashRange::FULL, NOW);
        assert_eq!(all.len(), 500);
        let mid = 1u64 << 63;
        let lower = HashRange::new(0, mid - 1);
        let upper = HashRange::new(mid, u64::MAX);
        let wrap = HashRange::new(mid + (1 << 62), (1 << 62) - 1);
        let lo = s.extract_range(lower, NOW);
        let hi = s.extract_range(upper, NOW);
        assert_eq!(lo.len() + hi.len(), 500);
        assert!(lo.iter().all(|i| key_hash(&i.key) < mid));
        let w = s.extract_range(wrap, NOW);
        assert!(w.iter().all(|i| wrap.contains(key_hash(&i.key))));
        assert_eq!(
            w.len(),
            all.iter()
                .filter(|i| wrap.contains(key_hash(&i.key)))
                .count()
        );

        // Hand the upper half to another store, as-is.
        let t = Store::new(StoreConfig {
            memory_limit_bytes: 1 << 20,
            ..small_config()
        })
        .unwrap();
        for item in &hi {
            t.insert_item(item, NOW).unwrap();
        }
        assert_eq!(s.drop_range(upper), hi.len());
        assert!(s.extract_range(upper, NOW).is_empty());
        let mut moved = t.extract_range(HashRange::FULL, NOW);
        let mut expected = hi.clone();
        moved.sort_by(|a, b| a.key.cmp(&b.key));
        expected.sort_by(|a, b| a.key.cmp(&b.key));
        assert_eq!(
            moved, expected,
            "CAS, flags, expiry and value survive the hand-off"
        );
        s.check_invariants();
        t.check_invariants();
    }
}

#[derive(Default)]
struct Recorder(Mutex<Vec<(u64, OwnedChange)>>);

#[derive(Debug, Clone, PartialEq)]
enum OwnedChange {
    Put(OwnedItem),
    Delete(Vec<u8>),
    Touch(Vec<u8>, Expiry),
    Flush(HashRange),
}

impl ChangeSink for Recorder {
    fn record(&self, c: &Change<'_>) {
        let o = match c.kind {
            ChangeKind::Put {
                key,
                value,
                flags,
                expiry,
                cas,
                stale,
            } => OwnedChange::Put(OwnedItem {
                key: key.to_vec(),
                value: value.to_vec(),
                flags,
                expiry,
                cas,
                stale,
            }),
            ChangeKind::Delete { key } => OwnedChange::Delete(key.to_vec()),
            ChangeKind::Touch { key, expiry } => OwnedChange::Touch(key.to_vec(), expiry),
            ChangeKind::Flush { range } => OwnedChange::Flush(range),
        };
        self.0.lock().unwrap().push((c.seq, o));
    }
}

#[test]
fn change_feed_replay_rebuilds_an_identical_store() {
    let rec = Arc::new(Recorder::default());
    let s = Store::with_change_sink(small_config(), rec.clone()).unwrap();
    set(&s, b"gone", b"x");
    s.flush_all(NOW, 0);
    for i in 0..60u32 {
        let key = format!("f{}", i % 20);
        match i % 6 {
            0 => drop(s.write(
                &WriteRequest {
                    flags: i,
                    ..req(WriteMode::Set, key.as_bytes(), b"12")
                },
                NOW,
            )),
            1 => drop(s.write(&req(WriteMode::Append, key.as_bytes(), b"3"), NOW)),
            2 => drop(s.arith(key.as_bytes(), NOW, &ArithRequest::incr(5))),
            3 => drop(s.touch(key.as_bytes(), Expiry::at(NOW + 500 + i), NOW)),
            4 => drop(s.delete(
                key.as_bytes(),
                NOW,
                DeleteOptions {
                    invalidate: i % 12 == 4,
                    compare_cas: None,
                    new_cas: None,
                },
            )),
            _ => drop(s.write(&req(WriteMode::Prepend, key.as_bytes(), b"9"), NOW)),
        }
    }
    let log = rec.0.lock().unwrap().clone();
    assert!(
        log.windows(2).all(|w| w[0].0 < w[1].0),
        "sequence numbers increase"
    );
    assert!(log.iter().any(|(_, c)| matches!(c, OwnedChange::Flush(_))));
    let replica = Store::new(small_config()).unwrap();
    for (_, c) in &log {
        let kind = match c {
            OwnedChange::Put(i) => ChangeKind::Put {
                key: &i.key,
                value: &i.value,
                flags: i.flags,
                expiry: i.expiry,
                cas: i.cas,
                stale: i.stale,
            },
            OwnedChange::Delete(k) => ChangeKind::Delete { key: k },
            OwnedChange::Touch(k, e) => ChangeKind::Touch { key: k, expiry: *e },
            OwnedChange::Flush(r) => ChangeKind::Flush { range: *r },
        };
        replica.apply_change(&kind, NOW).unwrap();
    }
    let mut a = s.extract_range(HashRange::FULL, NOW);
    let mut b = replica.extract_range(HashRange::FULL, NOW);
    a.sort_by(|x, y| x.key.cmp(&y.key));
    b.sort_by(|x, y| x.key.cmp(&y.key));
    assert!(!a.is_empty());
    assert_eq!(a, b);
}

#[test]
fn partitioned_layout_behaves_like_shared() {
    for layout in [Layout::Shared, Layout::Partitioned { shards: 4 }] {
        let s = Store::new(StoreConfig {
            layout,
            memory_limit_bytes: 2 << 20,
            ..small_config()
        })
        .unwrap();
        for i in 0..1000u32 {
            set(&s, format!("p{i}").as_bytes(), &i.to_le_bytes());
        }
        for i in 0..1000u32 {
            assert_eq!(
                get(&s, format!("p{i}").as_bytes(), NOW).unwrap().0,
                i.to_le_bytes()
            );
        }
        assert_eq!(s.stats().curr_items, 1000);
        s.check_invariants();
    }
}

#[test]
fn largest_items_never_fail_when_the_last_slab_is_short() {
    // 5 KiB over a whole number of slabs plus index: the arena's last slab is short.
    let cfg = StoreConfig {
        memory_limit_bytes: (200 << 10) + 5000,
        ..small_config()
    };
    let s = Store::new(cfg).unwrap();
    let max = s.config().item_size_max_bytes;
    let tail = s.stats().arena_bytes % (16 << 10);
    assert!(
        tail > 0 && (tail as usize) < max,
        "the arena must end in a short slab ({tail})"
    );
    // The largest value the longest of these keys may have.
    let big = vec![9u8; max - "big199".len() - ITEM_OVERHEAD_BYTES];
    for i in 0..200u32 {
        let key = format!("big{i}");
        assert!(
            matches!(
                s.write(&WriteRequest::set(key.as_bytes(), &big), NOW),
                Ok(WriteOutcome::Stored { .. })
            ),
            "write {i}"
        );
        // Small items may still use the short slab.
        set(&s, format!("small{i}").as_bytes(), b"x");
    }
    assert!(get(&s, b"big199", NOW).is_some());
    s.check_invariants();
}

#[test]
fn second_chance_keeps_read_items_and_drops_unread_neighbours() {
    let cfg = StoreConfig {
        eviction: EvictionPolicyKind::SecondChanceFifo,
        ..small_config()
    };
    let s = Store::new(cfg).unwrap();
    let v = [4u8; 500];
    // Hot keys are written among cold ones and read regularly; slab LRU would keep or drop
    // them together with their slab, second chance keeps exactly the read ones.
    for i in 0..4000u32 {
        set(&s, format!("c{i}").as_bytes(), &v);
        if i % 50 == 0 {
            set(&s, format!("hot{}", i / 50).as_bytes(), &v);
        }
        if i % 10 == 0 {
            for h in 0..=(i / 50) {
                assert!(
                    get(&s, format!("hot{h}").as_bytes(), NOW).is_some(),
                    "hot{h} lost at {i}"
                );
            }
        }
    }
    let st = s.stats();
    assert!(st.second_chance_items > 0 && st.evicted_items > 0, "{st:?}");
    assert!(get(&s, b"c1", NOW).is_none());
    s.check_invariants();
}

#[test]
fn config_deserializes_from_toml_with_defaults() {
    let c: StoreConfig = toml::from_str(
        r#"
        memory_limit_bytes = 33554432
        layout = { kind = "partitioned", shards = 4 }
        eviction = { kind = "least_live_of_lru", candidates = 8 }
        compaction_dead_permille = 300
        "#,
    )
    .unwrap();
    assert_eq!(c.memory_limit_bytes, 32 << 20);
    assert_eq!(c.layout, Layout::Partitioned { shards: 4 });
    assert_eq!(
        c.eviction,
        EvictionPolicyKind::LeastLiveOfLru { candidates: 8 }
    );
    assert_eq!(c.slab_size_bytes, StoreConfig::default().slab_size_bytes);
    assert!(Store::new(c).is_ok());
    let c: StoreConfig = toml::from_str(r#"eviction = { kind = "second_chance_fifo" }"#).unwrap();
    assert_eq!(c.eviction, EvictionPolicyKind::SecondChanceFifo);
    assert!(
        toml::from_str::<StoreConfig>("memory_limit = 5").is_err(),
        "unknown fields are refused"
    );
}

/// C7's snapshot + concurrent writes: a slab-by-slab scan interleaved with mutations, plus the
/// feed entries recorded since the scan started, reproduces the range exactly — including items
/// that touch or overwrite moved into slabs the scan had already passed.
#[test]
fn scan_range_plus_feed_reproduces_the_range() {
    let rec = Arc::new(Recorder::default());
    let cfg = StoreConfig {
        memory_limit_bytes: 4 << 20,
        ..small_config()
    };
    let s = Store::with_change_sink(cfg.clone(), rec.clone()).unwrap();
    let range = HashRange::new(1 << 62, (1 << 63) + (1 << 62));
    for i in 0..600u32 {
        let key = format!("s{i}");
        s.write(
            &WriteRequest {
                flags: i,
                ..req(WriteMode::Set, key.as_bytes(), &[i as u8; 100])
            },
            NOW,
        )
        .unwrap();
    }
    rec.0.lock().unwrap().clear();
    let mut cursor = Some(ScanCursor::START);
    let mut step = 0u32;
    while let Some(c) = cursor {
        cursor = s.scan_range(range, NOW, c, |v| {
            rec.0
                .lock()
                .unwrap()
                .push((0, OwnedChange::Put(OwnedItem::from_view(&v))))
        });
        // Mutate between steps: old keys (possibly already scanned or not), new keys.
        for j in 0..5u32 {
            let n = (step * 37 + j * 101) % 600;
            let key = format!("s{n}");
            match (step + j) % 5 {
                0 => drop(s.write(&req(WriteMode::Set, key.as_bytes(), b"rewritten"), NOW)),
                1 => drop(s.touch(key.as_bytes(), Expiry::at(NOW + 5000 + n), NOW)),
                2 => drop(s.delete(key.as_bytes(), NOW, DeleteOptions::default())),
                3 => drop(s.write(&req(WriteMode::Append, key.as_bytes(), b"+"), NOW)),
                _ => drop(s.write(
                    &req(
                        WriteMode::Set,
                        format!("new{step}-{j}").as_bytes(),
                        b"fresh",
                    ),
                    NOW,
                )),
            }
        }
        step += 1;
    }
    assert!(step > 5, "the scan must take several steps ({step})");
    assert_eq!(s.stats().evicted_items, 0);
    let replica = Store::new(cfg).unwrap();
    for (_, c) in rec.0.lock().unwrap().iter() {
        let key = match c {
            OwnedChange::Put(i) => &i.key,
            OwnedChange::Delete(k) | OwnedChange::Touch(k, _) => k,
            OwnedChange::Flush(_) => panic!("no flush in this test"),
        };
        if !range.contains(key_hash(key)) {
            continue;
        }
        match c {
            OwnedChange::Put(i) => replica.insert_item(i, NOW).unwrap(),
            OwnedChange::Delete(k) => drop(replica.delete(k, NOW, DeleteOptions::default())),
            OwnedChange::Touch(k, e) => drop(replica.touch(k, *e, NOW)),
            OwnedChange::Flush(_) => {}
        }
    }
    let mut want = s.extract_range(range, NOW);
    let mut got = replica.extract_range(HashRange::FULL, NOW);
    want.sort_by(|a, b| a.key.cmp(&b.key));
    got.sort_by(|a, b| a.key.cmp(&b.key));
    assert!(want.len() > 100);
    // The fetched bit is read-side state and not part of the comparison (OwnedItem has none).
    assert_eq!(got, want);
}

/// Regression: a touch that must rewrite an item (it had no expiry field) can move it into a slab
/// a range scan already passed; the feed must then carry the whole item, not just the new expiry.
#[test]
fn touch_relocation_into_a_scanned_slab_reaches_the_feed() {
    let rec = Arc::new(Recorder::default());
    let s = Store::with_change_sink(small_config(), rec.clone()).unwrap();
    let v = [1u8; 1000];
    let mut n = 0;
    while s.stats().slabs_free > 0 {
        set(&s, format!("a{n}").as_bytes(), &v);
        n += 1;
    }
    // 16 such items fill a 16 KiB slab: free slabs 0 and 1 (in that order) by deleting their items.
    for i in 0..32 {
        s.delete(format!("a{i}").as_bytes(), NOW, DeleteOptions::default());
    }
    assert_eq!(s.stats().slabs_free, 2);
    rec.0.lock().unwrap().clear();
    let push = |v: ItemView<'_>| {
        rec.0
            .lock()
            .unwrap()
            .push((0, OwnedChange::Put(OwnedItem::from_view(&v))))
    };
    // Scan slabs 0 and 1 (empty), then fill slab 0 so the rewrite lands in slab 1.
    let mut cursor = s.scan_range(HashRange::FULL, NOW, ScanCursor::START, push);
    cursor = s.scan_range(HashRange::FULL, NOW, cursor.unwrap(), push);
    set(&s, b"filler", &vec![2u8; 15_400]);
    let moved = format!("a{}", n - 1);
    assert!(s.touch(moved.as_bytes(), Expiry::at(NOW + 100), NOW));
    while let Some(c) = cursor {
        cursor = s.scan_range(HashRange::FULL, NOW, c, push);
    }
    assert_eq!(s.stats().evicted_items, 0);
    let replica = Store::new(small_config()).unwrap();
    for (_, c) in rec.0.lock().unwrap().iter() {
        match c {
            OwnedChange::Put(i) => replica.insert_item(i, NOW).unwrap(),
            OwnedChange::Touch(k, e) => drop(replica.touch(k, *e, NOW)),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(
        replica.get(moved.as_bytes(), NOW, |v| (v.value.len(), v.expiry)),
        Some((1000, Expiry::at(NOW + 100)))
    );
    assert_eq!(replica.stats().curr_items, s.stats().curr_items);
}

/// Regression: with several shards a flush used to be applied (and reported) shard by shard, so
/// a replica replaying the feed could wipe writes the master kept. A flush is now one event,
/// applied under all shard locks.
#[test]
fn flush_is_one_event_across_shards_and_replays_exactly() {
    let rec = Arc::new(Recorder::default());
    let cfg = StoreConfig {
        layout: Layout::Partitioned { shards: 4 },
        memory_limit_bytes: 1 << 20,
        ..small_config()
    };
    let s = Store::with_change_sink(cfg.clone(), rec.clone()).unwrap();
    for i in 0..40 {
        set(&s, format!("before{i}").as_bytes(), b"x");
    }
    s.flush_all(NOW, 0);
    for i in 0..40 {
        set(&s, format!("between{i}").as_bytes(), b"y");
    }
    s.flush_all(NOW, 5);
    let at = |now: u32, key: &str| {
        s.write(&req(WriteMode::Set, key.as_bytes(), b"z"), now)
            .unwrap()
    };
    at(NOW + 4, "late0");
    at(NOW + 5, "after0"); // the first operation at the flush second applies it, then writes
    at(NOW + 6, "after1");
    let log = rec.0.lock().unwrap().clone();
    let flushes = log
        .iter()
        .filter(|(_, c)| matches!(c, OwnedChange::Flush(_)))
        .count();
    assert_eq!(flushes, 2, "one event per flush, not one per shard");
    assert!(get(&s, b"between3", NOW + 6).is_none() && get(&s, b"late0", NOW + 6).is_none());
    assert!(get(&s, b"after0", NOW + 6).is_some());
    let replica = Store::new(StoreConfig {
        layout: Layout::Shared,
        ..cfg
    })
    .unwrap();
    for (_, c) in &log {
        match c {
            OwnedChange::Put(i) => replica.insert_item(i, NOW).unwrap(),
            OwnedChange::Flush(r) => drop(replica.drop_range(*r)),
            other => panic!("unexpected {other:?}"),
        }
    }
    let mut a = s.extract_range(HashRange::FULL, NOW + 6);
    let mut b = replica.extract_range(HashRange::FULL, NOW + 6);
    a.sort_by(|x, y| x.key.cmp(&y.key));
    b.sort_by(|x, y| x.key.cmp(&y.key));
    assert_eq!(a.len(), 2);
    assert_eq!(a, b);
}

/// Regression: the index used to make room by clearing a whole slab other than the new item's;
/// when every indexed item lived in that same slab, writes failed with OutOfMemory.
#[test]
fn a_full_index_evicts_from_the_keys_buckets() {
    // Index sized for 2000-byte items, fed 10-byte ones: the index fills long before the arena.
    let cfg = StoreConfig {
        index_item_bytes_expected: 2000,
        ..small_config()
    };
    let s = Store::new(cfg).unwrap();
    let slots = s.stats().index_slots;
    for i in 0..(slots * 4) as u32 {
        set(&s, format!("tiny{i}").as_bytes(), b"0123456789");
    }
    let st = s.stats();
    assert!(
        st.index_full_evictions > 0 && st.evicted_items > 0,
        "{st:?}"
    );
    assert!(st.curr_items <= slots);
    let last = format!("tiny{}", slots * 4 - 1);
    assert_eq!(get(&s, last.as_bytes(), NOW).unwrap().0, b"0123456789");
    s.check_invariants();
}

#[test]
fn a_range_flush_drops_only_its_range_and_is_reported_once_with_it() {
    let rec = Arc::new(Recorder::default());
    let cfg = StoreConfig {
        layout: Layout::Partitioned { shards: 4 },
        memory_limit_bytes: 1 << 20,
        ..small_config()
    };
    let s = Store::with_change_sink(cfg, rec.clone()).unwrap();
    let keys: Vec<String> = (0..200).map(|i| format!("k{i}")).collect();
    for k in &keys {
        set(&s, k.as_bytes(), b"v");
    }
    let half = HashRange::new(0, u64::MAX / 2);
    s.flush_range(half);
    for k in &keys {
        let inside = half.contains(cellcache_store::key_hash(k.as_bytes()));
        assert_eq!(get(&s, k.as_bytes(), NOW).is_none(), inside, "{k}");
    }
    let log = rec.0.lock().unwrap().clone();
    let flushes: Vec<_> = log
        .iter()
        .filter_map(|(_, c)| match c {
            OwnedChange::Flush(r) => Some(*r),
            _ => None,
        })
        .collect();
    assert_eq!(flushes, vec![half]);
    // Replaying the flush on a replica drops the same keys and reports nothing.
    let replica_rec = Arc::new(Recorder::default());
    let replica = Store::with_change_sink(small_config(), replica_rec.clone()).unwrap();
    for k in &keys {
        set(&replica, k.as_bytes(), b"v");
    }
    replica_rec.0.lock().unwrap().clear();
    replica
        .apply_change(&ChangeKind::Flush { range: half }, NOW)
        .unwrap();
    assert!(replica_rec.0.lock().unwrap().is_empty());
    let mut a = s.extract_range(HashRange::FULL, NOW);
    let mut b = replica.extract_range(HashRange::FULL, NOW);
    a.sort_by(|x, y| x.key.cmp(&y.key));
    b.sort_by(|x, y| x.key.cmp(&y.key));
    assert_eq!(a.len(), b.len());
    assert_eq!(
        a.iter().map(|i| &i.key).collect::<Vec<_>>(),
        b.iter().map(|i| &i.key).collect::<Vec<_>>()
    );
}

/// memcached -M: with evictions off a full store refuses writes (`OutOfMemory`) and keeps
/// every live item; deleting frees room again.
#[test]
fn without_evictions_a_full_store_refuses_writes_and_keeps_items() {
    let s = Store::new(StoreConfig {
        evictions: false,
        ..small_config()
    })
    .unwrap();
    let value = vec![3u8; 1000];
    let mut stored = 0u32;
    let refused = loop {
        assert!(stored < 10_000, "a 256 KiB store never filled");
        let key = format!("k{stored}");
        match s.write(&WriteRequest::set(key.as_bytes(), &value), NOW) {
            Ok(WriteOutcome::Stored { .. }) => stored += 1,
            Err(e) => break e,
            Ok(other) => panic!("{other:?}"),
        }
    };
    assert_eq!(refused, StoreError::OutOfMemory);
    assert_eq!((s.stats().evicted_items, s.stats().evicted_slabs), (0, 0));
    for i in 0..stored {
        assert!(
            get(&s, format!("k{i}").as_bytes(), NOW).is_some(),
            "k{i} lost"
        );
    }
    // Deleted space is reclaimed (compaction), never live items.
    for i in 0..stored / 2 {
        s.delete(format!("k{i}").as_bytes(), NOW, DeleteOptions::default());
    }
    set(&s, b"again", &value);
    s.check_invariants();
}

/// memcached -C: items count 8 bytes less (no CAS field) against item_size_max.
#[test]
fn without_cas_items_count_eight_bytes_less() {
    let s = Store::new(StoreConfig {
        cas_enabled: false,
        ..small_config()
    })
    .unwrap();
    let max = s.config().item_size_max_bytes;
    let value_max = max - 1 - ITEM_OVERHEAD_BYTES + ITEM_CAS_BYTES;
    assert_eq!(s.config().value_bytes_max(), value_max);
    set(&s, b"k", &vec![1u8; value_max]);
    assert!(matches!(
        s.write(&WriteRequest::set(b"k", &vec![1u8; value_max + 1]), NOW),
        Err(StoreError::TooLarge { .. })
    ));
}

/// The base64-key mark (meta `ms … b`) survives rewrites of the same item (touch to a new
/// expiry field, append, incr, invalidation) and is dropped by a new write of the key.
#[test]
fn key_binary_mark_follows_the_item() {
    let s = store();
    set(&s, b"k", b"1");
    assert_eq!(s.get(b"k", NOW, |v| v.key_binary), Some(false));
    s.mark_key_binary(b"k", NOW);
    assert_eq!(s.get(b"k", NOW, |v| v.key_binary), Some(true));
    assert!(s.touch(b"k", Expiry::at(NOW + 100), NOW));
    assert_eq!(s.get(b"k", NOW, |v| v.key_binary), Some(true));
    let append = WriteRequest {
        mode: WriteMode::Append,
        ..WriteRequest::set(b"k", b"2")
    };
    assert!(matches!(
        s.write(&append, NOW),
        Ok(WriteOutcome::Stored { .. })
    ));
    assert!(s.arith(b"k", NOW, &ArithRequest::incr(1)).is_ok());
    let inval = DeleteOptions {
        invalidate: true,
        ..DeleteOptions::default()
    };
    assert_eq!(s.delete(b"k", NOW, inval), DeleteOutcome::Deleted);
    assert_eq!(
        s.get(b"k", NOW, |v| (v.value.to_vec(), v.key_binary)),
        Some((b"13".to_vec(), true))
    );
    set(&s, b"k", b"new");
    assert_eq!(s.get(b"k", NOW, |v| v.key_binary), Some(false));
    s.check_invariants();
}
