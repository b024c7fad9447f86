//! Storage, arithmetic, expiry, flushes, item-size limits, pipelining and malformed input.

use super::*;

#[test]
fn storage_commands() {
    let s = server();
    let mut c = s.connect();
    let steps: &[(&[u8], &[u8])] = &[
        // set / get, flags preserved, empty value allowed
        (b"set a 5 0 3\r\nabc\r\n", b"STORED\r\n"),
        (b"get a\r\n", b"VALUE a 5 3\r\nabc\r\nEND\r\n"),
        (b"set empty 0 0 0\r\n\r\n", b"STORED\r\n"),
        (b"get empty\r\n", b"VALUE empty 0 0\r\n\r\nEND\r\n"),
        (b"set f 4294967295 0 1\r\nx\r\n", b"STORED\r\n"),
        (b"get f\r\n", b"VALUE f 4294967295 1\r\nx\r\nEND\r\n"),
        // add only if absent, replace only if present
        (b"add a 0 0 1\r\nz\r\n", b"NOT_STORED\r\n"),
        (b"add b 0 0 2\r\nbb\r\n", b"STORED\r\n"),
        (b"replace nope 0 0 1\r\nz\r\n", b"NOT_STORED\r\n"),
        (b"replace b 7 0 3\r\nBBB\r\n", b"STORED\r\n"),
        (b"get b\r\n", b"VALUE b 7 3\r\nBBB\r\nEND\r\n"),
        // append / prepend keep flags, need an existing item
        (b"append a 9 0 2\r\nde\r\n", b"STORED\r\n"),
        (b"prepend a 9 0 2\r\n__\r\n", b"STORED\r\n"),
        (b"get a\r\n", b"VALUE a 5 7\r\n__abcde\r\nEND\r\n"),
        (b"append nope 0 0 1\r\nz\r\n", b"NOT_STORED\r\n"),
        (b"prepend nope 0 0 1\r\nz\r\n", b"NOT_STORED\r\n"),
        // multi-key get skips misses, keeps order
        (
            b"get a nope b\r\n",
            b"VALUE a 5 7\r\n__abcde\r\nVALUE b 7 3\r\nBBB\r\nEND\r\n",
        ),
        // delete
        (b"delete b\r\n", b"DELETED\r\n"),
        (b"delete b\r\n", b"NOT_FOUND\r\n"),
        (b"get b\r\n", b"END\r\n"),
        // noreply is silent, the next command answers
        (
            b"set q 0 0 1 noreply\r\nq\r\nget q\r\n",
            b"VALUE q 0 1\r\nq\r\nEND\r\n",
        ),
        (b"delete q noreply\r\nget q\r\n", b"END\r\n"),
        (
            b"add q 0 0 1 noreply\r\n1\r\nappend q 0 0 1 noreply\r\n2\r\nget q\r\n",
            b"VALUE q 0 2\r\n12\r\nEND\r\n",
        ),
    ];
    for (req, want) in steps {
        c.roundtrip(req, want);
    }
}

#[test]
fn cas_command() {
    let s = server();
    let mut c = s.connect();
    c.roundtrip(b"cas missing 0 0 1 1\r\nx\r\n", b"NOT_FOUND\r\n");
    c.roundtrip(b"set k 0 0 2\r\nv1\r\n", b"STORED\r\n");
    let cas = cas_of(&mut c, "k");
    c.roundtrip(
        format!("cas k 3 0 2 {}\r\nv2\r\n", cas + 1000).as_bytes(),
        b"EXISTS\r\n",
    );
    c.roundtrip(
        format!("cas k 3 0 2 {cas}\r\nv2\r\n").as_bytes(),
        b"STORED\r\n",
    );
    c.roundtrip(b"get k\r\n", b"VALUE k 3 2\r\nv2\r\nEND\r\n");
    let cas2 = cas_of(&mut c, "k");
    assert_ne!(cas, cas2, "a write changes the CAS unique");
    // The old CAS no longer matches.
    c.roundtrip(
        format!("cas k 0 0 2 {cas}\r\nv3\r\n").as_bytes(),
        b"EXISTS\r\n",
    );
    c.roundtrip(
        format!("cas k 0 0 2 {cas2} noreply\r\nv3\r\nget k\r\n").as_bytes(),
        b"VALUE k 0 2\r\nv3\r\nEND\r\n",
    );
    // gets on several keys returns each CAS
    c.send(b"gets k k\r\n");
    let a = c.line();
    c.line();
    let b = c.line();
    c.line();
    assert_eq!(a, b);
    assert_eq!(c.line(), "END");
}

