//! TLS for clients (memcached's `-Z`, `-o ssl_*`): a TLS client is served on every engine
//! (`CELLCACHE_TEST_IO_ENGINE`), on one cell and through a ring (`CELLCACHE_TEST_RING`),
//! whatever it asks; a client that does not speak TLS is refused; the limits that hold for
//! plain clients hold under TLS; client certificates are checked when required. Run against
//! memcached too (`CELLCACHE_TEST_SERVER=memcached`, Debian's is built with TLS), which
//! proves the expectations.

mod common;

use common::tls::Pki;
use common::{Client, Server, is_memcached};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// A server with `-Z` and this PKI's certificate, and `extra`; its clients speak TLS.
fn tls_server(pki: &Pki, extra: &[&str], env: &[(&str, &str)]) -> Server {
    let option = pki.server_option();
    let mut args = vec!["-Z", "-o", &option];
    args.extend_from_slice(extra);
    let mut server = Server::start_with_env(&args, env);
    server.tls_client = Some(pki.client(None));
    server
}

fn handshake_errors(c: &mut Client) -> u64 {
    c.stats("")
        .into_iter()
        .find(|(k, _)| k == "ssl_handshake_errors")
        .expect("stats has ssl_handshake_errors under -Z")
        .1
        .parse()
        .unwrap()
}

