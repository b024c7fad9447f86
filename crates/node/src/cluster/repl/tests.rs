//! The lanes, batches and receiving side of replication, without links.

use super::stream::{CLOSED_POLL, sleep_unless_closed};
use super::target::{Acked, Batch, TargetState, next_batch, trim_acked};
use super::*;
use cellcache_cluster::wire::FrameKind;
use cellcache_cluster::wire::payload::{ItemState, RangeSeq, ReplicationRecord, encode_item};
use cellcache_store::Store;

fn replicator() -> Arc<Replicator> {
    Replicator::new(ReplPolicy {
        accept_unreachable: false,
        chunk_bytes: 1024,
        backlog_bytes_max: 1 << 20,
        stream_bytes_per_sec: 0,
        io_timeout: Duration::from_secs(1),
        child_lag_bytes_max: 4096,
        child_answer_window: Duration::from_secs(3600),
    })
}

fn encode(op: ReplicationOp<'_>) -> Vec<u8> {
    let mut b = Vec::new();
    ReplicationRecord {
        range: HashRange::FULL,
        seq: 0,
        op,
    }
    .encode(&mut b)
    .expect("encodes");
    b
}

fn set(key: &str, value: &str) -> Entry {
    Entry::Record(
        encode(ReplicationOp::Set {
            key: key.as_bytes(),
            value: value.as_bytes(),
            flags: 0,
            expiry_unix_secs: 0,
            cas: 1,
            stale: false,
        }),
        Some(cellcache_store::key_hash(key.as_bytes())),
    )
}

fn touch(key: &str) -> Entry {
    Entry::Record(
        encode(ReplicationOp::Touch {
            key: key.as_bytes(),
            expiry_unix_secs: 7,
        }),
        Some(cellcache_store::key_hash(key.as_bytes())),
    )
}

/// (seq, op name, key, value) of each record of a batch.
fn records(b: &Batch) -> Vec<(u64, &'static str, String, String)> {
    ReplicationRecord::decode_all(&b.payload)
        .map(|r| {
            let r = r.expect("decodes");
            let s = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
            match r.op {
                ReplicationOp::Set { key, value, .. } => (r.seq, "set", s(key), s(value)),
                ReplicationOp::Touch { key, .. } => (r.seq, "touch", s(key), String::new()),
                ReplicationOp::Delete { key } => (r.seq, "delete", s(key), String::new()),
                ReplicationOp::Flush { .. } => (r.seq, "flush", String::new(), String::new()),
                ReplicationOp::SetPart { key, part, .. } => (r.seq, "part", s(key), s(part)),
            }
        })
        .collect()
}

/// A target whose receiver's positions are known (its first empty frames were answered:
/// nothing applied yet).
fn positioned(cell: u64, waited: bool) -> Target {
    let t = Target::new(CellId::whole(cell), 0, waited);
    {
        let mut st = t.state.lock();
        st.live_wire.known = true;
        st.snapshot_wire.known = true;
    }
    t
}

/// Takes the next batch and acknowledges it, as the sender does on a `ReplicateAck`.
fn send(t: &Target) -> Option<Batch> {
    send_turn(t, false)
}

/// [`send`] in `alternate` mode or not, recording the lane's turn as the sender does.
fn send_turn(t: &Target, alternate: bool) -> Option<Batch> {
    let mut st = t.state.lock();
    let b = next_batch(&st, 1024, alternate)?;
    st.sending(&b);
    assert_eq!(st.acknowledged(&b, b.last_position), Acked::Applied);
    trim_acked(&mut st);
    Some(b)
}

