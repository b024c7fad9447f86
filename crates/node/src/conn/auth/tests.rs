//! The gate at the session, driven by hand on a standalone cell with an auth file: every
//! expected reply is what memcached 1.6.18 answered (`-Y` for text, `-S` for binary) to the
//! same bytes; the wire tables in crates/cli/tests/auth.rs check the same against both.

use crate::cell::Cell;
use crate::config::NodeConfig;
use crate::conn::{ClientService, Conn};
use crate::credentials::Credentials;
use cellcache_io::{Accepted, Notify, Progress, Service, Session};
use std::sync::Arc;

fn session(auth_file: Option<&[u8]>) -> (Arc<Cell>, Conn) {
    let mut config = NodeConfig::default();
    config.cluster.enabled = false;
    config.store.memory_limit_bytes = 16 << 20;
    config.validate().expect("valid test config");
    let store = cellcache_store::Store::new(config.store.clone()).expect("store");
    let limits = config.protocol_limits();
    let mut cell = Cell::new(config, store, limits, cellcache_io::Shutdown::new());
    cell.credentials =
        auth_file.map(|text| Credentials::parse("test", text).expect("test auth file"));
    let cell = Arc::new(cell);
    let service = ClientService {
        cell: cell.clone(),
        ring: Default::default(),
    };
    let accepted = Accepted {
        peer: "127.0.0.1:40000".parse().expect("addr"),
        listener: "127.0.0.1:11211".parse().expect("addr"),
        fd: -1,
    };
    let conn = service.open(accepted, Notify::noop());
    (cell, conn)
}

const FILE: &[u8] = b"alice:secret\nbob:hunter2\n";

/// Feeds `input` and returns what was written and the progress.
fn feed(conn: &mut Conn, input: &[u8]) -> (Vec<u8>, Progress) {
    let mut out = Vec::new();
    let p = conn.on_input(input, &mut out, 1 << 20);
    (out, p)
}

fn text(out: &[u8]) -> String {
    String::from_utf8_lossy(out).into_owned()
}

#[test]
fn text_requests_before_the_login_are_refused_then_served() {
    let (cell, mut conn) = session(Some(FILE));
    for (request, reply) in [
        (
            &b"get foo\r\n"[..],
            &b"CLIENT_ERROR unauthenticated\r\n"[..],
        ),
        (b"version\r\n", b"CLIENT_ERROR unauthenticated\r\n"),
        (b"quit\r\n", b"CLIENT_ERROR unauthenticated\r\n"),
        (b"mn\r\n", b"CLIENT_ERROR unauthenticated\r\n"),
        (b"cluster status\r\n", b"CLIENT_ERROR unauthenticated\r\n"),
        (
            b"set x 0 0 11\r\nalice wrong\r\n",
            b"CLIENT_ERROR authentication failure\r\n",
        ),
        (
            b"set x 0 0 5\r\nalice\r\n",
            b"CLIENT_ERROR bad authentication token format\r\n",
        ),
        (b"set x 0 0 12\r\nalice secret\r\n", b"STORED\r\n"),
        // Logged in: a set is a set, a wrong login an ordinary value.
        (b"set x 0 0 11\r\nalice wrong\r\n", b"STORED\r\n"),
        (b"get x\r\n", b"VALUE x 0 11\r\nalice wrong\r\nEND\r\n"),
    ] {
        let (out, p) = feed(&mut conn, request);
        assert_eq!(text(&out), text(reply), "{}", text(request));
        assert_eq!(p.consumed, request.len());
        assert!(!p.close);
    }
    let c = cell.counters.snapshot();
    // The malformed login is not a checked attempt (memcached counts the same way).
    assert_eq!((c.auth_cmds, c.auth_errors), (2, 1));
    assert_eq!(c.cmd_set, 1, "the login is no set");
}

