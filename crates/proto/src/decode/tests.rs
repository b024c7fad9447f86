//! Whole replies decoded from bytes (tables, including the load generator's former own
//! codec's cases), and round trips: requests written in place parse back with
//! [`crate::parse`], replies composed with [`Response::encode`] decode back.

use proptest::prelude::*;

use crate::*;

fn decode(buf: &[u8], expect: Expect) -> Result<Decoded<'_>, ReplyError> {
    decode_reply(buf, expect, &Limits::for_replies(4096, 1 << 20))
}

fn complete(reply: Reply<'_>, consumed: usize) -> Result<Decoded<'_>, ReplyError> {
    Ok(Decoded::Complete { reply, consumed })
}

#[test]
fn single_lines_and_errors() {
    for (bytes, expect, want) in [
        (&b"STORED\r\n"[..], Expect::Line, Response::Stored),
        (b"NOT_STORED\r\n", Expect::Line, Response::NotStored),
        (b"EXISTS\r\n", Expect::Line, Response::Exists),
        (b"NOT_FOUND\r\n", Expect::Line, Response::NotFound),
        (
            b"VERSION 1.6.18\r\n",
            Expect::Line,
            Response::Version(b"1.6.18"),
        ),
        (b"ERROR\r\n", Expect::Values, Response::Error),
        (
            b"SERVER_ERROR out of memory storing object\r\n",
            Expect::Stats,
            Response::ServerError(b"out of memory storing object"),
        ),
        (
            b"CLIENT_ERROR bad data chunk\r\n",
            Expect::Line,
            Response::ClientError(b"bad data chunk"),
        ),
    ] {
        assert_eq!(
            decode(bytes, expect),
            complete(Reply::Line(want), bytes.len())
        );
        let is_error = expect != Expect::Line || bytes.ends_with(b"chunk\r\n");
        assert_eq!(Reply::Line(want).is_error(), is_error, "{bytes:?}");
    }
}

#[test]
fn multi_value_reply_is_zero_copy() {
    let buf = b"VALUE a 1 3\r\nabc\r\nVALUE bb 0 0 99\r\n\r\nEND\r\nSTORED\r\n";
    let Ok(Decoded::Complete {
        reply: Reply::Values(values),
        consumed,
    }) = decode(buf, Expect::Values)
    else {
        panic!("expected values");
    };
    assert_eq!(consumed, buf.len() - lines::STORED.len());
    assert_eq!(values.count(), 2);
    let all: Vec<_> = values.iter().collect();
    assert_eq!(
        all,
        [
            Value {
                key: b"a",
                flags: 1,
                cas: None,
                data: b"abc"
            },
            Value {
                key: b"bb",
                flags: 0,
                cas: Some(99),
                data: b""
            }
        ]
    );
    assert!(std::ptr::eq(all[0].data.as_ptr(), buf[13..].as_ptr()));
}

#[test]
fn a_miss_is_no_values() {
    let Ok(Decoded::Complete {
        reply: Reply::Values(values),
        consumed: 5,
    }) = decode(b"END\r\n", Expect::Values)
    else {
        panic!("expected an empty retrieval");
    };
    assert_eq!((values.count(), values.iter().count()), (0, 0));
}

#[test]
fn every_prefix_of_a_reply_is_incomplete() {
    // Value data holding CR LF and "END" is skipped by its length, not scanned.
    let buf = b"VALUE k 0 7\r\nEND\r\nxx\r\nEND\r\n";
    for cut in 0..buf.len() {
        assert_eq!(
            decode(&buf[..cut], Expect::Values),
            Ok(Decoded::Incomplete),
            "cut at {cut}"
        );
    }
    let Ok(Decoded::Complete {
        reply: Reply::Values(v),
        consumed,
    }) = decode(buf, Expect::Values)
    else {
        panic!("expected complete");
    };
    assert_eq!((v.count(), consumed), (1, buf.len()));
    assert_eq!(v.iter().next().map(|v| v.data), Some(&b"END\r\nxx"[..]));
}

#[test]
fn stats_lines_up_to_end() {
    let buf = b"STAT pid 12\r\nSTAT evictions 5\r\nSTAT version 1.6.18\r\nEND\r\n";
    let Ok(Decoded::Complete {
        reply: Reply::Stats(stats),
        consumed,
    }) = decode(buf, Expect::Stats)
    else {
        panic!("expected stats");
    };
    assert_eq!(consumed, buf.len());
    let all: Vec<_> = stats.iter().collect();
    assert_eq!(
        all,
        [
            (&b"pid"[..], &b"12"[..]),
            (b"evictions", b"5"),
            (b"version", b"1.6.18")
        ]
    );
}

#[test]
fn rejects_what_the_request_cannot_get_and_enforces_limits() {
    for (bytes, expect, error) in [
        (&b"HELLO\r\n"[..], Expect::Line, ReplyError::Unknown),
        (b"STORED\r\n", Expect::Values, ReplyError::Unexpected),
        (
            b"VALUE k 0 1\r\na\r\nSTORED\r\n",
            Expect::Values,
            ReplyError::Unexpected,
        ),
        (
            b"VALUE k 0 1\r\na\r\nERROR\r\n",
            Expect::Values,
            ReplyError::Unexpected,
        ),
        (
            b"STAT a 1\r\nVALUE k 0 1\r\na\r\n",
            Expect::Stats,
            ReplyError::Unexpected,
        ),
        (
            b"VALUE k 0 1\r\na\r\n",
            Expect::Stats,
            ReplyError::Unexpected,
        ),
        (
            b"VALUE k x 1\r\na\r\nEND\r\n",
            Expect::Values,
            ReplyError::Malformed,
        ),
        (
            b"VALUE k 0 1\r\nab\r\nEND\r\n",
            Expect::Values,
            ReplyError::BadDataChunk,
        ),
    ] {
        assert_eq!(decode(bytes, expect), Err(error), "{bytes:?}");
    }
    let tight = Limits::for_replies(8, 4);
    assert_eq!(
        decode_reply(b"NOT_STORED", Expect::Line, &tight),
        Err(ReplyError::LineTooLong)
    );
    assert_eq!(
        decode_reply(
            b"VALUE k 0 5\r\n",
            Expect::Values,
            &Limits::for_replies(64, 4)
        ),
        Err(ReplyError::ValueTooLarge)
    );
}

fn key() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(b'!'..=b'~', 1..=250)
}