#[test]
fn a_live_record_is_sent_ahead_of_queued_snapshot_chunks() {
    let r = replicator();
    let t = positioned(2, true);
    let value = "v".repeat(200);
    for i in 0..40 {
        r.push(&t, 1, set(&format!("snap{i}"), &value), LaneKind::Snapshot);
    }
    r.push(&t, 1, Entry::Done(HashRange::FULL), LaneKind::Snapshot);
    r.push(&t, 1, set("live", "now"), LaneKind::Live);
    let first = send(&t).expect("a batch");
    assert_eq!(first.kind, FrameKind::Replicate);
    assert_eq!(
        records(&first),
        vec![(1, "set", "live".into(), "now".into())],
        "the live lane's first position"
    );
    // Then the snapshot, in chunks, and its marker last.
    let mut kinds = Vec::new();
    let mut keys = Vec::new();
    while let Some(b) = send(&t) {
        kinds.push(b.kind);
        if b.kind == FrameKind::SnapshotChunk {
            keys.extend(records(&b).into_iter().map(|r| r.2));
        }
    }
    assert!(kinds.len() > 2, "several chunks: {kinds:?}");
    assert_eq!(kinds.last(), Some(&FrameKind::SnapshotDone));
    assert!(
        kinds[..kinds.len() - 1]
            .iter()
            .all(|k| *k == FrameKind::SnapshotChunk)
    );
    let expected: Vec<String> = (0..40).map(|i| format!("snap{i}")).collect();
    assert_eq!(keys, expected);
    assert_eq!(t.state.lock().backlog_bytes, 0);
}

#[test]
fn a_live_record_takes_the_older_snapshot_copy_of_its_key_along() {
    let r = replicator();
    let t = positioned(2, true);
    r.push(&t, 1, set("a", "old-a"), LaneKind::Snapshot);
    r.push(&t, 1, set("b", "old-b"), LaneKind::Snapshot);
    r.push(&t, 1, set("c", "old-c"), LaneKind::Snapshot);
    r.push(&t, 1, touch("b"), LaneKind::Live);
    // A snapshot item scanned after the live record stays in the snapshot lane.
    r.push(&t, 1, set("b", "new-b"), LaneKind::Snapshot);
    let first = send(&t).expect("the live lane");
    assert_eq!(first.kind, FrameKind::Replicate);
    let got = records(&first);
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(
        (got[0].1, got[0].2.as_str(), got[0].3.as_str()),
        ("set", "b", "old-b")
    );
    assert_eq!((got[1].0, got[1].1, got[1].2.as_str()), (2, "touch", "b"));
    assert!(got[0].0 < got[1].0, "the copy is applied first: {got:?}");
    let rest = send(&t).expect("the snapshot lane");
    assert_eq!(rest.kind, FrameKind::SnapshotChunk);
    let keys: Vec<(String, String)> = records(&rest).into_iter().map(|r| (r.2, r.3)).collect();
    assert_eq!(
        keys,
        vec![
            ("a".into(), "old-a".into()),
            ("c".into(), "old-c".into()),
            ("b".into(), "new-b".into())
        ]
    );
    assert!(send(&t).is_none());
}

#[test]
fn a_live_flush_drops_the_snapshot_items_queued_before_it() {
    let r = replicator();
    let t = positioned(2, true);
    r.push(&t, 1, set("a", "1"), LaneKind::Snapshot);
    r.push(&t, 1, set("b", "2"), LaneKind::Snapshot);
    let flush = Entry::Record(encode(ReplicationOp::Flush { at_unix_secs: 5 }), None);
    r.push(&t, 1, flush, LaneKind::Live);
    r.push(&t, 1, set("c", "3"), LaneKind::Snapshot);
    r.push(&t, 1, Entry::Done(HashRange::FULL), LaneKind::Snapshot);
    let first = send(&t).expect("the flush");
    assert_eq!(
        records(&first).into_iter().map(|r| r.1).collect::<Vec<_>>(),
        ["flush"]
    );
    let rest = send(&t).expect("what the flush left");
    assert_eq!(
        records(&rest).into_iter().map(|r| r.2).collect::<Vec<_>>(),
        ["c"]
    );
    assert_eq!(send(&t).expect("marker").kind, FrameKind::SnapshotDone);
    assert_eq!(t.state.lock().snapshot_bytes, 0);
}

#[test]
fn the_snapshot_marker_waits_for_every_earlier_live_record() {
    let r = replicator();
    let t = positioned(2, true);
    r.push(&t, 1, Entry::Done(HashRange::FULL), LaneKind::Snapshot);
    let live = r.push(&t, 1, set("x", "1"), LaneKind::Live);
    // Not acknowledged yet: the next batch is still the live record, not the marker.
    let b = next_batch(&t.state.lock(), 1024, false).expect("a batch");
    assert_eq!((b.kind, b.last), (FrameKind::Replicate, live));
    let b = next_batch(&t.state.lock(), 1024, false).expect("a batch");
    assert_eq!(b.kind, FrameKind::Replicate, "resent until acknowledged");
    send(&t);
    assert_eq!(send(&t).expect("marker").kind, FrameKind::SnapshotDone);
}

