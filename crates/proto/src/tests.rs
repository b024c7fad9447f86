//! Wire tables for both directions: request bytes to [`Request`], malformed
//! bytes to the exact error line memcached sends, and [`Response`]s to reply
//! bytes. Cases marked "memcached 1.6.18" were checked against a real
//! memcached 1.6.18 on 127.0.0.1.

use crate::*;

fn limits() -> Limits {
    Limits::default()
}

fn parse_ok(bytes: &[u8]) -> Request<'_> {
    match parse(bytes, &limits()) {
        Parsed::Complete { request, consumed } => {
            assert_eq!(
                consumed,
                bytes.len(),
                "{:?}",
                String::from_utf8_lossy(bytes)
            );
            request
        }
        other => panic!("{:?} parsed to {other:?}", String::from_utf8_lossy(bytes)),
    }
}

fn keys(text: &[u8]) -> Keys<'_> {
    Keys::new(text, 250, 256).expect("valid test keys")
}

fn mkey(wire: &[u8]) -> MetaKey<'_> {
    MetaKey {
        wire,
        base64: false,
    }
}

fn returns<'a>(flags: &[ReturnFlag], opaque: Option<&'a [u8]>) -> ReturnFlags<'a> {
    let mut r = ReturnFlags::new();
    for &f in flags {
        if f == ReturnFlag::Opaque {
            r.push_opaque(opaque.unwrap_or_default());
        } else {
            r.push(f);
        }
    }
    r
}

#[test]
fn classic_requests_parse_to_their_typed_form() {
    let table: Vec<(&[u8], Request<'static>)> = vec![
        // Retrievals: one or many keys, runs of spaces, bare \n (memcached accepts it).
        (
            b"get a\r\n",
            Request::Retrieve(Retrieve {
                return_cas: false,
                touch_exptime: None,
                keys: keys(b"a"),
            }),
        ),
        (
            b"get  a   b \r\n",
            Request::Retrieve(Retrieve {
                return_cas: false,
                touch_exptime: None,
                keys: keys(b"a   b "),
            }),
        ),
        (
            b"gets a b\n",
            Request::Retrieve(Retrieve {
                return_cas: true,
                touch_exptime: None,
                keys: keys(b"a b"),
            }),
        ),
        (
            b"gat 10 a\r\n",
            Request::Retrieve(Retrieve {
                return_cas: false,
                touch_exptime: Some(10),
                keys: keys(b"a"),
            }),
        ),
        (
            b"gats -1 a b\r\n",
            Request::Retrieve(Retrieve {
                return_cas: true,
                touch_exptime: Some(-1),
                keys: keys(b"a b"),
            }),
        ),
        // Storage commands with data blocks that contain \r and \n.
        (
            b"set k 5 100 3\r\na\nb\r\n",
            Request::Store(Store {
                mode: StoreMode::Set,
                key: b"k",
                flags: 5,
                exptime: 100,
                value: b"a\nb",
                noreply: false,
            }),
        ),
        (
            b"add k 0 0 0 noreply\r\n\r\n",
            Request::Store(Store {
                mode: StoreMode::Add,
                key: b"k",
                flags: 0,
                exptime: 0,
                value: b"",
                noreply: true,
            }),
        ),
        (
            b"replace k 4294967295 -1 1\r\nx\r\n",
            Request::Store(Store {
                mode: StoreMode::Replace,
                key: b"k",
                flags: u32::MAX,
                exptime: -1,
                value: b"x",
                noreply: false,
            }),
        ),
        (
            b"append k 0 0 1\r\nx\r\n",
            Request::Store(Store {
                mode: StoreMode::Append,
                key: b"k",
                flags: 0,
                exptime: 0,
                value: b"x",
                noreply: false,
            }),
        ),
        (
            b"prepend k 0 0 1\r\nx\r\n",
            Request::Store(Store {
                mode: StoreMode::Prepend,
                key: b"k",
                flags: 0,
                exptime: 0,
                value: b"x",
                noreply: false,
            }),
        ),
        (
            b"cas k 1 2 1 99 noreply\r\nx\r\n",
            Request::Store(Store {
                mode: StoreMode::Cas { unique: 99 },
                key: b"k",
                flags: 1,
                exptime: 2,
                value: b"x",
                noreply: true,
            }),
        ),
        // memcached 1.6.18: an extra token that is not "noreply" is ignored
        // (`set a 0 0 1 extra` -> STORED); leading `+` accepted.
        (
            b"set k +1 0 1 extra\r\nx\r\n",
            Request::Store(Store {
                mode: StoreMode::Set,
                key: b"k",
                flags: 1,
                exptime: 0,
                value: b"x",
                noreply: false,
            }),
        ),
        (
            b"delete k\r\n",
            Request::Delete {
                key: b"k",
                noreply: false,
            },
        ),
        // memcached 1.6.18: the legacy hold time 0 is accepted.
        (
            b"delete k 0 noreply\r\n",
            Request::Delete {
                key: b"k",
                noreply: true,
            },
        ),
        (
            b"delete k noreply\r\n",
            Request::Delete {
                key: b"k",
                noreply: true,
            },
        ),
        (
            b"incr k 18446744073709551615\r\n",
            Request::Arithmetic {
                op: ArithmeticOp::Incr,
                key: b"k",
                delta: u64::MAX,
                noreply: false,
            },
        ),
        (
            b"decr k 3 noreply\r\n",
            Request::Arithmetic {
                op: ArithmeticOp::Decr,
                key: b"k",
                delta: 3,
                noreply: true,
            },
        ),
        (
            b"touch k 60 noreply\r\n",
            Request::Touch {
                key: b"k",
                exptime: 60,
                noreply: true,
            },
        ),
        (
            b"flush_all\r\n",
            Request::FlushAll {
                delay: None,
                noreply: false,
            },
        ),
        (
            b"flush_all noreply\r\n",
            Request::FlushAll {
                delay: None,
                noreply: true,
            },
        ),
        (
            b"flush_all 30 noreply\r\n",
            Request::FlushAll {
                delay: Some(30),
                noreply: true,
            },
        ),
        // memcached 1.6.18: `version extra` -> VERSION.
        (b"version\r\n", Request::Version),
        (b"version extra\r\n", Request::Version),
        (
            b"verbosity 1\r\n",
            Request::Verbosity {
                level: 1,
                noreply: false,
            },
        ),
        (
            b"verbosity 1 noreply\r\n",
            Request::Verbosity {
                level: 1,
                noreply: true,
            },
        ),
        (
            b"cache_memlimit 64\r\n",
            Request::CacheMemlimit {
                megabytes: 64,
                noreply: false,
            },
        ),
        (
            b"cache_memlimit 8 noreply\r\n",
            Request::CacheMemlimit {
                megabytes: 8,
                noreply: true,
            },
        ),
        (b"stats\r\n", Request::Stats(StatsGroup::General)),
        (b"stats settings\r\n", Request::Stats(StatsGroup::Settings)),
        (b"stats items\r\n", Request::Stats(StatsGroup::Items)),
        (b"stats slabs \r\n", Request::Stats(StatsGroup::Slabs)),
        (b"stats sizes\r\n", Request::Stats(StatsGroup::Sizes)),
        (b"stats conns\r\n", Request::Stats(StatsGroup::Conns)),
        (b"stats reset\r\n", Request::Stats(StatsGroup::Reset)),
        (
            b"stats detail on\r\n",
            Request::Stats(StatsGroup::Other(b"detail on")),
        ),
        (b"quit\r\n", Request::Quit),
        (b"quit extra\r\n", Request::Quit),
        (b"shutdown\r\n", Request::Shutdown { graceful: false }),
        (
            b"shutdown graceful\r\n",
            Request::Shutdown { graceful: true },
        ),
    ];
    for (bytes, expected) in table {
        assert_eq!(
            parse_ok(bytes),
            expected,
            "{:?}",
            String::from_utf8_lossy(bytes)
        );
    }
}

