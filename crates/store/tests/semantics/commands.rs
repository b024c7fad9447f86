//! Each memcached command on the store: storage, CAS, arithmetic, expiry, touch, flush,
//! delete and invalidation, meta tokens, key and size limits, configuration.

use super::*;

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
    // The smallest limit accepted is exactly what `memory_limit_min_bytes` says.
    for shards in [1, 3] {
        let c = StoreConfig {
            layout: Layout::Partitioned { shards },
            ..StoreConfig::default()
        };
        let min = c.memory_limit_min_bytes();
        let at = |memory_limit_bytes| StoreConfig {
            memory_limit_bytes,
            ..c.clone()
        };
        assert!(at(min).validate().is_ok(), "{shards} shards: {min}");
        assert!(
            matches!(
                at(min - shards).validate(),
                Err(ConfigError::MemoryTooSmall { .. })
            ),
            "{shards} shards: {min}"
        );
    }
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

/// memcached's `get_expired`: a fetch that finds the item expired (an item stored with a
/// past exptime is stored, and expires at once) counts there, besides `get_misses`.
#[test]
fn a_get_of_an_expired_item_counts_get_expired() {
    let s = store();
    let past = WriteRequest {
        expiry: Expiry::from_protocol(-1, NOW),
        ..WriteRequest::set(b"gone", b"v")
    };
    assert!(matches!(
        s.write(&past, NOW).unwrap(),
        WriteOutcome::Stored { .. }
    ));
    assert_eq!(get(&s, b"gone", NOW), None);
    assert_eq!(get(&s, b"never", NOW), None);
    let st = s.stats();
    assert_eq!((st.get_expired, st.get_misses), (1, 2));
    assert_eq!(st.reclaimed, 1);
    s.reset_stats();
    assert_eq!(s.stats().get_expired, 0);
}
