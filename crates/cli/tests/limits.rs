//! Limits and lifecycle of a running cell: the connection limit answers
//! memcached's error, idle connections are closed, a request left half-sent is closed after
//! the request timeout (so slow clients cannot hold the connection slots), over-long lines
//! are refused, SIGTERM stops the cell gracefully after answering what it received.

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
    let mut held = vec![settled(&server)];
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

/// A connection that is the server's only one: the connections the harness opened to see
/// the server ready are gone (the `threads` engine counts one until its thread noticed the
/// close), so a test of the connection limit knows how many slots are taken.
fn settled(server: &Server) -> common::Client {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut c = server.connect();
    while c.stat("curr_connections") != "1" {
        assert!(
            Instant::now() < deadline,
            "the harness's connections never closed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    c
}

/// The request timeout the next tests configure (`io.request_timeout_secs`).
const REQUEST_TIMEOUT: (&str, &str) = ("CELLCACHE_IO__REQUEST_TIMEOUT_SECS", "1");

/// What a connection that sent part of a request reads next: `None` once the cell closed
/// it, else the bytes answered. Waits `wait` at most.
fn closed_or_answered(c: &mut common::Client, wait: Duration) -> Option<Vec<u8>> {
    c.stream.set_read_timeout(Some(wait)).unwrap();
    let mut buf = [0u8; 256];
    match c.stream.read(&mut buf) {
        Ok(0) => None,
        Ok(n) => Some(buf[..n].to_vec()),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => None,
        Err(_) => Some(Vec::new()),
    }
}

/// A client sends the start of a `set` and then one byte now and then (slowloris): the
/// cell closes it once the request timeout passed, however it trickles, while a client that
/// completes its requests is served all along.
#[test]
fn a_half_sent_request_is_closed_after_the_request_timeout() {
    if is_memcached() {
        println!("not run against memcached: it has no request timeout");
        return;
    }
    let server = Server::start_with_env(&[], &[REQUEST_TIMEOUT]);
    let mut slow = server.connect();
    slow.send(b"set slow 0 0 1000\r\nabc");
    let mut good = server.connect();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        good.roundtrip(b"set good 0 0 1\r\nv\r\n", b"STORED\r\n");
        match closed_or_answered(&mut slow, Duration::from_millis(200)) {
            None => break,
            Some(answer) if answer.is_empty() => {}
            Some(answer) => panic!("answered: {:?}", String::from_utf8_lossy(&answer)),
        }
        assert!(
            Instant::now() < deadline,
            "the half-sent request was never closed"
        );
        // One more byte of the value: arriving bytes do not restart the clock.
        let _ = slow.stream.write_all(b"d");
    }
    good.roundtrip(b"get good\r\n", b"VALUE good 0 1\r\nv\r\nEND\r\n");
    assert!(
        good.stat_of("cellcache", "request_timeouts")
            .parse::<u64>()
            .unwrap()
            >= 1
    );
}

/// With `-c 3`, three clients holding half-sent requests take every slot: a fourth gets
/// memcached's error, then gets in once the request timeout closed them.
#[test]
fn half_sent_requests_cannot_hold_every_connection_slot() {
    if is_memcached() {
        println!("not run against memcached: it has no request timeout");
        return;
    }
    let server = Server::start_with_env(&["-c", "3", "-t", "1"], &[REQUEST_TIMEOUT]);
    let mut held = vec![settled(&server), server.connect(), server.connect()];
    for c in &mut held {
        c.send(b"set held 0 0 1000\r\nabc");
    }
    // Accepted in order: the fourth finds every slot taken.
    let mut refused = server.connect();
    refused.send(b"version\r\n");
    assert_eq!(refused.line(), "ERROR Too many open connections");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut c = server.connect();
        c.send(b"version\r\n");
        if c.line().starts_with("VERSION") {
            break;
        }
        assert!(Instant::now() < deadline, "no slot was ever freed");
        std::thread::sleep(Duration::from_millis(100));
    }
    for c in &mut held {
        assert_eq!(
            closed_or_answered(c, Duration::from_secs(10)),
            None,
            "a half-sent request was let stay"
        );
    }
}

/// 3,000 idle connections from one address hold at most that address's share of the
/// connection slots (`io.connections_per_address_max`: half of `-c` by default): a client
/// from another address is served all along, and each refusal is counted.
#[test]
fn idle_connections_from_one_address_leave_other_clients_served() {
    if is_memcached() {
        println!("not run against memcached: it has no per-address limit");
        return;
    }
    const FLOOD: usize = 3_000;
    let server = Server::start_with_env(
        &["-c", "100"],
        &[("CELLCACHE_IO__CONNECTIONS_PER_ADDRESS_LOOPBACK", "true")],
    );
    let elsewhere: std::net::IpAddr = [127, 0, 0, 2].into();
    let flood: Vec<std::net::TcpStream> = (0..FLOOD)
        .filter_map(|_| std::net::TcpStream::connect(server.addr).ok())
        .collect();
    let mut c = common::Client::from_source(elsewhere, server.addr);
    c.roundtrip(b"set k 0 0 1\r\nv\r\n", b"STORED\r\n");
    c.roundtrip(b"get k\r\n", b"VALUE k 0 1\r\nv\r\nEND\r\n");
    let refused = |c: &mut common::Client| -> u64 {
        c.stat_of("cellcache", "address_refusals").parse().unwrap()
    };
    // Half of -c 100 from 127.0.0.1 (the harness's probe may hold one of them).
    let deadline = Instant::now() + Duration::from_secs(60);
    while refused(&mut c) < (FLOOD - 50) as u64 {
        assert!(Instant::now() < deadline, "refusals: {}", refused(&mut c));
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(refused(&mut c) <= (FLOOD - 49) as u64);
    // More clients from other addresses get the other half.
    let others: Vec<common::Client> = (0..40)
        .map(|_| common::Client::from_source(elsewhere, server.addr))
        .collect();
    for mut o in others {
        o.roundtrip(b"get k\r\n", b"VALUE k 0 1\r\nv\r\nEND\r\n");
    }
    drop(flood);
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
