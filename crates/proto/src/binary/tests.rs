//! Wire tables for the binary codec (request bytes written out by hand, byte by byte, from
//! the protocol's header layout), and properties: every frame round-trips, any bytes parse
//! without panicking, and a frame split anywhere parses the same once complete.

use super::*;
use crate::Limits;
use proptest::prelude::*;

fn limits() -> Limits {
    Limits::default()
}

/// A request header written out field by field.
fn header(opcode: u8, ext: u8, key: u16, body: u32, opaque: u32, cas: u64) -> Vec<u8> {
    let mut h = vec![0x80, opcode];
    h.extend_from_slice(&key.to_be_bytes());
    h.push(ext);
    h.push(0);
    h.extend_from_slice(&[0, 0]);
    h.extend_from_slice(&body.to_be_bytes());
    h.extend_from_slice(&opaque.to_be_bytes());
    h.extend_from_slice(&cas.to_be_bytes());
    h
}

fn complete(bytes: &[u8]) -> Frame<'_> {
    match parse_request(bytes, &limits()) {
        BinaryParsed::Complete { frame, consumed } => {
            assert_eq!(consumed, bytes.len());
            frame
        }
        other => panic!("{bytes:?} parsed to {other:?}"),
    }
}

fn error(bytes: &[u8]) -> BinaryError<'_> {
    match parse_request(bytes, &limits()) {
        BinaryParsed::Error(e) => e,
        other => panic!("{bytes:?} parsed to {other:?}"),
    }
}

#[test]
fn get_with_opaque_and_cas() {
    let mut b = header(0x00, 0, 3, 3, 0xdead_beef, 7);
    b.extend_from_slice(b"foo");
    let f = complete(&b);
    assert_eq!(f.opcode, Opcode::Get);
    assert_eq!(f.opaque, 0xdead_beef);
    assert_eq!(f.cas, 7);
    assert_eq!(f.command, Command::Get { key: b"foo" });
}

#[test]
fn set_reads_flags_exptime_and_value() {
    let mut b = header(0x11, 8, 1, 8 + 1 + 5, 1, 0);
    b.extend_from_slice(&0xcafe_u32.to_be_bytes());
    b.extend_from_slice(&300_u32.to_be_bytes());
    b.extend_from_slice(b"khello");
    let f = complete(&b);
    assert_eq!(f.opcode, Opcode::SetQ);
    assert!(f.opcode.is_quiet());
    assert_eq!(
        f.command,
        Command::Store {
            key: b"k",
            value: b"hello",
            flags: 0xcafe,
            exptime: 300
        }
    );
}

#[test]
fn incr_reads_delta_initial_expiration() {
    let mut b = header(0x05, 20, 1, 21, 0, 0);
    b.extend_from_slice(&5_u64.to_be_bytes());
    b.extend_from_slice(&10_u64.to_be_bytes());
    b.extend_from_slice(&NO_CREATE_EXPTIME.to_be_bytes());
    b.push(b'n');
    assert_eq!(
        complete(&b).command,
        Command::Arithmetic {
            key: b"n",
            delta: 5,
            initial: 10,
            exptime: NO_CREATE_EXPTIME
        }
    );
}

#[test]
fn flush_with_and_without_delay() {
    assert_eq!(
        complete(&header(0x08, 0, 0, 0, 0, 0)).command,
        Command::Flush { delay: None }
    );
    let mut b = header(0x18, 4, 0, 4, 0, 0);
    b.extend_from_slice(&9_u32.to_be_bytes());
    assert_eq!(complete(&b).command, Command::Flush { delay: Some(9) });
}

#[test]
fn stat_group_is_the_key() {
    let mut b = header(0x10, 0, 5, 5, 0, 0);
    b.extend_from_slice(b"slabs");
    assert_eq!(complete(&b).command, Command::Stat { group: b"slabs" });
    assert_eq!(
        complete(&header(0x10, 0, 0, 0, 0, 0)).command,
        Command::Stat { group: b"" }
    );
}

#[test]
fn partial_frames_are_incomplete() {
    let mut b = header(0x01, 8, 1, 8 + 1 + 3, 0, 0);
    b.extend_from_slice(&[0; 8]);
    b.extend_from_slice(b"kabc");
    for cut in 0..b.len() {
        assert_eq!(
            parse_request(&b[..cut], &limits()),
            BinaryParsed::Incomplete,
            "cut at {cut}"
        );
    }
    complete(&b);
}

