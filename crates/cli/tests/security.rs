//! What an attacker on the network can do to a ring, tried with real processes on
//! loopback: with a cluster secret, a peer that cannot prove it is closed before any of its
//! frames is read, the client port speaks only memcached (the ring's commands are on the
//! admin plane, which needs its token beyond loopback), a cell without the secret cannot
//! join, and idle connections cannot hold the peer or admin port. Without a secret the same
//! forged peer wipes a cell's data — the reason rings run with one. What a peer that holds
//! the secret (a member) can no longer do is in `security/member.rs`.

mod common;
#[path = "security/member.rs"]
mod member;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use cellcache_cluster::wire::{self, FrameKind, WireConfig, payload};
use common::{Client, Ring};

/// A fresh secret file written by `cellcache ctl secret new`, unique to `name`.
fn secret_file(name: &str) -> PathBuf {
    let dir = cellcache_testkit::process::scratch_dir("secrets");
    let path = dir.join(format!("{name}.secret"));
    let _ = std::fs::remove_file(&path);
    let out = Command::new(env!("CARGO_BIN_EXE_cellcache"))
        .args(["ctl", "secret", "new"])
        .arg(&path)
        .output()
        .expect("ctl secret new runs");
    assert!(out.status.success(), "{out:?}");
    path
}

fn ring_with_secret(n: usize, secret: &std::path::Path) -> Ring {
    let path = secret.to_str().expect("a UTF-8 path");
    Ring::start_with_env(
        n,
        &["-m", "32"],
        &[("CELLCACHE_CLUSTER__SECRET_FILE", path)],
    )
}

fn get(c: &mut Client, key: &str) -> Option<String> {
    c.get_value(key)
}

/// `(client address, peer address, ring id)` of cell `i`, from its status.
fn addresses(ring: &Ring, i: usize) -> (String, String, u64) {
    let status = ring.status(i);
    let ring_id = status[0]
        .split(' ')
        .skip_while(|w| *w != "RING")
        .nth(1)
        .map(|h| u64::from_str_radix(h, 16).expect("a hex ring id"))
        .expect("RING in the status");
    let me = ring.id(i);
    let line = status
        .iter()
        .find(|l| l.starts_with(&format!("CELL {me} ")))
        .expect("the cell's own line");
    let field = |name: &str| {
        line.split(' ')
            .find_map(|w| w.strip_prefix(name))
            .expect("an address field")
            .to_string()
    };
    (field("client="), field("peer="), ring_id)
}

fn stat(ring: &Ring, i: usize, name: &str) -> u64 {
    ring.cells[i]
        .connect()
        .stat_of("cellcache", name)
        .parse()
        .expect("a count")
}

/// A forged peer: introduces itself as cell 2 of the ring (it read the ring id from the
/// client port), then forwards a `flush_all` as a cell would. Returns whether the cell
/// closed the connection without answering.
fn forged_peer_flush(peer: &str, ring_id: u64) -> bool {
    let wire = WireConfig::default();
    let mut frames = Vec::new();
    let hello = payload::encode_hello(&payload::Hello {
        cell: cellcache_cluster::CellId::whole(2),
        ring: ring_id,
        client: "127.0.0.1:1".into(),
    });
    wire::encode(&wire, FrameKind::Hello, 1_000, 0, &hello, &mut frames).expect("hello");
    wire::encode(
        &wire,
        FrameKind::ForwardRequest,
        1_000,
        7,
        b"flush_all\r\n",
        &mut frames,
    )
    .expect("forward");
    let mut s = TcpStream::connect(peer).expect("the peer port accepts");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    s.write_all(&frames).expect("sent");
    let mut reply = Vec::new();
    let _ = s.read_to_end(&mut reply);
    // Only a `Refused` frame saying why may come back; never a forwarded reply.
    let answered = !reply.is_empty()
        && matches!(
            wire::decode(&wire, &reply),
            Ok(wire::Decoded::Complete { frame, .. }) if frame.kind != FrameKind::Refused
        );
    !answered
}

fn write_keys(c: &mut Client, n: usize) {
    for i in 0..n {
        c.roundtrip(
            format!("set k{i} 0 0 2\r\nv{}\r\n", i % 10).as_bytes(),
            b"STORED\r\n",
        );
    }
}

fn readable(c: &mut Client, n: usize) -> usize {
    (0..n)
        .filter(|i| get(c, &format!("k{i}")).is_some())
        .count()
}

#[test]
fn a_peer_without_the_secret_is_closed_before_any_frame_is_read() {
    if common::is_memcached() {
        return;
    }
    let secret = secret_file("forged");
    let ring = ring_with_secret(2, &secret);
    let mut c = ring.cells[0].connect();
    write_keys(&mut c, 100);
    let (_, peer, ring_id) = addresses(&ring, 0);
    assert!(
        forged_peer_flush(&peer, ring_id),
        "the forged peer got an answer"
    );
    assert_eq!(
        readable(&mut c, 100),
        100,
        "no key lost to the forged flush"
    );
    assert!(stat(&ring, 0, "cluster_peer_handshakes_failed") >= 1);
}