#[test]
fn a_login_in_pieces_and_requests_behind_it() {
    let (_, mut conn) = session(Some(FILE));
    let input = b"set k 0 0 11\r\nbob hunter2\r\nset a 0 0 1\r\nb\r\nget a\r\n";
    // One byte at a time, as an engine: unconsumed bytes are offered again with the next.
    let mut pending = Vec::new();
    let mut out = Vec::new();
    for (i, &b) in input.iter().enumerate() {
        pending.push(b);
        let before = out.len();
        let p = conn.on_input(&pending, &mut out, 1 << 20);
        pending.drain(..p.consumed);
        if i < 25 {
            // Nothing is answered before the login's block is whole.
            assert_eq!(out.len(), before, "after byte {i}");
        }
    }
    assert!(pending.is_empty());
    assert_eq!(
        text(&out),
        "STORED\r\nSTORED\r\nVALUE a 0 1\r\nb\r\nEND\r\n"
    );
}

#[test]
fn a_line_without_an_end_is_closed_at_memcacheds_bound() {
    let (_, mut conn) = session(Some(FILE));
    let (out, p) = feed(&mut conn, &[b'x'; 2048]);
    assert!(out.is_empty() && !p.close && p.consumed == 0);
    let (out, p) = feed(&mut conn, &[b'x'; 2049]);
    assert!(out.is_empty() && p.close);
}

#[test]
fn an_oversized_login_is_refused_and_its_block_swallowed() {
    let (_, mut conn) = session(Some(FILE));
    let mut input = b"set x 0 0 5000\r\n".to_vec();
    input.resize(input.len() + 5002, b'z');
    input.extend_from_slice(b"version\r\n");
    let (out, p) = feed(&mut conn, &input);
    assert_eq!(
        text(&out),
        "CLIENT_ERROR bad authentication token format\r\nCLIENT_ERROR unauthenticated\r\n"
    );
    assert_eq!(p.consumed, input.len());
}

/// Without an auth file the gate is open and a `set` is a `set`.
#[test]
fn without_an_auth_file_nothing_changes() {
    let (cell, mut conn) = session(None);
    let (out, _) = feed(&mut conn, b"set x 0 0 12\r\nalice secret\r\nget x\r\n");
    assert_eq!(
        text(&out),
        "STORED\r\nVALUE x 0 12\r\nalice secret\r\nEND\r\n"
    );
    assert_eq!(cell.counters.snapshot().auth_cmds, 0);
    // SASL is unknown, as on memcached without -S (0x81, the connection kept).
    let (out, p) = feed(&mut conn, b"");
    assert!(out.is_empty() && !p.close);
    let (_, mut conn) = session(None);
    let (out, p) = feed(&mut conn, &frame(0x20, b"", b""));
    assert_eq!((out[1], status(&out)), (0x20, 0x81));
    assert!(!p.close);
}

/// A binary request frame.
fn frame(opcode: u8, key: &[u8], value: &[u8]) -> Vec<u8> {
    let mut f = vec![0x80, opcode];
    f.extend_from_slice(&(key.len() as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0, 0, 0]);
    f.extend_from_slice(&((key.len() + value.len()) as u32).to_be_bytes());
    f.extend_from_slice(&0x0102_0304_u32.to_be_bytes());
    f.extend_from_slice(&[0; 8]);
    f.extend_from_slice(key);
    f.extend_from_slice(value);
    f
}

fn status(response: &[u8]) -> u16 {
    u16::from_be_bytes([response[6], response[7]])
}

fn body(response: &[u8]) -> &[u8] {
    &response[24..]
}

#[test]
fn binary_sasl_plain_as_memcached() {
    let (cell, mut conn) = session(Some(FILE));
    // version is allowed before authentication.
    let (out, _) = feed(&mut conn, &frame(0x0b, b"", b""));
    assert_eq!(status(&out), 0);
    let (out, _) = feed(&mut conn, &frame(0x20, b"", b""));
    assert_eq!((status(&out), body(&out)), (0, &b"PLAIN"[..]));
    let (out, p) = feed(&mut conn, &frame(0x21, b"PLAIN", b"\0alice\0wrong"));
    assert_eq!((status(&out), body(&out)), (0x20, &b"Auth failure."[..]));
    assert!(!p.close, "a failed attempt keeps the connection");
    let (out, _) = feed(&mut conn, &frame(0x21, b"PLAIN", b"\0alice\0secret"));
    assert_eq!(
        (out[1], status(&out), body(&out)),
        (0x21, 0, &b"Authenticated"[..])
    );
    // Served now, and stays so (a served frame does not touch the gate).
    for _ in 0..2 {
        let (out, p) = feed(&mut conn, &frame(0x0a, b"", b""));
        assert_eq!((out[1], status(&out)), (0x0a, 0));
        assert!(!p.close);
    }
    let c = cell.counters.snapshot();
    assert_eq!((c.auth_cmds, c.auth_errors), (2, 1));
}