#[test]
fn bad_magic_closes_without_reply() {
    let e = error(b"get foo\r\n");
    assert_eq!(e.kind, FrameError::BadMagic(b'g'));
    assert_eq!(e.status, None);
    assert!(e.close);
    let mut out = Vec::new();
    e.encode_reply(&mut out);
    assert!(out.is_empty());
}

#[test]
fn unknown_opcode_is_answered_and_its_body_skipped() {
    let mut b = header(0x42, 0, 0, 6, 77, 0);
    b.extend_from_slice(b"abcdef");
    let e = error(&b);
    assert_eq!(e.kind, FrameError::UnknownOpcode(0x42));
    assert_eq!(e.status, Some(Status::UnknownCommand));
    assert!(!e.close);
    assert_eq!((e.consumed, e.swallow), (24, 6));
    let mut out = Vec::new();
    e.encode_reply(&mut out);
    let mut expected = vec![0x81, 0x42, 0, 0, 0, 0, 0x00, 0x81, 0, 0, 0, 15, 0, 0, 0, 77];
    expected.extend_from_slice(&[0; 8]);
    expected.extend_from_slice(b"Unknown command");
    assert_eq!(out, expected);
}

#[test]
fn lengths_that_do_not_fit_the_opcode_close() {
    // get with extras
    let mut b = header(0x00, 4, 1, 5, 0, 0);
    b.extend_from_slice(&[0; 5]);
    let e = error(&b);
    assert_eq!(e.kind, FrameError::BadLengths(Opcode::Get));
    assert_eq!(e.status, Some(Status::InvalidArguments));
    assert!(e.close);
    // get without a key
    assert!(error(&header(0x00, 0, 0, 0, 0, 0)).close);
    // noop with a body
    assert!(error(&header(0x0a, 0, 0, 1, 0, 0)).close);
    // key + extras beyond the body
    let short = header(0x01, 8, 10, 4, 0, 0);
    let e = error(&short);
    assert_eq!(e.kind, FrameError::LengthsExceedBody);
    assert_eq!(e.status, Some(Status::UnknownCommand));
    assert!(e.close);
    // key over the limit
    let long = header(0x00, 0, 251, 251, 0, 0);
    let e = error(&long);
    assert_eq!(e.kind, FrameError::KeyTooLong(251));
    assert!(e.close);
}

#[test]
fn oversized_value_is_refused_once_the_key_arrived_and_swallowed() {
    let value_len = (1 << 20) + 1;
    let mut b = header(0x01, 8, 3, 8 + 3 + value_len, 5, 0);
    b.extend_from_slice(&[0; 8]);
    // Before the key: wait.
    assert_eq!(parse_request(&b, &limits()), BinaryParsed::Incomplete);
    b.extend_from_slice(b"big");
    let e = error(&b);
    assert_eq!(e.kind, FrameError::ValueTooLarge(value_len as usize));
    assert_eq!(e.status, Some(Status::ValueTooLarge));
    assert!(!e.close);
    assert_eq!((e.consumed, e.swallow), (b.len(), value_len as usize));
    assert_eq!(e.failed_set_key, Some(&b"big"[..]));
    // An append keeps the old value.
    let mut b = header(0x0e, 0, 3, 3 + value_len, 5, 0);
    b.extend_from_slice(b"big");
    assert_eq!(error(&b).failed_set_key, None);
}

#[test]
fn largest_frame_fits_the_connection_input_bound() {
    let l = limits();
    assert!(frame_bytes_max(&l) <= l.frame_bytes_max());
    let small = Limits {
        key_bytes_max: 1,
        line_bytes_max: 129,
        item_size_max: 0,
        cas_enabled: true,
        keys_per_get_max: 1,
    };
    assert_eq!(small.validate(), Ok(()));
    assert!(frame_bytes_max(&small) <= small.frame_bytes_max());
}

#[test]
fn responses_round_trip() {
    let r = BinaryResponse {
        opcode: 0x0c,
        status: 0,
        opaque: 9,
        cas: 12,
        extras: &[0, 0, 0, 1],
        key: b"key",
        value: b"value",
    };
    let mut out = Vec::new();
    r.encode(&mut out);
    assert_eq!(out.len(), 24 + 4 + 3 + 5);
    assert_eq!(out[0], MAGIC_RESPONSE);
    assert_eq!(
        parse_response(&out, 1 << 20),
        ParsedResponse::Complete {
            response: r,
            consumed: out.len()
        }
    );
    assert_eq!(
        parse_response(&out[..30], 1 << 20),
        ParsedResponse::Incomplete
    );
    assert_eq!(
        parse_response(&out, 4),
        ParsedResponse::Error(ResponseError::TooLarge(12))
    );
}

