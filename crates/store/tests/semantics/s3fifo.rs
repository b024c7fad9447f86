//! S3-FIFO in the store: what it keeps and drops, its ghost, and range scans while its
//! clearings move items between slabs.

use super::ranges::{OwnedChange, Recorder};
use super::*;

fn s3fifo_config(memory_limit_bytes: usize) -> StoreConfig {
    StoreConfig {
        memory_limit_bytes,
        eviction: EvictionPolicyKind::S3FIFO,
        ..small_config()
    }
}

fn set(s: &Store, key: &str, value: &[u8]) {
    s.write(&req(WriteMode::Set, key.as_bytes(), value), NOW)
        .unwrap();
}

fn present(s: &Store, key: &str) -> bool {
    s.get(key.as_bytes(), NOW, |_| ()).is_some()
}

/// Hot keys read between rounds of one-time writes (a scan) stay under S3-FIFO: the scan's
/// keys pass through the small queue and leave; under slab LRU the same scan flushes them.
#[test]
fn a_scan_of_fresh_keys_does_not_flush_items_read_again() {
    let run = |eviction| {
        let s = Store::new(StoreConfig {
            eviction,
            ..s3fifo_config(1 << 20)
        })
        .unwrap();
        for i in 0..200 {
            set(&s, &format!("hot{i}"), &[1; 100]);
        }
        // Each round: the hot keys are read (a miss is filled again), then 3,000 fresh keys
        // of 400 bytes, more than the store holds, are written once.
        for round in 0..20 {
            for i in 0..200 {
                let key = format!("hot{i}");
                if !present(&s, &key) {
                    set(&s, &key, &[1; 100]);
                }
            }
            for j in 0..3_000 {
                set(&s, &format!("scan{round}-{j}"), &[2; 400]);
            }
        }
        s.check_invariants();
        (0..200).filter(|i| present(&s, &format!("hot{i}"))).count()
    };
    let kept_s3fifo = run(EvictionPolicyKind::S3FIFO);
    let kept_lru = run(EvictionPolicyKind::SlabLru);
    assert_eq!(kept_s3fifo, 200, "every hot key survives the scans");
    assert!(
        kept_lru < 100,
        "slab LRU lets the scan flush them ({kept_lru})"
    );
}

/// A key dropped from the small queue unread and written again soon is remembered by the
/// ghost and admitted to main at its slab's next clearing; the ghost lives inside the arena.
#[test]
fn the_ghost_admits_a_key_written_again_and_costs_arena_not_memory() {
    let s = Store::new(s3fifo_config(1 << 20)).unwrap();
    let st = s.stats();
    assert!(st.slabs_ghost >= 1);
    assert_eq!(st.ghost_entries, st.slabs_ghost * (16 << 10) / 4);
    let lru = Store::new(small_config_of(1 << 20)).unwrap();
    assert_eq!(
        st.arena_bytes + st.index_bytes,
        lru.stats().arena_bytes + lru.stats().index_bytes,
        "same memory; the ghost's slab is one the arena does not fill with items"
    );
    // Fill well past capacity with keys written once: the first ones leave unread, into the
    // ghost. Written again, they come back accessed, so they survive the next round of
    // one-time writes, which an unremembered key does not.
    for i in 0..5_000 {
        set(&s, &format!("a{i}"), &[1; 300]);
    }
    assert!(!present(&s, "a0"));
    set(&s, "a0", &[1; 300]);
    set(&s, "fresh", &[1; 300]);
    for i in 0..5_000 {
        set(&s, &format!("b{i}"), &[1; 300]);
    }
    assert!(present(&s, "a0"), "remembered by the ghost, moved to main");
    assert!(!present(&s, "fresh"), "a key seen once left with its slab");
    assert!(s.stats().promoted_items > 0);
    s.check_invariants();
}

fn small_config_of(memory_limit_bytes: usize) -> StoreConfig {
    StoreConfig {
        memory_limit_bytes,
        ..small_config()
    }
}

/// A hand-off's snapshot while S3-FIFO moves items between slabs: a slab-by-slab scan
/// interleaved with reads (setting accessed bits) and writes that force clearings. The
/// scanned items plus the feed since the scan began must hold every item the store has at
/// the end, with its current state — items moved into slabs the scan had already passed
/// included (the scan visits those again).
#[test]
fn scan_range_plus_feed_keeps_items_s3fifo_moved_behind_the_scan() {
    let rec = Arc::new(Recorder::default());
    let s = Store::with_change_sink(s3fifo_config(1 << 20), rec.clone()).unwrap();
    for i in 0..3_000u32 {
        set(&s, &format!("k{i}"), &[i as u8; 200]);
    }
    rec.0.lock().unwrap().clear();
    let promoted_before = s.stats().promoted_items;
    let mut cursor = Some(ScanCursor::START);
    let mut step = 0u32;
    while let Some(c) = cursor {
        cursor = s.scan_range(HashRange::FULL, NOW, c, |v| {
            rec.0
                .lock()
                .unwrap()
                .push((0, OwnedChange::Put(OwnedItem::from_view(&v))))
        });
        // Read a spread of keys (accessed bits), then write enough to clear a few slabs.
        for j in 0..200u32 {
            let _ = present(&s, &format!("k{}", (step * 131 + j * 7) % 3_000));
        }
        for j in 0..300u32 {
            set(&s, &format!("w{step}-{j}"), &[3; 200]);
        }
        step += 1;
        assert!(step < 10_000, "the scan ends");
    }
    assert!(
        s.stats().promoted_items > promoted_before + 100,
        "items moved meanwhile"
    );
    let replica = Store::new(StoreConfig {
        memory_limit_bytes: 32 << 20,
        ..small_config()
    })
    .unwrap();
    for (_, c) in rec.0.lock().unwrap().iter() {
        match c {
            OwnedChange::Put(i) => replica.insert_item(i, NOW).unwrap(),
            OwnedChange::Delete(k) => drop(replica.delete(k, NOW, DeleteOptions::default())),
            OwnedChange::Touch(k, e) => drop(replica.touch(k, *e, NOW)),
            OwnedChange::Flush(_) => panic!("no flush in this test"),
        }
    }
    assert_eq!(replica.stats().evicted_items, 0);
    let want = s.extract_range(HashRange::FULL, NOW);
    assert!(want.len() > 1_000);
    for item in &want {
        let got = replica.get(&item.key, NOW, |v| OwnedItem::from_view(&v));
        assert_eq!(
            got.as_ref(),
            Some(item),
            "{:?}",
            String::from_utf8_lossy(&item.key)
        );
    }
}
