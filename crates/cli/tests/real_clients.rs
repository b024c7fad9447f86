//! Clients no one on this project wrote, against the real binary: libmemcached's protocol
//! checker `memccapable` (ASCII mode) and its load generator `memcaslap` (text and binary,
//! a cell and a ring). pymemcache runs from tests/python (scripts/test).

mod common;

use common::{Ring, Server};
use std::process::Command;

#[test]
fn memccapable_ascii_suite_passes() {
    let server = Server::start(&["-m", "64", "-t", "2"]);
    let out = Command::new("memccapable")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &server.addr.port().to_string(),
            "-a",
            "-t",
            "10",
        ])
        .output()
        .expect("memccapable not found: install Debian's libmemcached-tools (.ci/run does)");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    println!("{text}");
    let passed = text
        .lines()
        .filter(|l| l.trim_end().ends_with("[pass]"))
        .count();
    let failed: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("[FAIL]") || l.contains("[fail]"))
        .collect();
    assert!(failed.is_empty(), "memccapable failures: {failed:#?}");
    assert_eq!(
        passed, 27,
        "every ASCII test of memccapable runs and passes"
    );
    assert!(
        out.status.success(),
        "memccapable exited with {}",
        out.status
    );
}

/// Runs Debian's `memcaslap` against `server` for two seconds and returns its output,
/// asserting it ran, reported its summary and got no error reply (it prints one line per
/// error reply, `<fd SERVER_ERROR …`, `<fd CLIENT_ERROR …` or `<fd ERROR`).
fn memcaslap(server: std::net::SocketAddr, binary: bool) -> String {
    let mut cmd = Command::new("memcaslap");
    cmd.args([
        "-s",
        &server.to_string(),
        "-T",
        "1",
        "-c",
        "8",
        "-t",
        "2s",
        "-X",
        "100",
    ]);
    if binary {
        cmd.arg("-B");
    }
    let out = cmd
        .output()
        .expect("memcaslap not found: install Debian's libmemcached-tools (.ci/run does)");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let errors: Vec<&str> = text
        .lines()
        .filter(|l| {
            l.starts_with('<')
                && ["SERVER_ERROR", "CLIENT_ERROR", "ERROR"]
                    .iter()
                    .any(|e| l.split(' ').nth(1) == Some(*e))
        })
        .take(5)
        .collect();
    assert!(
        errors.is_empty(),
        "memcaslap got error replies: {errors:#?}"
    );
    assert!(
        text.contains("Run time:"),
        "memcaslap printed no summary ({}):\n{text}",
        out.status
    );
    text
}

/// Debian's load generator starts every key with eight control bytes (its key counter):
/// a drop-in memcached takes them, in text and in binary. Every text set of it failed
/// until cellcache took control bytes in keys as memcached does.
#[test]
fn memcaslap_runs_without_error_replies() {
    let server = Server::start(&["-m", "64"]);
    for binary in [false, true] {
        memcaslap(server.addr, binary);
    }
    let mut c = server.connect();
    let sets: u64 = c.stat("cmd_set").parse().unwrap();
    let hits: u64 = c.stat("get_hits").parse().unwrap();
    assert!(
        sets > 0 && hits > 0,
        "memcaslap stored and read: {sets} sets, {hits} hits"
    );
}

/// The same through a ring of three cells: its keys hash, route and replicate as any other.
#[test]
fn memcaslap_runs_through_a_ring_without_error_replies() {
    if common::is_memcached() {
        return;
    }
    let ring = Ring::start(3, &["-m", "32"]);
    memcaslap(ring.cells[0].addr, false);
}