#[test]
fn opcode_and_status_tables_are_consistent() {
    for &op in Opcode::ALL {
        assert_eq!(Opcode::from_code(op.code()), Some(op));
    }
    for &s in Status::ALL {
        assert_eq!(Status::from_code(s.code()), Some(s));
        let silent = matches!(s, Status::NoError | Status::AuthContinue);
        assert_eq!(s.message().is_empty(), silent, "{s:?}");
    }
    assert_eq!(Opcode::from_code(0x20), Some(Opcode::SaslListMechs));
    assert_eq!(Opcode::from_code(0x25), None);
}

/// SASL frames as memcached's `proto_bin.c` takes them: list mechs has no body; auth and
/// step carry the mechanism as the key and the client's response as the value.
#[test]
fn sasl_frames() {
    let list = header(0x20, 0, 0, 0, 9, 0);
    let f = complete(&list);
    assert_eq!(
        (f.opcode, f.opaque, f.command),
        (Opcode::SaslListMechs, 9, Command::SaslListMechs)
    );
    let mut b = header(0x21, 0, 5, 5 + 13, 10, 0);
    b.extend_from_slice(b"PLAIN\0alice\0secret");
    let f = complete(&b);
    assert_eq!(
        (f.opcode, f.command),
        (
            Opcode::SaslAuth,
            Command::Sasl {
                mechanism: b"PLAIN",
                data: b"\0alice\0secret"
            }
        )
    );
    assert_eq!(f.key(), None, "a SASL frame addresses no key");
    let mut b = header(0x22, 0, 5, 5, 11, 0);
    b.extend_from_slice(b"PLAIN");
    assert_eq!(complete(&b).opcode, Opcode::SaslStep);
    // Lengths memcached rejects as a protocol error (0x04, then close): list mechs with a
    // body, auth without a mechanism, auth with extras.
    let mut b = header(0x20, 0, 1, 1, 0, 0);
    b.push(b'k');
    let e = error(&b);
    assert_eq!((e.status, e.close), (Some(Status::InvalidArguments), true));
    for bad in [header(0x21, 0, 0, 3, 0, 0), header(0x21, 4, 5, 9, 0, 0)] {
        let e = error(&bad);
        assert_eq!((e.status, e.close), (Some(Status::InvalidArguments), true));
    }
}

/// A mechanism over 32 bytes is "invalid arguments" (memcached's MAX_SASL_MECH_LEN) and
/// data over cellcache's bound an auth error; both swallow the data and keep the connection.
#[test]
fn sasl_bounds_swallow_the_data() {
    let mut b = header(0x21, 0, 40, 40 + 7, 3, 0);
    b.extend_from_slice(&[b'X'; 40]);
    // Incomplete until the mechanism is here.
    assert_eq!(parse_request(&b[..30], &limits()), BinaryParsed::Incomplete);
    let e = error(&b);
    assert_eq!(e.kind, FrameError::MechanismTooLong(40));
    assert_eq!(
        (e.status, e.consumed, e.swallow, e.close),
        (Some(Status::InvalidArguments), 24 + 40, 7, false)
    );
    let data = SASL_DATA_BYTES_MAX + 1;
    let mut b = header(0x21, 0, 5, (5 + data) as u32, 3, 0);
    b.extend_from_slice(b"PLAIN");
    let e = error(&b);
    assert_eq!(e.kind, FrameError::SaslDataTooLong(data));
    assert_eq!(
        (e.status, e.consumed, e.swallow, e.close),
        (Some(Status::AuthError), 24 + 5, data, false)
    );
    // At the bound, the frame is served.
    let mut b = header(0x21, 0, 5, (5 + SASL_DATA_BYTES_MAX) as u32, 3, 0);
    b.extend_from_slice(b"PLAIN");
    b.resize(b.len() + SASL_DATA_BYTES_MAX, b'p');
    assert!(matches!(
        complete(&b).command,
        Command::Sasl { data, .. } if data.len() == SASL_DATA_BYTES_MAX
    ));
}

