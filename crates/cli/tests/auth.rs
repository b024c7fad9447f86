//! Client authentication over real sockets (memcached `-Y`): the text login and SASL PLAIN
//! on the binary protocol, as `(request bytes, expected reply)` tables. One request per
//! step, as memcached's own t/ascii-auth.t does: memcached reuses one reply object for the
//! refused requests of one read, so pipelined refusals would show only its last one
//! (cellcache answers each; docs/protocol.md, "Client authentication").
//!
//! `CELLCACHE_TEST_SERVER=memcached` proves the expected bytes: the text tables run against
//! memcached `-Y FILE`, the binary ones against memcached `-S -B binary`, whose Cyrus SASL
//! database is built from the same users with `saslpasswd2` (Debian's sasl2-bin). cellcache
//! serves both from its `-Y` file. `CELLCACHE_TEST_RING=3` runs them through one cell of a
//! ring whose every cell has the file.

mod binary_wire;
mod common;

use binary_wire::*;
use common::{Client, Server, auth_file, is_memcached, login};

const USERS: &str = "alice:secret\nbob:hunter2\n";

/// A server whose clients log in (`-Y`).
fn server() -> Server {
    Server::start(&["-m", "64", "-t", "2", "-Y", &auth_file(USERS)])
}

/// A server that takes SASL PLAIN for [`USERS`]: cellcache with `-Y`; memcached with `-S`
/// (binary only) and a SASL database of the same users.
fn sasl_server() -> Server {
    if !is_memcached() {
        return server();
    }
    // A database per server: tests run in parallel, and saslpasswd2 locks its file.
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = cellcache_testkit::process::scratch_dir(&format!("sasl-{n}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let db = dir.join("sasldb");
    for entry in USERS.lines() {
        let (user, password) = entry.split_once(':').unwrap();
        // saslpasswd2 -p reads the password from stdin; the realm is the host name, as
        // memcached's.
        let mut child = std::process::Command::new("saslpasswd2")
            .args([
                "-f",
                db.to_str().unwrap(),
                "-a",
                "memcached",
                "-c",
                "-p",
                user,
            ])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .expect("saslpasswd2 (Debian's sasl2-bin) builds memcached's SASL database");
        use std::io::Write as _;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(password.as_bytes())
            .unwrap();
        assert!(child.wait().unwrap().success(), "saslpasswd2 {user}");
    }
    let conf = format!("mech_list: plain\nsasldb_path: {}\n", db.display());
    std::fs::write(dir.join("memcached.conf"), conf).unwrap();
    Server::start_with_env(
        &["-S", "-B", "binary"],
        &[("SASL_CONF_PATH", dir.to_str().unwrap())],
    )
}

/// The steps of a text connection before and after its login (memcached 1.6.18 -Y
/// answered every one of them so).
#[test]
fn text_requests_are_refused_until_the_login() {
    let s = server();
    let mut admin = s.logged_in();
    let before = auth_counts(&mut admin);
    let mut c = s.connect();
    let refused: &[(&[u8], &[u8])] = &[
        (b"get foo\r\n", b"CLIENT_ERROR unauthenticated\r\n"),
        (b"version\r\n", b"CLIENT_ERROR unauthenticated\r\n"),
        (b"stats\r\n", b"CLIENT_ERROR unauthenticated\r\n"),
        (b"mg foo v\r\n", b"CLIENT_ERROR unauthenticated\r\n"),
        (b"flush_all\r\n", b"CLIENT_ERROR unauthenticated\r\n"),
        // quit is refused too, and the connection stays.
        (b"quit\r\n", b"CLIENT_ERROR unauthenticated\r\n"),
        // A set that is not a login (add) or has too few words.
        (b"add foo 0 0 2\r\n", b"CLIENT_ERROR unauthenticated\r\n"),
        (b"set foo 0 0\r\n", b"CLIENT_ERROR unauthenticated\r\n"),
        // Any set is a login: "hi" is one word, not a user and a password.
        (
            b"set foo 0 0 2\r\nhi\r\n",
            b"CLIENT_ERROR bad authentication token format\r\n",
        ),
        (
            b"set foo 0 0 3\r\nabcde",
            b"CLIENT_ERROR bad command line termination\r\n",
        ),
        (
            b"set foo 0 0 11\r\nalice wrong\r\n",
            b"CLIENT_ERROR authentication failure\r\n",
        ),
        // Another user's password.
        (
            b"set foo 0 0 13\r\nalice hunter2\r\n",
            b"CLIENT_ERROR authentication failure\r\n",
        ),
    ];
    for (request, reply) in refused {
        c.roundtrip(request, reply);
    }
    // The key, flags, expiration and noreply of the login are ignored.
    c.roundtrip(
        b"set anything 5 100 12 noreply\r\nalice secret\r\n",
        b"STORED\r\n",
    );
    // Served now: a set is a set, the login's key was not stored.
    c.roundtrip(b"get anything\r\n", b"END\r\n");
    c.roundtrip(b"set foo 0 0 11\r\nalice wrong\r\n", b"STORED\r\n");
    c.roundtrip(b"get foo\r\n", b"VALUE foo 0 11\r\nalice wrong\r\nEND\r\n");
    c.roundtrip(b"mn\r\n", b"MN\r\n");
    // Two wrong logins and the right one were checked; malformed ones are not counted.
    let after = auth_counts(&mut admin);
    assert_eq!((after.0 - before.0, after.1 - before.1), (3, 2));
}

/// The server closed the connection: end of stream, or a reset (it closed with input
/// unread). A timeout is not a close.
fn closed(c: &mut Client) -> bool {
    let mut buf = [0u8; 64];
    loop {
        match std::io::Read::read(&mut c.stream, &mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) => return e.kind() == std::io::ErrorKind::ConnectionReset,
        }
    }
}

/// `auth_cmds` and `auth_errors` of the cell the client talks to.
fn auth_counts(c: &mut Client) -> (u64, u64) {
    let n = |c: &mut Client, name| c.stat(name).parse::<u64>().unwrap();
    (n(c, "auth_cmds"), n(c, "auth_errors"))
}

/// Each connection logs in for itself (memcached's t/ascii-auth.t, second socket).
#[test]
fn every_connection_logs_in_for_itself() {
    let s = server();
    let mut a = s.connect();
    a.roundtrip(&login("alice", "secret"), b"STORED\r\n");
    a.roundtrip(b"set toast 0 0 2\r\nhi\r\n", b"STORED\r\n");
    let mut b = s.connect();
    b.roundtrip(b"get toast\r\n", b"CLIENT_ERROR unauthenticated\r\n");
    b.roundtrip(&login("bob", "hunter2"), b"STORED\r\n");
    b.roundtrip(b"get toast\r\n", b"VALUE toast 0 2\r\nhi\r\nEND\r\n");
}

/// The login and what follows it may arrive in one read, or split anywhere.
#[test]
fn a_login_pipelined_with_requests_or_split() {
    let s = server();
    let mut c = s.connect();
    c.roundtrip(
        b"set k 0 0 12\r\nalice secret\r\nset a 0 0 1\r\nb\r\nget a\r\n",
        b"STORED\r\nSTORED\r\nVALUE a 0 1\r\nb\r\nEND\r\n",
    );
    let mut c = s.connect();
    let bytes = b"set k 0 0 11\r\nbob hunter2\r\nget a\r\n";
    for chunk in bytes.chunks(5) {
        c.send(chunk);
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    c.expect(b"STORED\r\nVALUE a 0 1\r\nb\r\nEND\r\n");
}

/// memcached closes an unauthenticated connection that sends 2048 bytes without a line end.
#[test]
fn a_long_line_before_the_login_closes() {
    let s = server();
    let mut c = s.connect();
    c.send(&[b'x'; 3000]);
    assert!(closed(&mut c), "closed without a reply");
}

/// `stats settings` names the file, as memcached's `auth_enabled_ascii`; SASL is on in
/// cellcache (binary connections authenticate against the same file), off in memcached -Y.
#[test]
fn stats_settings_name_the_auth_file() {
    let path = auth_file(USERS);
    let s = Server::start(&["-m", "64", "-Y", &path]);
    let settings = s.logged_in().stats("settings");
    let get = |name: &str| {
        settings
            .iter()
            .find(|(k, _)| k == name)
            .unwrap_or_else(|| panic!("no {name}"))
            .1
            .clone()
    };
    assert_eq!(get("auth_enabled_ascii"), path);
    let sasl = if is_memcached() { "no" } else { "yes" };
    assert_eq!(get("auth_enabled_sasl"), sasl);
    let plain = Server::start(&["-m", "64"]);
    let settings = plain.logged_in().stats("settings");
    for name in ["auth_enabled_ascii", "auth_enabled_sasl"] {
        assert!(
            settings.contains(&(name.to_string(), "no".to_string())),
            "{name}"
        );
    }
}

/// SASL on the binary protocol (memcached -S answered every step so).
#[test]
fn sasl_plain_list_auth_and_failure() {
    let s = sasl_server();
    let mut c = s.connect();
    // version needs no authentication; the mechanism list is PLAIN.
    assert_eq!(
        call(&mut c, &request(VERSION, &[], &[], &[], 1, 0)).status,
        OK
    );
    let r = call(&mut c, &request(SASL_LIST_MECHS, &[], &[], &[], 2, 0));
    assert_eq!((r.status, r.value.as_slice()), (OK, &b"PLAIN"[..]));
    // A wrong password: "Auth failure.", the connection stays unauthenticated and open.
    let r = call(&mut c, &sasl_plain("alice", "wrong", 3));
    assert_eq!(
        (r.status, r.value.as_slice()),
        (AUTH_ERROR, &b"Auth failure."[..])
    );
    assert_eq!(
        call(&mut c, &request(VERSION, &[], &[], &[], 4, 0)).status,
        OK
    );
    // A command before authentication: refused, then closed.
    let r = call(&mut c, &set(b"k", b"v", 0, 5, 0));
    assert_eq!(
        (r.status, r.value.as_slice()),
        (AUTH_ERROR, &b"Auth failure."[..])
    );
    assert!(closed(&mut c));

    let mut c = s.connect();
    let r = call(&mut c, &sasl_plain("bob", "hunter2", 6));
    assert_eq!((r.status, r.value.as_slice()), (OK, &b"Authenticated"[..]));
    assert_eq!(call(&mut c, &set(b"k", b"v", 7, 8, 0)).status, OK);
    let r = call(&mut c, &get(GET, b"k", 9));
    assert_eq!((r.status, r.value.as_slice()), (OK, &b"v"[..]), "{r:?}");
    assert_eq!(r.flags(), 7);
}

/// What memcached refuses in SASL requests, and how.
#[test]
fn sasl_refusals_as_memcached() {
    let s = sasl_server();
    let mut c = s.connect();
    // A mechanism over 32 bytes: invalid arguments, the connection kept.
    let r = call(
        &mut c,
        &request(SASL_AUTH, &[], &[b'X'; 40], b"\0bob\0hunter2", 1, 0),
    );
    assert_eq!(
        (r.status, r.value.as_slice()),
        (EINVAL, &b"Invalid arguments"[..])
    );
    // A mechanism not offered, another identity than the user's, a step with nothing to
    // continue: auth errors.
    let other = request(SASL_AUTH, &[], b"CRAM-MD5", b"\0bob\0hunter2", 2, 0);
    let proxy = request(SASL_AUTH, &[], b"PLAIN", b"alice\0bob\0hunter2", 3, 0);
    let step = request(SASL_STEP, &[], b"PLAIN", b"\0bob\0hunter2", 4, 0);
    for req in [other, proxy, step] {
        assert_eq!(call(&mut c, &req).status, AUTH_ERROR, "{req:?}");
    }
    // The user itself as the authorization identity is fine.
    let me = request(SASL_AUTH, &[], b"PLAIN", b"bob\0bob\0hunter2", 5, 0);
    assert_eq!(call(&mut c, &me).status, OK);
}

/// PLAIN without the client's response is "continue" (0x21, empty); a step carries it.
#[test]
fn sasl_plain_in_two_steps() {
    let s = sasl_server();
    let mut c = s.connect();
    let r = call(&mut c, &request(SASL_AUTH, &[], b"PLAIN", &[], 1, 0));
    assert_eq!((r.status, r.value.len()), (AUTH_CONTINUE, 0));
    let r = call(
        &mut c,
        &request(SASL_STEP, &[], b"PLAIN", b"\0alice\0secret", 2, 0),
    );
    assert_eq!((r.status, r.value.as_slice()), (OK, &b"Authenticated"[..]));
    assert_eq!(call(&mut c, &request(NOOP, &[], &[], &[], 3, 0)).status, OK);
}

/// Before authentication every command but SASL and version is refused on its header and
/// the connection closed, quit and noop included.
#[test]
fn binary_commands_before_authentication_close() {
    let s = sasl_server();
    for req in [
        get(GET, b"k", 1),
        request(NOOP, &[], &[], &[], 2, 0),
        request(STAT, &[], &[], &[], 3, 0),
        request(QUIT, &[], &[], &[], 4, 0),
        request(FLUSH, &[], &[], &[], 5, 0),
    ] {
        let mut c = s.connect();
        let r = call(&mut c, &req);
        assert_eq!(
            (r.status, r.value.as_slice()),
            (AUTH_ERROR, &b"Auth failure."[..])
        );
        assert!(closed(&mut c), "opcode {:#x}", req[1]);
    }
}

/// Without an auth file SASL is an unknown command (memcached without -S), the
/// connection kept.
#[test]
fn without_an_auth_file_sasl_is_unknown() {
    let s = Server::start(&["-m", "64"]);
    let mut c = s.connect();
    for req in [
        request(SASL_LIST_MECHS, &[], &[], &[], 1, 0),
        sasl_plain("alice", "secret", 2),
    ] {
        let r = call(&mut c, &req);
        assert_eq!(
            (r.status, r.value.as_slice()),
            (UNKNOWN_COMMAND, &b"Unknown command"[..])
        );
    }
    assert_eq!(call(&mut c, &request(NOOP, &[], &[], &[], 3, 0)).status, OK);
}

/// Binary `auth_cmds`/`auth_errors` count checked attempts (binary STAT after logging in).
#[test]
fn sasl_attempts_are_counted() {
    let s = sasl_server();
    let stat = |name: &str| -> u64 {
        let mut c = s.connect();
        assert_eq!(call(&mut c, &sasl_plain("alice", "secret", 0)).status, OK);
        c.send(&request(STAT, &[], &[], &[], 0, 0));
        loop {
            let r = recv(&mut c);
            assert!(!r.key.is_empty(), "no {name} in stats");
            if r.key == name.as_bytes() {
                return String::from_utf8(r.value).unwrap().parse().unwrap();
            }
        }
    };
    let before = (stat("auth_cmds"), stat("auth_errors"));
    let mut c = s.connect();
    for (password, status) in [("no", AUTH_ERROR), ("nope", AUTH_ERROR), ("secret", OK)] {
        assert_eq!(
            call(&mut c, &sasl_plain("alice", password, 1)).status,
            status
        );
    }
    // Each `stat` above logs in once more (one success per call).
    let after = (stat("auth_cmds"), stat("auth_errors"));
    assert_eq!((after.0 - before.0, after.1 - before.1), (3 + 2, 2));
}

/// An address that failed `server.auth_failures_max` logins has the rest of its window
/// refused unchecked — the right password too — on text and binary connections alike,
/// while another address logs in.
#[test]
fn guessing_passwords_from_one_address_is_throttled() {
    if is_memcached() {
        println!("not run against memcached: it has no login limit");
        return;
    }
    let s = Server::start_with_env(
        &["-m", "64", "-t", "2", "-Y", &auth_file(USERS)],
        &[
            ("CELLCACHE_SERVER__AUTH_FAILURES_MAX", "3"),
            ("CELLCACHE_SERVER__AUTH_FAILURE_WINDOW_SECS", "600"),
        ],
    );
    let elsewhere: std::net::IpAddr = [127, 0, 0, 2].into();
    // The harness's own requests log in from 127.0.0.1 and succeed: they never count.
    let mut guesser = Client::from_source(elsewhere, s.addr);
    for guess in ["a", "b", "c"] {
        guesser.roundtrip(
            &login("alice", guess),
            b"CLIENT_ERROR authentication failure\r\n",
        );
    }
    guesser.roundtrip(
        &login("alice", "secret"),
        b"CLIENT_ERROR authentication failure\r\n",
    );
    let mut binary = Client::from_source(elsewhere, s.addr);
    assert_eq!(
        call(&mut binary, &sasl_plain("alice", "secret", 0)).status,
        AUTH_ERROR,
        "SASL from the throttled address"
    );
    // 127.0.0.1 is another address: served.
    let mut c = s.connect();
    c.roundtrip(&login("bob", "hunter2"), b"STORED\r\n");
    c.roundtrip(b"set k 0 0 1\r\nv\r\n", b"STORED\r\n");
    let throttled: u64 = c.stat_of("cellcache", "auth_throttled").parse().unwrap();
    assert_eq!(throttled, 2, "the right password and the SASL attempt");
}