#[test]
fn meta_requests_parse_every_flag() {
    use ReturnFlag as R;
    // Return flags keep request order: memcached 1.6.18 answers
    // `mg a c f t v s k O123 q` with `VA 1 c1 f5 t-1 s1 ka O123`.
    assert_eq!(
        parse_ok(b"mg a c f t v s k O123 q\r\n"),
        Request::MetaGet {
            key: mkey(b"a"),
            flags: MetaGetFlags {
                returns: returns(
                    &[R::Cas, R::ClientFlags, R::Ttl, R::Size, R::Key, R::Opaque],
                    Some(b"123")
                ),
                value: true,
                quiet: true,
                ..MetaGetFlags::default()
            },
        }
    );
    assert_eq!(
        parse_ok(b"mg a h l u E77 N30 R10 T-1 Y\r\n"),
        Request::MetaGet {
            key: mkey(b"a"),
            flags: MetaGetFlags {
                returns: returns(&[R::HitBefore, R::LastAccess], None),
                no_lru_bump: true,
                eventual: true,
                new_cas: Some(77),
                vivify_ttl: Some(30),
                recache_ttl: Some(10),
                new_ttl: Some(-1),
                ..MetaGetFlags::default()
            },
        }
    );
    // memcached 1.6.18: bytes after a token-less flag are ignored (`mg a vx`).
    assert_eq!(
        parse_ok(b"mg a vx\r\n"),
        Request::MetaGet {
            key: mkey(b"a"),
            flags: MetaGetFlags {
                value: true,
                ..MetaGetFlags::default()
            },
        }
    );
    // Base64 key: validated by the parser, decoded on demand.
    let request = parse_ok(b"mg bXlrZXk= b k v\r\n");
    let Request::MetaGet { key, .. } = request else {
        panic!("not mg: {request:?}");
    };
    assert!(key.base64);
    let mut buf: meta::BinaryKeyBuf = [0u8; token::BINARY_KEY_BYTES_MAX];
    assert_eq!(key.binary(&mut buf), b"mykey");

    assert_eq!(
        parse_ok(b"ms k 2 c k O9 s F3 T100 q I C5 E6 MA N60\r\nhi\r\n"),
        Request::MetaSet {
            key: mkey(b"k"),
            value: b"hi",
            flags: MetaSetFlags {
                returns: returns(&[R::Cas, R::Key, R::Opaque, R::Size], Some(b"9")),
                quiet: true,
                compare_cas: Some(5),
                new_cas: Some(6),
                client_flags: Some(3),
                invalidate: true,
                ttl: Some(100),
                mode: SetMode::Append,
                vivify_ttl: Some(60),
            },
        }
    );
    for (mode, expected) in [
        (&b"ms k 0 MS\r\n\r\n"[..], SetMode::Set),
        (b"ms k 0 ME\r\n\r\n", SetMode::Add),
        (b"ms k 0 MP\r\n\r\n", SetMode::Prepend),
        (b"ms k 0 MR\r\n\r\n", SetMode::Replace),
    ] {
        let Request::MetaSet { flags, .. } = parse_ok(mode) else {
            panic!("not ms");
        };
        assert_eq!(flags.mode, expected);
    }
}