/// `value` of `len` bytes, different per `version`.
fn big(len: usize, version: u8) -> Vec<u8> {
    (0..len)
        .map(|i| b'a' + ((i + version as usize) % 26) as u8)
        .collect()
}

/// The records of one item, numbered from `first`.
fn item_records(key: &[u8], value: &[u8], cas: u64, part: usize, first: u64) -> Vec<Vec<u8>> {
    let item = ItemState {
        key,
        value,
        flags: 0,
        expiry_unix_secs: 0,
        cas,
        stale: false,
    };
    let mut recs = encode_item(HashRange::FULL, &item, part).expect("encodes");
    for (i, r) in recs.iter_mut().enumerate() {
        set_record_seq(r, first + i as u64);
    }
    recs
}

fn stored(store: &Store, key: &[u8]) -> Option<(Vec<u8>, u64)> {
    store.get(key, now_secs(), |v| (v.value.to_vec(), v.cas))
}

#[test]
fn values_sent_in_parts_are_rebuilt_once_their_last_part_arrives() {
    let store = Store::new(cellcache_store::StoreConfig::default()).expect("store");
    let (mut applied, mut parts) = (0, Assembly::default());
    let mut apply = |payload: &[u8], applied: &mut u64| {
        apply_records(
            &store,
            payload,
            applied,
            &mut parts,
            1 << 20,
            now_secs(),
            |_| true,
            |_, _| {},
        )
        .expect("applies")
    };
    let value = big(100_000, 0);
    let recs = item_records(b"k", &value, 7, 30_000, 1);
    assert_eq!(recs.len(), 4);
    // Parts 1-2 arrive; nothing is stored yet.
    assert_eq!(
        apply(&[recs[0].clone(), recs[1].clone()].concat(), &mut applied),
        0
    );
    assert_eq!(stored(&store, b"k"), None);
    // Another key travels between the parts.
    let other = item_records(b"other", b"small", 3, 30_000, 10);
    assert_eq!(apply(&other[0], &mut applied), 0);
    // A resent part (its acknowledgement was lost) is skipped by sequence; a moved copy
    // of an applied part (new sequence, same bytes) is a repeat and ignored.
    let moved = item_records(b"k", &value, 7, 30_000, 11);
    assert_eq!(
        apply(&[recs[1].clone(), moved[1].clone()].concat(), &mut applied),
        0
    );
    // The rest, moved into the live lane with newer sequences, completes the value.
    assert_eq!(
        apply(&[moved[2].clone(), moved[3].clone()].concat(), &mut applied),
        1
    );
    assert_eq!(stored(&store, b"k"), Some((value.clone(), 7)));
    assert_eq!(stored(&store, b"other"), Some((b"small".to_vec(), 3)));
    assert!(parts.is_empty());
}

/// Applies a payload that must decode, keeping every key.
fn apply_all(
    store: &Store,
    payload: &[u8],
    applied: &mut u64,
    parts: &mut Assembly,
    parts_bytes_max: usize,
) -> u64 {
    apply_records(
        store,
        payload,
        applied,
        parts,
        parts_bytes_max,
        now_secs(),
        |_| true,
        |_, _| {},
    )
    .expect("applies")
}

#[test]
fn a_newer_change_supersedes_a_value_still_arriving_in_parts() {
    let store = Store::new(cellcache_store::StoreConfig::default()).expect("store");
    let (mut applied, mut parts) = (0, Assembly::default());
    let old = item_records(b"k", &big(50_000, 1), 5, 20_000, 1);
    let mut payload = old[0].clone();
    // A newer whole value for the key, then a part of the old version that fits nowhere.
    payload.extend(item_records(b"k", b"new", 6, 20_000, 2).concat());
    payload.extend(
        item_records(b"k", &big(50_000, 1), 5, 20_000, 2)[1]
            .iter()
            .copied(),
    );
    let n = payload.len() - old[1].len();
    set_record_seq(&mut payload[n..], 3);
    let rebuilt = apply_all(&store, &payload, &mut applied, &mut parts, 1 << 20);
    assert_eq!(rebuilt, 0);
    assert_eq!(stored(&store, b"k"), Some((b"new".to_vec(), 6)));
    assert!(parts.is_empty(), "no partial copy left behind");
    // A new version's first part replaces an older partial copy.
    let a = item_records(b"j", &big(50_000, 2), 8, 20_000, 10);
    let b = item_records(b"j", &big(50_000, 3), 9, 20_000, 11);
    let payload = [a[0].clone(), b.concat()].concat();
    let rebuilt = apply_all(&store, &payload, &mut applied, &mut parts, 1 << 20);
    assert_eq!(rebuilt, 1);
    assert_eq!(stored(&store, b"j"), Some((big(50_000, 3), 9)));
    // Partial copies beyond the bound are dropped, largest first.
    let c = item_records(b"c", &big(50_000, 4), 1, 20_000, 20);
    let d = item_records(b"d", &big(50_000, 5), 1, 20_000, 30);
    let payload = [c[0].clone(), c[1].clone(), d[0].clone()].concat();
    apply_all(&store, &payload, &mut applied, &mut parts, 50_000);
    assert_eq!(parts.len(), 1, "the larger partial copy went");
}

