//! Client authentication through a ring whose every cell has the same `-Y` file: the entry
//! cell checks the client; the requests it forwards to a key's master travel between cells
//! (proven by the ring's secret) and are not checked again, so an authenticated client is
//! served on any cell for keys mastered anywhere, in text and in binary. The ring's own
//! work (joining, rejoining, `ctl`) never goes through a client port, so it needs no login.

mod binary_wire;
mod common;

use binary_wire::*;
use common::{Client, Ring, Server, auth_file, login};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const USERS: &str = "alice:secret\nbob:hunter2\n";
const KEYS: usize = 48;

fn key(i: usize) -> String {
    format!("akey{i}")
}

/// A fresh ring secret (`cellcache ctl secret new`).
fn secret_file() -> String {
    let path = format!("{}.secret", auth_file(""));
    let out = Command::new(env!("CARGO_BIN_EXE_cellcache"))
        .args(["ctl", "secret", "new", &path])
        .output()
        .expect("ctl secret new runs");
    assert!(out.status.success(), "{out:?}");
    path
}

fn logged_in(s: &Server, user: &str, password: &str) -> Client {
    let mut c = s.connect();
    c.roundtrip(&login(user, password), b"STORED\r\n");
    c
}

#[test]
fn an_authenticated_client_is_served_on_every_cell_for_keys_mastered_elsewhere() {
    if common::is_memcached() {
        return;
    }
    let users = auth_file(USERS);
    let secret = secret_file();
    let ring = Ring::start(
        3,
        &["-m", "32", "-Y", &users, "--cluster-secret-file", &secret],
    );
    let masters: Vec<usize> = (0..KEYS).map(|i| ring.master_of(&key(i))).collect();
    for cell in 0..3 {
        assert!(masters.contains(&cell), "a key of cell {cell}: {masters:?}");
    }
    // Text writes through every cell: a third of the keys each, most mastered elsewhere.
    for (cell, server) in ring.cells.iter().enumerate() {
        let mut c = logged_in(server, "alice", "secret");
        for i in (cell..KEYS).step_by(3) {
            let v = format!("t{i}");
            let set = format!("set {} 0 0 {}\r\n{v}\r\n", key(i), v.len());
            c.roundtrip(set.as_bytes(), b"STORED\r\n");
        }
    }
    // Every key read back through every cell, in text and in binary.
    for (cell, server) in ring.cells.iter().enumerate() {
        let mut t = logged_in(server, "bob", "hunter2");
        let mut b = server.connect();
        let r = call(&mut b, &sasl_plain("bob", "hunter2", 1));
        assert_eq!((r.status, r.value.as_slice()), (OK, &b"Authenticated"[..]));
        for i in 0..KEYS {
            let want = format!("t{i}");
            assert_eq!(
                t.get_value(&key(i)),
                Some(want.clone()),
                "{} via {cell}",
                key(i)
            );
            let r = call(&mut b, &get(GET, key(i).as_bytes(), 2 + i as u32));
            assert_eq!(
                (r.status, r.value),
                (OK, want.into_bytes()),
                "binary via {cell}"
            );
        }
    }
    // Binary writes through every cell are forwarded too.
    for (cell, server) in ring.cells.iter().enumerate() {
        let mut b = server.connect();
        assert_eq!(call(&mut b, &sasl_plain("alice", "secret", 1)).status, OK);
        for i in (cell..KEYS).step_by(3) {
            let r = call(&mut b, &set(key(i).as_bytes(), b"b", 0, 100 + i as u32, 0));
            assert_eq!(r.status, OK, "binary set of {} via {cell}", key(i));
        }
    }
    for (cell, server) in ring.cells.iter().enumerate() {
        let mut t = logged_in(server, "alice", "secret");
        for i in 0..KEYS {
            assert_eq!(t.get_value(&key(i)).as_deref(), Some("b"), "via {cell}");
        }
        // A client that did not log in is refused here, before anything is forwarded.
        let mut anon = server.connect();
        for i in [0, 1, 2] {
            anon.roundtrip(
                format!("get {}\r\n", key(i)).as_bytes(),
                b"CLIENT_ERROR unauthenticated\r\n",
            );
        }
        let mut anon = server.connect();
        let r = call(&mut anon, &get(GET, key(0).as_bytes(), 7));
        assert_eq!(r.status, AUTH_ERROR);
    }
}

/// Runs `cellcache` with `args` to its end (bounded), returning its status and stderr.
fn run(args: &[&str]) -> (std::process::ExitStatus, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_cellcache"))
        .args(args)
        .env("CELLCACHE_CLUSTER__STATE_DIR", "off")
        .env("CELLCACHE_LOG__LEVEL", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cellcache runs");
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() >= deadline {
            let _ = child.kill();
            panic!("cellcache {args:?} did not end");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("output");
    let text =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    (out.status, text)
}

/// Client logins guard the client ports only: the ring's own work goes over the peer and
/// admin planes, which have credentials of their own (the ring's secret, the admin token).
/// `ctl` needs no client login, and a cell's status answers on its admin plane while its
/// client port refuses anything before a login.
#[test]
fn the_rings_planes_do_not_take_client_logins() {
    if common::is_memcached() {
        return;
    }
    let users = auth_file(USERS);
    let ring = Ring::start(1, &["-m", "16", "-Y", &users]);
    let admin = ring.cells[0].admin.expect("an admin port").to_string();
    let (status, text) = run(&["ctl", "-s", &admin, "status"]);
    assert!(status.success() && text.contains("CELL "), "{text}");
    let mut c = ring.cells[0].connect();
    c.roundtrip(b"stats\r\n", b"CLIENT_ERROR unauthenticated\r\n");
}

/// A ring's first cell restarted with its command line rejoins through its old ring's
/// cells (asked over the peer plane, whatever their client logins), and an authenticated
/// client reads what was written before.
#[test]
fn a_restarted_first_cell_with_logins_rejoins() {
    if common::is_memcached() {
        return;
    }
    let users = auth_file(USERS);
    let mut ring = Ring::start(3, &["-m", "16", "-Y", &users]);
    let peer = ring.peer_port(0);
    let admin = ring.cells[0]
        .admin
        .expect("an admin port")
        .port()
        .to_string();
    let mut c = logged_in(&ring.cells[1], "alice", "secret");
    c.roundtrip(b"set kept 0 0 1\r\nk\r\n", b"STORED\r\n");
    let old_id = ring.id(0);
    let port = ring.cells[0].addr.port();
    ring.cells[0].kill9();
    let args = [
        "-m",
        "16",
        "-Y",
        &users,
        "--peer-port",
        &peer,
        "--admin-port",
        &admin,
    ];
    let (restarted, ready) = Server::restart_on(port, &args, None);
    assert!(ready, "the restarted cell serves");
    ring.cells[0] = restarted;
    ring.wait_formed(3);
    assert_ne!(ring.id(0), old_id, "it rejoined as a new cell");
    let mut c = logged_in(&ring.cells[0], "bob", "hunter2");
    assert_eq!(c.get_value("kept").as_deref(), Some("k"));
}
