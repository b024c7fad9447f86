//! Clients no one on this project wrote, against the real binary: libmemcached's protocol
//! checker `memccapable` (ASCII mode). pymemcache runs from tests/python (scripts/test).

mod common;

use common::Server;
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