#[test]
fn a_large_live_value_is_queued_in_parts_and_acknowledged_by_its_last() {
    let r = replicator();
    let t = positioned(2, true);
    let value = big(5000, 0);
    let mut last = 0;
    for b in item_records(b"big", &value, 1, 1024, 0) {
        last = r.push(
            &t,
            1,
            Entry::Record(b, Some(cellcache_store::key_hash(b"big"))),
            LaneKind::Live,
        );
    }
    let mut rebuilt = Vec::new();
    let mut batches = 0;
    while let Some(b) = send(&t) {
        batches += 1;
        assert!(
            b.payload.len() <= 1024 + 128,
            "one part per frame: {}",
            b.payload.len()
        );
        for (_, kind, key, part) in records(&b) {
            assert_eq!((kind, key.as_str()), ("part", "big"));
            rebuilt.extend_from_slice(part.as_bytes());
        }
        if b.last == last {
            assert!(send(&t).is_none());
        }
    }
    assert_eq!(batches, 5);
    assert_eq!(rebuilt, value);
}

#[test]
fn a_throttled_stream_stops_waiting_when_its_target_closes() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let t = Arc::new(positioned(2, true));
    rt.block_on(async {
        assert!(sleep_unless_closed(&t, Duration::ZERO).await);
        let closer = t.clone();
        tokio::spawn(async move {
            tokio::time::sleep(CLOSED_POLL).await;
            closer.closed.store(true, Ordering::Release);
        });
        // An hour's throttle pause: only the close can end it (the guard below fails the
        // test instead of hanging it).
        let waited = tokio::time::timeout(
            Duration::from_secs(60),
            sleep_unless_closed(&t, Duration::from_secs(3600)),
        )
        .await;
        assert_eq!(waited, Ok(false));
    });
}

fn send_alternating(t: &Target) -> Option<Batch> {
    send_turn(t, true)
}

#[test]
fn a_child_still_taking_its_snapshot_gets_turns_without_reordering_a_key() {
    let r = replicator();
    let t = positioned(2, false);
    // A write arrives first; the snapshot items scanned after it must follow it.
    let first = r.push(&t, 1, set("x", "live-1"), LaneKind::Live);
    r.push(&t, 1, set("a", "snap-a"), LaneKind::Snapshot);
    r.push(&t, 1, set("x", "snap-x"), LaneKind::Snapshot);
    let b = send_alternating(&t).expect("a batch");
    assert_eq!((b.kind, b.last), (FrameKind::Replicate, first));
    // More writes keep coming, one per turn; the snapshot still gets its turn.
    let mut order = Vec::new();
    for i in 0..3 {
        r.push(&t, 1, set(&format!("w{i}"), "v"), LaneKind::Live);
        let b = send_alternating(&t).expect("a batch");
        order.push((
            b.kind,
            records(&b).into_iter().map(|r| r.2).collect::<Vec<_>>(),
        ));
    }
    let snap = FrameKind::SnapshotChunk;
    let live = FrameKind::Replicate;
    let keys = |k: &[&str]| k.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        order,
        vec![
            (snap, keys(&["a", "x"])),
            (live, keys(&["w0", "w1"])),
            (live, keys(&["w2"])),
        ],
        "the snapshot's turn, then the live lane's (the snapshot lane is empty)"
    );
    // A snapshot item scanned after a pending live record waits for it even on the
    // snapshot's turn, and so does the marker.
    r.push(&t, 1, set("w3", "v"), LaneKind::Live);
    r.push(&t, 1, set("b", "snap-b"), LaneKind::Snapshot);
    r.push(&t, 1, Entry::Done(HashRange::FULL), LaneKind::Snapshot);
    let mut rest = Vec::new();
    while let Some(b) = send_alternating(&t) {
        let keys = if b.kind == FrameKind::SnapshotDone {
            Vec::new()
        } else {
            records(&b).into_iter().map(|r| r.2).collect()
        };
        rest.push((b.kind, keys));
    }
    assert_eq!(
        rest,
        vec![
            (live, keys(&["w3"])),
            (snap, keys(&["b"])),
            (FrameKind::SnapshotDone, vec![]),
        ]
    );
}

