//! Dropping a range a slab at a time (`Store::drop_step`), as a cell does with what it no
//! longer holds: complete, exact, and nothing removed when the caller's view is stale.

use super::*;

fn walk(s: &Store, drop: &dyn Fn(u64) -> bool, mut between: impl FnMut(u32)) -> usize {
    let mut cursor = Some(ScanCursor::START);
    let (mut dropped, mut steps) = (0, 0u32);
    while let Some(c) = cursor {
        match s.drop_step(c, drop, &|| true) {
            DropStep::Dropped { dropped: n, next } => {
                dropped += n;
                cursor = next;
            }
            other => panic!("unexpected {other:?}"),
        }
        between(steps);
        steps += 1;
        assert!(steps < 100_000, "the walk ends");
    }
    dropped
}

/// Every item of the range goes, every other stays, for both layouts and with S3-FIFO,
/// which moves items between slabs as it clears them (the walk visits the slabs moved into
/// again).
#[test]
fn a_stepped_walk_drops_exactly_the_range() {
    for layout in [Layout::Shared, Layout::Partitioned { shards: 3 }] {
        let s = filled(layout);
        walk_drops_exactly_the_upper_half(&s);
    }
}

/// S3-FIFO moves the items it keeps into other slabs as it clears one: with writes between
/// the steps keeping it evicting, the walk still leaves nothing of the range behind. (The
/// walk is `scan_range`'s, which visits the slabs moved into again; the scan's own S3-FIFO
/// test is the one that fails without that.)
#[test]
fn a_walk_under_s3fifo_clearings_leaves_nothing_of_the_range() {
    let s = Store::new(StoreConfig {
        eviction: EvictionPolicyKind::S3FIFO,
        ..small_config()
    })
    .unwrap();
    let lower = HashRange::new(0, (1 << 63) - 1);
    let write = |s: &Store, n: u32| {
        s.write(
            &req(WriteMode::Set, format!("f{n}").as_bytes(), &[7; 100]),
            NOW,
        )
        .unwrap();
        // Re-read older keys so clearings keep (move) some of them.
        get(s, format!("f{}", n / 2).as_bytes(), NOW);
    };
    for n in 0..4000 {
        write(&s, n);
    }
    assert!(s.stats().evicted_items > 0, "full and evicting");
    let mut n = 4000;
    let dropped = walk(&s, &|h| !lower.contains(h), |_| {
        // Only keys kept are written during the walk (as a cell would).
        for _ in 0..40 {
            n += 1;
            if lower.contains(key_hash(format!("f{n}").as_bytes())) {
                write(&s, n);
            }
        }
    });
    assert!(dropped > 0);
    let upper = HashRange::new(1 << 63, u64::MAX);
    assert_eq!(s.extract_range(upper, NOW).len(), 0);
    s.check_invariants();
}

fn walk_drops_exactly_the_upper_half(s: &Store) {
    {
        let all = s.extract_range(HashRange::FULL, NOW);
        let upper = HashRange::new(1 << 63, u64::MAX);
        let expected = all
            .iter()
            .filter(|i| upper.contains(key_hash(&i.key)))
            .count();
        assert!(expected > 0 && expected < all.len());
        assert_eq!(walk(s, &|h| upper.contains(h), |_| ()), expected);
        let left = s.extract_range(HashRange::FULL, NOW);
        assert_eq!(left.len(), all.len() - expected);
        assert!(left.iter().all(|i| !upper.contains(key_hash(&i.key))));
        s.check_invariants();
    }
}

/// Writes between the steps (to keys on either side, overwrites moving items to other
/// slabs): when the walk ends, no item it should drop that was there all along is left, and
/// every key outside the range is intact.
#[test]
fn writes_between_steps_leave_nothing_behind_and_lose_nothing_kept() {
    let s = filled(Layout::Shared);
    let lower = HashRange::new(0, (1 << 63) - 1);
    let in_lower = |k: &str| lower.contains(key_hash(k.as_bytes()));
    let dropped = walk(&s, &|h| !lower.contains(h), |step| {
        for j in 0..4u32 {
            let key = format!("r{}", (step * 13 + j * 7) % 500);
            // Only keys kept are written: a write to a dropped key is a write the
            // cell accepted for a range it no longer holds, which may stay behind.
            if in_lower(&key) {
                s.write(&req(WriteMode::Set, key.as_bytes(), b"rewritten"), NOW)
                    .unwrap();
            }
        }
    });
    assert!(dropped > 0);
    for i in 0..500u32 {
        let key = format!("r{i}");
        let held = get(&s, key.as_bytes(), NOW).is_some();
        assert_eq!(held, in_lower(&key), "{key}");
    }
    s.check_invariants();
}

#[test]
fn a_stale_step_removes_nothing() {
    let s = filled(Layout::Partitioned { shards: 2 });
    assert_eq!(
        s.drop_step(ScanCursor::START, &|_| true, &|| false),
        DropStep::Stale
    );
    assert_eq!(s.extract_range(HashRange::FULL, NOW).len(), 500);
}
