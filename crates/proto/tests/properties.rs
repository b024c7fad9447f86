//! Property tests for both directions:
//! - every request encodes to bytes that parse back to the same request;
//! - every reply encodes to bytes that parse back to the same reply;
//! - a byte stream split at arbitrary points parses to the same outcomes as
//!   the whole stream (the connection-side contract of `Incomplete` and
//!   `Discard`);
//! - the parsers never panic on arbitrary bytes and never report more
//!   consumed bytes than they were given (a bounded in-`cargo test` fuzz;
//!   the libFuzzer targets in `fuzz/` run the same checks unbounded).
//!
//! Strategies build `'static` requests from leaked buffers: tests only, and
//! bounded by the case count.

use cellcache_proto::token::base64_encode;
use cellcache_proto::*;
use proptest::prelude::*;
use proptest::sample::subsequence;

/// Small limits so that limit edges are hit often.
fn limits() -> Limits {
    let limits = Limits {
        key_bytes_max: 24,
        line_bytes_max: 200,
        // Values up to 64 bytes fit with any key: memcached's accounting adds key, 59 and
        // 4 for flags.
        item_size_max: 64 + 24 + limits::ITEM_OVERHEAD_BYTES + limits::ITEM_FLAGS_BYTES,
        keys_per_get_max: 4,
        cas_enabled: true,
    };
    limits.validate().expect("test limits are valid");
    limits
}

fn leak(bytes: Vec<u8>) -> &'static [u8] {
    Box::leak(bytes.into_boxed_slice())
}

fn key_byte() -> impl Strategy<Value = u8> {
    prop_oneof![4 => 33u8..127, 1 => 128u8..=255]
}

fn key() -> impl Strategy<Value = &'static [u8]> {
    proptest::collection::vec(key_byte(), 1..=24).prop_map(leak)
}

fn value() -> impl Strategy<Value = &'static [u8]> {
    proptest::collection::vec(any::<u8>(), 0..=64).prop_map(leak)
}

fn meta_key() -> impl Strategy<Value = MetaKey<'static>> {
    prop_oneof![
        key().prop_map(|wire| MetaKey {
            wire,
            base64: false
        }),
        proptest::collection::vec(any::<u8>(), 1..=15).prop_map(|binary| {
            let mut wire = Vec::new();
            base64_encode(&binary, &mut wire);
            MetaKey {
                wire: leak(wire),
                base64: true,
            }
        }),
    ]
}

fn returns(allowed: &'static [ReturnFlag]) -> impl Strategy<Value = ReturnFlags<'static>> {
    let opaque = proptest::collection::vec(33u8..127, 0..=32).prop_map(leak);
    (
        subsequence(allowed, 0..=allowed.len()).prop_shuffle(),
        opaque,
    )
        .prop_map(|(flags, opaque)| {
            let mut r = ReturnFlags::new();
            for flag in flags {
                if flag == ReturnFlag::Opaque {
                    r.push_opaque(opaque);
                } else {
                    r.push(flag);
                }
            }
            r
        })
}

use ReturnFlag as R;
const GET_RETURNS: &[ReturnFlag] = &[
    R::Cas,
    R::ClientFlags,
    R::HitBefore,
    R::Key,
    R::LastAccess,
    R::Opaque,
    R::Size,
    R::Ttl,
];
const SET_RETURNS: &[ReturnFlag] = &[R::Cas, R::Key, R::Opaque, R::Size];
const DELETE_RETURNS: &[ReturnFlag] = &[R::Key, R::Opaque];
const ARITHMETIC_RETURNS: &[ReturnFlag] = &[R::Cas, R::Ttl, R::Key, R::Opaque];

fn meta_get() -> impl Strategy<Value = Request<'static>> {
    (
        meta_key(),
        returns(GET_RETURNS),
        any::<[bool; 4]>(),
        any::<Option<u64>>(),
        any::<[Option<i64>; 3]>(),
    )
        .prop_map(
            |(key, returns, [value, quiet, no_lru_bump, eventual], new_cas, ttls)| {
                Request::MetaGet {
                    key,
                    flags: MetaGetFlags {
                        returns,
                        value,
                        quiet,
                        no_lru_bump,
                        new_cas,
                        vivify_ttl: ttls[0],
                        recache_ttl: ttls[1],
                        new_ttl: ttls[2],
                        eventual,
                    },
                }
            },
        )
}