#[test]
fn a_child_falling_behind_while_it_answers_is_waited_for() {
    let r = replicator(); // child_lag_bytes_max: 4096
    let t = positioned(2, false);
    let value = "v".repeat(1000);
    for i in 0..3 {
        r.push(&t, 1, set(&format!("k{i}"), &value), LaneKind::Live);
    }
    assert!(!r.child_lags(&t), "3 kB queued: within the bound");
    for i in 3..6 {
        r.push(&t, 1, set(&format!("k{i}"), &value), LaneKind::Live);
    }
    assert!(
        r.child_lags(&t),
        "6 kB queued and the child answers: backpressure"
    );
    // Snapshot items do not count: the scan has its own bound.
    let s = positioned(3, false);
    for i in 0..6 {
        r.push(&s, 1, set(&format!("k{i}"), &value), LaneKind::Snapshot);
    }
    assert!(!r.child_lags(&s));
    // A child that does not answer is not waited for: its hand-off pauses instead.
    t.state.lock().unreachable = true;
    assert!(!r.child_lags(&t));
}

/// Takes the next batch and sends it, as the sender does before its answer arrives.
fn sent(st: &mut TargetState) -> Batch {
    let b = next_batch(st, 1024, false).expect("a batch");
    st.sending(&b);
    b
}

/// Positions of each record of a batch.
fn positions(b: &Batch) -> Vec<u64> {
    records(b).into_iter().map(|r| r.0).collect()
}

#[test]
fn each_lane_of_each_target_is_numbered_consecutively_on_the_wire() {
    let r = replicator();
    let (t, u) = (positioned(2, true), positioned(3, true));
    // Records for two targets and both lanes interleave in the cell-wide sequence.
    for i in 0..3 {
        r.push(&t, 1, set(&format!("s{i}"), "v"), LaneKind::Snapshot);
        r.push(&u, 1, set(&format!("u{i}"), "v"), LaneKind::Live);
        r.push(&t, 1, set(&format!("l{i}"), "v"), LaneKind::Live);
    }
    r.push(&t, 1, Entry::Done(HashRange::FULL), LaneKind::Snapshot);
    assert_eq!(positions(&send(&t).expect("live")), [1, 2, 3]);
    assert_eq!(positions(&send(&t).expect("snapshot")), [1, 2, 3]);
    let done = send(&t).expect("the marker");
    assert_eq!(done.kind, FrameKind::SnapshotDone);
    assert_eq!(RangeSeq::decode(&done.payload).expect("marker").seq, 4);
    assert_eq!(positions(&send(&u).expect("the other target")), [1, 2, 3]);
    r.push(&t, 1, set("l3", "v"), LaneKind::Live);
    assert_eq!(positions(&send(&t).expect("later")), [4]);
}

#[test]
fn a_new_target_first_asks_the_receivers_position_and_continues_from_it() {
    let r = replicator();
    let t = Target::new(CellId::whole(2), 0, true);
    assert!(
        next_batch(&t.state.lock(), 1024, false).is_none(),
        "nothing to send"
    );
    r.push(&t, 1, set("a", "1"), LaneKind::Live);
    let mut st = t.state.lock();
    let probe = next_batch(&st, 1024, false).expect("a probe");
    assert!(probe.probe && probe.payload.is_empty());
    assert_eq!(probe.kind, FrameKind::Replicate);
    st.sending(&probe);
    // The receiver applied 41 positions of an earlier stream of this cell.
    assert_eq!(st.acknowledged(&probe, 41), Acked::Positioned);
    let b = next_batch(&st, 1024, false).expect("the record");
    assert_eq!(positions(&b), [42]);
}

