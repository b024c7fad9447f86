//! The memcached text protocol over a real socket, as `(request bytes, expected reply)`
//! tables. Run with `CELLCACHE_TEST_SERVER=memcached` to check the tables against Debian's
//! memcached; by default they run against the `cellcache` binary.

#[path = "../common/mod.rs"]
mod common;
mod meta;
mod options;
mod stats;
mod storage;

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

/// `set <key> <flags> 0 <n>` with an `n`-byte value.
fn set_of(key: &str, flags: u32, n: usize) -> Vec<u8> {
    let mut req = format!("set {key} {flags} 0 {n}\r\n").into_bytes();
    req.resize(req.len() + n, b'v');
    req.extend_from_slice(b"\r\n");
    req
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

/// `conn_yields` of `stats` (memcached) or `stats cell` (cellcache).
fn conn_yields(c: &mut Client) -> u64 {
    c.stat("conn_yields")
        .parse()
        .expect("conn_yields is a number")
}

/// The CAS `mg <key> c` reports (`HD c<cas> …`).
fn meta_cas(c: &mut Client, key: &str) -> u64 {
    c.send(format!("mg {key} c\r\n").as_bytes());
    let line = c.line();
    let rest = line.strip_prefix("HD c").expect(&line);
    rest.split(' ').next().unwrap().parse().unwrap()
}