#[test]
fn meta_delete_and_arithmetic_flags() {
    use ReturnFlag as R;
    assert_eq!(
        parse_ok(b"md k q I T30 x C1 E2 k O1\r\n"),
        Request::MetaDelete {
            key: mkey(b"k"),
            flags: MetaDeleteFlags {
                returns: returns(&[R::Key, R::Opaque], Some(b"1")),
                quiet: true,
                compare_cas: Some(1),
                new_cas: Some(2),
                invalidate: true,
                new_ttl: Some(30),
                remove_value: true,
            },
        }
    );
    assert_eq!(
        parse_ok(b"ma n v t c k O7 N0 J10 D3 T5 MD q C4 E9\r\n"),
        Request::MetaArithmetic {
            key: mkey(b"n"),
            flags: MetaArithmeticFlags {
                returns: returns(&[R::Ttl, R::Cas, R::Key, R::Opaque], Some(b"7")),
                value: true,
                quiet: true,
                compare_cas: Some(4),
                new_cas: Some(9),
                vivify_ttl: Some(0),
                initial: Some(10),
                delta: Some(3),
                new_ttl: Some(5),
                mode: ArithmeticMode::Decrement,
            },
        }
    );
    for (line, mode) in [
        (&b"ma n M+\r\n"[..], ArithmeticMode::Increment),
        (b"ma n MI\r\n", ArithmeticMode::Increment),
        (b"ma n M-\r\n", ArithmeticMode::Decrement),
    ] {
        let Request::MetaArithmetic { flags, .. } = parse_ok(line) else {
            panic!("not ma");
        };
        assert_eq!(flags.mode, mode);
        assert_eq!(flags.delta_or_default(), 1);
        assert_eq!(flags.initial_or_default(), 0);
    }
    // memcached 1.6.18: `mn foo` -> MN.
    assert_eq!(parse_ok(b"mn\r\n"), Request::MetaNoop);
    assert_eq!(parse_ok(b"mn foo\r\n"), Request::MetaNoop);
    assert_eq!(
        parse_ok(b"me k\r\n"),
        Request::MetaDebug { key: mkey(b"k") }
    );
    // memcached 1.6.18: tokens after `me <key>` other than a first `b` are
    // ignored (`me a q MD` -> EN).
    assert_eq!(
        parse_ok(b"me k q MD\r\n"),
        Request::MetaDebug { key: mkey(b"k") }
    );
    assert_eq!(
        parse_ok(b"me bXlrZXk= b\r\n"),
        Request::MetaDebug {
            key: MetaKey {
                wire: b"bXlrZXk=",
                base64: true
            }
        }
    );
}

/// Expected outcome of a malformed request.
struct Bad {
    bytes: &'static [u8],
    reply: &'static [u8],
    consumed: usize,
    swallow: usize,
    noreply: bool,
}

const fn bad(bytes: &'static [u8], reply: &'static [u8], consumed: usize) -> Bad {
    Bad {
        bytes,
        reply,
        consumed,
        swallow: 0,
        noreply: false,
    }
}

