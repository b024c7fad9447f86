//! Responses to reply bytes and back: classic and meta replies, quiet mode, the client
//! side.

use super::*;

#[test]
fn responses_encode_to_memcached_bytes() {
    let table: Vec<(Response<'static>, &[u8])> = vec![
        (
            Response::Value {
                key: b"a",
                flags: 5,
                cas: None,
                data: b"x",
            },
            b"VALUE a 5 1\r\nx\r\n",
        ),
        (
            Response::Value {
                key: b"a",
                flags: 0,
                cas: Some(12),
                data: b"",
            },
            b"VALUE a 0 0 12\r\n\r\n",
        ),
        (Response::End, b"END\r\n"),
        (Response::Stored, b"STORED\r\n"),
        (Response::NotStored, b"NOT_STORED\r\n"),
        (Response::Exists, b"EXISTS\r\n"),
        (Response::NotFound, b"NOT_FOUND\r\n"),
        (Response::Deleted, b"DELETED\r\n"),
        (Response::Touched, b"TOUCHED\r\n"),
        (Response::Ok, b"OK\r\n"),
        (Response::Reset, b"RESET\r\n"),
        (
            Response::Number(18446744073709551615),
            b"18446744073709551615\r\n",
        ),
        (Response::Version(b"1.6.18"), b"VERSION 1.6.18\r\n"),
        (
            Response::Stat {
                name: b"pid",
                value: b"42",
            },
            b"STAT pid 42\r\n",
        ),
        (Response::Error, b"ERROR\r\n"),
        (
            Response::ClientError(b"bad data chunk"),
            b"CLIENT_ERROR bad data chunk\r\n",
        ),
        (
            Response::ServerError(b"out of memory storing object"),
            b"SERVER_ERROR out of memory storing object\r\n",
        ),
        (Response::MetaNoop, b"MN\r\n"),
        (
            Response::MetaDebug {
                key: b"k",
                info: b"exp=-1 la=1 cas=7 fetch=no cls=1 size=68",
            },
            b"ME k exp=-1 la=1 cas=7 fetch=no cls=1 size=68\r\n",
        ),
        (
            Response::Meta(MetaReply {
                status: MetaStatus::Hd,
                flags: MetaReplyFlags::default(),
                value: None,
            }),
            b"HD\r\n",
        ),
        (
            Response::Meta(MetaReply {
                status: MetaStatus::Va,
                flags: MetaReplyFlags {
                    cas: Some(1),
                    client_flags: Some(5),
                    ttl_secs: Some(-1),
                    ..MetaReplyFlags::default()
                },
                value: Some(b"x"),
            }),
            b"VA 1 c1 f5 t-1\r\nx\r\n",
        ),
    ];
    for (response, bytes) in table {
        let mut out = Vec::new();
        response.encode(&mut out);
        assert_eq!(
            String::from_utf8_lossy(&out),
            String::from_utf8_lossy(bytes)
        );
        // And the client parses it back to the same value.
        assert_eq!(
            parse_reply(&out, &limits()),
            ParsedReply::Complete {
                reply: response,
                consumed: out.len()
            }
        );
    }
}

/// Builds the reply a server sends for `request_line` (an `mg`/`ms`/`md`/
/// `ma`) with `item` describing the item.
fn meta_reply(
    request_line: &[u8],
    status: MetaStatus,
    item: MetaReplyFlags<'_>,
    value: Option<&[u8]>,
) -> Vec<u8> {
    let request = parse_ok(request_line);
    let (requested, base64) = match request {
        Request::MetaGet { key, flags } => (flags.returns, key.base64),
        Request::MetaSet { key, flags, .. } => (flags.returns, key.base64),
        Request::MetaDelete { key, flags } => (flags.returns, key.base64),
        Request::MetaArithmetic { key, flags } => (flags.returns, key.base64),
        other => panic!("not a meta request: {other:?}"),
    };
    let item = MetaReplyFlags {
        base64_key: base64,
        ..item
    };
    let mut out = Vec::new();
    write_meta_header(
        &mut out,
        status,
        value.map_or(0, <[u8]>::len),
        &requested,
        &item,
    );
    if let Some(value) = value {
        out.extend_from_slice(value);
        write_value_end(&mut out);
    }
    out
}