/// The same forged peer against a ring without a secret: its flush is served. This is
/// what running open means (docs/security.md), and why `cluster up` makes a secret.
#[test]
fn without_a_secret_a_forged_peer_is_served() {
    if common::is_memcached() {
        return;
    }
    let ring = Ring::start(2, &["-m", "32"]);
    // Every status says the ring is open.
    assert!(
        ring.status(1)[0].ends_with(" PEERS open"),
        "{:?}",
        ring.status(1)
    );
    let mut c = ring.cells[0].connect();
    write_keys(&mut c, 100);
    let (_, peer, ring_id) = addresses(&ring, 0);
    assert!(
        !forged_peer_flush(&peer, ring_id),
        "the open ring refused it"
    );
    assert!(
        readable(&mut c, 100) < 100,
        "the forged flush emptied a range"
    );
}

#[test]
fn the_client_port_speaks_only_memcached() {
    if common::is_memcached() {
        return;
    }
    let secret = secret_file("commands");
    let ring = ring_with_secret(2, &secret);
    // The ring's commands are not memcached's: the client port answers them as memcached
    // answers any unknown command, and nothing changes.
    let mut c = ring.cells[0].connect();
    for line in [
        "cluster leave 2",
        "cluster join 127.0.0.1:1 127.0.0.1:2",
        "cluster status",
        "cluster invite 127.0.0.1:1 1",
    ] {
        c.roundtrip(format!("{line}\r\n").as_bytes(), b"ERROR\r\n");
    }
    c.roundtrip(b"set after 0 0 1\r\nx\r\n", b"STORED\r\n");
    assert!(
        ring.status(1)[0].ends_with(" PEERS secret"),
        "{:?}",
        ring.status(1)
    );
    let (_, peer, _) = addresses(&ring, 0);
    // A cell without the secret, or with another one, cannot join: it says why and exits.
    let other = secret_file("other");
    for extra in [None, Some(other.to_str().expect("utf-8"))] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_cellcache"));
        cmd.args(["serve", "-l", "127.0.0.1", "-p", "0", "--join", &peer])
            .env("CELLCACHE_CLUSTER__STATE_DIR", "off")
            .env("CELLCACHE_LOG__LEVEL", "error");
        if let Some(path) = extra {
            cmd.args(["--cluster-secret-file", path]);
        }
        let out = cmd.output().expect("serve runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "joined without the secret: {stderr}");
        assert!(stderr.contains("secret"), "{extra:?}: {stderr}");
    }
    assert_eq!(
        ring.status(0)
            .iter()
            .filter(|l| l.starts_with("CELL "))
            .count(),
        2
    );
    // The operator's way: `ctl leave` on the admin plane (loopback) and the cell leaves.
    let leaving = ring.id(1);
    let admin = ring.cells[0].admin.expect("an admin port").to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_cellcache"))
        .args(["ctl", "leave", &leaving, "-s", &admin])
        .output()
        .expect("ctl leave runs");
    assert!(out.status.success(), "{out:?}");
    common::wait_until(
        "the cell left the ring",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || {
            ring.status(0)
                .iter()
                .filter(|l| l.starts_with("CELL "))
                .count()
                == 1
        },
    );
}

/// With a token, the admin plane answers only requests that carry it (`ctl` with
/// `--admin-token-file`); only with one may it listen beyond loopback.
#[test]
fn the_admin_plane_needs_its_token() {
    if common::is_memcached() {
        return;
    }
    let token_path = secret_file("admin-token");
    let token = std::fs::read_to_string(&token_path).expect("the token");
    let token = token.trim();
    let path = token_path.to_str().expect("utf-8");
    let ring = Ring::start(1, &["-m", "32", "--admin-token-file", path]);
    let admin = ring.cells[0].admin.expect("an admin port").to_string();
    let call = |token: Option<&str>| {
        cellcache_node::admin::client::call(
            &admin,
            "GET",
            "/cluster/status",
            token,
            Duration::from_secs(10),
        )
        .expect("the admin plane answers")
    };
    for wrong in [None, Some("nope"), Some(&token[1..])] {
        let reply = call(wrong);
        assert_eq!(reply.status, 401, "{wrong:?}: {reply:?}");
        assert!(!reply.body.contains("EPOCH"), "{reply:?}");
    }
    let reply = call(Some(token));
    assert_eq!(reply.status, 200, "{reply:?}");
    assert!(reply.body.starts_with("EPOCH "), "{reply:?}");
    // The data endpoints need it; the health probe (`OK`, for orchestrators' probes, which
    // cannot send a token) and the dashboard page (no data of its own) do not.
    for (path, open) in [
        ("/health", true),
        ("/", true),
        ("/cells", false),
        ("/metrics", false),
    ] {
        let reply =
            cellcache_node::admin::client::call(&admin, "GET", path, None, Duration::from_secs(10))
                .expect("the admin plane answers");
        assert_eq!(reply.status == 200, open, "{path}: {reply:?}");
    }
    let ctl = |with_token: bool| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_cellcache"));
        cmd.args(["ctl", "status", "-s", &admin])
            .env_remove("CELLCACHE_ADMIN__TOKEN_FILE");
        if with_token {
            cmd.args(["--admin-token-file", path]);
        }
        cmd.output().expect("ctl runs")
    };
    assert!(!ctl(false).status.success());
    let out = ctl(true);
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("CELL 1 active"));
    // Beyond loopback without a token: refused at start, saying why.
    let out = Command::new(env!("CARGO_BIN_EXE_cellcache"))
        .args(["serve", "-l", "127.0.0.1", "-p", "0", "--standalone"])
        .args(["--admin-listen", "0.0.0.0"])
        .env("CELLCACHE_CLUSTER__STATE_DIR", "off")
        .output()
        .expect("serve runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("admin.token_file"), "{stderr}");
}

