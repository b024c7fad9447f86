//! Mutual TLS between cells (`--peer-tls-cert/--peer-tls-key/--peer-tls-ca`,
//! `[cluster.tls]`), with real processes on loopback and certificates made here (rcgen): a
//! ring with TLS (and its secret) forms, serves and loses no acknowledged write to a
//! `kill -9`; a peer with a certificate of another CA, one with the ring's CA but another
//! name, and one speaking plain TCP are closed before any of their frames is processed; a
//! partial configuration or an unreadable file stops the start saying what; and a cell
//! cannot join a ring whose TLS setting is not its own.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cellcache_cluster::wire::{self, FrameKind, WireConfig, payload};
use common::Ring;
use common::tls::Ca;

/// The name every cell's certificate carries (`cluster.tls.server_name`'s default).
const SERVER_NAME: &str = "cellcache";

/// A directory of its own for `name`'s files.
fn dir(name: &str) -> PathBuf {
    cellcache_testkit::process::scratch_dir(&format!("peer-tls-{name}"))
}

/// The `--peer-tls-*` flags of a cell presenting `cert`/`key` and trusting `ca`.
fn tls_flags(cert: &Path, key: &Path, ca: &Path) -> Vec<String> {
    let s = |p: &Path| p.to_str().expect("a UTF-8 path").to_string();
    vec![
        "--peer-tls-cert".into(),
        s(cert),
        "--peer-tls-key".into(),
        s(key),
        "--peer-tls-ca".into(),
        s(ca),
    ]
}

/// A fresh secret file written by `cellcache ctl secret new`.
fn secret_file(dir: &Path) -> PathBuf {
    let path = dir.join("ring.secret");
    let _ = std::fs::remove_file(&path);
    let out = Command::new(env!("CARGO_BIN_EXE_cellcache"))
        .args(["ctl", "secret", "new"])
        .arg(&path)
        .output()
        .expect("ctl secret new runs");
    assert!(out.status.success(), "{out:?}");
    path
}

/// Runs `cmd` (a `serve` expected to stop by itself) for at most `limit`: whether it
/// succeeded, and its stderr.
fn run_bounded(cmd: &mut Command, limit: Duration) -> (bool, String) {
    let mut child = cmd
        .env("CELLCACHE_CLUSTER__STATE_DIR", "off")
        .env("CELLCACHE_LOG__LEVEL", "error")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("serve runs");
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            let mut stderr = String::new();
            let _ = child
                .stderr
                .take()
                .expect("piped")
                .read_to_string(&mut stderr);
            return (status.success(), stderr);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("serve still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `(peer address, ring id)` of cell `i`, from its status.
fn peer_and_ring(ring: &Ring, i: usize) -> (String, u64) {
    let status = ring.status(i);
    let ring_id = status[0]
        .split(' ')
        .skip_while(|w| *w != "RING")
        .nth(1)
        .map(|h| u64::from_str_radix(h, 16).expect("a hex ring id"))
        .expect("RING in the status");
    (ring.peer(i), ring_id)
}

fn failed_handshakes(ring: &Ring, i: usize) -> u64 {
    ring.cells[i]
        .connect()
        .stat_of("cellcache", "cluster_peer_handshakes_failed")
        .parse()
        .expect("a count")
}

/// What a forged cell sends: its `Hello` as cell 2 of the ring, then a forwarded
/// `flush_all`.
fn forged_frames(ring_id: u64) -> Vec<u8> {
    let wire = WireConfig::default();
    let mut frames = Vec::new();
    let hello = payload::encode_hello(&payload::Hello {
        cell: cellcache_cluster::CellId::whole(2),
        ring: ring_id,
        client: "127.0.0.1:1".into(),
    });
    wire::encode(&wire, FrameKind::Hello, 1_000, 0, &hello, &mut frames).expect("hello");
    let flush = b"flush_all\r\n";
    wire::encode(
        &wire,
        FrameKind::ForwardRequest,
        1_000,
        7,
        flush,
        &mut frames,
    )
    .expect("forward");
    frames
}

/// Whether `reply` holds a frame other than `Refused`: the forged flush was processed.
fn answered(reply: &[u8]) -> bool {
    matches!(
        wire::decode(&WireConfig::default(), reply),
        Ok(wire::Decoded::Complete { frame, .. }) if frame.kind != FrameKind::Refused
    )
}

/// Sends the forged frames over plain TCP; what came back.
fn plain_peer(peer: &str, frames: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(peer).expect("the peer port accepts");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let _ = s.write_all(frames);
    let mut reply = Vec::new();
    let _ = s.read_to_end(&mut reply);
    reply
}

/// Sends the forged frames over TLS, trusting `ca` and presenting `cert`/`key`; the
/// plaintext that came back (nothing when the cell ended the session).
fn tls_peer(peer: &str, ca: &Path, cert: &Path, key: &Path, frames: &[u8]) -> Vec<u8> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca).expect("CA file") {
        roots.add(c.expect("a CA certificate")).expect("a root");
    }
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .expect("cert file")
        .map(|c| c.expect("a certificate"))
        .collect();
    let key = PrivateKeyDer::from_pem_file(key).expect("key file");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .expect("client config");
    let name = ServerName::try_from(SERVER_NAME).expect("a DNS name");
    let conn = rustls::ClientConnection::new(Arc::new(config), name).expect("a session");
    let sock = TcpStream::connect(peer).expect("the peer port accepts");
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut tls = rustls::StreamOwned::new(conn, sock);
    let _ = tls.write_all(frames).and_then(|()| tls.flush());
    let mut reply = Vec::new();
    let _ = tls.read_to_end(&mut reply);
    reply
}

