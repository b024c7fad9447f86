//! `stats` and its groups, `stats reset`, and the administration commands (`version`, `verbosity`, `quit`, …).

use super::*;

/// memcached's t/issue_61.t: with `-R 1` six sets pipelined in one write are all stored,
/// each after a yield but the last, so `conn_yields` reaches 5; another connection is
/// served meanwhile, and a long multi-get taken across yields answers whole.
#[test]
fn dash_r_yields_after_each_request_as_memcached() {
    let s = Server::start(&["-m", "64", "-t", "2", "-R", "1"]);
    let mut c = s.connect();
    let before = conn_yields(&mut c);
    let sets: String = (0..6)
        .map(|i| format!("set foo{i} 0 0 1\r\n{i}\r\n"))
        .collect();
    c.send(sets.as_bytes());
    for _ in 0..6 {
        assert_eq!(c.line(), "STORED");
    }
    let after = conn_yields(&mut c);
    assert!(
        after - before >= 5,
        "Got a decent number of yields: {before} -> {after}"
    );
    let mut other = s.connect();
    other.roundtrip(b"get foo5\r\n", b"VALUE foo5 0 1\r\n5\r\nEND\r\n");
    let keys: Vec<String> = (0..6).map(|i| format!("foo{i}")).collect();
    c.send(format!("get {}\r\nget foo0\r\n", keys.join(" ")).as_bytes());
    for i in 0..6 {
        assert_eq!(c.line(), format!("VALUE foo{i} 0 1"));
        assert_eq!(c.line(), i.to_string());
    }
    assert_eq!(c.line(), "END");
    c.expect(b"VALUE foo0 0 1\r\n0\r\nEND\r\n");
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
    // The harness's readiness probe has closed, but a cell may not have seen its close yet
    // (the threads engine notices it on the probe's own thread): wait for it to leave the
    // list, bounded, rather than count it.
    let mut conns = asking.stats("conns");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while conns
        .iter()
        .filter(|(k, _)| k.ends_with(":listen_addr"))
        .count()
        > 2
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(std::time::Duration::from_millis(20));
        conns = asking.stats("conns");
    }
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