#[test]
fn incr_decr() {
    let s = server();
    let mut c = s.connect();
    let steps: &[(&[u8], &[u8])] = &[
        (b"incr n 1\r\n", b"NOT_FOUND\r\n"),
        (b"set n 0 0 2\r\n10\r\n", b"STORED\r\n"),
        (b"incr n 5\r\n", b"15\r\n"),
        (b"decr n 20\r\n", b"0\r\n"),
        (
            b"incr n 18446744073709551615\r\n",
            b"18446744073709551615\r\n",
        ),
        (b"incr n 2\r\n", b"1\r\n"),
        (b"decr n 1\r\n", b"0\r\n"),
        (b"set big 0 0 3\r\n100\r\n", b"STORED\r\n"),
        (b"decr big 1\r\n", b"99\r\n"),
        // memcached keeps the old length when a decr shortens the number (space-padded)
        (b"get big\r\n", b"VALUE big 0 3\r\n99 \r\nEND\r\n"),
        (b"set t 0 0 3\r\nabc\r\n", b"STORED\r\n"),
        (
            b"incr t 1\r\n",
            b"CLIENT_ERROR cannot increment or decrement non-numeric value\r\n",
        ),
        (
            b"incr n abc\r\n",
            b"CLIENT_ERROR invalid numeric delta argument\r\n",
        ),
        // after the wrap the value is still 20 bytes long: "1" padded with spaces
        (
            b"incr n 1 noreply\r\nget n\r\n",
            b"VALUE n 0 20\r\n1                   \r\nEND\r\n",
        ),
    ];
    for (req, want) in steps {
        c.roundtrip(req, want);
    }
}

/// `incr`/`decr` read a stored number as memcached's strtoull does (values measured on
/// memcached 1.6.18): leading whitespace and `+` are accepted, anything after the digits and
/// a space is ignored, the result is padded to the old length.
#[test]
fn incr_decr_on_non_canonical_numbers() {
    let s = server();
    let mut c = s.connect();
    let cases: &[(&[u8], &[u8], &[u8])] = &[
        // (stored value, incr 1 reply, value after)
        (b"  12", b"13\r\n", b"13  "),
        (b"12  ", b"13\r\n", b"13  "),
        (b" 12 ", b"13\r\n", b"13  "),
        (b"+12", b"13\r\n", b"13 "),
        (b"012", b"13\r\n", b"13 "),
        (b"\t12", b"13\r\n", b"13 "),
        (b"1 2", b"2\r\n", b"2  "),
        (b"-12", NON_NUMERIC, b"-12"),
        (b"12a", NON_NUMERIC, b"12a"),
        (b"0x10", NON_NUMERIC, b"0x10"),
        (
            b"18446744073709551616",
            NON_NUMERIC,
            b"18446744073709551616",
        ),
    ];
    const NON_NUMERIC: &[u8] = b"CLIENT_ERROR cannot increment or decrement non-numeric value\r\n";
    for (value, reply, after) in cases {
        let mut set = format!("set n 0 0 {}\r\n", value.len()).into_bytes();
        set.extend_from_slice(value);
        set.extend_from_slice(b"\r\n");
        c.roundtrip(&set, b"STORED\r\n");
        c.roundtrip(b"incr n 1\r\n", reply);
        let mut get = format!("VALUE n 0 {}\r\n", after.len()).into_bytes();
        get.extend_from_slice(after);
        get.extend_from_slice(b"\r\nEND\r\n");
        c.roundtrip(b"get n\r\n", &get);
    }
    c.roundtrip(b"set n 0 0 4\r\n  12\r\n", b"STORED\r\n");
    c.roundtrip(b"decr n 1\r\n", b"11\r\n");
    c.roundtrip(b"get n\r\n", b"VALUE n 0 4\r\n11  \r\nEND\r\n");
}