#[test]
fn malformed_requests_get_memcached_error_lines() {
    let table = [
        // memcached 1.6.18 for each: unknown commands, empty lines, case.
        bad(b"foo\r\n", b"ERROR\r\n", 5),
        bad(b"\r\n", b"ERROR\r\n", 2),
        bad(b"   \n", b"ERROR\r\n", 4),
        bad(b"GET a\r\n", b"ERROR\r\n", 7),
        bad(b"get\r\n", b"ERROR\r\n", 5),
        bad(b"gats\r\n", b"ERROR\r\n", 6),
        bad(
            b"gat a\r\n",
            b"CLIENT_ERROR invalid exptime argument\r\n",
            7,
        ),
        bad(
            b"gat abc a\r\n",
            b"CLIENT_ERROR invalid exptime argument\r\n",
            11,
        ),
        // Wrong argument counts are ERROR; the data line is then its own
        // (bad) command, as in memcached.
        bad(b"set a 0 0\r\n", b"ERROR\r\n", 11),
        bad(b"cas a 0 0 1\r\n", b"ERROR\r\n", 13),
        bad(b"set a 0 0 1 noreply extra\r\n", b"ERROR\r\n", 27),
        bad(b"set a\t0 0 1\r\n", b"ERROR\r\n", 13),
        bad(
            b"set a 0 0 abc\r\n",
            b"CLIENT_ERROR bad command line format\r\n",
            15,
        ),
        bad(
            b"set a 0 0 -1\r\n",
            b"CLIENT_ERROR bad command line format\r\n",
            14,
        ),
        bad(
            b"set a -1 0 1\r\n",
            b"CLIENT_ERROR bad command line format\r\n",
            14,
        ),
        bad(
            b"cas a 0 0 1 abc\r\n",
            b"CLIENT_ERROR bad command line format\r\n",
            17,
        ),
        // cellcache: flags are 32-bit (SPEC D1); memcached 1.6.18 accepted this.
        bad(
            b"set a 4294967296 0 1\r\n",
            b"CLIENT_ERROR bad command line format\r\n",
            22,
        ),
        bad(b"incr a\r\n", b"ERROR\r\n", 8),
        bad(
            b"incr a abc\r\n",
            b"CLIENT_ERROR invalid numeric delta argument\r\n",
            12,
        ),
        bad(
            b"incr a -1\r\n",
            b"CLIENT_ERROR invalid numeric delta argument\r\n",
            11,
        ),
        bad(b"touch a\r\n", b"ERROR\r\n", 9),
        bad(
            b"touch a abc\r\n",
            b"CLIENT_ERROR invalid exptime argument\r\n",
            13,
        ),
        bad(
            b"flush_all abc\r\n",
            b"CLIENT_ERROR invalid exptime argument\r\n",
            15,
        ),
        bad(b"verbosity\r\n", b"ERROR\r\n", 11),
        bad(b"verbosity 1 2 3\r\n", b"ERROR\r\n", 17),
        bad(
            b"verbosity abc\r\n",
            b"CLIENT_ERROR bad command line format\r\n",
            15,
        ),
        bad(
            b"delete a 5\r\n",
            b"CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]\r\n",
            12,
        ),
        // Meta errors (memcached 1.6.18 wording).
        bad(b"mg\r\n", b"ERROR\r\n", 4),
        bad(b"mg a v v\r\n", b"CLIENT_ERROR duplicate flag\r\n", 10),
        bad(b"mg a Z\r\n", b"CLIENT_ERROR invalid flag\r\n", 8),
        bad(
            b"mg a T\r\n",
            b"CLIENT_ERROR bad token in command line format\r\n",
            8,
        ),
        bad(
            b"mg a Tabc\r\n",
            b"CLIENT_ERROR bad token in command line format\r\n",
            11,
        ),
        bad(b"mg !!!! b\r\n", b"CLIENT_ERROR error decoding key\r\n", 11),
        bad(
            b"mg a v Ofoo bar\r\n",
            b"CLIENT_ERROR error decoding key\r\n",
            17,
        ),
        bad(
            b"mg a a a a a a a a a a a a a a a a a a a a a a a a a\r\n",
            b"CLIENT_ERROR options flags are too long\r\n",
            54,
        ),
        bad(
            b"mg b Oaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa v\r\n",
            b"CLIENT_ERROR opaque token too long\r\n",
            49,
        ),
        bad(b"ms a\r\n", b"CLIENT_ERROR bad command line format\r\n", 6),
        bad(
            b"ms a abc\r\n",
            b"CLIENT_ERROR bad command line format\r\n",
            10,
        ),
        bad(
            b"ms b -1\r\n",
            b"CLIENT_ERROR bad command line format\r\n",
            9,
        ),
        bad(
            b"ma n Dx\r\n",
            b"CLIENT_ERROR invalid numeric delta value\r\n",
            9,
        ),
        bad(
            b"ma n Jx\r\n",
            b"CLIENT_ERROR invalid numeric initial value\r\n",
            9,
        ),
        bad(
            b"ma n M\r\n",
            b"CLIENT_ERROR incorrect length for M token\r\n",
            8,
        ),
        bad(
            b"ma n MX\r\n",
            b"CLIENT_ERROR invalid mode for ma M token\r\n",
            9,
        ),
        // cellcache rejects flags the command does not use (memcached 1.6.18
        // also rejects `md a x`'s cousins with "invalid or duplicate flag").
        bad(b"md a v\r\n", b"CLIENT_ERROR invalid flag\r\n", 8),
        bad(b"me\r\n", b"CLIENT_ERROR bad command line format\r\n", 4),
        bad(
            b"me a b\r\n",
            b"CLIENT_ERROR bad command line format\r\n",
            8,
        ),
    ];
    for case in table {
        check_bad(&case);
    }
}

fn check_bad(case: &Bad) {
    let name = String::from_utf8_lossy(case.bytes);
    let Parsed::Error(e) = parse(case.bytes, &limits()) else {
        panic!("{name:?} did not fail: {:?}", parse(case.bytes, &limits()));
    };
    let mut out = Vec::new();
    e.reply.encode(&mut out);
    assert_eq!(
        String::from_utf8_lossy(&out),
        String::from_utf8_lossy(case.reply),
        "{name:?}"
    );
    assert_eq!(e.consumed, case.consumed, "{name:?} consumed");
    assert_eq!(e.swallow, case.swallow, "{name:?} swallow");
    assert_eq!(e.noreply, case.noreply, "{name:?} noreply");
    assert!(!e.close, "{name:?} close");
}

