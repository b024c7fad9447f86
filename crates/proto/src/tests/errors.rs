//! Malformed requests and limits: the exact error line memcached sends, what is swallowed,
//! what is incomplete.

use super::*;

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
        // cellcache: client flags are 32-bit; memcached 1.6.18 accepted this.
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

    // Control bytes are part of a key, as in memcached (memcaslap sends them); a CR
    // inside the line is not.
    let Parsed::Complete {
        request: Request::Retrieve(r),
        ..
    } = parse(b"get a\x01b\r\n", &limits)
    else {
        panic!("a control byte refused");
    };
    assert_eq!(r.keys.iter().collect::<Vec<_>>(), [b"a\x01b"]);
    let Parsed::Error(e) = parse(b"get a\rb\r\n", &limits) else {
        panic!("a CR inside a key accepted");
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