fn text() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(b'!'..=b'~', 1..20)
}

fn data() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 0..64)
}

type Item = (Vec<u8>, u32, Option<u64>, Vec<u8>);

fn item() -> impl Strategy<Value = Item> {
    (key(), any::<u32>(), any::<Option<u64>>(), data())
}

/// Splits `bytes` in two at `cut` (modulo its length) and checks the first part alone is
/// incomplete.
fn assert_prefix_incomplete(bytes: &[u8], expect: Expect, cut: usize) {
    let cut = cut % bytes.len().max(1);
    assert_eq!(decode(&bytes[..cut], expect), Ok(Decoded::Incomplete));
}

proptest! {
    #[test]
    fn retrieve_written_in_place_parses_back(
        keys in prop::collection::vec(key(), 1..20),
        return_cas in any::<bool>(),
        touch in prop::option::of(-1_000_000i64..100_000_000),
    ) {
        let mut out = Vec::new();
        write_retrieve_with(&mut out, return_cas, touch, keys.len(), |i, out| {
            out.extend_from_slice(&keys[i]);
        });
        let mut through_iter = Vec::new();
        write_retrieve(&mut through_iter, return_cas, touch, keys.iter().map(Vec::as_slice));
        prop_assert_eq!(&out, &through_iter);
        let Parsed::Complete { request: Request::Retrieve(r), consumed } =
            parse(&out, &Limits::default())
        else {
            panic!("{:?} did not parse", String::from_utf8_lossy(&out));
        };
        prop_assert_eq!(consumed, out.len());
        prop_assert_eq!((r.return_cas, r.touch_exptime), (return_cas, touch));
        prop_assert!(r.keys.iter().eq(keys.iter().map(Vec::as_slice)));
    }

    #[test]
    fn store_written_in_place_parses_back(
        key in key(),
        value in prop::collection::vec(any::<u8>(), 0..512),
        flags in any::<u32>(),
        exptime in -1_000_000i64..100_000_000,
        noreply in any::<bool>(),
        mode in prop_oneof![
            Just(StoreMode::Set),
            Just(StoreMode::Add),
            Just(StoreMode::Replace),
            Just(StoreMode::Append),
            Just(StoreMode::Prepend),
            any::<u64>().prop_map(|unique| StoreMode::Cas { unique }),
        ],
    ) {
        let head = StoreHead { mode, flags, exptime, noreply };
        let mut out = Vec::new();
        write_store_with(&mut out, head, |out| out.extend_from_slice(&key), &value);
        let want = Request::Store(Store { mode, key: &key, flags, exptime, value: &value, noreply });
        let mut encoded = Vec::new();
        want.encode(&mut encoded);
        prop_assert_eq!(&out, &encoded);
        prop_assert_eq!(
            parse(&out, &Limits::default()),
            Parsed::Complete { request: want, consumed: out.len() }
        );
    }

    #[test]
    fn values_encoded_then_decoded_are_identity(
        items in prop::collection::vec(item(), 0..8),
        cut in any::<usize>(),
    ) {
        let mut out = Vec::new();
        for (key, flags, cas, data) in &items {
            Response::Value { key, flags: *flags, cas: *cas, data }.encode(&mut out);
        }
        Response::End.encode(&mut out);
        out.extend_from_slice(lines::STORED);
        let Ok(Decoded::Complete { reply: Reply::Values(values), consumed }) =
            decode(&out, Expect::Values)
        else {
            panic!("{:?} did not decode", String::from_utf8_lossy(&out));
        };
        prop_assert_eq!(consumed, out.len() - lines::STORED.len());
        prop_assert_eq!(values.count(), items.len());
        let back: Vec<Item> = values
            .iter()
            .map(|v| (v.key.to_vec(), v.flags, v.cas, v.data.to_vec()))
            .collect();
        prop_assert_eq!(back, items);
        assert_prefix_incomplete(&out[..consumed], Expect::Values, cut);
    }

    #[test]
    fn stats_encoded_then_decoded_are_identity(
        stats in prop::collection::vec((text(), text()), 0..16),
        cut in any::<usize>(),
    ) {
        let mut out = Vec::new();
        for (name, value) in &stats {
            Response::Stat { name, value }.encode(&mut out);
        }
        Response::End.encode(&mut out);
        let Ok(Decoded::Complete { reply: Reply::Stats(decoded), consumed }) =
            decode(&out, Expect::Stats)
        else {
            panic!("{:?} did not decode", String::from_utf8_lossy(&out));
        };
        prop_assert_eq!(consumed, out.len());
        let back: Vec<(Vec<u8>, Vec<u8>)> =
            decoded.iter().map(|(n, v)| (n.to_vec(), v.to_vec())).collect();
        prop_assert_eq!(back, stats);
        assert_prefix_incomplete(&out, Expect::Stats, cut);
    }

    #[test]
    fn decoder_never_panics_and_stays_in_bounds(
        bytes in prop::collection::vec(
            prop::sample::select(b"VALUE END STAT STORED ERROR\r\n0123 x".to_vec()),
            0..64,
        ),
    ) {
        for expect in [Expect::Values, Expect::Stats, Expect::Line] {
            if let Ok(Decoded::Complete { reply, consumed }) = decode(&bytes, expect) {
                prop_assert!(consumed <= bytes.len());
                if let Reply::Values(v) = reply {
                    prop_assert_eq!(v.iter().count(), v.count());
                }
            }
        }
    }
}