#[test]
fn rejected_data_blocks_are_swallowed() {
    let cases = [
        // memcached 1.6.18: `set a 0 0 2\r\nxyz\r\n` -> bad data chunk after
        // reading exactly len + 2 bytes; the leftover `\n` is then an ERROR.
        Bad {
            bytes: b"set a 0 0 2\r\nxyz\r\n",
            reply: b"CLIENT_ERROR bad data chunk\r\n",
            consumed: 17,
            swallow: 0,
            noreply: false,
        },
        // ... and with noreply memcached sends nothing for it.
        Bad {
            bytes: b"set a 0 0 2 noreply\r\nxyz\r\n",
            reply: b"CLIENT_ERROR bad data chunk\r\n",
            consumed: 25,
            swallow: 0,
            noreply: true,
        },
        // memcached 1.6.18: a bare-\n data terminator is a bad data chunk.
        Bad {
            bytes: b"set a 0 0 1\n1\nget a\n",
            reply: b"CLIENT_ERROR bad data chunk\r\n",
            consumed: 15,
            swallow: 0,
            noreply: false,
        },
        // memcached 1.6.18: `set a 0 0 abc noreply` is silent.
        Bad {
            bytes: b"set a 0 0 abc noreply\r\n",
            reply: b"CLIENT_ERROR bad command line format\r\n",
            consumed: 23,
            swallow: 0,
            noreply: true,
        },
        // Too large: the announced block (not yet received) is swallowed;
        // memcached 1.6.18 swallows it too (`set a 0 0 2000000` then silence).
        Bad {
            bytes: b"set a 0 0 2000000\r\nxx",
            reply: b"SERVER_ERROR object too large for cache\r\n",
            consumed: 19,
            swallow: 2_000_002,
            noreply: false,
        },
        Bad {
            bytes: b"ms b 2000000 T0\r\n",
            reply: b"SERVER_ERROR object too large for cache\r\n",
            consumed: 17,
            swallow: 2_000_002,
            noreply: false,
        },
        // memcached 1.6.18: bad ms flags swallow the data (`ms a 2 Z` then MN).
        Bad {
            bytes: b"ms a 2 Z\r\nxx\r\n",
            reply: b"CLIENT_ERROR invalid flag\r\n",
            consumed: 10,
            swallow: 4,
            noreply: false,
        },
        Bad {
            bytes: b"ms a 2 MX\r\nxx\r\n",
            reply: b"CLIENT_ERROR invalid mode for ms M token\r\n",
            consumed: 11,
            swallow: 4,
            noreply: false,
        },
        // Regression: modes are upper case only (memcached 1.6.18: `ms a 2 Ms` refused).
        Bad {
            bytes: b"ms a 2 Ms\r\nxx\r\n",
            reply: b"CLIENT_ERROR invalid mode for ms M token\r\n",
            consumed: 11,
            swallow: 4,
            noreply: false,
        },
        Bad {
            bytes: b"ma a Mi\r\n",
            reply: b"CLIENT_ERROR invalid mode for ma M token\r\n",
            consumed: 9,
            swallow: 0,
            noreply: false,
        },
        Bad {
            bytes: b"ms a 2 MEE\r\nxx\r\n",
            reply: b"CLIENT_ERROR incorrect length for M token\r\n",
            consumed: 12,
            swallow: 4,
            noreply: false,
        },
        Bad {
            bytes: b"ms b 2 Oaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\nhi\r\n",
            reply: b"CLIENT_ERROR opaque token too long\r\n",
            consumed: 52,
            swallow: 4,
            noreply: false,
        },
        Bad {
            bytes: b"ms a 2 b\r\nhi\r\n",
            reply: b"CLIENT_ERROR error decoding key\r\n",
            consumed: 10,
            swallow: 4,
            noreply: false,
        },
    ];
    for case in &cases {
        check_bad(case);
    }
}

#[test]
fn too_large_set_names_the_key_to_unlink() {
    let Parsed::Error(e) = parse(b"set big 0 0 9999999\r\n", &limits()) else {
        panic!("accepted");
    };
    assert_eq!(e.failed_set_key.map(|k| k.wire), Some(&b"big"[..]));
    let Parsed::Error(e) = parse(b"add big 0 0 9999999\r\n", &limits()) else {
        panic!("accepted");
    };
    assert_eq!(e.failed_set_key, None, "only set unlinks");
    // memcached 1.6.18 unlinks on a too-large ms in every mode (proto_text.c
    // process_mset_command), base64 keys included.
    let Parsed::Error(e) = parse(b"ms big 9999999 MA\r\n", &limits()) else {
        panic!("accepted");
    };
    assert_eq!(e.reply, ErrorReply::Server(ServerError::ObjectTooLarge));
    assert_eq!(e.failed_set_key.map(|k| k.wire), Some(&b"big"[..]));
    let Parsed::Error(e) = parse(b"ms Ymln 9999999 b\r\n", &limits()) else {
        panic!("accepted");
    };
    let key = e.failed_set_key.expect("unlinks");
    assert!(key.base64);
    assert_eq!(key.binary(&mut [0; 186]), b"big");
}

/// memcached 1.6.18 counts the whole item against `-I` (item_size_max):
/// `key + value + 59`, 4 more with non-zero client flags. Measured with
/// `memcached -I 1m` and a bisecting `set`: 1 048 516 with key `k`, 1 048 267
/// with a 250-byte key, 1 048 512 with flags 1.
#[test]
fn item_size_max_counts_key_value_and_flags_as_memcached() {
    let l = limits();
    let fits = |line: &[u8]| match parse(line, &l) {
        Parsed::Incomplete => true,
        Parsed::Error(e) => {
            assert_eq!(e.reply, ErrorReply::Server(ServerError::ObjectTooLarge));
            false
        }
        other => panic!("{other:?}"),
    };
    assert!(fits(b"set k 0 0 1048516\r\n"));
    assert!(!fits(b"set k 0 0 1048517\r\n"));
    assert!(fits(b"set k 1 0 1048512\r\n"));
    assert!(!fits(b"set k 1 0 1048513\r\n"));
    let long = [b'k'; 250];
    let line = |n: usize| [b"set ", &long[..], format!(" 0 0 {n}\r\n").as_bytes()].concat();
    assert!(fits(&line(1_048_267)));
    assert!(!fits(&line(1_048_268)));
    assert!(fits(b"ms k 1048516 T0\r\n"));
    assert!(!fits(b"ms k 1048516 F1\r\n"));
    assert!(fits(b"ms k 1048512 F1\r\n"));
    // b: the decoded key counts (YQ== is "a").
    assert!(fits(b"ms YQ== 1048516 b\r\n"));
    assert!(!fits(b"ms YQ== 1048517 b\r\n"));
    // A bad flag is reported before the size, as memcached checks flags first.
    let Parsed::Error(e) = parse(b"ms k 9999999 !\r\n", &l) else {
        panic!("accepted");
    };
    assert_eq!(e.reply, ErrorReply::Client(ClientError::InvalidFlag));
}