#[test]
fn touch_gat_and_expiry() {
    let s = server();
    let mut c = s.connect();
    let steps: &[(&[u8], &[u8])] = &[
        (b"touch nope 10\r\n", b"NOT_FOUND\r\n"),
        (b"set t 1 0 1\r\nv\r\n", b"STORED\r\n"),
        (b"touch t 100\r\n", b"TOUCHED\r\n"),
        (b"gat 200 t nope\r\n", b"VALUE t 1 1\r\nv\r\nEND\r\n"),
        // negative expiry: stored but immediately expired
        (b"set gone 0 -1 1\r\nv\r\n", b"STORED\r\n"),
        (b"get gone\r\n", b"END\r\n"),
        // absolute time in the past (larger than 30 days, so absolute): expired
        (b"set past 0 2592001 1\r\nv\r\n", b"STORED\r\n"),
        (b"get past\r\n", b"END\r\n"),
        // touch to a negative time expires it
        (b"touch t -1\r\n", b"TOUCHED\r\n"),
        (b"get t\r\n", b"END\r\n"),
    ];
    for (req, want) in steps {
        c.roundtrip(req, want);
    }
    c.roundtrip(b"set g 0 0 1\r\nv\r\n", b"STORED\r\n");
    c.send(b"gats 100 g\r\n");
    let header = c.line();
    assert!(header.starts_with("VALUE g 0 1 "), "{header}");
    c.expect(b"v\r\nEND\r\n");
}

/// `gat`/`gats`/`mg T` with a negative or past exptime return the value once, then the item
/// is expired (memcached 1.6.18: `gat -1 a` answers `VALUE a 0 2`, the next `get a` `END`).
#[test]
fn gat_with_past_exptime_returns_the_value_then_expires_it() {
    let s = server();
    let mut c = s.connect();
    let steps: &[(&[u8], &[u8])] = &[
        (b"set a 0 0 2\r\nhi\r\n", b"STORED\r\n"),
        (b"gat -1 a\r\n", b"VALUE a 0 2\r\nhi\r\nEND\r\n"),
        (b"get a\r\n", b"END\r\n"),
        (b"set b 3 0 2\r\nhi\r\n", b"STORED\r\n"),
        // an absolute time in the past (above 30 days, so absolute)
        (b"gat 2592001 b\r\n", b"VALUE b 3 2\r\nhi\r\nEND\r\n"),
        (b"gat 0 b\r\n", b"END\r\n"),
        (b"set m 0 0 2\r\nhi\r\n", b"STORED\r\n"),
        (b"mg m v T-1\r\n", b"VA 2\r\nhi\r\n"),
        (b"mg m v\r\n", b"EN\r\n"),
    ];
    for (req, want) in steps {
        c.roundtrip(req, want);
    }
    c.roundtrip(b"set g 0 0 2\r\nhi\r\n", b"STORED\r\n");
    c.send(b"gats -1 g\r\n");
    let header = c.line();
    assert!(header.starts_with("VALUE g 0 2 "), "{header}");
    c.expect(b"hi\r\nEND\r\n");
    c.roundtrip(b"gets g\r\n", b"END\r\n");
}