#[test]
fn binary_commands_before_authentication_are_refused_and_closed() {
    for opcode in [0x00, 0x01, 0x07, 0x0a, 0x10, 0x17, 0x25] {
        let (_, mut conn) = session(Some(FILE));
        // The header alone is judged: the body need not have arrived.
        let (out, p) = feed(&mut conn, &frame(opcode, b"k", b"vvvv")[..24]);
        assert_eq!(
            (out[1], status(&out), body(&out)),
            (opcode, 0x20, &b"Auth failure."[..]),
            "opcode {opcode:#x}"
        );
        assert!(p.close, "opcode {opcode:#x}");
    }
}

#[test]
fn plain_without_a_response_continues_in_a_step() {
    let (cell, mut conn) = session(Some(FILE));
    let (out, _) = feed(&mut conn, &frame(0x21, b"PLAIN", b""));
    assert_eq!((out[1], status(&out), out.len()), (0x21, 0x21, 24));
    let (out, _) = feed(&mut conn, &frame(0x22, b"PLAIN", b"\0bob\0hunter3"));
    assert_eq!(status(&out), 0x20);
    // Another step may follow a failed one.
    let (out, _) = feed(&mut conn, &frame(0x22, b"XX", b"\0bob\0hunter2"));
    assert_eq!(
        (out[1], status(&out), body(&out)),
        (0x22, 0, &b"Authenticated"[..])
    );
    // A step with nothing to continue fails, and leaves the connection unauthenticated.
    let (out, _) = feed(&mut conn, &frame(0x22, b"PLAIN", b"\0bob\0hunter2"));
    assert_eq!(status(&out), 0x20);
    let (out, p) = feed(&mut conn, &frame(0x0a, b"", b""));
    assert_eq!(status(&out), 0x20);
    assert!(p.close);
    let c = cell.counters.snapshot();
    assert_eq!((c.auth_cmds, c.auth_errors), (3, 2));
}

#[test]
fn any_sasl_command_starts_over() {
    let (_, mut conn) = session(Some(FILE));
    let (out, _) = feed(&mut conn, &frame(0x21, b"plain", b"alice\0alice\0secret"));
    assert_eq!(status(&out), 0, "mechanism names are case-insensitive");
    let (out, _) = feed(&mut conn, &frame(0x20, b"", b""));
    assert_eq!(status(&out), 0);
    let (out, p) = feed(&mut conn, &frame(0x00, b"k", b""));
    assert_eq!(status(&out), 0x20, "listing mechanisms unauthenticated it");
    assert!(p.close);
}

#[test]
fn sasl_refusals() {
    let (cell, mut conn) = session(Some(FILE));
    for (mechanism, data) in [
        (&b"CRAM-MD5"[..], &b"\0alice\0secret"[..]),
        (b"PLAIN", b"bob\0alice\0secret"),
        (b"PLAIN", b"\0alice"),
    ] {
        let (out, p) = feed(&mut conn, &frame(0x21, mechanism, data));
        assert_eq!(status(&out), 0x20, "{mechanism:?} {data:?}");
        assert!(!p.close);
    }
    // A mechanism over 32 bytes: invalid arguments, not counted, the connection kept.
    let (out, p) = feed(&mut conn, &frame(0x21, &[b'X'; 40], b"\0alice\0secret"));
    assert_eq!(
        (status(&out), body(&out)),
        (0x04, &b"Invalid arguments"[..])
    );
    assert!(!p.close);
    // Data over the bound: a failed attempt, swallowed.
    let (out, p) = feed(&mut conn, &frame(0x21, b"PLAIN", &[b'p'; 2000]));
    assert_eq!(status(&out), 0x20);
    assert!(!p.close);
    let c = cell.counters.snapshot();
    assert_eq!((c.auth_cmds, c.auth_errors), (4, 4));
}