fn meta_set() -> impl Strategy<Value = Request<'static>> {
    let mode = prop_oneof![
        Just(SetMode::Set),
        Just(SetMode::Add),
        Just(SetMode::Append),
        Just(SetMode::Prepend),
        Just(SetMode::Replace),
    ];
    (
        meta_key(),
        value(),
        returns(SET_RETURNS),
        any::<[bool; 2]>(),
        any::<[Option<u64>; 2]>(),
        any::<Option<u32>>(),
        any::<[Option<i64>; 2]>(),
        mode,
    )
        .prop_map(
            |(key, value, returns, [quiet, invalidate], cas, client_flags, ttls, mode)| {
                Request::MetaSet {
                    key,
                    value,
                    flags: MetaSetFlags {
                        returns,
                        quiet,
                        compare_cas: cas[0],
                        new_cas: cas[1],
                        client_flags,
                        invalidate,
                        ttl: ttls[0],
                        mode,
                        vivify_ttl: ttls[1],
                    },
                }
            },
        )
}

fn meta_delete() -> impl Strategy<Value = Request<'static>> {
    (
        meta_key(),
        returns(DELETE_RETURNS),
        any::<[bool; 3]>(),
        any::<[Option<u64>; 2]>(),
        any::<Option<i64>>(),
    )
        .prop_map(
            |(key, returns, [quiet, invalidate, remove_value], cas, new_ttl)| Request::MetaDelete {
                key,
                flags: MetaDeleteFlags {
                    returns,
                    quiet,
                    compare_cas: cas[0],
                    new_cas: cas[1],
                    invalidate,
                    new_ttl,
                    remove_value,
                },
            },
        )
}

fn meta_arithmetic() -> impl Strategy<Value = Request<'static>> {
    let mode = prop_oneof![
        Just(ArithmeticMode::Increment),
        Just(ArithmeticMode::Decrement)
    ];
    (
        meta_key(),
        returns(ARITHMETIC_RETURNS),
        any::<[bool; 2]>(),
        any::<[Option<u64>; 4]>(),
        any::<[Option<i64>; 2]>(),
        mode,
    )
        .prop_map(|(key, returns, [value, quiet], numbers, ttls, mode)| {
            Request::MetaArithmetic {
                key,
                flags: MetaArithmeticFlags {
                    returns,
                    value,
                    quiet,
                    compare_cas: numbers[0],
                    new_cas: numbers[1],
                    vivify_ttl: ttls[0],
                    initial: numbers[2],
                    delta: numbers[3],
                    new_ttl: ttls[1],
                    mode,
                },
            }
        })
}

fn retrieve() -> impl Strategy<Value = Request<'static>> {
    (
        proptest::collection::vec(key(), 1..=4),
        any::<bool>(),
        any::<Option<i64>>(),
    )
        .prop_map(|(keys, return_cas, touch_exptime)| {
            let text = leak(keys.join(&b' '));
            let keys = Keys::new(text, 24, 4).expect("generated keys are valid");
            Request::Retrieve(Retrieve {
                return_cas,
                touch_exptime,
                keys,
            })
        })
}

fn store() -> impl Strategy<Value = Request<'static>> {
    let mode = prop_oneof![
        Just(StoreMode::Set),
        Just(StoreMode::Add),
        Just(StoreMode::Replace),
        Just(StoreMode::Append),
        Just(StoreMode::Prepend),
        any::<u64>().prop_map(|unique| StoreMode::Cas { unique }),
    ];
    (
        mode,
        key(),
        any::<u32>(),
        any::<i64>(),
        value(),
        any::<bool>(),
    )
        .prop_map(|(mode, key, flags, exptime, value, noreply)| {
            Request::Store(Store {
                mode,
                key,
                flags,
                exptime,
                value,
                noreply,
            })
        })
}