#[test]
fn discard_carries_a_swallow_across_reads() {
    let mut discard = Discard::new(10);
    assert_eq!(discard.take(4), 4);
    assert_eq!(discard.remaining(), 6);
    assert_eq!(discard.take(100), 6);
    assert!(discard.is_done());
    assert_eq!(discard.take(5), 0);
}

#[test]
fn limits_bound_keys_lines_values_and_key_counts() {
    let limits = Limits::default();
    let long_key = [b'k'; 251];
    let ok_key = [b'k'; 250];
    // memcached 1.6.18: a 251-byte key -> CLIENT_ERROR bad command line format.
    for command in [&b"get "[..], b"mg ", b"delete ", b"touch "] {
        let mut line = command.to_vec();
        line.extend_from_slice(&long_key);
        line.extend_from_slice(if command == b"touch " {
            b" 1\r\n"
        } else {
            b"\r\n"
        });
        let Parsed::Error(e) = parse(&line, &limits) else {
            panic!("long key accepted for {command:?}");
        };
        assert_eq!(
            e.reply,
            ErrorReply::Client(ClientError::BadCommandLineFormat)
        );
    }
    let mut line = b"get ".to_vec();
    line.extend_from_slice(&ok_key);
    line.extend_from_slice(b"\r\n");
    assert!(matches!(parse(&line, &limits), Parsed::Complete { .. }));

    // A line without an end, longer than the limit: close without a reply, as memcached.
    let endless = vec![b'a'; limits.line_bytes_max];
    let Parsed::Error(e) = parse(&endless, &limits) else {
        panic!("endless line accepted");
    };
    assert!(e.close && e.noreply);
    assert_eq!(e.reply, ErrorReply::Client(ClientError::LineTooLong));
    assert_eq!(e.consumed, endless.len());
    // One byte less is still just incomplete.
    assert_eq!(
        parse(&endless[..limits.line_bytes_max - 1], &limits),
        Parsed::Incomplete
    );

    // Value limit: exactly the maximum is fine, one more is too large.
    let small = Limits {
        item_size_max: 1 + 4 + crate::limits::ITEM_OVERHEAD_BYTES,
        ..Limits::default()
    };
    assert!(matches!(
        parse(b"set k 0 0 4\r\nabcd\r\n", &small),
        Parsed::Complete { .. }
    ));
    let Parsed::Error(e) = parse(b"set k 0 0 5\r\nabcde\r\n", &small) else {
        panic!("too large accepted");
    };
    assert_eq!(e.reply, ErrorReply::Server(ServerError::ObjectTooLarge));
    assert_eq!((e.consumed, e.swallow), (13, 7));

    // Key count limit.
    let few = Limits {
        keys_per_get_max: 2,
        ..Limits::default()
    };
    assert!(matches!(
        parse(b"get a b\r\n", &few),
        Parsed::Complete { .. }
    ));
    // More keys than a batch: the first batch, then the rest of the line (memcached takes
    // any number of keys).
    let Parsed::Partial {
        request: Request::Retrieve(first),
        consumed,
        rest,
    } = parse(b"get a b c\r\n", &few)
    else {
        panic!("a long get is not taken in batches");
    };
    assert_eq!(first.keys.iter().collect::<Vec<_>>(), [b"a", b"b"]);
    assert_eq!(consumed, b"get a b".len());
    let Parsed::Complete {
        request: Request::Retrieve(last),
        consumed,
    } = parse_retrieve_rest(b" c\r\n", &rest, &few)
    else {
        panic!("the rest of the line is not its last batch");
    };
    assert_eq!(last.keys.iter().collect::<Vec<_>>(), [b"c"]);
    assert_eq!(consumed, 4);

    // Control bytes in keys are rejected (SPEC D1).
    let Parsed::Error(e) = parse(b"get a\x01b\r\n", &limits) else {
        panic!("control byte accepted");
    };
    assert_eq!(
        e.reply,
        ErrorReply::Client(ClientError::BadCommandLineFormat)
    );
}

#[test]
fn partial_frames_are_incomplete_not_errors() {
    for whole in [
        &b"get a b\r\n"[..],
        b"set k 0 0 5\r\nhello\r\n",
        b"ms k 5 T1\r\nhello\r\n",
        b"mg k v\r\n",
    ] {
        for cut in 0..whole.len() {
            assert_eq!(
                parse(&whole[..cut], &limits()),
                Parsed::Incomplete,
                "{:?} cut at {cut}",
                String::from_utf8_lossy(whole)
            );
        }
    }
}