#[test]
fn a_batch_that_got_no_answer_goes_again_with_its_positions_before_the_other_lane() {
    let r = replicator();
    let t = positioned(2, true);
    r.push(&t, 1, set("a", "old-a"), LaneKind::Snapshot);
    r.push(&t, 1, set("b", "old-b"), LaneKind::Snapshot);
    let first = sent(&mut t.state.lock());
    assert_eq!(positions(&first), [1, 2]);
    // Its answer is lost. Meanwhile a live change of `b` and one more item arrive: the
    // item sent keeps its place (it may have been applied under its position), so the
    // snapshot lane goes first again, then the change.
    r.push(&t, 1, touch("b"), LaneKind::Live);
    r.push(&t, 1, set("c", "old-c"), LaneKind::Snapshot);
    let again = send(&t).expect("the same snapshot batch");
    assert_eq!(again.kind, FrameKind::SnapshotChunk);
    let got: Vec<(u64, String)> = records(&again).into_iter().map(|r| (r.0, r.2)).collect();
    assert_eq!(got, [(1, "a".into()), (2, "b".into())]);
    let live = send(&t).expect("the change");
    assert_eq!(records(&live)[0].1, "touch");
    assert_eq!(positions(&send(&t).expect("the rest")), [3]);
}

#[test]
fn an_unsent_snapshot_item_still_moves_ahead_of_a_live_change_of_its_key() {
    let r = replicator();
    let t = positioned(2, true);
    r.push(&t, 1, set("a", "old-a"), LaneKind::Snapshot);
    sent(&mut t.state.lock());
    r.push(&t, 1, set("b", "old-b"), LaneKind::Snapshot);
    r.push(&t, 1, touch("b"), LaneKind::Live);
    // `a` went out: resent first, alone, with its position; `b` moved to the live lane.
    let again = send(&t).expect("a again");
    assert_eq!(positions(&again), [1]);
    let live = send(&t).expect("the live lane");
    let got: Vec<(u64, &str, String)> = records(&live)
        .into_iter()
        .map(|r| (r.0, r.1, r.2))
        .collect();
    assert_eq!(got, [(1, "set", "b".into()), (2, "touch", "b".into())]);
    assert!(send(&t).is_none(), "nothing left in the snapshot lane");
}

#[test]
fn a_receiver_elsewhere_than_expected_gets_the_lane_again_from_its_position() {
    let r = replicator();
    let t = positioned(2, true);
    let written = r.push(&t, 1, set("a", "1"), LaneKind::Live);
    r.push(&t, 1, set("b", "2"), LaneKind::Live);
    let mut st = t.state.lock();
    let b = sent(&mut st);
    assert_eq!(positions(&b), [1, 2]);
    // Another stream moved the receiver to 9 (its records at 1 and 2 were skipped as
    // resends): not taken as applied.
    assert_eq!(st.acknowledged(&b, 9), Acked::Diverged);
    assert!(st.acked < written, "the writes still wait");
    assert_eq!(positions(&sent(&mut st)), [10, 11]);
    // A receiver that refuses a gap says where it is: from there, too.
    st.gap(LaneKind::Live, 4);
    let b = sent(&mut st);
    assert_eq!(positions(&b), [4, 5]);
    assert_eq!(st.acknowledged(&b, 5), Acked::Applied);
    trim_acked(&mut st);
    assert!(next_batch(&st, 1024, false).is_none());
}

#[test]
fn after_dropping_entries_that_may_have_arrived_the_lane_goes_on_past_them() {
    let r = replicator();
    let t = positioned(2, true);
    r.push(&t, 7, set("a", "1"), LaneKind::Live);
    r.push(&t, 7, set("b", "2"), LaneKind::Live);
    {
        let mut st = t.state.lock();
        sent(&mut st);
        // Refused for good on a second attempt: the first may have been applied.
        let retry = next_batch(&st, 1024, false).expect("again");
        assert_eq!(retry.sent_before, 2);
        st.refused_for_good(&retry);
        trim_acked(&mut st);
    }
    r.push(&t, 7, set("c", "3"), LaneKind::Live);
    assert_eq!(positions(&send(&t).expect("c")), [3]);
    // A backlog dropped with entries out: the next ones go after them as well.
    r.push(&t, 7, set("d", "4"), LaneKind::Live);
    {
        let mut st = t.state.lock();
        sent(&mut st);
        st.backlog.clear();
        st.acked = r.seq.load(Ordering::Acquire);
        st.dropped();
    }
    r.push(&t, 7, set("e", "5"), LaneKind::Live);
    assert_eq!(positions(&send(&t).expect("e")), [5]);
}

