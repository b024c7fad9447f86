//! Ranges and the change feed: enumerating, extracting and dropping a range, replaying the
//! feed, scanning while writing, flushes of a range, what a replica counts.

use super::*;

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
pub(super) struct Recorder(pub(super) Mutex<Vec<(u64, OwnedChange)>>);

#[derive(Debug, Clone, PartialEq)]
pub(super) enum OwnedChange {
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

/// A hand-off's snapshot + concurrent writes: a slab-by-slab scan interleaved with mutations,
/// plus the feed entries recorded since the scan started, reproduces the range exactly —
/// including items that touch or overwrite moved into slabs the scan had already passed.
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
    // A scan visits slabs coldest first. Reading an item of slab 2 makes that slab the
    // hottest: the scan passes every other slab in use first, the current one (room to
    // spare) among them.
    let moved = "a40".to_string();
    assert!(s.get(moved.as_bytes(), NOW, |_| ()).is_some());
    let mut slabs = 0;
    let mut cursor = Some(ScanCursor::START);
    while let Some(c) = cursor {
        cursor = s.scan_range(HashRange::FULL, NOW, c, |_| ());
        slabs += 1;
    }
    let in_use = slabs - s.stats().slabs_free;
    rec.0.lock().unwrap().clear();
    let mut cursor = Some(ScanCursor::START);
    for _ in 0..in_use - 1 {
        cursor = s.scan_range(HashRange::FULL, NOW, cursor.unwrap(), push);
    }
    assert!(
        !rec.0
            .lock()
            .unwrap()
            .iter()
            .any(|(_, c)| matches!(c, OwnedChange::Put(i) if i.key == moved.as_bytes())),
        "the moved item's slab is scanned last"
    );
    // The touch rewrites the item into the current slab, which the scan has passed.
    assert!(s.touch(moved.as_bytes(), Expiry::at(NOW + 100), NOW));
    let mut rest = Vec::new();
    while let Some(c) = cursor {
        cursor = s.scan_range(HashRange::FULL, NOW, c, |v| {
            rest.push(OwnedItem::from_view(&v))
        });
    }
    assert!(
        !rest.iter().any(|i| i.key == moved.as_bytes()),
        "the rewrite must land in a slab the scan had passed"
    );
    rec.0
        .lock()
        .unwrap()
        .extend(rest.into_iter().map(|i| (0, OwnedChange::Put(i))));
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

/// The warm hand-off: a range scanned and written elsewhere in scan order keeps its recency
/// there, so when the receiver fills up it evicts what the sender would have (the items read
/// lately stay), not whatever sat in the lowest-numbered slabs.
#[test]
fn a_range_written_in_scan_order_keeps_its_recency_at_the_receiver() {
    let s = store();
    let v = [7u8; 1000];
    for i in 0..150 {
        set(&s, format!("k{i}").as_bytes(), &v);
    }
    // The first items written sit in the lowest slabs; reading them makes those the hottest.
    let hot: Vec<String> = (0..30).map(|i| format!("k{i}")).collect();
    for k in &hot {
        assert!(s.get(k.as_bytes(), NOW, |_| ()).is_some());
    }
    let receiver = store();
    let mut cursor = Some(ScanCursor::START);
    while let Some(c) = cursor {
        cursor = s.scan_range(HashRange::FULL, NOW, c, |v| {
            receiver
                .insert_item(&OwnedItem::from_view(&v), NOW)
                .unwrap()
        });
    }
    assert_eq!(receiver.stats().curr_items, 150);
    for i in 0..120 {
        set(&receiver, format!("new{i}").as_bytes(), &v);
    }
    let evicted = receiver.stats().evicted_items;
    assert!(evicted > 0, "the receiver must have evicted");
    let lost: Vec<&String> = hot
        .iter()
        .filter(|k| receiver.get(k.as_bytes(), NOW, |_| ()).is_none())
        .collect();
    assert!(
        lost.is_empty(),
        "hot items evicted first: {lost:?} ({evicted} evictions)"
    );
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

/// `total_items` counts what clients store; a replica's copy, a hand-off's item and a touch
/// store no new item. `reclaimed` counts what a flush dropped, once: on the master, not on
/// a replica applying it.
#[test]
fn total_items_and_reclaimed_count_client_work_once() {
    let master = store();
    let replica = store();
    for k in [&b"a"[..], b"b", b"c"] {
        set(&master, k, b"v");
        let item = OwnedItem {
            key: k.to_vec(),
            value: b"v".to_vec(),
            flags: 0,
            expiry: Expiry::NEVER,
            cas: 1,
            stale: false,
        };
        replica.insert_item(&item, NOW).unwrap();
        replica
            .apply_change(
                &ChangeKind::Touch {
                    key: k,
                    expiry: Expiry::from_protocol(100, NOW),
                },
                NOW,
            )
            .unwrap();
    }
    assert_eq!(master.stats().total_items, 3);
    assert_eq!(replica.stats().total_items, 0);
    assert_eq!(replica.stats().curr_items, 3);
    master.flush_range(HashRange::FULL);
    replica
        .apply_change(
            &ChangeKind::Flush {
                range: HashRange::FULL,
            },
            NOW,
        )
        .unwrap();
    assert_eq!(master.stats().reclaimed, 3);
    assert_eq!(replica.stats().curr_items, 0);
    assert_eq!(replica.stats().reclaimed, 0);
}
