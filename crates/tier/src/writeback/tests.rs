//! The engine's rules one by one; tests/ordering.rs checks them together against a model.

use super::*;
use crate::record::KeyedOp;

fn put(v: &str) -> Op {
    Op::Put(Record {
        value: Arc::from(v.as_bytes()),
        flags: 0,
        expiry_unix: 0,
    })
}

fn config(window_ms: u64) -> WriteBackConfig {
    WriteBackConfig {
        window_ms,
        dirty_bytes_max: 1000,
        batch_items_max: 10,
        batch_bytes_max: 1 << 20,
        batches_in_flight_max: 4,
        items_per_sec_max: 0,
        backoff_initial_ms: 10,
        backoff_max_ms: 40,
    }
}

fn ops(b: Batch) -> (u64, Vec<KeyedOp>) {
    match b {
        Batch::Ops { id, ops } => (id, ops),
        Batch::Clear { .. } => panic!("expected ops, got a clear"),
    }
}

#[test]
fn ten_writes_in_a_window_cost_one_store_write() {
    let mut wb = WriteBack::<()>::new(config(100));
    for i in 0..10 {
        wb.record(b"k", put(&format!("v{i}")), i + 1, i);
    }
    assert_eq!(wb.take_batch(99, 1), None, "not due before the window");
    let (id, sent) = ops(wb.take_batch(100, 1).expect("due"));
    assert_eq!(sent, vec![(Arc::from(&b"k"[..]), put("v9"))]);
    wb.complete(id, true, 101);
    let s = wb.stats();
    assert_eq!((s.recorded, s.coalesced, s.flushed_ops), (10, 9, 1));
    assert!(wb.is_clean());
    assert_eq!(s.dirty_bytes, 0);
}

#[test]
fn one_flush_per_key_in_flight_and_a_newer_value_waits_for_it() {
    let mut wb = WriteBack::<()>::new(config(0));
    wb.record(b"k", put("old"), 1, 0);
    let (first, _) = ops(wb.take_batch(0, 1).expect("due"));
    wb.record(b"k", put("new"), 2, 0);
    assert_eq!(wb.take_batch(0, 1), None, "the key's flush is in flight");
    assert_eq!(
        wb.known(b"k"),
        Known::Present(match put("new") {
            Op::Put(r) => r,
            _ => unreachable!(),
        })
    );
    wb.complete(first, true, 1);
    let (_, sent) = ops(wb.take_batch(1, 1).expect("the newer value is due now"));
    assert_eq!(sent[0].1, put("new"));
}

#[test]
fn a_failed_flush_is_retried_after_a_backoff_unless_superseded() {
    let mut wb = WriteBack::<()>::new(config(0));
    wb.record(b"a", put("a1"), 1, 0);
    wb.record(b"b", put("b1"), 2, 0);
    let (id, sent) = ops(wb.take_batch(0, 1).expect("due"));
    assert_eq!(sent.len(), 2);
    wb.record(b"b", put("b2"), 3, 0);
    wb.complete(id, false, 0);
    assert_eq!(wb.take_batch(9, 1), None, "paused for the backoff");
    let (id, sent) = ops(wb.take_batch(10, 1).expect("after the backoff"));
    let mut sent: Vec<_> = sent.into_iter().map(|(k, op)| (k.to_vec(), op)).collect();
    sent.sort_by(|x, y| x.0.cmp(&y.0));
    assert_eq!(
        sent,
        vec![(b"a".to_vec(), put("a1")), (b"b".to_vec(), put("b2"))]
    );
    wb.complete(id, false, 10);
    assert_eq!(wb.take_batch(29, 1), None, "the backoff doubled");
    let (id, _) = ops(wb.take_batch(30, 1).expect("after the doubled backoff"));
    wb.complete(id, true, 30);
    assert!(wb.is_clean());
    assert_eq!(wb.stats().failed_batches, 2);
}

#[test]
fn dirty_bytes_are_bounded() {
    let mut wb = WriteBack::<()>::new(config(100));
    wb.record(b"k", put(&"x".repeat(998)), 1, 0);
    assert!(wb.has_room().is_ok(), "999 bytes of 1000");
    wb.record(b"k", put(&"x".repeat(999)), 2, 0);
    assert!(wb.has_room().is_err(), "1000 bytes of 1000");
    let mut wb = WriteBack::<()>::new(config(100));
    wb.record(b"k", put(&"x".repeat(500)), 1, 0);
    assert!(wb.has_room().is_ok());
    wb.record(b"j", put(&"x".repeat(500)), 2, 0);
    assert_eq!(
        wb.has_room(),
        Err(Full {
            dirty_bytes: 1002,
            dirty_bytes_max: 1000
        })
    );
    let (id, _) = ops(wb.take_batch(100, 1).expect("due"));
    assert!(wb.has_room().is_err(), "bytes in flight still count");
    wb.complete(id, true, 100);
    assert!(wb.has_room().is_ok());
}