fn stats() -> impl Strategy<Value = StatsGroup<'static>> {
    prop_oneof![
        Just(StatsGroup::General),
        Just(StatsGroup::Settings),
        Just(StatsGroup::Items),
        Just(StatsGroup::Slabs),
        Just(StatsGroup::Sizes),
        Just(StatsGroup::Conns),
        Just(StatsGroup::Reset),
        proptest::collection::vec(proptest::collection::vec(33u8..127, 1..8), 1..3).prop_map(
            |words| {
                let mut args = b"x".to_vec();
                args.extend_from_slice(&words.join(&b' '));
                StatsGroup::Other(leak(args))
            }
        ),
    ]
}

fn request() -> impl Strategy<Value = Request<'static>> {
    let op = prop_oneof![Just(ArithmeticOp::Incr), Just(ArithmeticOp::Decr)];
    prop_oneof![
        retrieve(),
        store(),
        (key(), any::<bool>()).prop_map(|(key, noreply)| Request::Delete { key, noreply }),
        (op, key(), any::<u64>(), any::<bool>()).prop_map(|(op, key, delta, noreply)| {
            Request::Arithmetic {
                op,
                key,
                delta,
                noreply,
            }
        }),
        (key(), any::<i64>(), any::<bool>()).prop_map(|(key, exptime, noreply)| {
            Request::Touch {
                key,
                exptime,
                noreply,
            }
        }),
        (any::<Option<i64>>(), any::<bool>())
            .prop_map(|(delay, noreply)| Request::FlushAll { delay, noreply }),
        Just(Request::Version),
        (any::<u32>(), any::<bool>())
            .prop_map(|(level, noreply)| Request::Verbosity { level, noreply }),
        stats().prop_map(Request::Stats),
        Just(Request::Quit),
        any::<bool>().prop_map(|graceful| Request::Shutdown { graceful }),
        meta_get(),
        meta_set(),
        meta_delete(),
        meta_arithmetic(),
        Just(Request::MetaNoop),
        meta_key().prop_map(|key| Request::MetaDebug { key }),
    ]
}

fn meta_reply_flags() -> impl Strategy<Value = MetaReplyFlags<'static>> {
    let token = proptest::collection::vec(33u8..127, 0..=24).prop_map(leak);
    (
        any::<(Option<u64>, Option<u32>, Option<bool>, Option<u64>)>(),
        proptest::option::of(key()),
        proptest::option::of(token),
        any::<(Option<u64>, Option<i64>)>(),
        any::<[bool; 4]>(),
    )
        .prop_map(
            |(
                (cas, client_flags, hit_before, last_access_secs),
                key,
                opaque,
                (size, ttl_secs),
                [base64, won, stale, win_sent],
            )| MetaReplyFlags {
                cas,
                client_flags,
                hit_before,
                key,
                last_access_secs,
                opaque,
                size,
                ttl_secs,
                base64_key: base64,
                won,
                stale,
                win_sent,
            },
        )
}