#[test]
fn pipelined_requests_parse_one_after_another() {
    let stream = b"set a 0 0 1\r\nx\r\nget a b\r\nmg a v\r\nmn\r\n";
    let mut at = 0;
    let mut seen = Vec::new();
    while at < stream.len() {
        match parse(&stream[at..], &limits()) {
            Parsed::Complete { request, consumed } => {
                seen.push(request);
                at += consumed;
            }
            other => panic!("at {at}: {other:?}"),
        }
    }
    assert_eq!(seen.len(), 4);
    assert_eq!(seen[3], Request::MetaNoop);
}

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
fn memcached_differential_findings() {
    // Found by sending generated malformed lines to memcached 1.6.18 and to
    // this parser, and comparing the error lines.

    // A length beyond INT_MAX - 2 is a bad command line with nothing
    // swallowed (`ms t 4294967295` then `mn` -> the error, then MN).
    for bytes in [
        &b"ms t 4294967295\r\n"[..],
        b"set t 0 0 2147483646\r\n",
        b"ms t 9223372036854775807 T1\r\n",
    ] {
        let Parsed::Error(e) = parse(bytes, &limits()) else {
            panic!("{:?} accepted", String::from_utf8_lossy(bytes));
        };
        assert_eq!(
            e.reply,
            ErrorReply::Client(ClientError::BadCommandLineFormat)
        );
        assert_eq!(e.swallow, 0);
    }
    // The largest length memcached parses is too large for the cache, and
    // its data is swallowed.
    let Parsed::Error(e) = parse(b"set t 0 0 2147483645\r\n", &limits()) else {
        panic!("accepted");
    };
    assert_eq!(e.reply, ErrorReply::Server(ServerError::ObjectTooLarge));
    assert_eq!(e.swallow, 2_147_483_647);

    // noreply is "the last token says noreply", wherever it is
    // (`append noreply F4294967296 2 noreply` is silent).
    let Parsed::Error(e) = parse(b"append noreply F4294967296 2 noreply\r\n", &limits()) else {
        panic!("accepted");
    };
    assert!(e.noreply);
    let Parsed::Error(e) = parse(b"incr k noreply\r\n", &limits()) else {
        panic!("accepted");
    };
    assert!(e.noreply);

    // verbosity takes any unsigned number (`verbosity 18446744073709551615` -> OK).
    assert_eq!(
        parse_ok(b"verbosity 18446744073709551615\r\n"),
        Request::Verbosity {
            level: u32::MAX,
            noreply: false
        }
    );
}

/// Splits `stream` (one or more retrieval lines) into what a connection would run: the keys
/// of each batch, `END` at each line end, and error replies.
fn drive_batches(stream: &[u8], limits: &Limits) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = stream;
    let mut batch = None;
    // Each pass consumes at least one byte or stops.
    for _ in 0..=stream.len() {
        if rest.is_empty() {
            break;
        }
        let parsed = match batch {
            Some(b) => parse_retrieve_rest(rest, &b, limits),
            None => parse(rest, limits),
        };
        let keys = |r: &Request<'_>| match r {
            Request::Retrieve(r) => r
                .keys
                .iter()
                .map(|k| String::from_utf8_lossy(k).into_owned())
                .collect::<Vec<_>>()
                .join(","),
            other => format!("{other:?}"),
        };
        match parsed {
            Parsed::Partial {
                request,
                consumed,
                rest: next,
            } => {
                assert!(consumed > 0 && consumed <= rest.len());
                out.push(keys(&request));
                batch = Some(next);
                rest = &rest[consumed..];
            }
            Parsed::Complete { request, consumed } => {
                out.push(keys(&request));
                out.push("END".into());
                batch = None;
                rest = &rest[consumed..];
            }
            Parsed::Error(e) => {
                out.push(format!("{:?} skip_line={}", e.reply, e.skip_line));
                batch = None;
                rest = &rest[e.consumed..];
                if e.skip_line {
                    let eol = rest.iter().position(|&b| b == b'\n');
                    rest = &rest[eol.map_or(rest.len(), |i| i + 1)..];
                }
            }
            Parsed::Incomplete => {
                out.push("incomplete".into());
                break;
            }
        }
    }
    out
}

/// memcached serves a get of any number of keys (10 000 keys, a 128 KiB line: measured on
/// 1.6.18); cellcache takes such a line in batches of at most `keys_per_get_max` keys, each
/// within `line_bytes_max`, so neither the line nor its values are held whole.
#[test]
fn long_retrievals_are_taken_in_bounded_batches() {
    let limits = Limits::default();
    let keys: Vec<String> = (0..10_000).map(|i| format!("key{i}")).collect();
    let line = format!("gets {}\r\nget x\r\n", keys.join(" "));
    let out = drive_batches(line.as_bytes(), &limits);
    let mut seen = Vec::new();
    let mut ends = 0;
    for batch in &out {
        if batch == "END" {
            ends += 1;
            continue;
        }
        let n = batch.split(',').count();
        assert!(n <= limits.keys_per_get_max, "batch of {n} keys");
        if ends == 0 {
            seen.extend(batch.split(',').map(str::to_string));
        }
    }
    assert_eq!(seen, keys);
    assert_eq!(ends, 2);
    assert_eq!(out[out.len() - 2..], ["x".to_string(), "END".to_string()]);

    // A 128 KiB line of 250-byte keys with no line end yet: batches of whole keys within
    // the window; the cut key waits for the rest.
    let long_key = "k".repeat(250);
    let mut line = b"get".to_vec();
    while line.len() < 128 << 10 {
        line.push(b' ');
        line.extend_from_slice(long_key.as_bytes());
    }
    let open = &line[..line.len() - 100];
    let Parsed::Partial {
        request: Request::Retrieve(r),
        consumed,
        ..
    } = parse(open, &limits)
    else {
        panic!("a long get line without its end is not batched");
    };
    assert!(consumed <= limits.line_bytes_max);
    assert!(r.keys.iter().all(|k| k == long_key.as_bytes()));
    line.extend_from_slice(b"\r\n");
    let out = drive_batches(&line, &limits);
    assert_eq!(out.last().map(String::as_str), Some("END"));
    let total: usize = out
        .iter()
        .filter(|b| *b != "END")
        .map(|b| b.split(',').count())
        .sum();
    assert_eq!(total, (line.len() - 5) / 251);

    // gat keeps its exptime across batches; spaces only at the end are just the END.
    let few = Limits {
        keys_per_get_max: 2,
        ..Limits::default()
    };
    assert_eq!(
        drive_batches(b"gat -1 a b c d   \r\n", &few),
        ["a,b", "c,d", "END"]
    );
    let Parsed::Partial { rest, .. } = parse(b"gat -1 a b c\r\n", &few) else {
        panic!("not batched");
    };
    assert_eq!(rest.touch_exptime, Some(-1));
    assert!(!rest.return_cas);
}

