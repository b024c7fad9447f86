//! Request bytes to their typed form: classic commands, and every flag of the meta
//! commands.

use super::*;

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
        (b"config get cluster\r\n", Request::ConfigGetCluster),
        (
            b"refresh_certs\r\n",
            Request::RefreshCerts { noreply: false },
        ),
        (
            b"refresh_certs noreply\r\n",
            Request::RefreshCerts { noreply: true },
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
