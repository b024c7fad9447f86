//! Making room: slab eviction and its policies, compaction, second chance, a full index,
//! the largest items, running without evictions.

use super::*;

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