#[test]
fn meta_replies_follow_request_order_like_memcached() {
    let item = MetaReplyFlags {
        cas: Some(1),
        client_flags: Some(5),
        ttl_secs: Some(-1),
        key: Some(b"a"),
        size: Some(1),
        ..MetaReplyFlags::default()
    };
    // memcached 1.6.18, both orders:
    assert_eq!(
        meta_reply(b"mg a v t f c k s\r\n", MetaStatus::Va, item, Some(b"x")),
        b"VA 1 t-1 f5 c1 ka s1\r\nx\r\n"
    );
    assert_eq!(
        meta_reply(
            b"mg a c f t v s k O123 q\r\n",
            MetaStatus::Va,
            item,
            Some(b"x")
        ),
        b"VA 1 c1 f5 t-1 s1 ka O123\r\nx\r\n"
    );
    // memcached 1.6.18: `mg a h l` -> `HD h1 l0`.
    let seen = MetaReplyFlags {
        hit_before: Some(true),
        last_access_secs: Some(0),
        ..MetaReplyFlags::default()
    };
    assert_eq!(
        meta_reply(b"mg a h l\r\n", MetaStatus::Hd, seen, None),
        b"HD h1 l0\r\n"
    );
    // memcached 1.6.18: a miss still echoes k and O: `mg zz k O1 v` -> `EN kzz O1`.
    let miss = MetaReplyFlags {
        key: Some(b"zz"),
        ..MetaReplyFlags::default()
    };
    assert_eq!(
        meta_reply(b"mg zz k O1 v\r\n", MetaStatus::En, miss, None),
        b"EN kzz O1\r\n"
    );
    // memcached 1.6.18: base64 keys come back base64 with a trailing `b`.
    let b64 = MetaReplyFlags {
        key: Some(b"bXlrZXk="),
        ..MetaReplyFlags::default()
    };
    assert_eq!(
        meta_reply(b"mg bXlrZXk= b k v\r\n", MetaStatus::Va, b64, Some(b"hi")),
        b"VA 2 kbXlrZXk= b\r\nhi\r\n"
    );
    // memcached 1.6.18 after `md c I T30`: `mg c v c t O1 k` ->
    // `VA 2 c27 t30 O1 kc X W`, then `mg c v c` -> `VA 2 c27 Z X`.
    let stale_win = MetaReplyFlags {
        cas: Some(27),
        ttl_secs: Some(30),
        key: Some(b"c"),
        stale: true,
        won: true,
        ..MetaReplyFlags::default()
    };
    assert_eq!(
        meta_reply(
            b"mg c v c t O1 k\r\n",
            MetaStatus::Va,
            stale_win,
            Some(b"hi")
        ),
        b"VA 2 c27 t30 O1 kc X W\r\nhi\r\n"
    );
    let stale_sent = MetaReplyFlags {
        cas: Some(27),
        stale: true,
        win_sent: true,
        ..MetaReplyFlags::default()
    };
    assert_eq!(
        meta_reply(b"mg c v c\r\n", MetaStatus::Va, stale_sent, Some(b"hi")),
        b"VA 2 c27 Z X\r\nhi\r\n"
    );
    // memcached 1.6.18: `ms b 2 c k O9 s F3 T100` -> `HD c12 kb O9` (it
    // does not report s; cellcache's server decides by filling `size`).
    let stored = MetaReplyFlags {
        cas: Some(12),
        key: Some(b"b"),
        ..MetaReplyFlags::default()
    };
    assert_eq!(
        meta_reply(
            b"ms b 2 c k O9 s F3 T100\r\nhi\r\n",
            MetaStatus::Hd,
            stored,
            None
        ),
        b"HD c12 kb O9\r\n"
    );
    // memcached 1.6.18: `md b k O3` miss -> `NF kb O3`.
    let gone = MetaReplyFlags {
        key: Some(b"b"),
        ..MetaReplyFlags::default()
    };
    assert_eq!(
        meta_reply(b"md b k O3\r\n", MetaStatus::Nf, gone, None),
        b"NF kb O3\r\n"
    );
    // memcached 1.6.18: `ma n v t c k O7 N0` -> `VA 2 t-1 c15 kn O7` / `11`.
    let counted = MetaReplyFlags {
        cas: Some(15),
        ttl_secs: Some(-1),
        key: Some(b"n"),
        ..MetaReplyFlags::default()
    };
    assert_eq!(
        meta_reply(
            b"ma n v t c k O7 N0\r\n",
            MetaStatus::Va,
            counted,
            Some(b"11")
        ),
        b"VA 2 t-1 c15 kn O7\r\n11\r\n"
    );
}

#[test]
fn quiet_mode_hides_what_memcached_hides() {
    // memcached 1.6.18: `mg a q` hit -> HD; miss -> nothing; `ms .. q` HD
    // hidden, NS shown; `md zz q` -> NF; `ma zz q` -> NF; `ma m q` hit hidden.
    assert!(!MetaStatus::Hd.hidden_by_quiet(b"mg"));
    assert!(MetaStatus::En.hidden_by_quiet(b"mg"));
    assert!(MetaStatus::Hd.hidden_by_quiet(b"ms"));
    assert!(!MetaStatus::Ns.hidden_by_quiet(b"ms"));
    assert!(MetaStatus::Hd.hidden_by_quiet(b"md"));
    assert!(!MetaStatus::Nf.hidden_by_quiet(b"md"));
    assert!(MetaStatus::Hd.hidden_by_quiet(b"ma"));
    assert!(!MetaStatus::Nf.hidden_by_quiet(b"ma"));
}