/// A bad key in a later batch (in the first, the whole line is refused, as memcached does):
/// the batches before it were answered (memcached, holding the
/// whole line, answers only the error); the rest of the line is dropped, the next line runs.
#[test]
fn bad_key_in_a_long_retrieval_drops_the_rest_of_its_line() {
    let few = Limits {
        keys_per_get_max: 2,
        ..Limits::default()
    };
    let bad = "z".repeat(251);
    let line = format!("get a b c {bad} e\r\nget d\r\n");
    assert_eq!(
        drive_batches(line.as_bytes(), &few),
        [
            "a,b".to_string(),
            "Client(BadCommandLineFormat) skip_line=false".to_string(),
            "d".to_string(),
            "END".to_string()
        ]
    );
    // With the line end still ahead, the error asks to skip the rest of the line.
    let limits = Limits::default();
    let mut open = b"get ".to_vec();
    open.extend_from_slice(&vec![b'y'; limits.line_bytes_max]);
    let Parsed::Error(e) = parse(&open, &limits) else {
        panic!("a 64 KiB token accepted as a key");
    };
    assert!(e.skip_line && !e.close);
    assert_eq!(
        e.reply,
        ErrorReply::Client(ClientError::BadCommandLineFormat)
    );
}

/// An unknown command whose last token starts with `HTTP/` closes the connection without a
/// reply (memcached 1.6.18: `GET / HTTP/1.0`); a known command or another last token does not.
#[test]
fn http_request_lines_close_the_connection() {
    let limits = Limits::default();
    for line in [
        &b"GET / HTTP/1.0\r\n"[..],
        b"POST /x HTTP/1.1\r\n",
        b"HTTP/1.1\r\n",
    ] {
        let Parsed::Error(e) = parse(line, &limits) else {
            panic!("{line:?} accepted");
        };
        assert!(e.close && e.noreply, "{line:?}");
        assert_eq!(e.consumed, line.len());
    }
    for line in [
        &b"foo HTTP/1.1 x\r\n"[..],
        b"GET /\r\n",
        b"set HTTP/1.0\r\n",
    ] {
        let Parsed::Error(e) = parse(line, &limits) else {
            panic!("{line:?} accepted");
        };
        assert!(!e.close && !e.noreply, "{line:?}");
        assert_eq!(e.reply, ErrorReply::Error);
    }
    assert!(matches!(
        parse(b"get / HTTP/1.0\r\n", &limits),
        Parsed::Complete { .. }
    ));
}

/// memcached 1.6's slab mover, LRU crawler and shutdown lines parse to [`Admin`] commands
/// with memcached's argument checks (replies measured on 1.6.18).
#[test]
fn administration_commands_parse_like_memcached() {
    let limits = Limits::default();
    let admin = |line: &[u8]| match parse(line, &limits) {
        Parsed::Complete {
            request: Request::Admin(a),
            ..
        } => Some(a),
        _ => None,
    };
    assert_eq!(
        admin(b"slabs automove 2\r\n"),
        Some(Admin::SlabsAutomove(2))
    );
    assert_eq!(
        admin(b"slabs reassign 1 -1\r\n"),
        Some(Admin::SlabsReassign {
            source: 1,
            destination: -1
        })
    );
    assert_eq!(
        admin(b"lru_crawler crawl 1,2\r\n"),
        Some(Admin::LruCrawlerRun)
    );
    assert_eq!(
        admin(b"lru_crawler tocrawl 5\r\n"),
        Some(Admin::LruCrawlerSetting)
    );
    assert_eq!(admin(b"shutdown now\r\n"), Some(Admin::ShutdownInvalidMode));
    for (line, reply) in [
        (&b"slabs automove 3\r\n"[..], ErrorReply::Error),
        (
            b"slabs reassign a 1\r\n",
            ErrorReply::Client(ClientError::BadCommandLineFormat),
        ),
        (b"lru_crawler mgdump all\r\n", ErrorReply::Error),
        (
            b"lru_crawler sleep -1\r\n",
            ErrorReply::Client(ClientError::BadCommandLineFormat),
        ),
        (b"cache_memlimit x\r\n", ErrorReply::Error),
    ] {
        let Parsed::Error(e) = parse(line, &limits) else {
            panic!("{line:?} accepted");
        };
        assert_eq!(e.reply, reply, "{line:?}");
    }
}
