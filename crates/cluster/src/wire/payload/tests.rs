//! Round trips and refusals of the payload codecs.

use super::*;

#[test]
fn a_records_sequence_number_is_set_in_place() {
    let record = ReplicationRecord {
        range: HashRange::FULL,
        seq: 0,
        op: ReplicationOp::Delete { key: b"k" },
    };
    let mut b = Vec::new();
    record.encode(&mut b).unwrap();
    assert!(set_record_seq(&mut b, 42));
    let (decoded, _) = ReplicationRecord::decode(&b).unwrap();
    assert_eq!(decoded.seq, 42);
    assert_eq!(decoded.op, record.op);
    assert!(!set_record_seq(&mut [0u8; 20], 1), "too short for a record");
}
/// A gap refusal names the position the receiver expects, and no other refusal reads as one.
#[test]
fn a_sequence_gap_round_trips_and_other_refusals_are_not_one() {
    let gap = SequenceGap { expected: 42 };
    assert_eq!(SequenceGap::decode(&gap.encode()), Some(gap));
    assert_eq!(
        String::from_utf8(gap.encode()).unwrap(),
        "sequence gap: expected 42"
    );
    for other in [
        &b"stale epoch"[..],
        b"sequence gap: expected ",
        b"sequence gap: expected -1",
        b"sequence gap: expected 1 2",
        b"sequence gap: expected 99999999999999999999999",
        b"\xff",
    ] {
        assert_eq!(SequenceGap::decode(other), None, "{other:?}");
    }
}

use proptest::prelude::*;

fn arb_key() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(33u8..127, 1..=KEY_BYTES_MAX)
}

#[derive(Debug, Clone)]
enum OwnedOp {
    Set(Vec<u8>, Vec<u8>, u32, u64, u64, bool),
    Delete(Vec<u8>),
    Touch(Vec<u8>, u64),
    Flush(u64),
    SetPart(Vec<u8>, u64, u32, Vec<u8>),
}

impl OwnedOp {
    fn op(&self) -> ReplicationOp<'_> {
        match self {
            OwnedOp::Set(k, v, f, e, c, st) => ReplicationOp::Set {
                key: k,
                value: v,
                flags: *f,
                expiry_unix_secs: *e,
                cas: *c,
                stale: *st,
            },
            OwnedOp::Delete(k) => ReplicationOp::Delete { key: k },
            OwnedOp::Touch(k, e) => ReplicationOp::Touch {
                key: k,
                expiry_unix_secs: *e,
            },
            OwnedOp::Flush(a) => ReplicationOp::Flush { at_unix_secs: *a },
            OwnedOp::SetPart(k, c, offset, p) => ReplicationOp::SetPart {
                key: k,
                flags: 3,
                expiry_unix_secs: 9,
                cas: *c,
                stale: *c % 2 == 0,
                total_len: offset + p.len() as u32 + 5,
                offset: *offset,
                part: p,
            },
        }
    }
}

fn arb_op() -> impl Strategy<Value = OwnedOp> {
    prop_oneof![
        (
            arb_key(),
            proptest::collection::vec(any::<u8>(), 0..200),
            any::<u32>(),
            any::<u64>(),
            any::<u64>(),
            any::<bool>()
        )
            .prop_map(|(k, v, f, e, c, st)| OwnedOp::Set(k, v, f, e, c, st)),
        arb_key().prop_map(OwnedOp::Delete),
        (arb_key(), any::<u64>()).prop_map(|(k, e)| OwnedOp::Touch(k, e)),
        any::<u64>().prop_map(OwnedOp::Flush),
        (
            arb_key(),
            any::<u64>(),
            0u32..1 << 20,
            proptest::collection::vec(any::<u8>(), 0..200)
        )
            .prop_map(|(k, c, o, p)| OwnedOp::SetPart(k, c, o, p)),
    ]
}

#[test]
fn bad_keys_refused_both_ways() {
    let long = vec![b'k'; KEY_BYTES_MAX + 1];
    let rec = ReplicationRecord {
        range: HashRange::FULL,
        seq: 1,
        op: ReplicationOp::Delete { key: &long },
    };
    let mut out = vec![9];
    assert!(rec.encode(&mut out).is_err());
    assert_eq!(out, [9], "failed encode leaves the buffer as it was");
    let empty = ReplicationRecord {
        op: ReplicationOp::Delete { key: b"" },
        ..rec
    };
    assert!(empty.encode(&mut out).is_err());
    let hello = Hello {
        cell: "2.25".parse().unwrap(),
        ring: 0xfeed,
        client: "127.0.0.1:11211".into(),
    };
    assert_eq!(encode_hello(&hello), b"2.25 feed 127.0.0.1:11211");
    assert_eq!(decode_hello(&encode_hello(&hello)).unwrap(), hello);
    assert!(decode_hello(b"2.25").is_err(), "a hello names its ring");
    assert!(decode_hello(b"2.25 feed 127.0.0.1:1 x").is_err());
    assert!(decode_hello(b"x 1 a").is_err());
    assert_eq!(
        decode_cell_id(&encode_cell_id(&hello.cell)).unwrap(),
        hello.cell
    );
    assert!(RangeSeq::decode(&[0; 25]).is_err());
}