#[test]
fn relative_expiry_elapses() {
    let s = server();
    let mut c = s.connect();
    c.roundtrip(b"set soon 0 1 1\r\nv\r\n", b"STORED\r\n");
    c.roundtrip(b"set later 0 100 1\r\nv\r\n", b"STORED\r\n");
    // Expiry has one-second resolution: poll (bounded) until the short one is gone.
    let mut gone = false;
    for _ in 0..60 {
        c.send(b"get soon\r\n");
        if c.line() == "END" {
            gone = true;
            break;
        }
        c.lines_until_end();
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(gone, "item with 1 s TTL still served after 6 s");
    c.roundtrip(b"get later\r\n", b"VALUE later 0 1\r\nv\r\nEND\r\n");
}

#[test]
fn flush_all_now_and_delayed() {
    let s = server();
    let mut c = s.connect();
    c.roundtrip(b"set a 0 0 1\r\n1\r\n", b"STORED\r\n");
    c.roundtrip(b"flush_all\r\n", b"OK\r\n");
    c.roundtrip(b"get a\r\n", b"END\r\n");
    c.roundtrip(b"set a 0 0 1\r\n1\r\n", b"STORED\r\n");
    c.roundtrip(b"get a\r\n", b"VALUE a 0 1\r\n1\r\nEND\r\n");
    c.roundtrip(b"flush_all 2\r\n", b"OK\r\n");
    c.roundtrip(b"get a\r\n", b"VALUE a 0 1\r\n1\r\nEND\r\n");
    let mut flushed = false;
    for _ in 0..80 {
        c.send(b"get a\r\n");
        if c.line() == "END" {
            flushed = true;
            break;
        }
        c.lines_until_end();
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(flushed, "delayed flush_all never took effect");
    c.roundtrip(b"flush_all noreply\r\nversion\r\n", b"VERSION ");
    c.line();
}

#[test]
fn errors_keep_the_connection_usable() {
    let s = server();
    let mut c = s.connect();
    let steps: &[(&[u8], &[u8])] = &[
        (b"bogus\r\n", b"ERROR\r\n"),
        (b"\r\n", b"ERROR\r\n"),
        (b"get\r\n", b"ERROR\r\n"),
        (b"set x 0 0\r\n", b"ERROR\r\n"),
        (
            b"set x 0 0 notanumber\r\n",
            b"CLIENT_ERROR bad command line format\r\n",
        ),
        // data block longer than announced
        (
            b"set x 0 0 1\r\nabc\r\n",
            b"CLIENT_ERROR bad data chunk\r\nERROR\r\n",
        ),
        (b"set ok 0 0 1\r\nv\r\n", b"STORED\r\n"),
    ];
    for (req, want) in steps {
        c.roundtrip(req, want);
    }
    let long_key = "k".repeat(251);
    c.roundtrip(
        format!("get {long_key}\r\n").as_bytes(),
        b"CLIENT_ERROR bad command line format\r\n",
    );
    c.roundtrip(b"get ok\r\n", b"VALUE ok 0 1\r\nv\r\nEND\r\n");
}

#[test]
fn values_over_item_size_max_are_refused_and_swallowed() {
    let s = Server::start(&["-m", "64", "-I", "1m"]);
    let mut c = s.connect();
    let n = 1024 * 1024 + 1;
    let mut req = format!("set big 0 0 {n}\r\n").into_bytes();
    req.extend(std::iter::repeat_n(b'x', n));
    req.extend_from_slice(b"\r\nget big\r\n");
    c.send(&req);
    c.expect(b"SERVER_ERROR object too large for cache\r\nEND\r\n");
    // A large value that fits is stored and returned intact.
    let n = 512 * 1024;
    let value: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
    let mut req = format!("set ok 0 0 {n}\r\n").into_bytes();
    req.extend_from_slice(&value);
    req.extend_from_slice(b"\r\n");
    c.roundtrip(&req, b"STORED\r\n");
    c.send(b"get ok\r\n");
    assert_eq!(c.line(), format!("VALUE ok 0 {n}"));
    assert_eq!(c.read_exact_len(n), value);
    c.expect(b"\r\nEND\r\n");
}

/// memcached 1.6.18 counts the whole item against `-I`: a value fits when
/// `key + value + 59` (+ 4 with non-zero flags) is at most item_size_max, and
/// `stats settings` reports the `-I` value. Measured with a bisecting `set` on
/// `memcached -I 512k|1m|2m|4m`: 524 228, 1 048 516, 2 097 092, 4 194 244 with
/// key `k`; 1 048 267 with a 250-byte key.
#[test]
fn item_size_max_counts_the_whole_item_as_memcached() {
    const TOO_LARGE: &[u8] = b"SERVER_ERROR object too large for cache\r\n";
    for (flag, item) in [("512k", 512 << 10), ("1m", 1 << 20), ("2m", 2 << 20)] {
        let s = Server::start(&["-m", "64", "-I", flag]);
        let mut c = s.connect();
        let largest = item - 1 - 59;
        c.roundtrip(&set_of("k", 0, largest), b"STORED\r\n");
        c.roundtrip(b"mg k s\r\n", format!("HD s{largest}\r\n").as_bytes());
        // One more byte is too large, and the refused set drops the old item.
        c.roundtrip(&set_of("k", 0, largest + 1), TOO_LARGE);
        c.roundtrip(b"mg k s\r\n", b"EN\r\n");
        // Non-zero flags cost 4 bytes.
        c.roundtrip(&set_of("f", 1, largest - 4), b"STORED\r\n");
        c.roundtrip(&set_of("f", 1, largest - 3), TOO_LARGE);
        // The key counts too.
        let long = "k".repeat(250);
        c.roundtrip(&set_of(&long, 0, largest + 1 - 250), b"STORED\r\n");
        c.roundtrip(&set_of(&long, 0, largest + 2 - 250), TOO_LARGE);
        let settings = c.stats("settings");
        let reported = settings.iter().find(|(k, _)| k == "item_size_max");
        assert_eq!(
            reported.map(|(_, v)| v.as_str()),
            Some(item.to_string().as_str()),
            "-I {flag}"
        );
    }
}

/// memcached 1.6.18 answers an append/prepend that would make the item too
/// large `NOT_STORED` (`NS` for ms) and keeps the item; an ms refused as too
/// large drops the key's item in every mode.
#[test]
fn appending_past_item_size_max_is_not_stored() {
    let s = server();
    let mut c = s.connect();
    let largest = (1 << 20) - 1 - 59;
    c.roundtrip(&set_of("a", 0, largest), b"STORED\r\n");
    c.roundtrip(b"append a 0 0 1\r\nx\r\n", b"NOT_STORED\r\n");
    c.roundtrip(b"prepend a 0 0 1\r\nx\r\n", b"NOT_STORED\r\n");
    c.roundtrip(b"ms a 1 MA\r\nx\r\n", b"NS\r\n");
    c.roundtrip(b"ms a 1 MP\r\nx\r\n", b"NS\r\n");
    c.roundtrip(b"mg a s\r\n", format!("HD s{largest}\r\n").as_bytes());
    c.roundtrip(b"set b 0 0 1\r\ny\r\n", b"STORED\r\n");
    let mut req = format!("ms b {} MA\r\n", largest + 1).into_bytes();
    req.resize(req.len() + largest + 1, b'v');
    req.extend_from_slice(b"\r\nmg b v\r\n");
    c.roundtrip(&req, b"SERVER_ERROR object too large for cache\r\nEN\r\n");
}

#[test]
fn pipelined_requests_answered_in_order_even_when_split_byte_by_byte() {
    let s = server();
    let mut c = s.connect();
    let mut req = Vec::new();
    let mut want = Vec::new();
    for i in 0..200 {
        req.extend_from_slice(
            format!("set k{i} {i} 0 {}\r\nv{i}\r\n", format!("v{i}").len()).as_bytes(),
        );
        want.extend_from_slice(b"STORED\r\n");
    }
    for i in 0..200 {
        req.extend_from_slice(format!("get k{i}\r\n").as_bytes());
        want.extend_from_slice(
            format!(
                "VALUE k{i} {i} {}\r\nv{i}\r\nEND\r\n",
                format!("v{i}").len()
            )
            .as_bytes(),
        );
    }
    c.send(&req);
    c.expect(&want);
    // The same stream again, one byte per write.
    let mut c = s.connect();
    let small = b"set s 0 0 5\r\nhello\r\nget s\r\nincr nope 1\r\n";
    for b in small {
        c.send(&[*b]);
    }
    c.expect(b"STORED\r\nVALUE s 0 5\r\nhello\r\nEND\r\nNOT_FOUND\r\n");
}

/// memcached serves a get/gets/gat of any number of keys and any line length (measured on
/// 1.6.18: 1 000 and 10 000 keys, a 128 KiB line); cellcache answers them in batches.
#[test]
fn multi_get_of_thousands_of_keys_and_long_lines() {
    let s = server();
    let mut c = s.connect();
    c.roundtrip(b"set k 0 0 2\r\nab\r\n", b"STORED\r\n");
    c.roundtrip(b"set k7 1 0 1\r\nz\r\n", b"STORED\r\n");
    for n in [1_000, 10_000] {
        let keys: Vec<&str> = (0..n)
            .map(|i| if i % 2 == 0 { "k" } else { "nope" })
            .collect();
        let want = "VALUE k 0 2\r\nab\r\n".repeat(n / 2) + "END\r\n";
        // memcached lets only get/gets lines grow past 2 KiB while they arrive; a long gat
        // line it serves only when it comes in one read (docs/protocol.md, difference 3).
        let commands: &[&str] = if common::is_memcached() {
            &["get"]
        } else {
            &["get", "gat 0"]
        };
        for cmd in commands {
            let got = read_until(
                &mut c,
                format!("{cmd} {}\r\n", keys.join(" ")).as_bytes(),
                b"END\r\n",
            );
            assert_eq!(got.len(), want.len(), "{cmd} of {n} keys");
            assert_eq!(got, want.as_bytes(), "{cmd} of {n} keys");
        }
    }
    // A 128 KiB line of 250-byte keys with two hits in it, sent in pieces.
    let long = "x".repeat(250);
    let mut line = String::from("gets");
    let mut hits = 0;
    while line.len() < 128 << 10 {
        line.push(' ');
        if line.len() % 7 == 0 {
            line.push_str("k7");
            hits += 1;
        } else {
            line.push_str(&long);
        }
    }
    line.push_str("\r\nget k\r\n");
    for piece in line.as_bytes().chunks(10_000) {
        c.send(piece);
    }
    for _ in 0..hits {
        let header = c.line();
        assert!(header.starts_with("VALUE k7 1 1 "), "{header}");
        assert_eq!(c.line(), "z");
    }
    assert_eq!(c.line(), "END");
    c.expect(b"VALUE k 0 2\r\nab\r\nEND\r\n");
    // A too-long key ends the line with an error; the connection goes on.
    c.roundtrip(
        format!("get k {}\r\nget k\r\n", "y".repeat(251)).as_bytes(),
        b"CLIENT_ERROR bad command line format\r\nVALUE k 0 2\r\nab\r\nEND\r\n",
    );
}

/// What closes a connection, as memcached 1.6.18 (docs/protocol.md, "Closing"): an HTTP
/// request line, and a command line (other than a retrieval) too long to frame. Unknown
/// commands and bad data chunks do not.
#[test]
fn garbage_that_closes_the_connection() {
    let s = server();
    let mut c = s.connect();
    c.roundtrip(b"GET /\r\n", b"ERROR\r\n");
    c.roundtrip(b"foo HTTP/1.1 x\r\n", b"ERROR\r\n");
    c.roundtrip(
        b"set k 0 0 2\r\nabcd\r\nversion\r\n",
        b"CLIENT_ERROR bad data chunk\r\nERROR\r\nVERSION ",
    );
    c.line();
    c.send(b"GET / HTTP/1.0\r\n\r\n");
    assert!(
        closed(&mut c),
        "an HTTP request line must close the connection"
    );

    let mut c = s.connect();
    let mut long = b"foo ".to_vec();
    long.extend_from_slice(&vec![b'x'; 100_000]);
    long.extend_from_slice(b"\r\nversion\r\n");
    // The server may close before all of it is sent.
    let _ = std::io::Write::write_all(&mut c.stream, &long);
    assert!(
        closed(&mut c),
        "a 100 KB command line must close the connection"
    );
}
