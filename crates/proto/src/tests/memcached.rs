//! Differences found by running the same bytes against memcached 1.6.18, long retrieval
//! lines in batches, HTTP lines, administration commands.

use super::*;

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
        // Only ElastiCache's `config get cluster` is known.
        (b"config get other\r\n", ErrorReply::Error),
        (b"config set cluster 1\r\n", ErrorReply::Error),
    ] {
        let Parsed::Error(e) = parse(line, &limits) else {
            panic!("{line:?} accepted");
        };
        assert_eq!(e.reply, reply, "{line:?}");
    }
}