fn response() -> impl Strategy<Value = Response<'static>> {
    let text = proptest::collection::vec(32u8..127, 0..40).prop_map(leak);
    let status = prop_oneof![
        Just(MetaStatus::Hd),
        Just(MetaStatus::Va),
        Just(MetaStatus::En),
        Just(MetaStatus::Nf),
        Just(MetaStatus::Ns),
        Just(MetaStatus::Ex),
    ];
    prop_oneof![
        (key(), any::<u32>(), any::<Option<u64>>(), value()).prop_map(|(key, flags, cas, data)| {
            Response::Value {
                key,
                flags,
                cas,
                data,
            }
        }),
        Just(Response::End),
        Just(Response::Stored),
        Just(Response::NotStored),
        Just(Response::Exists),
        Just(Response::NotFound),
        Just(Response::Deleted),
        Just(Response::Touched),
        Just(Response::Ok),
        Just(Response::Reset),
        Just(Response::Error),
        Just(Response::MetaNoop),
        any::<u64>().prop_map(Response::Number),
        text.clone().prop_map(Response::Version),
        (key(), text.clone()).prop_map(|(name, value)| Response::Stat { name, value }),
        text.clone().prop_map(Response::ClientError),
        text.clone().prop_map(Response::ServerError),
        (key(), text).prop_map(|(key, info)| {
            let info = if info.first() == Some(&b' ') {
                &info[1..]
            } else {
                info
            };
            Response::MetaDebug { key, info }
        }),
        (status, meta_reply_flags(), value()).prop_map(|(status, flags, data)| {
            Response::Meta(MetaReply {
                status,
                flags,
                value: (status == MetaStatus::Va).then_some(data),
            })
        }),
    ]
}

/// What a connection would do with a stream delivered in `chunks`: parse,
/// drop consumed bytes, honour swallows across reads, stop on close.
fn drive(chunks: &[&[u8]], limits: &Limits) -> Vec<String> {
    let mut buf: Vec<u8> = Vec::new();
    let mut discard = Discard::default();
    let mut outcomes = Vec::new();
    let mut batch = None;
    let mut skip_line = false;
    for chunk in chunks {
        buf.extend_from_slice(chunk);
        // Each iteration consumes at least one byte or breaks.
        for _ in 0..=buf.len() {
            let now = discard.take(buf.len());
            buf.drain(..now);
            if !discard.is_done() {
                break;
            }
            if skip_line {
                match buf.iter().position(|&b| b == b'\n') {
                    Some(eol) => {
                        buf.drain(..=eol);
                        skip_line = false;
                    }
                    None => {
                        buf.clear();
                        break;
                    }
                }
            }
            let parsed = match batch {
                Some(rest) => parse_retrieve_rest(&buf, &rest, limits),
                None => parse(&buf, limits),
            };
            match parsed {
                Parsed::Complete { request, consumed } => {
                    assert!(consumed > 0 && consumed <= buf.len());
                    push_request(&mut outcomes, &request, true);
                    batch = None;
                    buf.drain(..consumed);
                }
                Parsed::Partial {
                    request,
                    consumed,
                    rest,
                } => {
                    assert!(consumed > 0 && consumed <= buf.len());
                    push_request(&mut outcomes, &request, false);
                    batch = Some(rest);
                    buf.drain(..consumed);
                }
                Parsed::Incomplete => break,
                Parsed::Error(e) => {
                    assert!(e.consumed > 0 && e.consumed <= buf.len());
                    batch = None;
                    if e.close {
                        // Where the parser gave up depends on the chunking;
                        // what it said does not.
                        outcomes.push(format!("close {:?}", e.reply));
                        return outcomes;
                    }
                    outcomes.push(format!("{:?}", e.reply));
                    skip_line = e.skip_line;
                    discard = e.discard();
                    buf.drain(..e.consumed);
                }
            }
        }
    }
    outcomes
}

/// Records a request as an outcome; a retrieval key by key, so that a line answered in
/// batches (their size depends on the chunking) reads the same as one taken whole.
fn push_request(outcomes: &mut Vec<String>, request: &Request<'_>, end: bool) {
    match request {
        Request::Retrieve(r) => {
            for key in r.keys.iter() {
                outcomes.push(format!(
                    "{} {:?} {:?}",
                    r.command(),
                    r.touch_exptime,
                    String::from_utf8_lossy(key)
                ));
            }
            if end {
                outcomes.push("END".into());
            }
        }
        other => outcomes.push(format!("{other:?}")),
    }
}