fn set(c: &mut common::Client, key: &str, value: &str) {
    let req = format!("set {key} 0 0 {}\r\n{value}\r\n", value.len());
    c.roundtrip(req.as_bytes(), b"STORED\r\n");
}

#[test]
fn a_ring_with_peer_tls_and_a_secret_serves_and_survives_a_kill() {
    if common::is_memcached() {
        return;
    }
    let d = dir("ring");
    let ca = Ca::new(&d, "ring");
    let (cert, key) = ca.issue(&d, "cell", &[SERVER_NAME]);
    let secret = secret_file(&d);
    let flags = tls_flags(&cert, &key, &ca.pem);
    let mut args: Vec<&str> = vec!["-m", "32"];
    args.extend(flags.iter().map(String::as_str));
    let secret = secret.to_str().expect("utf-8");
    let mut ring = Ring::start_with_env(3, &args, &[("CELLCACHE_CLUSTER__SECRET_FILE", secret)]);
    for i in 0..3 {
        let first = &ring.status(i)[0];
        assert!(first.ends_with(" PEERS secret+tls"), "{first}");
    }
    // Writes through every cell, reads through every cell: requests cross the TLS links.
    const KEYS: usize = 300;
    for k in 0..KEYS {
        set(
            &mut ring.cells[k % 3].connect(),
            &format!("k{k}"),
            &format!("v{k}"),
        );
    }
    for i in 0..3 {
        let mut c = ring.cells[i].connect();
        for k in (0..KEYS).step_by(7) {
            assert_eq!(
                c.get_value(&format!("k{k}")),
                Some(format!("v{k}")),
                "via {i}"
            );
        }
    }
    assert_eq!(
        failed_handshakes(&ring, 0),
        0,
        "the cells' own handshakes all passed"
    );
    // The acknowledged writes survive the loss of any one cell.
    ring.cells[1].kill9();
    ring.wait_formed_among(2, &[0, 2]);
    for i in [0, 2] {
        let mut c = ring.cells[i].connect();
        for k in 0..KEYS {
            assert_eq!(
                c.get_value(&format!("k{k}")),
                Some(format!("v{k}")),
                "k{k} via {i}"
            );
        }
    }
}

#[test]
fn peers_without_the_rings_certificate_are_closed_before_any_frame() {
    if common::is_memcached() {
        return;
    }
    let d = dir("forged");
    let ca = Ca::new(&d, "ring");
    let (cert, key) = ca.issue(&d, "cell", &[SERVER_NAME]);
    let other = Ca::new(&d, "other");
    let (other_cert, other_key) = other.issue(&d, "other-cell", &[SERVER_NAME]);
    let (misnamed_cert, misnamed_key) = ca.issue(&d, "misnamed", &["intruder.example"]);
    let flags = tls_flags(&cert, &key, &ca.pem);
    let mut args: Vec<&str> = vec!["-m", "32"];
    args.extend(flags.iter().map(String::as_str));
    // TLS alone, no secret: the certificate is what admits a cell.
    let ring = Ring::start(2, &args);
    assert!(
        ring.status(0)[0].ends_with(" PEERS tls"),
        "{:?}",
        ring.status(0)
    );
    let mut c = ring.cells[0].connect();
    for k in 0..100 {
        set(&mut c, &format!("k{k}"), "v");
    }
    let (peer, ring_id) = peer_and_ring(&ring, 0);
    let frames = forged_frames(ring_id);
    // The plain peer may get the TLS alert back (not a frame); the TLS ones no plaintext.
    type Attempt<'a> = Box<dyn Fn() -> Vec<u8> + 'a>;
    let attempts: [(&str, Attempt); 3] = [
        ("plain TCP", Box::new(|| plain_peer(&peer, &frames))),
        (
            "another CA",
            Box::new(|| tls_peer(&peer, &ca.pem, &other_cert, &other_key, &frames)),
        ),
        (
            "another name",
            Box::new(|| tls_peer(&peer, &ca.pem, &misnamed_cert, &misnamed_key, &frames)),
        ),
    ];
    for (what, attempt) in attempts {
        let before = failed_handshakes(&ring, 0);
        let reply = attempt();
        assert!(!answered(&reply), "{what}: the forged flush was answered");
        assert!(
            what == "plain TCP" || reply.is_empty(),
            "{what}: got {} bytes back",
            reply.len()
        );
        common::wait_until(
            "the failed handshake counted",
            Duration::from_secs(10),
            Duration::from_millis(50),
            || failed_handshakes(&ring, 0) > before,
        );
    }
    let readable = (0..100)
        .filter(|k| c.get_value(&format!("k{k}")).is_some())
        .count();
    assert_eq!(readable, 100, "no key lost to a forged flush");
    // The control: the same client with the ring's certificate is a cell, and its
    // forwarded flush is served (which is why a ring may want the secret as well).
    let reply = tls_peer(&peer, &ca.pem, &cert, &key, &frames);
    assert!(answered(&reply), "the ring's own certificate got no answer");
}