#[test]
fn a_tls_client_is_served() {
    let pki = Pki::new();
    let server = tls_server(&pki, &[], &[]);
    let mut c = server.connect();
    c.roundtrip(b"set k 0 0 5\r\nhello\r\n", b"STORED\r\n");
    c.roundtrip(b"get k\r\n", b"VALUE k 0 5\r\nhello\r\nEND\r\n");
    // A value spanning many TLS records, both ways.
    let big: Vec<u8> = (0..300_000u32).map(|i| b'a' + (i % 26) as u8).collect();
    c.send(format!("set big 0 0 {}\r\n", big.len()).as_bytes());
    c.send(&big);
    c.roundtrip(b"\r\n", b"STORED\r\n");
    c.send(b"get big\r\n");
    assert_eq!(c.line(), format!("VALUE big 0 {}", big.len()));
    assert_eq!(c.read_exact_len(big.len()), big);
    c.expect(b"\r\nEND\r\n");
    // Many requests in one write (several records decrypted at once, replies past the
    // output budget): every one answered, in order.
    let mut keys = Vec::new();
    for i in 0..300 {
        keys.extend_from_slice(
            format!("set p{i} 0 0 {}\r\n{i}\r\n", i.to_string().len()).as_bytes(),
        );
    }
    for i in 0..300 {
        keys.extend_from_slice(format!("get p{i} big\r\n").as_bytes());
    }
    c.send(&keys);
    for _ in 0..300 {
        assert_eq!(c.line(), "STORED");
    }
    for i in 0..300 {
        let v = i.to_string();
        assert_eq!(c.line(), format!("VALUE p{i} 0 {}", v.len()));
        assert_eq!(c.line(), v);
        assert_eq!(c.line(), format!("VALUE big 0 {}", big.len()));
        assert_eq!(c.read_exact_len(big.len() + 2).len(), big.len() + 2);
        assert_eq!(c.line(), "END");
    }
    assert_eq!(handshake_errors(&mut c), 0);
    let settings = c.stats("settings");
    let setting = |name: &str| {
        settings
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(setting("ssl_enabled").as_deref(), Some("yes"));
    assert_eq!(setting("ssl_chain_cert"), Some(pki.path("server.pem")));
}

#[test]
fn a_plain_text_client_is_refused_on_a_tls_port() {
    let pki = Pki::new();
    let server = tls_server(&pki, &[], &[]);
    let mut plain = Client::to(server.addr);
    plain.send(b"set k 0 0 1\r\nv\r\nget k\r\nversion\r\n");
    let mut got = Vec::new();
    let _ = plain.stream.read_to_end(&mut got);
    let text = String::from_utf8_lossy(&got);
    assert!(
        !text.contains("STORED") && !text.contains("VERSION") && !text.contains("ERROR"),
        "a plain-text client was answered: {text:?}"
    );
    // Nothing it sent was stored, and the refusal is counted.
    let mut c = server.connect();
    c.roundtrip(b"get k\r\n", b"END\r\n");
    let deadline = Instant::now() + Duration::from_secs(10);
    while handshake_errors(&mut c) < 1 {
        assert!(Instant::now() < deadline, "the refusal is counted");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn openssl_s_client_is_served() {
    let pki = Pki::new();
    let server = tls_server(&pki, &[], &[]);
    let mut child = std::process::Command::new("openssl")
        .args(["s_client", "-quiet", "-verify_return_error", "-CAfile"])
        .arg(pki.path("ca-ca.pem"))
        .args([
            "-connect",
            &server.addr.to_string(),
            "-servername",
            "localhost",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("openssl is installed");
    let mut stdin = child.stdin.take().unwrap();
    stdin
        .write_all(b"set via-openssl 0 0 2\r\nok\r\nget via-openssl\r\n")
        .unwrap();
    stdin.flush().unwrap();
    // s_client -quiet keeps running after stdin ends: read until the reply is complete (or
    // a bounded wait), then stop it.
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        while !got.ends_with(b"END\r\n") {
            match stdout.read(&mut buf) {
                Ok(n) if n > 0 => got.extend_from_slice(&buf[..n]),
                _ => break,
            }
        }
        got
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    while !reader.is_finished() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    drop(stdin);
    let got = reader.join().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&got),
        "STORED\r\nVALUE via-openssl 0 2\r\nok\r\nEND\r\n"
    );
}

/// Under TLS too, a client holding part of a request — or half a handshake — is closed
/// after the request timeout, however slowly it trickles bytes.
#[test]
fn half_sent_requests_and_handshakes_are_closed_after_the_request_timeout() {
    if is_memcached() {
        println!("not run against memcached: it has no request timeout");
        return;
    }
    let pki = Pki::new();
    let server = tls_server(&pki, &[], &[("CELLCACHE_IO__REQUEST_TIMEOUT_SECS", "1")]);
    let mut slow = server.connect();
    slow.send(b"set slow 0 0 1000\r\nabc");
    let mut half_hello = TcpStream::connect(server.addr).unwrap();
    let hello = common::tls::client_hello();
    half_hello.write_all(&hello[..hello.len() / 2]).unwrap();
    half_hello
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut good = server.connect();
    let deadline = Instant::now() + Duration::from_secs(60);
    slow.stream
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    loop {
        good.roundtrip(b"set good 0 0 1\r\nv\r\n", b"STORED\r\n");
        if slow.is_closed() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the half-sent request was never closed"
        );
        // One more byte of the value: arriving bytes do not restart the clock.
        slow.send(b"d");
    }
    let mut buf = [0u8; 16];
    assert!(
        matches!(half_hello.read(&mut buf), Ok(0) | Err(_)),
        "half a handshake was let stay"
    );
    let timeouts: u64 = good
        .stat_of("cellcache", "request_timeouts")
        .parse()
        .unwrap();
    assert!(timeouts >= 2, "both counted: {timeouts}");
}

/// `ssl_verify_mode=2`: a client without a certificate, or with one of another CA, is
/// refused; one with a certificate of the configured CA is served.
#[test]
fn required_client_certificates_are_checked() {
    let pki = Pki::new();
    let option = format!("ssl_ca_cert={},ssl_verify_mode=2", pki.path("ca-ca.pem"));
    let mut server = tls_server(&pki, &["-o", &option], &[]);
    for refused in [None, Some("stranger")] {
        server.tls_client = Some(pki.client(refused));
        let mut c = server.connect();
        c.send(b"version\r\n");
        // TLS 1.3: the client learns of the refusal on its first read.
        let mut buf = [0u8; 64];
        let answer = c.read_some(&mut buf);
        assert!(
            !matches!(answer, Ok(n) if n > 0),
            "a client with {refused:?} was served: {answer:?}"
        );
    }
    server.tls_client = Some(pki.client(Some("client")));
    let mut c = server.connect();
    c.send(b"version\r\n");
    assert!(c.line().starts_with("VERSION"));
}

#[test]
fn tls_without_its_files_does_not_start() {
    if is_memcached() {
        println!("not run against memcached: its messages differ");
        return;
    }
    let pki = Pki::new();
    for (args, expected) in [
        (vec!["-Z".to_string()], "ssl_chain_cert"),
        (
            vec![
                "-Z".into(),
                "-o".into(),
                format!("ssl_chain_cert={}", pki.path("server.pem")),
            ],
            "ssl_key",
        ),
        (
            vec![
                "-Z".into(),
                "-o".into(),
                format!(
                    "ssl_chain_cert={},ssl_key={}",
                    pki.path("server.pem"),
                    pki.path("client.key")
                ),
            ],
            "do not make a TLS server",
        ),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_cellcache"))
            .args(["serve", "--standalone", "-p", "0"])
            .args(&args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} started");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(expected), "{args:?}: {err}");
    }
}
