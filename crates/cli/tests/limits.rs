//! Limits and lifecycle of a running cell: the connection limit answers
//! memcached's error, idle connections are closed, over-long lines are refused, SIGTERM
//! stops the cell gracefully after answering what it received.

mod common;

use common::{Server, is_memcached};
use std::io::{Read, Write};
use std::time::{Duration, Instant};

#[test]
fn connections_past_the_limit_get_memcached_error() {
    if is_memcached() {
        println!(
            "not run against memcached: it refuses to start with -c below its reserved descriptors"
        );
        return;
    }
    let server = Server::start(&["-c", "3", "-t", "1"]);
    // Hold connections until the limit is reached.
    let mut held = Vec::new();
    let mut refused = None;
    for _ in 0..8 {
        let mut c = server.connect();
        c.send(b"version\r\n");
        let line = c.line();
        if line.starts_with("ERROR") {
            refused = Some(line);
            break;
        }
        assert!(line.starts_with("VERSION"), "{line}");
        held.push(c);
    }
    assert_eq!(refused.as_deref(), Some("ERROR Too many open connections"));
    assert_eq!(held.len(), 3, "exactly the configured number is served");
    // Closing one frees a slot.
    held.pop();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut c = server.connect();
        c.send(b"version\r\n");
        if c.line().starts_with("VERSION") {
            break;
        }
        assert!(Instant::now() < deadline, "slot never freed");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn idle_connections_are_closed_after_the_timeout() {
    let flags: &[&str] = if is_memcached() {
        &["-o", "idle_timeout=1"]
    } else {
        &["--idle-timeout", "1"]
    };
    let server = Server::start(flags);
    let mut c = server.connect();
    c.roundtrip(b"set k 0 0 1\r\nv\r\n", b"STORED\r\n");
    c.stream
        .set_read_timeout(Some(Duration::from_secs(15)))
        .unwrap();
    let started = Instant::now();
    let mut buf = [0u8; 16];
    let n = c.stream.read(&mut buf).unwrap_or(0);
    assert_eq!(n, 0, "idle connection is closed, not answered");
    assert!(started.elapsed() < Duration::from_secs(15));
    // An active client is not affected.
    let mut d = server.connect();
    d.roundtrip(b"get k\r\n", b"VALUE k 0 1\r\nv\r\nEND\r\n");
}

#[test]
fn over_long_command_line_is_refused() {
    let server = Server::start(&[]);
    let mut c = server.connect();
    let mut line = b"get ".to_vec();
    line.extend(std::iter::repeat_n(b'k', 200 * 1024));
    line.extend_from_slice(b"\r\n");
    c.stream.write_all(&line).ok();
    let reply = c.line();
    assert!(
        reply.starts_with("CLIENT_ERROR") || reply.starts_with("SERVER_ERROR"),
        "{reply}"
    );
    // The cell itself is fine.
    let mut d = server.connect();
    d.roundtrip(b"set ok 0 0 1\r\nv\r\n", b"STORED\r\n");
}

#[test]
fn sigterm_answers_received_requests_then_exits_cleanly() {
    if is_memcached() {
        println!("not run against memcached: its SIGTERM exit is not what is specified here");
        return;
    }
    let server = Server::start(&[]);
    let mut c = server.connect();
    c.roundtrip(b"set k 0 0 1\r\nv\r\n", b"STORED\r\n");
    c.send(b"get k\r\n");
    c.expect(b"VALUE k 0 1\r\nv\r\nEND\r\n");
    let status = server.terminate();
    assert!(status.success(), "graceful exit, got {status}");
    assert!(c.is_closed(), "open connections are closed on shutdown");
}