/// Whether the server closed `s` (reads its end now, without waiting).
fn closed_now(s: &TcpStream) -> bool {
    s.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 64];
    let closed = match (&*s).read(&mut buf) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
    };
    s.set_nonblocking(false).unwrap();
    closed
}

/// 3,000 idle connections to the admin port: past `admin.connections_max` each is closed
/// at once (the held ones stay until their lifetime, set long here), and the operator gets
/// in once a slot frees; each connection lives at most `admin.connection_timeout_ms`.
#[test]
fn idle_connections_cannot_hold_the_admin_port() {
    if common::is_memcached() {
        return;
    }
    const FLOOD: usize = 3_000;
    const MAX: usize = 8;
    let env = [
        ("CELLCACHE_ADMIN__CONNECTIONS_MAX", "8"),
        ("CELLCACHE_ADMIN__CONNECTION_TIMEOUT_MS", "600000"),
    ];
    let server = common::Server::start_with_env(&["--standalone"], &env);
    let admin = server.admin.expect("an admin port");
    let health = || {
        cellcache_node::admin::client::call(
            &admin.to_string(),
            "GET",
            "/health",
            None,
            Duration::from_secs(2),
        )
        .is_ok_and(|r| r.ok())
    };
    let mut idle: Vec<TcpStream> = (0..FLOOD)
        .filter_map(|_| TcpStream::connect(admin).ok())
        .collect();
    assert!(idle.len() > MAX);
    // Long before their lifetime ends, all but the held ones are closed.
    common::wait_until(
        "every connection past admin.connections_max closed",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || idle.iter().filter(|s| !closed_now(s)).count() <= MAX,
    );
    idle.retain(|s| !closed_now(s));
    assert_eq!(idle.len(), MAX, "the held ones stay");
    assert!(!health(), "every slot is held");
    idle.pop();
    common::wait_until(
        "the operator gets a freed slot",
        Duration::from_secs(30),
        Duration::from_millis(100),
        health,
    );
    drop(idle);
    // A connection's lifetime: an idle one is closed once it ends.
    let env = [("CELLCACHE_ADMIN__CONNECTION_TIMEOUT_MS", "300")];
    let server = common::Server::start_with_env(&["--standalone"], &env);
    let lingering = TcpStream::connect(server.admin.expect("an admin port")).unwrap();
    common::wait_until(
        "an idle admin connection closed after admin.connection_timeout_ms",
        Duration::from_secs(30),
        Duration::from_millis(50),
        || closed_now(&lingering),
    );
}

/// An idle flood of the peer port: each connection is closed once it has not finished its
/// handshake in time, or at once past `peer_connections_max`; the ring keeps serving.
#[test]
fn idle_connections_cannot_hold_the_peer_port() {
    if common::is_memcached() {
        return;
    }
    const FLOOD: usize = 3_000;
    let secret = secret_file("flood");
    let path = secret.to_str().expect("utf-8");
    let ring = Ring::start_with_env(
        2,
        &["-m", "32"],
        &[
            ("CELLCACHE_CLUSTER__SECRET_FILE", path),
            ("CELLCACHE_CLUSTER__PEER_CONNECTIONS_MAX", "32"),
            ("CELLCACHE_CLUSTER__PEER_HANDSHAKE_TIMEOUT_MS", "500"),
        ],
    );
    let (_, peer, _) = addresses(&ring, 0);
    let flood: Vec<TcpStream> = (0..FLOOD)
        .filter_map(|_| TcpStream::connect(&peer).ok())
        .collect();
    common::wait_until(
        "every idle connection closed or refused",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || {
            stat(&ring, 0, "cluster_peer_handshakes_failed")
                + stat(&ring, 0, "cluster_peer_connections_refused")
                >= flood.len() as u64
        },
    );
    assert!(stat(&ring, 0, "cluster_peer_connections_refused") > 0);
    // Served throughout, through both cells (so across the peer plane).
    for cell in &ring.cells {
        let mut c = cell.connect();
        write_keys(&mut c, 50);
        assert_eq!(readable(&mut c, 50), 50);
    }
    drop(flood);
}