#[test]
fn a_partial_or_unreadable_peer_tls_configuration_stops_the_start() {
    if common::is_memcached() {
        return;
    }
    let d = dir("partial");
    let ca = Ca::new(&d, "ring");
    let (cert, _key) = ca.issue(&d, "cell", &[SERVER_NAME]);
    let serve = || {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_cellcache"));
        cmd.args(["serve", "-l", "127.0.0.1", "-p", "0"]);
        cmd
    };
    let (ok, stderr) = run_bounded(
        serve().args(["--peer-tls-cert", cert.to_str().expect("utf-8")]),
        Duration::from_secs(30),
    );
    assert!(!ok, "started with only a certificate: {stderr}");
    assert!(
        stderr.contains("--peer-tls-key") && stderr.contains("--peer-tls-ca"),
        "{stderr}"
    );
    // All three given, one of them missing on disk: the start stops naming that file.
    let missing = d.join("no-such-key.pem");
    let (ok, stderr) = run_bounded(
        serve().args(tls_flags(&cert, &missing, &ca.pem)),
        Duration::from_secs(30),
    );
    assert!(!ok, "started without its key: {stderr}");
    assert!(stderr.contains("no-such-key.pem"), "{stderr}");
    // A key that is not the certificate's.
    let (_, other_key) = ca.issue(&d, "other", &[SERVER_NAME]);
    let (ok, stderr) = run_bounded(
        serve().args(tls_flags(&cert, &other_key, &ca.pem)),
        Duration::from_secs(30),
    );
    assert!(!ok, "started with another certificate's key: {stderr}");
    assert!(stderr.contains("cell.pem"), "{stderr}");
}

#[test]
fn a_cell_cannot_join_a_ring_whose_peer_tls_differs() {
    if common::is_memcached() {
        return;
    }
    let d = dir("join");
    let ca = Ca::new(&d, "ring");
    let (cert, key) = ca.issue(&d, "cell", &[SERVER_NAME]);
    let flags = tls_flags(&cert, &key, &ca.pem);
    // A cell with TLS and a ring without: it says why and exits, without retrying.
    let plain = Ring::start(1, &["-m", "32"]);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cellcache"));
    cmd.args(["serve", "-l", "127.0.0.1", "-p", "0", "-m", "32", "--join"])
        .arg(plain.peer(0))
        .args(&flags);
    let (ok, stderr) = run_bounded(&mut cmd, Duration::from_secs(20));
    assert!(!ok, "joined a ring without TLS: {stderr}");
    assert!(stderr.contains("TLS"), "{stderr}");
    assert!(failed_handshakes(&plain, 0) >= 1);
    // A cell without TLS and a ring with it: refused as well, saying so.
    let mut args: Vec<&str> = vec!["-m", "32"];
    args.extend(flags.iter().map(String::as_str));
    let tls = Ring::start(1, &args);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cellcache"));
    cmd.args(["serve", "-l", "127.0.0.1", "-p", "0", "-m", "32", "--join"])
        .arg(tls.peer(0));
    let (ok, stderr) = run_bounded(&mut cmd, Duration::from_secs(20));
    assert!(!ok, "joined a ring with TLS without it: {stderr}");
    assert!(stderr.contains("TLS"), "{stderr}");
    for ring in [&plain, &tls] {
        let cells = ring
            .status(0)
            .iter()
            .filter(|l| l.starts_with("CELL "))
            .count();
        assert_eq!(cells, 1, "the ring took no cell");
    }
}