fn frame_strategy()
-> impl Strategy<Value = (Opcode, Vec<u8>, Vec<u8>, u32, u32, u64, u64, u32, u64)> {
    (
        proptest::sample::select(Opcode::ALL.to_vec()),
        proptest::collection::vec(any::<u8>(), 1..=250),
        proptest::collection::vec(any::<u8>(), 0..300),
        any::<u32>(),
        any::<u32>(),
        any::<u64>(),
        any::<u64>(),
        any::<u32>(),
        any::<u64>(),
    )
}

/// A valid frame for `opcode` built from the generated fields.
fn build<'a>(
    opcode: Opcode,
    key: &'a [u8],
    value: &'a [u8],
    a: u32,
    b: u32,
    c: u64,
    d: u64,
) -> Command<'a> {
    use Opcode as O;
    match opcode {
        O::Get | O::GetQ | O::GetK | O::GetKQ => Command::Get { key },
        O::Gat | O::GatQ | O::GatK | O::GatKQ => Command::GetAndTouch { key, exptime: a },
        O::Touch => Command::Touch { key, exptime: a },
        O::Set | O::SetQ | O::Add | O::AddQ | O::Replace | O::ReplaceQ => Command::Store {
            key,
            value,
            flags: a,
            exptime: b,
        },
        O::Append | O::AppendQ | O::Prepend | O::PrependQ => Command::Concat { key, value },
        O::Delete | O::DeleteQ => Command::Delete { key },
        O::Increment | O::IncrementQ | O::Decrement | O::DecrementQ => Command::Arithmetic {
            key,
            delta: c,
            initial: d,
            exptime: b,
        },
        O::Flush | O::FlushQ => Command::Flush {
            delay: (a % 2 == 0).then_some(b),
        },
        O::Stat => Command::Stat {
            group: &key[..key.len() / 2],
        },
        O::Verbosity => Command::Verbosity { level: a },
        O::Noop => Command::Noop,
        O::Version => Command::Version,
        O::Quit | O::QuitQ => Command::Quit,
        O::SaslListMechs => Command::SaslListMechs,
        O::SaslAuth | O::SaslStep => Command::Sasl {
            mechanism: &key[..key.len().min(SASL_MECHANISM_BYTES_MAX)],
            data: value,
        },
    }
}

proptest! {
    #[test]
    fn every_frame_round_trips((opcode, key, value, a, b, cas, c, opaque, d) in frame_strategy()) {
        let frame = Frame { opcode, opaque, cas, command: build(opcode, &key, &value, a, b, c, d) };
        let mut bytes = Vec::new();
        frame.encode(&mut bytes);
        match parse_request(&bytes, &limits()) {
            BinaryParsed::Complete { frame: again, consumed } => {
                prop_assert_eq!(again, frame);
                prop_assert_eq!(consumed, bytes.len());
            }
            other => prop_assert!(false, "{:?} parsed to {:?}", frame, other),
        }
        // Every strict prefix is incomplete, never an error.
        for cut in [0, 1, 23, 24, bytes.len() - 1] {
            if cut < bytes.len() {
                prop_assert_eq!(parse_request(&bytes[..cut], &limits()), BinaryParsed::Incomplete);
            }
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(mut bytes in proptest::collection::vec(any::<u8>(), 0..512), magic in any::<bool>()) {
        if magic && !bytes.is_empty() {
            bytes[0] = MAGIC_REQUEST;
        }
        let small = Limits { key_bytes_max: 16, line_bytes_max: 144, item_size_max: 64 + 60, cas_enabled: true, keys_per_get_max: 2 };
        for l in [limits(), small] {
            let mut rest = &bytes[..];
            for _ in 0..=bytes.len() {
                match parse_request(rest, &l) {
                    BinaryParsed::Complete { consumed, .. } => {
                        prop_assert!(consumed >= HEADER_BYTES && consumed <= rest.len());
                        rest = &rest[consumed..];
                    }
                    BinaryParsed::Incomplete => break,
                    BinaryParsed::Error(e) => {
                        prop_assert!(e.consumed > 0 && e.consumed <= rest.len());
                        let mut out = Vec::new();
                        e.encode_reply(&mut out);
                        prop_assert_eq!(out.is_empty(), e.status.is_none());
                        if e.close { break; }
                        rest = &rest[e.consumed..];
                        let mut d = e.discard();
                        rest = &rest[d.take(rest.len())..];
                    }
                }
            }
            let _ = parse_response(&bytes, 1 << 16);
        }
    }
}