#[test]
fn waiters_are_released_when_their_version_or_a_newer_one_is_durable() {
    let mut wb = WriteBack::<&str>::new(config(0));
    wb.record(b"k", put("v1"), 1, 0);
    assert_eq!(wb.wait(b"k", 1, "first"), Ok(()));
    wb.record(b"k", put("v2"), 2, 0);
    assert_eq!(wb.wait(b"k", 2, "second"), Ok(()));
    let (id, _) = ops(wb.take_batch(0, 1).expect("due"));
    // The batch carried v2 (coalesced): both are durable with it.
    let done = wb.complete(id, true, 0);
    assert_eq!(done.released, vec!["first", "second"]);
    assert_eq!(wb.wait(b"k", 2, "late"), Err("late"), "already durable");
}

#[test]
fn expired_puts_and_deletes_flush_as_deletes() {
    let mut wb = WriteBack::<()>::new(config(0));
    wb.record(
        b"e",
        Op::Put(Record {
            value: Arc::from(&b"v"[..]),
            flags: 0,
            expiry_unix: 50,
        }),
        1,
        0,
    );
    wb.record(b"d", put("v"), 2, 0);
    wb.record(b"d", Op::Delete, 3, 0);
    let (_, mut sent) = ops(wb.take_batch(0, 60).expect("due"));
    sent.sort_by(|x, y| x.0.cmp(&y.0));
    assert_eq!(sent[0].1, Op::Delete);
    assert_eq!(sent[1].1, Op::Delete);
}

#[test]
fn flush_all_clears_the_store_before_later_writes() {
    let mut wb = WriteBack::<&str>::new(config(0));
    wb.record(b"a", put("a1"), 1, 0);
    let (first, _) = ops(wb.take_batch(0, 1).expect("due"));
    wb.record(b"b", put("b1"), 2, 0);
    wb.record_clear(3);
    wb.record(b"c", put("c1"), 4, 0);
    assert_eq!(wb.known(b"a"), Known::Absent);
    assert_eq!(wb.known(b"b"), Known::Absent);
    assert!(matches!(wb.known(b"c"), Known::Present(_)));
    assert_eq!(wb.known(b"z"), Known::Absent, "the store is being cleared");
    assert_eq!(
        wb.take_batch(0, 1),
        None,
        "the clear waits for the flush in flight"
    );
    wb.complete(first, true, 0);
    let clear = wb.take_batch(0, 1).expect("the clear");
    assert!(matches!(clear, Batch::Clear { .. }));
    assert_eq!(
        wb.take_batch(0, 1),
        None,
        "nothing after the clear before it is confirmed"
    );
    wb.complete(clear.id(), true, 0);
    let (_, sent) = ops(wb.take_batch(0, 1).expect("c"));
    assert_eq!(sent, vec![(Arc::from(&b"c"[..]), put("c1"))]);
    assert_eq!(wb.known(b"z"), Known::Store);
}

#[test]
fn flushes_are_throttled() {
    let mut c = config(0);
    c.items_per_sec_max = 2;
    let mut wb = WriteBack::<()>::new(c);
    for (i, k) in ["a", "b", "c", "d"].iter().enumerate() {
        wb.record(k.as_bytes(), put("v"), i as u64 + 1, 0);
    }
    let (id, sent) = ops(wb.take_batch(0, 1).expect("due"));
    assert_eq!(sent.len(), 2, "two keys per second");
    wb.complete(id, true, 0);
    assert_eq!(wb.take_batch(400, 1), None, "under one key's allowance");
    let (_, sent) = ops(wb.take_batch(1000, 1).expect("a second later"));
    assert_eq!(sent.len(), 2);
}

#[test]
fn a_shorter_window_makes_pending_keys_due_sooner() {
    let mut wb = WriteBack::<()>::new(config(10_000));
    wb.record(b"k", put("v"), 1, 0);
    assert_eq!(wb.take_batch(100, 1), None);
    wb.reconfigure(config(0), 100);
    assert!(wb.take_batch(100, 1).is_some());
}

#[test]
fn unconfirmed_versions_are_the_newest_not_yet_in_the_store() {
    let mut wb = WriteBack::<()>::new(config(0));
    assert_eq!(wb.unconfirmed_version(b"k"), None);
    wb.record(b"k", put("v1"), 1, 0);
    let (id, _) = ops(wb.take_batch(0, 1).expect("due"));
    assert_eq!(wb.unconfirmed_version(b"k"), Some(1), "in flight");
    wb.record(b"k", put("v2"), 2, 0);
    assert_eq!(wb.unconfirmed_version(b"k"), Some(2), "pending behind it");
    wb.complete(id, true, 0);
    let (id, _) = ops(wb.take_batch(0, 1).expect("due"));
    wb.complete(id, true, 0);
    assert_eq!(wb.unconfirmed_version(b"k"), None);
    wb.record_clear(3);
    assert_eq!(
        wb.unconfirmed_version(b"other"),
        Some(3),
        "a pending clear counts for all"
    );
}