fn reply_drive(chunks: &[&[u8]], limits: &Limits) -> Vec<String> {
    let mut buf: Vec<u8> = Vec::new();
    let mut outcomes = Vec::new();
    for chunk in chunks {
        buf.extend_from_slice(chunk);
        for _ in 0..=buf.len() {
            match parse_reply(&buf, limits) {
                ParsedReply::Complete { reply, consumed } => {
                    assert!(consumed > 0 && consumed <= buf.len());
                    outcomes.push(format!("{reply:?}"));
                    buf.drain(..consumed);
                }
                ParsedReply::Incomplete => break,
                ParsedReply::Error(e) => {
                    outcomes.push(format!("{e:?}"));
                    return outcomes;
                }
            }
        }
    }
    outcomes
}

fn split_at_points<'a>(bytes: &'a [u8], points: &[usize]) -> Vec<&'a [u8]> {
    let mut cuts: Vec<usize> = points.iter().map(|p| p % (bytes.len() + 1)).collect();
    cuts.sort_unstable();
    let mut chunks = Vec::new();
    let mut at = 0;
    for cut in cuts {
        chunks.push(&bytes[at..cut]);
        at = cut;
    }
    chunks.push(&bytes[at..]);
    chunks
}

/// Bytes that look like protocol traffic: valid requests, fragments of
/// them, command words, numbers, line ends and noise.
fn protocol_like() -> impl Strategy<Value = Vec<u8>> {
    let piece = prop_oneof![
        4 => request().prop_map(|r| {
            let mut out = Vec::new();
            r.encode(&mut out);
            out
        }),
        2 => prop::sample::select(vec![
            &b"get "[..], b"set ", b"cas ", b"ms ", b"mg ", b"md ", b"ma ", b"mn", b"me ",
            b"delete ", b"incr ", b"touch ", b"gat ", b"flush_all", b"noreply", b" ", b"\r\n",
            b"\n", b"\r", b"0", b"1", b"-1", b"99", b"18446744073709551616", b"k", b" b", b" v",
            b" q", b" O", b" T", b" M", b" N5", b"=", b"set k 0 0 70\r\n", b"ms k 3 Z\r\n",
            b"ms k 99 T1\r\n", b"add k 0 0 3 noreply\r\n", b"abcdefghijklmnopqrstuvwxyz",
        ])
        .prop_map(<[u8]>::to_vec),
        1 => proptest::collection::vec(any::<u8>(), 0..16),
    ];
    proptest::collection::vec(piece, 0..12).prop_map(|pieces| pieces.concat())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn request_encode_then_parse_is_identity(request in request()) {
        let mut bytes = Vec::new();
        request.encode(&mut bytes);
        let generous = Limits { item_size_max: 1024 + 24 + limits::ITEM_OVERHEAD_BYTES + limits::ITEM_FLAGS_BYTES, line_bytes_max: 4096, ..limits() };
        match parse(&bytes, &generous) {
            Parsed::Complete { request: parsed, consumed } => {
                prop_assert_eq!(parsed, request);
                prop_assert_eq!(consumed, bytes.len());
            }
            other => prop_assert!(false, "{:?} -> {:?}", String::from_utf8_lossy(&bytes), other),
        }
    }

    #[test]
    fn response_encode_then_parse_reply_is_identity(response in response()) {
        let mut bytes = Vec::new();
        response.encode(&mut bytes);
        match parse_reply(&bytes, &Limits { line_bytes_max: 4096, ..limits() }) {
            ParsedReply::Complete { reply, consumed } => {
                prop_assert_eq!(reply, response);
                prop_assert_eq!(consumed, bytes.len());
            }
            other => prop_assert!(false, "{:?} -> {:?}", String::from_utf8_lossy(&bytes), other),
        }
    }

    #[test]
    fn meta_header_in_request_order_parses_back(
        request in prop_oneof![meta_get(), meta_set(), meta_delete(), meta_arithmetic()],
        item in meta_reply_flags(),
        data in value(),
    ) {
        let (requested, base64) = match request {
            Request::MetaGet { key, flags } => (flags.returns, key.base64),
            Request::MetaSet { key, flags, .. } => (flags.returns, key.base64),
            Request::MetaDelete { key, flags } => (flags.returns, key.base64),
            Request::MetaArithmetic { key, flags } => (flags.returns, key.base64),
            _ => unreachable!("strategy yields meta requests"),
        };
        let item = MetaReplyFlags { base64_key: base64, opaque: None, ..item };
        let mut out = Vec::new();
        write_meta_header(&mut out, MetaStatus::Va, data.len(), &requested, &item);
        out.extend_from_slice(data);
        write_value_end(&mut out);
        let ParsedReply::Complete { reply: Response::Meta(reply), consumed } =
            parse_reply(&out, &Limits { line_bytes_max: 4096, ..limits() })
        else {
            return Err(TestCaseError::fail(format!("{:?}", String::from_utf8_lossy(&out))));
        };
        prop_assert_eq!(consumed, out.len());
        prop_assert_eq!(reply.value, Some(data));
        let asked = |flag| requested.contains(flag);
        prop_assert_eq!(reply.flags.cas, item.cas.filter(|_| asked(R::Cas)));
        prop_assert_eq!(reply.flags.client_flags, item.client_flags.filter(|_| asked(R::ClientFlags)));
        prop_assert_eq!(reply.flags.hit_before, item.hit_before.filter(|_| asked(R::HitBefore)));
        prop_assert_eq!(reply.flags.key, item.key.filter(|_| asked(R::Key)));
        prop_assert_eq!(reply.flags.last_access_secs, item.last_access_secs.filter(|_| asked(R::LastAccess)));
        prop_assert_eq!(reply.flags.size, item.size.filter(|_| asked(R::Size)));
        prop_assert_eq!(reply.flags.ttl_secs, item.ttl_secs.filter(|_| asked(R::Ttl)));
        prop_assert_eq!(reply.flags.opaque, requested.opaque());
        prop_assert_eq!(reply.flags.base64_key, base64 && reply.flags.key.is_some());
        prop_assert_eq!((reply.flags.won, reply.flags.stale, reply.flags.win_sent), (item.won, item.stale, item.win_sent));
    }

    #[test]
    fn split_stream_parses_like_whole_stream(
        stream in protocol_like(),
        points in proptest::collection::vec(any::<usize>(), 0..6),
    ) {
        let limits = limits();
        let whole = drive(&[&stream], &limits);
        let split = drive(&split_at_points(&stream, &points), &limits);
        prop_assert_eq!(whole, split);
    }

    #[test]
    fn split_reply_stream_parses_like_whole_stream(
        responses in proptest::collection::vec(response(), 0..8),
        noise in proptest::collection::vec(any::<u8>(), 0..8),
        points in proptest::collection::vec(any::<usize>(), 0..6),
    ) {
        let limits = Limits { line_bytes_max: 4096, ..limits() };
        let mut stream = Vec::new();
        for response in &responses {
            response.encode(&mut stream);
        }
        stream.extend_from_slice(&noise);
        let whole = reply_drive(&[&stream], &limits);
        let split = reply_drive(&split_at_points(&stream, &points), &limits);
        prop_assert_eq!(&whole, &split);
        prop_assert!(whole.len() >= responses.len());
    }

    #[test]
    fn parsers_never_panic_and_stay_in_bounds(
        bytes in prop_oneof![protocol_like(), proptest::collection::vec(any::<u8>(), 0..256)],
    ) {
        let limits = limits();
        match parse(&bytes, &limits) {
            Parsed::Complete { consumed, .. } => prop_assert!(consumed > 0 && consumed <= bytes.len()),
            Parsed::Error(e) => prop_assert!(e.consumed > 0 && e.consumed <= bytes.len()),
            Parsed::Incomplete => prop_assert!(bytes.len() < limits.frame_bytes_max()),
            Parsed::Partial { consumed, .. } => prop_assert!(consumed > 0 && consumed <= bytes.len()),
        }
        match parse_reply(&bytes, &limits) {
            ParsedReply::Complete { consumed, .. } => prop_assert!(consumed > 0 && consumed <= bytes.len()),
            ParsedReply::Incomplete | ParsedReply::Error(_) => {}
        }
    }
}
