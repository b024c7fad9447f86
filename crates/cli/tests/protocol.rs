//! The memcached text protocol over a real socket, as `(request bytes, expected reply)`
//! tables. Run with `CELLCACHE_TEST_SERVER=memcached` to check the tables against Debian's
//! memcached; by default they run against the `cellcache` binary.

mod common;

use common::{Client, Server};

fn server() -> Server {
    Server::start(&["-m", "64", "-t", "2"])
}

/// Reads the CAS unique of `key` via `gets`.
fn cas_of(c: &mut Client, key: &str) -> u64 {
    c.send(format!("gets {key}\r\n").as_bytes());
    let header = c.line();
    let parts: Vec<&str> = header.split(' ').collect();
    assert_eq!(parts[0], "VALUE", "{header}");
    let len: usize = parts[3].parse().unwrap();
    c.read_exact_len(len + 2);
    assert_eq!(c.line(), "END");
    parts[4].parse().unwrap()
}

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

/// `set <key> <flags> 0 <n>` with an `n`-byte value.
fn set_of(key: &str, flags: u32, n: usize) -> Vec<u8> {
    let mut req = format!("set {key} {flags} 0 {n}\r\n").into_bytes();
    req.resize(req.len() + n, b'v');
    req.extend_from_slice(b"\r\n");
    req
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

#[test]
fn version_verbosity_quit() {
    let s = server();
    let mut c = s.connect();
    c.send(b"version\r\n");
    assert!(c.line().starts_with("VERSION "));
    c.roundtrip(b"verbosity 1\r\n", b"OK\r\n");
    // As memcached: the level set is what `stats settings` reports (clients read it).
    assert_eq!(c.stat_of("settings", "verbosity"), "1");
    c.roundtrip(b"verbosity 1 noreply\r\nversion\r\n", b"VERSION ");
    c.line();
    c.send(b"quit\r\n");
    assert!(c.is_closed());
}

#[test]
fn stats_report_memcached_fields() {
    let s = server();
    let mut c = s.connect();
    c.roundtrip(
        b"set a 0 0 1\r\n1\r\nget a\r\nget b\r\n",
        b"STORED\r\nVALUE a 0 1\r\n1\r\nEND\r\nEND\r\n",
    );
    let stats = c.stats("");
    let get = |k: &str| {
        stats
            .iter()
            .find(|(n, _)| n == k)
            .unwrap_or_else(|| panic!("stats lacks {k}"))
            .1
            .clone()
    };
    for field in [
        "pid",
        "uptime",
        "time",
        "version",
        "curr_connections",
        "total_connections",
        "cmd_get",
        "cmd_set",
        "get_hits",
        "get_misses",
        "curr_items",
        "total_items",
        "bytes",
        "limit_maxbytes",
        "evictions",
        "threads",
        "bytes_read",
        "bytes_written",
    ] {
        get(field);
    }
    assert_eq!(get("get_hits"), "1");
    assert_eq!(get("get_misses"), "1");
    assert_eq!(get("cmd_set"), "1");
    assert_eq!(get("curr_items"), "1");
    // Through a ring: the memory for distinct items, every cell's over the two copies.
    let cells = common::test_ring_size();
    let limit = 64 * 1024 * 1024 * cells / cells.min(2);
    assert_eq!(get("limit_maxbytes"), limit.to_string());
    assert_eq!(get("threads"), "2");
    let settings = c.stats("settings");
    assert!(
        settings
            .iter()
            .any(|(k, v)| k == "maxbytes" && v == &(64 * 1024 * 1024).to_string())
    );
    assert!(settings.iter().any(|(k, _)| k == "item_size_max"));
    let items = c.stats("items");
    assert!(
        !items.is_empty(),
        "stats items lists the slab(s) holding items"
    );
    c.stats("slabs");
    c.roundtrip(b"stats nonsense\r\n", b"ERROR\r\n");
}

#[test]
fn meta_commands() {
    let s = server();
    let mut c = s.connect();
    let steps: &[(&[u8], &[u8])] = &[
        (b"mn\r\n", b"MN\r\n"),
        (b"ms mk 2 T0 F5\r\nhi\r\n", b"HD\r\n"),
        (b"mg mk v f\r\n", b"VA 2 f5\r\nhi\r\n"),
        (b"mg mk s k\r\n", b"HD s2 kmk\r\n"),
        (b"mg missing v\r\n", b"EN\r\n"),
        (b"mg missing v q\r\nmn\r\n", b"MN\r\n"),
        (b"mg mk v O123\r\n", b"VA 2 O123\r\nhi\r\n"),
        (b"ms mk 3 MA\r\n!!!\r\n", b"HD\r\n"),
        (b"mg mk v\r\n", b"VA 5\r\nhi!!!\r\n"),
        (b"ms new 1 MR\r\nx\r\n", b"NS\r\n"),
        (b"ms mk 1 ME\r\nx\r\n", b"NS\r\n"),
        (b"md mk\r\n", b"HD\r\n"),
        (b"md mk\r\n", b"NF\r\n"),
        // quiet mode hides HD but still reports NF
        (b"md mk q\r\nmn\r\n", b"NF\r\nMN\r\n"),
        (b"ms qq 1 q\r\nx\r\nmd qq q\r\nmn\r\n", b"MN\r\n"),
        (b"ma cnt\r\n", b"NF\r\n"),
        (b"ma cnt N0 J10 v\r\n", b"VA 2\r\n10\r\n"),
        (b"ma cnt v\r\n", b"VA 2\r\n11\r\n"),
        (b"ma cnt MD D5 v\r\n", b"VA 1\r\n6\r\n"),
        (b"ma cnt\r\n", b"HD\r\n"),
        (b"me cnt\r\n", b"ME cnt "),
    ];
    for (req, want) in steps {
        c.roundtrip(req, want);
    }
    c.line(); // rest of the `me` debug line
    // CAS through meta: mg c returns it, ms C compares it.
    c.roundtrip(b"ms ck 1\r\na\r\n", b"HD\r\n");
    c.send(b"mg ck c\r\n");
    let line = c.line();
    let cas: u64 = line.strip_prefix("HD c").expect(&line).parse().unwrap();
    c.roundtrip(
        format!("ms ck 1 C{}\r\nb\r\n", cas + 1).as_bytes(),
        b"EX\r\n",
    );
    c.roundtrip(format!("ms ck 1 C{cas}\r\nb\r\n").as_bytes(), b"HD\r\n");
    c.roundtrip(b"mg ck v\r\n", b"VA 1\r\nb\r\n");
    // Invalidation: md I marks stale; mg then reports X and W once.
    c.roundtrip(b"md ck I T30\r\n", b"HD\r\n");
    c.roundtrip(b"mg ck v\r\n", b"VA 1 X W\r\nb\r\n");
    c.roundtrip(b"mg ck v\r\n", b"VA 1 Z X\r\nb\r\n");
    // Base64 keys.
    c.roundtrip(b"ms Zm9v 1 b\r\nz\r\n", b"HD\r\n");
    c.roundtrip(b"mg foo v\r\n", b"VA 1\r\nz\r\n");
    // Errors.
    c.roundtrip(b"mg Zm9v b v\r\n", b"VA 1\r\nz\r\n");
    // Errors; quiet mode still reports NF for ma, EN for me of a missing key.
    c.roundtrip(b"mg\r\n", b"ERROR\r\n");
    c.roundtrip(
        b"ms k notanumber\r\n",
        b"CLIENT_ERROR bad command line format\r\n",
    );
    c.roundtrip(b"me nope\r\n", b"EN\r\n");
    c.roundtrip(b"ma nope q\r\nmn\r\n", b"NF\r\nMN\r\n");
}

/// The CAS `mg <key> c` reports (`HD c<cas> …`).
fn meta_cas(c: &mut Client, key: &str) -> u64 {
    c.send(format!("mg {key} c\r\n").as_bytes());
    let line = c.line();
    let rest = line.strip_prefix("HD c").expect(&line);
    rest.split(' ').next().unwrap().parse().unwrap()
}

/// Stale items, win/recache tokens and vivify, as memcached 1.6.18 answers them (every
/// expected line was measured against it; TTLs other than -1 and CAS values are compared
/// only relatively, since they depend on the clock and the server's CAS counter).
#[test]
fn meta_stale_win_recache_and_vivify_as_memcached() {
    let s = server();
    let mut c = s.connect();
    c.roundtrip(b"ms a 2 T0\r\nhi\r\n", b"HD\r\n");
    let fresh = meta_cas(&mut c, "a");
    // md I marks stale and gives the item a new CAS (regression: cellcache kept the old one).
    c.roundtrip(b"md a I\r\n", b"HD\r\n");
    c.send(b"mg a c v\r\n");
    let line = c.line();
    let stale: u64 = line
        .strip_prefix("VA 2 c")
        .and_then(|r| r.strip_suffix(" X W"))
        .expect(&line)
        .parse()
        .unwrap();
    assert_ne!(stale, fresh, "md I bumps the CAS");
    assert_eq!(c.line(), "hi");
    c.roundtrip(b"mg a v\r\n", b"VA 2 Z X\r\nhi\r\n");
    c.roundtrip(b"mg a t\r\n", b"HD t-1 Z X\r\n");
    // The old CAS no longer deletes it.
    c.roundtrip(format!("md a C{fresh}\r\n").as_bytes(), b"EX\r\n");
    // ms I with an older CAS stores, still stale, and the token already handed out stays
    // handed out (regression: cellcache handed a second W).
    c.roundtrip(format!("ms a 2 I C{fresh}\r\nzz\r\n").as_bytes(), b"HD\r\n");
    c.roundtrip(b"mg a v\r\n", b"VA 2 Z X\r\nzz\r\n");
    // A newer CAS that does not match is still EX, with or without I.
    c.roundtrip(
        format!("ms a 2 I C{}\r\nyy\r\n", stale + 1_000_000).as_bytes(),
        b"EX\r\n",
    );
    // A plain write clears the stale state.
    c.roundtrip(b"ms a 2\r\nok\r\n", b"HD\r\n");
    c.roundtrip(b"mg a v t\r\n", b"VA 2 t-1\r\nok\r\n");
    // ms I without C is a plain set.
    c.roundtrip(b"md a I\r\nms a 2 I\r\nnn\r\n", b"HD\r\nHD\r\n");
    c.roundtrip(b"mg a v\r\n", b"VA 2\r\nnn\r\n");
    // md I / ms I C on a missing key.
    c.roundtrip(b"md gone I\r\n", b"NF\r\n");
    c.roundtrip(b"ms gone 2 I C1\r\nzz\r\n", b"NF\r\n");
    // Stale with a stale TTL: md I T30 keeps the item and the reader wins.
    c.roundtrip(
        b"ms st 2 T100\r\nab\r\nmd st I T30 q\r\nmn\r\n",
        b"HD\r\nMN\r\n",
    );
    c.send(b"mg st v t\r\n");
    let line = c.line();
    assert!(
        line.starts_with("VA 2 t") && line.ends_with(" X W"),
        "{line}"
    );
    assert_eq!(c.line(), "ab");
    // Vivify on miss: the first reader gets an empty item and W, later ones Z.
    c.roundtrip(b"mg vv N30 v\r\n", b"VA 0 W\r\n\r\n");
    c.roundtrip(b"mg vv N30 v\r\n", b"VA 0 Z\r\n\r\n");
    c.roundtrip(b"mg vv s f\r\n", b"HD s0 f0 Z\r\n");
    c.roundtrip(b"mg vv q v\r\n", b"VA 0 Z\r\n\r\n");
    c.roundtrip(b"ms vv 3\r\nabc\r\n", b"HD\r\n");
    c.roundtrip(b"mg vv v\r\n", b"VA 3\r\nabc\r\n");
    c.roundtrip(b"mg vq N30 q v\r\n", b"VA 0 W\r\n\r\n");
    // Recache: a TTL below R wins once; a higher R after that sees Z.
    c.roundtrip(b"ms b 1 T100\r\nx\r\n", b"HD\r\n");
    c.roundtrip(b"mg b R200 v\r\n", b"VA 1 W\r\nx\r\n");
    c.roundtrip(b"mg b R200 v\r\n", b"VA 1 Z\r\nx\r\n");
    c.roundtrip(b"mg b R50 v\r\n", b"VA 1 Z\r\nx\r\n");
    c.roundtrip(b"ms b 1 T100\r\ny\r\nmg b R200\r\n", b"HD\r\nHD W\r\n");
    c.roundtrip(
        b"ms nx 1\r\nx\r\nmg nx R30 v t\r\n",
        b"HD\r\nVA 1 t-1\r\nx\r\n",
    );
    // A stale item with R: the stale win comes first.
    c.roundtrip(
        b"md nx I\r\nmg nx R30 t v\r\n",
        b"HD\r\nVA 1 t-1 X W\r\nx\r\n",
    );
    c.roundtrip(b"mg nx N30 t v\r\n", b"VA 1 t-1 Z X\r\nx\r\n");
}

/// Keys, opaques and quiet mode per meta command, as memcached 1.6.18 answers them.
#[test]
fn meta_keys_opaque_and_quiet_mode_as_memcached() {
    let s = server();
    let mut c = s.connect();
    let steps: &[(&[u8], &[u8])] = &[
        (b"ms a 2 T0 F5\r\nhi\r\n", b"HD\r\n"),
        (
            b"mg a v t f k s O99 q\r\n",
            b"VA 2 t-1 f5 ka s2 O99\r\nhi\r\n",
        ),
        (b"mg a k b\r\n", b"CLIENT_ERROR error decoding key\r\n"),
        (b"ms YWJj 2 b\r\nzz\r\n", b"HD\r\n"),
        (b"mg YWJj b k v\r\n", b"VA 2 kYWJj b\r\nzz\r\n"),
        // An item's key is echoed as it was stored, whatever the request's form
        // (regression: cellcache echoed the request's form).
        (b"mg abc k v\r\n", b"VA 2 kYWJj b\r\nzz\r\n"),
        (b"ms ab 2\r\nzz\r\n", b"HD\r\n"),
        (b"mg YWI= b k v\r\n", b"VA 2 kab\r\nzz\r\n"),
        // Only ms flags an item as stored through a base64 key; ma N and mg N do not.
        (b"ma YWJk b N0 J1\r\nmg abd k\r\n", b"HD\r\nHD kabd\r\n"),
        (
            b"mg YWJl b N30 k s\r\nmg abe k\r\n",
            b"HD kabe s0 W\r\nHD kabe Z\r\n",
        ),
        (b"ms eA== 1 k b\r\ny\r\n", b"HD keA== b\r\n"),
        (b"md eA== b k\r\n", b"HD keA== b\r\n"),
        (b"mg eA== b k v\r\n", b"EN keA== b\r\n"),
        (b"mg nokey k O1 v\r\n", b"EN knokey O1\r\n"),
        (b"mg nokey s v t f\r\n", b"EN\r\n"),
        (b"mg nokey k O1 v q\r\nmn\r\n", b"MN\r\n"),
        (b"ms o 1 O\r\nx\r\n", b"HD O\r\n"),
        (
            b"ms o 1 Oabc Odef\r\nx\r\n",
            b"CLIENT_ERROR duplicate flag\r\n",
        ),
        // quiet: md hides HD, shows NF with its key and opaque
        (b"md o q\r\nmd o q\r\nmn\r\n", b"NF\r\nMN\r\n"),
        (b"md nope q k O5\r\n", b"NF knope O5\r\n"),
        // quiet: ms hides HD, shows NS
        (b"ms c 1 q O7 k\r\nx\r\nmn\r\n", b"MN\r\n"),
        (b"ms c2 1 MR q k O3\r\nx\r\n", b"NS kc2 O3\r\n"),
        (b"ms c 1 ME k O3\r\nx\r\n", b"NS kc O3\r\n"),
        // ms modes are upper case only (regression: cellcache took `Ms` `Ma` …)
        (
            b"ms c 1 Ms\r\nx\r\n",
            b"CLIENT_ERROR invalid mode for ms M token\r\n",
        ),
        (
            b"ms c 1 Ma\r\nx\r\n",
            b"CLIENT_ERROR invalid mode for ms M token\r\n",
        ),
        (b"ms c 1 MP\r\ny\r\nmg c v\r\n", b"HD\r\nVA 2\r\nyx\r\n"),
        // ma: quiet hides success even with v (regression: cellcache sent the VA)
        (b"ma n q\r\nmn\r\n", b"NF\r\nMN\r\n"),
        // ... but not a counter created by N (regression: cellcache hid its HD)
        (b"ma viv q N0 J5\r\nma viv q v\r\nmn\r\n", b"HD\r\nMN\r\n"),
        (b"ma viv2 q N0 J5 v\r\n", b"VA 1\r\n5\r\n"),
        (b"ma n N0 J13 v t\r\n", b"VA 2 t-1\r\n13\r\n"),
        (b"ma n q v\r\nma n q\r\nmn\r\n", b"MN\r\n"),
        (b"ma n v\r\n", b"VA 2\r\n16\r\n"),
        (
            b"ma n MD D20 v\r\nma n M- v\r\n",
            b"VA 1\r\n0\r\nVA 1\r\n0\r\n",
        ),
        (
            b"ma n M+ D5 v\r\nma n MI D5 v\r\n",
            b"VA 1\r\n5\r\nVA 2\r\n10\r\n",
        ),
        (
            b"ma n Mi\r\n",
            b"CLIENT_ERROR invalid mode for ma M token\r\n",
        ),
        (
            b"ma n Md\r\n",
            b"CLIENT_ERROR invalid mode for ma M token\r\n",
        ),
        (b"ma n2 N10 J5 k O7 v\r\n", b"VA 1 kn2 O7\r\n5\r\n"),
        (b"ma n2 k O7\r\n", b"HD kn2 O7\r\n"),
        (b"ma n3 k O7 q\r\n", b"NF kn3 O7\r\n"),
        (
            b"ms nn 2\r\nab\r\nma nn q\r\n",
            b"HD\r\nCLIENT_ERROR cannot increment or decrement non-numeric value\r\n",
        ),
        (b"ms big 5 T-1\r\nhello\r\nmg big v\r\n", b"HD\r\nEN\r\n"),
        (b"mn\r\n", b"MN\r\n"),
    ];
    for (req, want) in steps {
        c.roundtrip(req, want);
    }
}

/// `me`: memcached's fields; `size` is memcached's item size (regression: cellcache
/// printed its own packed size), `fetch` follows reads, `exp=-1` without expiry.
#[test]
fn meta_debug_fields_as_memcached() {
    let s = server();
    let mut c = s.connect();
    c.roundtrip(b"ms plain 3 F7\r\nabc\r\n", b"HD\r\n");
    let field = |line: &str, name: &str| -> String {
        line.split(' ')
            .find_map(|f| f.strip_prefix(&format!("{name}=")))
            .unwrap_or_else(|| panic!("{line} lacks {name}"))
            .to_string()
    };
    c.send(b"me plain\r\n");
    let line = c.line();
    assert!(line.starts_with("ME plain exp=-1 la="), "{line}");
    // 48-byte header + key and NUL + value and \r\n + 8-byte CAS + 4 bytes of flags
    assert_eq!(field(&line, "size"), "71");
    assert_eq!(field(&line, "fetch"), "no");
    assert_eq!(field(&line, "cls"), "1");
    c.roundtrip(b"mg plain v\r\n", b"VA 3\r\nabc\r\n");
    c.send(b"me plain\r\n");
    let line = c.line();
    assert_eq!(field(&line, "fetch"), "yes");
    c.roundtrip(b"ms n 2\r\n14\r\n", b"HD\r\n");
    c.send(b"me n\r\n");
    assert_eq!(field(&c.line(), "size"), "62");
    c.roundtrip(b"me nope\r\n", b"EN\r\n");
    // The key as stored: base64 for an item stored through a base64 key.
    c.roundtrip(b"ms YWJj 1 b\r\nx\r\nms ab 1\r\nx\r\n", b"HD\r\nHD\r\n");
    c.send(b"me abc\r\n");
    let line = c.line();
    assert!(line.starts_with("ME YWJj exp=-1 "), "{line}");
    c.send(b"me YWI= b\r\n");
    let line = c.line();
    assert!(line.starts_with("ME ab exp=-1 "), "{line}");
}

/// `ms` with `N` in append/prepend mode creates a missing item (protocol.txt); memcached
/// 1.6.18 answers `NS` (it predates the flag), so this is cellcache-only.
#[test]
fn meta_set_append_vivifies_with_n() {
    if common::is_memcached() {
        return;
    }
    let s = server();
    let mut c = s.connect();
    c.roundtrip(b"ms d 1 MA N30\r\nz\r\n", b"HD\r\n");
    c.roundtrip(b"ms d 1 MP N30\r\ny\r\nmg d v\r\n", b"HD\r\nVA 2\r\nyz\r\n");
}

/// Reads reply lines up to and including `END`.
fn lines_to_end(c: &mut Client, req: &[u8]) -> Vec<String> {
    c.send(req);
    let mut lines = Vec::new();
    for _ in 0..10_000 {
        let l = c.line();
        if l == "END" {
            return lines;
        }
        lines.push(l);
    }
    panic!("no END after 10 000 lines");
}

/// `stats detail`, as memcached 1.6.18 answers it (measured): per-prefix counts of every
/// retrieved key, classic storage command and delete; meta commands, incr and touch are
/// not counted; keys without the delimiter neither; `stats reset` forgets the table.
/// In a ring the table is the cell's own (it counts what it executed), so this runs on
/// one cell.
#[test]
fn stats_detail_counts_per_prefix() {
    if common::test_ring_size() > 1 {
        return;
    }
    let s = server();
    let mut c = s.connect();
    c.roundtrip(
        b"stats detail\r\n",
        b"CLIENT_ERROR usage: stats detail on|off|dump\r\n",
    );
    c.roundtrip(
        b"stats detail ON\r\n",
        b"CLIENT_ERROR usage: stats detail on|off|dump\r\n",
    );
    c.roundtrip(b"stats detail dump\r\n", b"END\r\n");
    c.roundtrip(b"stats detail on\r\n", b"OK\r\n");
    let steps: &[(&[u8], &[u8])] = &[
        (b"set foo:a 0 0 1\r\nx\r\n", b"STORED\r\n"),
        (b"add foo:a 0 0 1\r\nx\r\n", b"NOT_STORED\r\n"),
        (b"set bar:a 0 100 2\r\nxy\r\n", b"STORED\r\n"),
        (b"set nodelim 0 0 1\r\nx\r\n", b"STORED\r\n"),
        (
            b"get foo:a foo:zz nodelim\r\n",
            b"VALUE foo:a 0 1\r\nx\r\nVALUE nodelim 0 1\r\nx\r\nEND\r\n",
        ),
        (b"delete foo:a\r\n", b"DELETED\r\n"),
        (b"delete foo:c\r\n", b"NOT_FOUND\r\n"),
        (b"touch bar:a 10\r\n", b"TOUCHED\r\n"),
        (b"mg bar:a v\r\n", b"VA 2\r\nxy\r\n"),
        (b"ms bar:x 1\r\nx\r\nmd bar:x\r\n", b"HD\r\nHD\r\n"),
    ];
    for (req, want) in steps {
        c.roundtrip(req, want);
    }
    let mut dump = lines_to_end(&mut c, b"stats detail dump\r\n");
    dump.sort();
    assert_eq!(
        dump,
        [
            "PREFIX bar get 0 hit 0 set 1 del 0",
            "PREFIX foo get 2 hit 1 set 2 del 2",
        ]
    );
    let settings = c.stats("settings");
    assert!(settings.contains(&("detail_enabled".into(), "yes".into())));
    assert!(settings.contains(&("stat_key_prefix".into(), ":".into())));
    // off stops counting, the table stays
    c.roundtrip(b"stats detail off extra\r\n", b"OK\r\n");
    c.roundtrip(b"get bar:a\r\n", b"VALUE bar:a 0 2\r\nxy\r\nEND\r\n");
    let mut again = lines_to_end(&mut c, b"stats detail dump\r\n");
    again.sort();
    assert_eq!(again, dump);
    c.roundtrip(b"stats reset\r\n", b"RESET\r\n");
    c.roundtrip(b"stats detail dump\r\n", b"END\r\n");
}

/// `-D <char>` sets the prefix delimiter and turns the counts on, as memcached's `-D`.
#[test]
fn stats_detail_with_dash_d() {
    if common::test_ring_size() > 1 {
        return;
    }
    let s = Server::start(&["-m", "64", "-D", "/"]);
    let mut c = s.connect();
    c.roundtrip(
        b"set a/b 0 0 1\r\nx\r\nget a/b c:d\r\n",
        b"STORED\r\nVALUE a/b 0 1\r\nx\r\nEND\r\n",
    );
    c.roundtrip(
        b"stats detail dump\r\n",
        b"PREFIX a get 1 hit 1 set 1 del 0\r\nEND\r\n",
    );
}

/// `stats cachedump <class> <limit>`: memcached's argument checks and line format. Which
/// items a dump lists differs (memcached walks one LRU segment, cellcache the whole arena),
/// so the listing is checked against cellcache only.
#[test]
fn stats_cachedump() {
    let s = server();
    let mut c = s.connect();
    let steps: &[(&[u8], &[u8])] = &[
        (b"stats cachedump\r\n", b"CLIENT_ERROR bad command line\r\n"),
        (
            b"stats cachedump 1\r\n",
            b"CLIENT_ERROR bad command line\r\n",
        ),
        (
            b"stats cachedump x 1\r\n",
            b"CLIENT_ERROR bad command line format\r\n",
        ),
        (
            b"stats cachedump 1 -1\r\n",
            b"CLIENT_ERROR bad command line format\r\n",
        ),
        (
            b"stats cachedump 64 1\r\n",
            b"CLIENT_ERROR Illegal slab id\r\n",
        ),
        (b"stats cachedump 63 1\r\n", b"END\r\n"),
        (b"stats cachedump 2 0\r\n", b"END\r\n"),
    ];
    for (req, want) in steps {
        c.roundtrip(req, want);
    }
    if common::is_memcached() || common::test_ring_size() > 1 {
        return;
    }
    c.roundtrip(b"stats cachedump 1 0\r\n", b"END\r\n");
    c.roundtrip(
        b"set k1 0 0 3\r\nabc\r\nset k2 0 0 1\r\nx\r\nset k3 0 1000000 2\r\nxy\r\n",
        b"STORED\r\nSTORED\r\nSTORED\r\n",
    );
    let mut all = lines_to_end(&mut c, b"stats cachedump 1 0\r\n");
    all.sort();
    assert_eq!(all[0], "ITEM k1 [3 b; 0 s]");
    assert_eq!(all[1], "ITEM k2 [1 b; 0 s]");
    let at: u64 = all[2]
        .strip_prefix("ITEM k3 [2 b; ")
        .and_then(|r| r.strip_suffix(" s]"))
        .expect(&all[2])
        .parse()
        .unwrap();
    assert!(at > 1_000_000_000, "absolute unix time: {at}");
    assert_eq!(lines_to_end(&mut c, b"stats cachedump 1 2\r\n").len(), 2);
}

/// `stats conns`, as memcached 1.6.18: per listener `<fd>:addr`, `<fd>:state
/// conn_listening`, `<fd>:secs_since_last_cmd`; per connection `<fd>:addr tcp:IP:PORT`,
/// `<fd>:listen_addr`, `<fd>:state` (`conn_parse_cmd` for the one asking) and
/// `<fd>:secs_since_last_cmd`.
#[test]
fn stats_conns_lists_listeners_and_connections() {
    let s = server();
    let mut asking = s.connect();
    let mut other = s.connect();
    other.roundtrip(b"version\r\n", b"VERSION ");
    other.line();
    let conns = asking.stats("conns");
    let value = |name: &str, value: &str| {
        conns
            .iter()
            .filter(|(k, v)| k.ends_with(name) && v == value)
            .count()
    };
    let listen = format!("tcp:{}", s.addr);
    assert_eq!(value(":addr", &listen), 1, "{conns:?}");
    assert_eq!(value(":state", "conn_listening"), 1, "{conns:?}");
    assert_eq!(value(":listen_addr", &listen), 2, "{conns:?}");
    assert_eq!(value(":state", "conn_parse_cmd"), 1, "{conns:?}");
    // Each connection's lines share its descriptor prefix; both clients are listed.
    let fds: std::collections::BTreeSet<&str> = conns
        .iter()
        .filter(|(k, _)| k.ends_with(":listen_addr"))
        .map(|(k, _)| k.split(':').next().unwrap())
        .collect();
    assert_eq!(fds.len(), 2);
    for fd in fds {
        for field in ["addr", "state", "secs_since_last_cmd"] {
            assert!(
                conns.iter().any(|(k, _)| k == &format!("{fd}:{field}")),
                "{fd}:{field} in {conns:?}"
            );
        }
    }
    drop(other);
    // The closed connection leaves the list (bounded wait: the server notices the close).
    common::wait_until(
        "a closed connection leaves stats conns",
        std::time::Duration::from_secs(10),
        std::time::Duration::from_millis(20),
        || {
            asking
                .stats("conns")
                .iter()
                .filter(|(k, _)| k.ends_with(":listen_addr"))
                .count()
                == 1
        },
    );
}

/// A repeated `-l` adds a listener (memcached 1.6.18: `-l 127.0.0.1 -l 127.0.0.2` serves
/// both, `stats settings inter` is `127.0.0.1,127.0.0.2`, and `stats conns` gives each
/// connection the listener it came through).
#[test]
fn repeated_dash_l_listens_on_every_address() {
    let s = Server::start(&["-m", "64", "-l", "127.0.0.2"]);
    let second = std::net::SocketAddr::from(([127, 0, 0, 2], s.addr.port()));
    let mut c = common::Client::to(second);
    c.roundtrip(b"set k 0 0 1\r\nx\r\n", b"STORED\r\n");
    let mut first = s.connect();
    first.roundtrip(b"get k\r\n", b"VALUE k 0 1\r\nx\r\nEND\r\n");
    let settings = c.stats("settings");
    assert!(
        settings.contains(&("inter".into(), "127.0.0.1,127.0.0.2".into())),
        "{settings:?}"
    );
    let conns = c.stats("conns");
    let listen = |addr: std::net::SocketAddr| {
        conns
            .iter()
            .filter(|(k, v)| k.ends_with(":listen_addr") && *v == format!("tcp:{addr}"))
            .count()
    };
    assert_eq!(listen(s.addr), 1, "{conns:?}");
    assert_eq!(listen(second), 1, "{conns:?}");
    assert_eq!(
        conns.iter().filter(|(_, v)| v == "conn_listening").count(),
        2
    );
}

/// An `-l IP:PORT` entry listens on its own port (memcached 1.6.18:
/// `-l 127.0.0.1:21601,127.0.0.1 -p 21600` serves both ports). One server only: a ring's
/// cells cannot share the fixed port.
#[test]
fn dash_l_with_a_port_listens_there() {
    if common::test_ring_size() > 1 {
        return;
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let own = format!("127.0.0.1:{port}");
    let s = Server::start(&["-m", "64", "-l", &own]);
    let mut c = common::Client::to(own.parse().unwrap());
    c.roundtrip(b"set k 0 0 1\r\nx\r\n", b"STORED\r\n");
    s.connect()
        .roundtrip(b"get k\r\n", b"VALUE k 0 1\r\nx\r\nEND\r\n");
    let settings = c.stats("settings");
    assert!(
        settings.contains(&("inter".into(), format!("127.0.0.1,{own}"))),
        "{settings:?}"
    );
}

/// The same address twice in one `-l` list fails the start with "Address already in use",
/// as memcached 1.6.18 (`-l 127.0.0.1,127.0.0.1`: "failed to listen on one of
/// interface(s) …: Address already in use", exit 71).
#[test]
fn dash_l_with_an_address_twice_fails() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string();
    let mut cmd = if common::is_memcached() {
        let mut c = std::process::Command::new("memcached");
        c.args(["-U", "0", "-u", "root"]);
        c
    } else {
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_cellcache"));
        c.args(["serve", "--standalone"]);
        if let Some(engine) = common::io_engine() {
            c.args(["--io-engine", &engine]);
        }
        c
    };
    cmd.args(["-l", "127.0.0.1,127.0.0.1", "-p", &port])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            panic!("the server kept running with an address given twice");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert!(!status.success());
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(err.contains("Address already in use"), "{err}");
}

/// `stats reset` zeroes what memcached 1.6.18's does (measured: `total_items`,
/// `total_connections`, `bytes_read`, `evictions`, `reclaimed`, … go to 0) and keeps the
/// gauges (`curr_items`, `curr_connections`). Regression: cellcache kept the item,
/// connection and traffic counters.
#[test]
fn stats_reset_clears_what_memcached_clears() {
    let s = server();
    let mut c = s.connect();
    c.roundtrip(
        b"set a 0 0 1\r\n1\r\nset b 0 0 1\r\n2\r\nget a\r\n",
        b"STORED\r\nSTORED\r\nVALUE a 0 1\r\n1\r\nEND\r\n",
    );
    c.roundtrip(b"stats reset\r\n", b"RESET\r\n");
    let stats = c.stats("");
    let get = |k: &str| -> u64 {
        stats
            .iter()
            .find(|(n, _)| n == k)
            .unwrap_or_else(|| panic!("stats lacks {k}"))
            .1
            .parse()
            .unwrap()
    };
    for zero in [
        "total_items",
        "cmd_get",
        "cmd_set",
        "get_hits",
        "evictions",
        "reclaimed",
        "expired_unfetched",
        "evicted_unfetched",
        "rejected_connections",
    ] {
        assert_eq!(get(zero), 0, "{zero} after stats reset");
    }
    if common::test_ring_size() == 1 {
        assert_eq!(get("total_connections"), 0);
    }
    // Only this `stats` request was read since the reset.
    assert!(get("bytes_read") < 100, "bytes_read {}", get("bytes_read"));
    assert_eq!(get("curr_items"), 2);
    assert!(get("curr_connections") >= 1);
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

/// Sends `req` and reads until `tail` ends the reply; returns everything read.
fn read_until(c: &mut Client, req: &[u8], tail: &[u8]) -> Vec<u8> {
    c.send(req);
    let mut got = Vec::new();
    // Bounded: every reply here is below 4 MiB.
    while !got.ends_with(tail) {
        assert!(got.len() < 4 << 20, "reply never ended with {tail:?}");
        got.extend_from_slice(&c.read_exact_len(1));
    }
    got
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

/// The server closed the connection: end of stream, or a reset (it closed with unread
/// input, so the kernel answered the rest with RST). A timeout is not a close.
fn closed(c: &mut Client) -> bool {
    let mut buf = [0u8; 64];
    loop {
        match std::io::Read::read(&mut c.stream, &mut buf) {
            Ok(0) => return true,
            Ok(_) => continue, // replies sent before the close
            Err(e) => return e.kind() == std::io::ErrorKind::ConnectionReset,
        }
    }
}

/// Administration commands, answered as memcached 1.6.18 does (measured with the same
/// lines); where cellcache has no such mechanism (slab classes, an LRU crawler) the answer
/// is memcached's for "nothing to do" (docs/protocol.md, "Administration").
#[test]
fn administration_commands_answer_like_memcached() {
    let s = server();
    let mut c = s.connect();
    let steps: &[(&[u8], &[u8])] = &[
        (b"shutdown foo\r\n", b"ERROR: shutdown not enabled\r\n"),
        (
            b"shutdown graceful x\r\n",
            b"ERROR: shutdown not enabled\r\n",
        ),
        (b"slabs automove 1\r\n", b"OK\r\n"),
        (b"slabs automove 0\r\n", b"OK\r\n"),
        (b"slabs automove 3\r\n", b"ERROR\r\n"),
        // memcached's t/strtol-testing.t: a level that is no number.
        (
            b"slabs automove invalid\r\n",
            b"CLIENT_ERROR bad command line format\r\n",
        ),
        (b"slabs automove\r\n", b"ERROR\r\n"),
        (
            b"slabs reassign 1 1\r\n",
            b"SAME src and dst class are identical\r\n",
        ),
        (
            b"slabs reassign 1 99\r\n",
            b"BADCLASS invalid src or dst class id\r\n",
        ),
        (
            b"slabs reassign 99 1\r\n",
            b"BADCLASS invalid src or dst class id\r\n",
        ),
        (
            b"slabs reassign x 1\r\n",
            b"CLIENT_ERROR bad command line format\r\n",
        ),
        (b"slabs reassign 1\r\n", b"ERROR\r\n"),
        (b"slabs foo\r\n", b"ERROR\r\n"),
        (b"slabs\r\n", b"ERROR\r\n"),
        (b"lru_crawler disable\r\n", b"OK\r\n"),
        (b"lru_crawler sleep 100\r\n", b"OK\r\n"),
        (b"lru_crawler tocrawl 10\r\n", b"OK\r\n"),
        (
            b"lru_crawler sleep x\r\n",
            b"CLIENT_ERROR bad command line format\r\n",
        ),
        (b"lru_crawler foo\r\n", b"ERROR\r\n"),
        (b"lru_crawler\r\n", b"ERROR\r\n"),
        (b"verbosity\r\n", b"ERROR\r\n"),
        (b"verbosity 1\r\n", b"OK\r\n"),
        (
            b"verbosity x\r\n",
            b"CLIENT_ERROR bad command line format\r\n",
        ),
        (b"verbosity 1 noreply\r\nverbosity 1 2\r\n", b"OK\r\n"),
        (b"verbosity 1 2 3\r\n", b"ERROR\r\n"),
        (b"cache_memlimit\r\n", b"ERROR\r\n"),
        (
            b"cache_memlimit 0\r\n",
            b"MEMLIMIT_TOO_SMALL cannot set maxbytes to less than 8m\r\n",
        ),
        (
            b"cache_memlimit 7\r\n",
            b"MEMLIMIT_TOO_SMALL cannot set maxbytes to less than 8m\r\n",
        ),
        (b"cache_memlimit x\r\n", b"ERROR\r\n"),
        (
            b"cache_memlimit 64 noreply\r\ncache_memlimit 64\r\n",
            b"OK\r\n",
        ),
    ];
    for (req, want) in steps {
        c.roundtrip(req, want);
    }
    if !common::is_memcached() {
        // No crawler: memcached's answers when its crawler is disabled.
        c.roundtrip(
            b"lru_crawler crawl all\r\n",
            b"CLIENT_ERROR lru crawler disabled\r\n",
        );
        c.roundtrip(
            b"lru_crawler metadump all\r\n",
            b"CLIENT_ERROR lru crawler disabled\r\n",
        );
        c.roundtrip(
            b"lru_crawler enable\r\n",
            b"ERROR failed to start lru crawler thread\r\n",
        );
    }
    // With shutdown enabled, a bad mode is a client error and the server keeps running.
    let s = Server::start(&["-m", "64", "-A"]);
    let mut c = s.connect();
    c.roundtrip(
        b"shutdown foo\r\nversion\r\n",
        b"CLIENT_ERROR invalid shutdown mode\r\nVERSION ",
    );
}

/// `-t 0` is refused with a clear message (memcached 1.6.18: "Number of threads must be
/// greater than 0"); `-b` (listen backlog) is accepted.
#[test]
fn serve_refuses_zero_threads_and_accepts_a_backlog() {
    if common::is_memcached() {
        println!("not run against memcached: checks cellcache's command line");
        return;
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cellcache"))
        .args([
            "serve",
            "--standalone",
            "-l",
            "127.0.0.1",
            "-p",
            "0",
            "-t",
            "0",
        ])
        .output()
        .expect("cellcache runs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("threads must be greater than 0"), "{err}");
    let s = Server::start(&["-m", "64", "-b", "64"]);
    let mut c = s.connect();
    c.roundtrip(b"set k 0 0 1\r\nv\r\n", b"STORED\r\n");
}

/// `-F`: memcached 1.6.18 refuses every `flush_all` with `CLIENT_ERROR flush_all not
/// allowed` (nothing with `noreply`) and keeps the items.
#[test]
fn flush_all_is_refused_with_dash_f() {
    let s = Server::start(&["-m", "64", "-F"]);
    let mut c = s.connect();
    let steps: &[(&[u8], &[u8])] = &[
        (b"set a 0 0 1\r\n1\r\n", b"STORED\r\n"),
        (b"flush_all\r\n", b"CLIENT_ERROR flush_all not allowed\r\n"),
        (
            b"flush_all 0\r\n",
            b"CLIENT_ERROR flush_all not allowed\r\n",
        ),
        (b"flush_all noreply\r\nmn\r\n", b"MN\r\n"),
        (b"get a\r\n", b"VALUE a 0 1\r\n1\r\nEND\r\n"),
    ];
    for (req, want) in steps {
        c.roundtrip(req, want);
    }
    assert_eq!(c.stat_of("settings", "flush_enabled"), "no");
}

/// `-C`: memcached 1.6.18 keeps no CAS. Every CAS it reports is 0; the storage commands'
/// compare (`cas`, `ms C`) never matches an existing item; `md C` / `ma C` compare with 0;
/// `ms E` is an invalid flag.
#[test]
fn no_cas_with_dash_c() {
    let s = Server::start(&["-m", "64", "-C"]);
    let mut c = s.connect();
    let steps: &[(&[u8], &[u8])] = &[
        (b"set a 0 0 1\r\n1\r\n", b"STORED\r\n"),
        (b"gets a\r\n", b"VALUE a 0 1 0\r\n1\r\nEND\r\n"),
        (b"gats 0 a\r\n", b"VALUE a 0 1 0\r\n1\r\nEND\r\n"),
        (b"mg a c v\r\n", b"VA 1 c0\r\n1\r\n"),
        (b"cas a 0 0 1 0\r\n2\r\n", b"EXISTS\r\n"),
        (b"cas a 0 0 1 1\r\n2\r\n", b"EXISTS\r\n"),
        (b"cas zz 0 0 1 0\r\n2\r\n", b"NOT_FOUND\r\n"),
        (b"ms a 1 C0\r\n2\r\n", b"EX\r\n"),
        (b"ms a 1 C1 I\r\n2\r\n", b"EX\r\n"),
        (b"ms a 1 c\r\n3\r\n", b"HD c0\r\n"),
        (b"ms a 1 E5\r\n4\r\n", b"CLIENT_ERROR invalid flag\r\n"),
        (b"mg a v\r\n", b"VA 1\r\n3\r\n"),
        (b"ma n N0 c\r\n", b"HD c0\r\n"),
        (b"ma n C1\r\n", b"EX\r\n"),
        (b"ma n C0\r\n", b"HD\r\n"),
        (b"md a C1\r\n", b"EX\r\n"),
        (b"md a C0\r\n", b"HD\r\n"),
        (b"md zz C0\r\n", b"NF\r\n"),
    ];
    for (req, want) in steps {
        c.roundtrip(req, want);
    }
    assert_eq!(c.stat_of("settings", "cas_enabled"), "no");
}

/// `-M`: memcached answers `SERVER_ERROR out of memory storing object` when full instead of
/// evicting, and the items already stored stay.
#[test]
fn out_of_memory_instead_of_evicting_with_dash_m() {
    let s = Server::start(&["-m", "8", "-M"]);
    let mut c = s.connect();
    let value = vec![b'v'; 100 * 1024];
    let mut stored = 0;
    loop {
        assert!(stored < 2000, "8 MB never filled with 100 KB values");
        let mut req = format!("set k{stored} 0 0 {}\r\n", value.len()).into_bytes();
        req.extend_from_slice(&value);
        req.extend_from_slice(b"\r\n");
        c.send(&req);
        match c.line().as_str() {
            "STORED" => stored += 1,
            "SERVER_ERROR out of memory storing object" => break,
            other => panic!("set k{stored}: {other}"),
        }
    }
    assert!(stored > 10, "only {stored} values fit");
    for i in [0, stored / 2, stored - 1] {
        c.send(format!("mg k{i} s\r\n").as_bytes());
        assert_eq!(c.line(), format!("HD s{}", value.len()), "k{i} was evicted");
    }
    assert_eq!(c.stat("evictions"), "0");
    assert_eq!(c.stat_of("settings", "evictions"), "off");
}

/// `-B ascii`: memcached reads a binary request's bytes as text (no reply until a line end,
/// then `ERROR`) and the connection stays usable; cellcache does the same.
#[test]
fn binary_magic_is_read_as_text_with_dash_b_ascii() {
    let s = Server::start(&["-m", "64", "-B", "ascii"]);
    let mut c = s.connect();
    let mut version_request = vec![0x80, 0x0b];
    version_request.resize(24, 0);
    c.send(&version_request);
    c.roundtrip(b"version\r\n", b"ERROR\r\n");
    c.roundtrip(b"set a 0 0 1\r\n1\r\n", b"STORED\r\n");
    assert_eq!(c.stat_of("settings", "binding_protocol"), "ascii");
}

/// `-B binary`: binary frames only. A binary `version` is answered (response magic 0x81);
/// a text line gets no text reply (cellcache closes the connection, as on any bad magic).
#[test]
fn only_binary_frames_with_dash_b_binary() {
    let s = Server::start(&["-m", "64", "-B", "binary"]);
    let mut c = s.connect();
    let mut version_request = vec![0x80, 0x0b];
    version_request.resize(24, 0);
    c.send(&version_request);
    let header = c.read_exact_len(24);
    assert_eq!(header[0], 0x81, "a binary response");
    assert_eq!(header[1], 0x0b, "to version");
    let body = u32::from_be_bytes([header[8], header[9], header[10], header[11]]) as usize;
    assert!(c.read_exact_len(body).starts_with(b"1."));
    if common::is_memcached() {
        return;
    }
    let mut c = s.connect();
    c.send(b"version\r\n");
    assert!(c.is_closed(), "no text protocol with -B binary");
}

/// memcached's t/stats.t: a set refused as too large counts in `store_too_large`, and one
/// `flush_all` is one `cmd_flush` — through a ring too, where every cell flushes its part.
#[test]
fn refusals_and_flushes_are_counted_once() {
    let s = Server::start(&["-m", "64"]);
    let mut c = s.connect();
    let big = "x".repeat((1 << 20) + 1);
    c.roundtrip(
        format!("set big 0 0 {}\r\n{big}\r\n", big.len()).as_bytes(),
        b"SERVER_ERROR object too large for cache\r\n",
    );
    assert_eq!(c.stat_of("", "store_too_large"), "1");
    c.roundtrip(b"flush_all\r\n", b"OK\r\n");
    assert_eq!(c.stat_of("", "cmd_flush"), "1");
}
