//! The meta commands (`mg`, `ms`, `md`, `ma`, `mn`, `me`): flags, stale/win/recache, opaque and quiet mode.

use super::*;

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

/// An `ms` that stores nothing returns CAS 0 when asked for it (memcached's t/metaget.t
/// "zeroed out cas on return").
#[test]
fn meta_set_not_stored_returns_cas_zero() {
    let s = server();
    let mut c = s.connect();
    c.roundtrip(b"ms zc 2\r\nbo\r\n", b"HD\r\n");
    c.roundtrip(b"ms zc 2 c C999999\r\nio\r\n", b"EX c0\r\n");
    c.roundtrip(b"ms zc-none 2 c C1\r\nio\r\n", b"NF c0\r\n");
    c.roundtrip(b"ms zc 2 c ME\r\nio\r\n", b"NS c0\r\n");
    c.roundtrip(b"ms zc 2 c C999999 O12 k\r\nio\r\n", b"EX c0 O12 kzc\r\n");
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