/// The records of `keys` (values "v"), numbered from `first`.
fn numbered(keys: &[&str], first: u64) -> Vec<u8> {
    let mut payload = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        let mut rec = encode(ReplicationOp::Set {
            key: k.as_bytes(),
            value: b"v",
            flags: 0,
            expiry_unix_secs: 0,
            cas: 1,
            stale: false,
        });
        set_record_seq(&mut rec, first + i as u64);
        payload.extend(rec);
    }
    payload
}

#[test]
fn a_receiver_accepts_the_next_position_or_a_resend_and_refuses_a_jump() {
    assert!(check_sequence(&numbered(&["a", "b"], 6), 5).is_ok(), "next");
    assert!(
        check_sequence(&numbered(&["a", "b", "c"], 4), 5).is_ok(),
        "overlap"
    );
    assert!(check_sequence(&numbered(&["a"], 2), 5).is_ok(), "resend");
    assert!(check_sequence(&[], 5).is_ok(), "a position probe");
    assert!(matches!(
        check_sequence(&numbered(&["a"], 1 << 62), 5),
        Err(SequenceError::Gap { expected: 6, got }) if got == 1 << 62
    ));
    let holed = [numbered(&["a"], 6), numbered(&["b"], 8)].concat();
    assert!(matches!(
        check_sequence(&holed, 5),
        Err(SequenceError::Gap {
            expected: 6,
            got: 8
        })
    ));
    assert!(matches!(
        check_sequence(b"junk", 5),
        Err(SequenceError::Wire(_))
    ));
}

/// The attack this guards against: a frame numbered far ahead, had it been applied, would
/// have made every later record of the master look like a resend.
#[test]
fn a_forged_jump_leaves_the_lane_where_it_was() {
    let store = Store::new(cellcache_store::StoreConfig::default()).expect("store");
    let (mut applied, mut parts) = (0, Assembly::default());
    let first = numbered(&["a"], 1);
    check_sequence(&first, applied).expect("next");
    apply_all(&store, &first, &mut applied, &mut parts, 1 << 20);
    let forged = numbered(&["evil"], 1 << 62);
    assert!(check_sequence(&forged, applied).is_err());
    let next = numbered(&["b"], 2);
    check_sequence(&next, applied).expect("the master's next record");
    apply_all(&store, &next, &mut applied, &mut parts, 1 << 20);
    assert_eq!(applied, 2);
    assert!(stored(&store, b"b").is_some());
    assert!(stored(&store, b"evil").is_none());
}

/// The tail a cell that gave up a range delivers before the range's new master may serve
/// it: the writes queued so far on every target, a removed one still delivering included;
/// with `writes_only`, not the snapshot items (a re-replication to another backup may take
/// far longer than any client waits).
#[test]
fn drained_waits_for_the_writes_queued_so_far_on_every_target() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let r = replicator();
    let backup = Arc::new(positioned(2, true));
    let removed = Arc::new(positioned(3, true));
    {
        let mut layout = r.layout.lock();
        layout.targets.insert(backup.to.clone(), backup.clone());
        layout.retired.insert(removed.to.clone(), removed.clone());
    }
    let short = Duration::from_millis(5);
    let drained = |upto, writes_only| rt.block_on(r.drained(upto, short, writes_only));
    r.push(&backup, 1, set("s", "v"), LaneKind::Snapshot);
    assert!(drained(r.position(), true), "a snapshot item is no write");
    assert!(!drained(r.position(), false));
    r.push(&removed, 1, set("k", "v"), LaneKind::Live);
    let upto = r.position();
    assert!(
        !drained(upto, true),
        "the removed target's write is waited for"
    );
    send(&removed).expect("a batch");
    r.push(&removed, 1, set("later", "v"), LaneKind::Live);
    assert!(
        drained(upto, true),
        "a write queued after `upto` is not waited for"
    );
}