#[test]
fn a_large_value_is_cut_into_ordered_parts_that_rebuild_it() {
    let value: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
    let item = |value| ItemState {
        key: b"k",
        value,
        flags: 1,
        expiry_unix_secs: 2,
        cas: 3,
        stale: true,
    };
    let small = encode_item(HashRange::FULL, &item(b"tiny"), 1000).unwrap();
    assert_eq!(small.len(), 1);
    let (rec, _) = ReplicationRecord::decode(&small[0]).unwrap();
    assert!(matches!(rec.op, ReplicationOp::Set { value: b"tiny", .. }));
    let parts = encode_item(HashRange::FULL, &item(&value), 3000).unwrap();
    assert_eq!(parts.len(), 4);
    let mut rebuilt = Vec::new();
    for p in &parts {
        let (rec, used) = ReplicationRecord::decode(p).unwrap();
        assert_eq!(used, p.len());
        let ReplicationOp::SetPart {
            key,
            flags,
            expiry_unix_secs,
            cas,
            stale,
            total_len,
            offset,
            part,
        } = rec.op
        else {
            panic!("a part: {rec:?}")
        };
        assert_eq!((key, flags, expiry_unix_secs, cas), (&b"k"[..], 1, 2, 3));
        assert!(stale);
        assert_eq!(total_len as usize, value.len());
        assert_eq!(offset as usize, rebuilt.len());
        assert!(part.len() <= 3000);
        rebuilt.extend_from_slice(part);
    }
    assert_eq!(rebuilt, value);
    // A part claiming bytes beyond the value is refused both ways.
    let bad = ReplicationRecord {
        range: HashRange::FULL,
        seq: 1,
        op: ReplicationOp::SetPart {
            key: b"k",
            flags: 0,
            expiry_unix_secs: 0,
            cas: 1,
            stale: false,
            total_len: 4,
            offset: 3,
            part: b"xy",
        },
    };
    assert!(bad.encode(&mut Vec::new()).is_err());
    let mut forged = parts[3].clone();
    let total_at = 1 + 24 + 2 + 4 + 8 + 8 + 1;
    forged[total_at..total_at + 4].copy_from_slice(&1u32.to_le_bytes());
    assert!(ReplicationRecord::decode(&forged).is_err());
}

proptest! {
    #[test]
    fn records_round_trip(ops in proptest::collection::vec(arb_op(), 1..8), start in any::<u64>(), seq in any::<u64>()) {
        let range = HashRange::new(start, start.wrapping_add(1000));
        let mut payload = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            ReplicationRecord { range, seq: seq.wrapping_add(i as u64), op: op.op() }.encode(&mut payload).unwrap();
        }
        let back: Vec<_> = ReplicationRecord::decode_all(&payload).collect::<Result<_, _>>().unwrap();
        prop_assert_eq!(back.len(), ops.len());
        for (i, (rec, op)) in back.iter().zip(&ops).enumerate() {
            prop_assert_eq!(rec.op, op.op());
            prop_assert_eq!(rec.seq, seq.wrapping_add(i as u64));
            prop_assert_eq!(rec.range, range);
        }
        let ack = RangeSeq { range, seq };
        let mut b = Vec::new();
        ack.encode(&mut b);
        prop_assert_eq!(RangeSeq::decode(&b).unwrap(), ack);
    }

    #[test]
    fn truncated_or_random_payloads_never_panic(op in arb_op(), cut in any::<prop::sample::Index>(), junk in proptest::collection::vec(any::<u8>(), 0..64)) {
        let mut payload = Vec::new();
        ReplicationRecord { range: HashRange::FULL, seq: 1, op: op.op() }.encode(&mut payload).unwrap();
        let n = cut.index(payload.len());
        prop_assert!(ReplicationRecord::decode(&payload[..n]).is_err(), "a strict prefix is truncated");
        for r in ReplicationRecord::decode_all(&junk) {
            let _ = r;
        }
    }
}