#[test]
fn client_parses_server_replies() {
    let l = limits();
    // memcached pads shrunken decr results: `0 ` (seen from 1.6.18).
    assert_eq!(
        parse_reply(b"0 \r\n", &l),
        ParsedReply::Complete {
            reply: Response::Number(0),
            consumed: 4
        }
    );
    // memcached's "ERROR: shutdown not enabled" is an ERROR.
    assert!(matches!(
        parse_reply(b"ERROR: shutdown not enabled\r\n", &l),
        ParsedReply::Complete {
            reply: Response::Error,
            ..
        }
    ));
    let ParsedReply::Complete { reply, consumed } = parse_reply(
        b"VA 2 c27 Z X W b kabc O1 h0 l3 s2 f9 t-1\r\nhi\r\nEND\r\n",
        &l,
    ) else {
        panic!("VA not parsed");
    };
    assert_eq!(consumed, 46);
    assert_eq!(
        reply,
        Response::Meta(MetaReply {
            status: MetaStatus::Va,
            flags: MetaReplyFlags {
                cas: Some(27),
                client_flags: Some(9),
                hit_before: Some(false),
                key: Some(b"abc"),
                last_access_secs: Some(3),
                opaque: Some(b"1"),
                size: Some(2),
                ttl_secs: Some(-1),
                base64_key: true,
                won: true,
                stale: true,
                win_sent: true,
            },
            value: Some(b"hi"),
        })
    );
    for partial in [&b"VALUE a 0 5\r\nhel"[..], b"VA 5\r\nhello\r", b"STOR", b""] {
        assert_eq!(parse_reply(partial, &l), ParsedReply::Incomplete);
    }
    for (bad, error) in [
        (&b"WHAT\r\n"[..], ReplyError::Unknown),
        (b"VALUE a x 1\r\nx\r\n", ReplyError::Malformed),
        (b"VALUE a 0 1\r\nxy\r\n", ReplyError::BadDataChunk),
        (b"VALUE a 0 2000000\r\n", ReplyError::ValueTooLarge),
        (b"HD Q\r\n", ReplyError::Malformed),
        (b"HDX\r\n", ReplyError::Unknown),
        (b"12a\r\n", ReplyError::Malformed),
        (b"STAT nospace\r\n", ReplyError::Malformed),
    ] {
        assert_eq!(
            parse_reply(bad, &l),
            ParsedReply::Error(error),
            "{:?}",
            String::from_utf8_lossy(bad)
        );
    }
    let endless = vec![b'V'; l.line_bytes_max];
    assert_eq!(
        parse_reply(&endless, &l),
        ParsedReply::Error(ReplyError::LineTooLong)
    );
}

#[test]
fn write_retrieve_sends_any_key_list() {
    let mut out = Vec::new();
    write_retrieve(&mut out, true, Some(30), [&b"a"[..], b"b"]);
    assert_eq!(out, b"gats 30 a b\r\n");
    out.clear();
    write_retrieve(&mut out, false, None, [&b"k"[..]]);
    assert_eq!(out, b"get k\r\n");
}

#[test]
fn noreply_silences_classic_errors_like_memcached() {
    // memcached 1.6.18 answers each of these (followed by `mn`) with only `MN`.
    let cases = [
        (&b"incr a abc noreply\r\n"[..], ClientError::InvalidDelta),
        (b"touch a abc noreply\r\n", ClientError::InvalidExptime),
        (b"flush_all abc noreply\r\n", ClientError::InvalidExptime),
        (b"delete a 5 noreply\r\n", ClientError::BadDeleteFormat),
    ];
    for (bytes, expected) in cases {
        let Parsed::Error(e) = parse(bytes, &limits()) else {
            panic!("{:?} accepted", String::from_utf8_lossy(bytes));
        };
        assert_eq!(e.reply, ErrorReply::Client(expected));
        assert!(e.noreply, "{:?}", String::from_utf8_lossy(bytes));
        assert_eq!(e.consumed, bytes.len());
    }
    // Meta errors are always sent, `q` or not.
    let Parsed::Error(e) = parse(b"mg a Z q\r\n", &limits()) else {
        panic!("accepted");
    };
    assert!(!e.noreply);
}

#[test]
fn empty_input_is_incomplete_even_with_degenerate_limits() {
    let zero = Limits {
        line_bytes_max: 0,
        ..Limits::default()
    };
    assert_eq!(parse(b"", &zero), Parsed::Incomplete);
    assert_eq!(parse_reply(b"", &zero), ParsedReply::Incomplete);
    assert_eq!(parse(b"", &limits()), Parsed::Incomplete);
}

#[test]
fn dump_lines_are_memcacheds() {
    let mut out = Vec::new();
    write_cachedump_item(&mut out, b"k1", 5, 0);
    write_cachedump_item(&mut out, b"k2", 0, 1_700_000_000);
    let counts = PrefixCounts {
        get: 2,
        hit: 1,
        set: 1,
        del: 0,
    };
    write_detail_prefix(&mut out, b"foo", counts);
    assert_eq!(
        out,
        b"ITEM k1 [5 b; 0 s]\r\nITEM k2 [0 b; 1700000000 s]\r\n\
          PREFIX foo get 2 hit 1 set 1 del 0\r\n"
    );
}
