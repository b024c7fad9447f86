//! Restarting a ring's first cell (the one started without `--join`) with its original
//! command line, after `kill -9`: with its membership file it rejoins its ring as a new,
//! empty cell and the ring loses no acknowledged write; without the file it is called by
//! its old ring, refuses it and stops, never serving beside it. Either way there is one
//! ring, never two.

mod common;

use common::{Client, Ring, Server};
use std::time::Duration;

const KEYS: usize = 300;

fn get(c: &mut Client, key: &str) -> Option<String> {
    c.get_value(key)
}

/// A ring of three with `KEYS` keys written through cell 1; returns the ring and the
/// command line (after `serve -l 127.0.0.1 -p PORT`) cell 0 was started with.
fn ring_with_keys() -> (Ring, Vec<String>) {
    let ring = Ring::start(3, &["-m", "32"]);
    let mut c = ring.cells[1].connect();
    for i in 0..KEYS {
        let v = format!("v{i}");
        c.roundtrip(
            format!("set key{i} 0 0 {}\r\n{v}\r\n", v.len()).as_bytes(),
            b"STORED\r\n",
        );
    }
    let status = ring.status(0);
    let me = status
        .iter()
        .find(|l| l.starts_with("CELL ") && l.contains(&format!("client={} ", ring.cells[0].addr)))
        .expect("cell 0 in the map");
    let peer = me
        .split(' ')
        .find_map(|w| w.strip_prefix("peer="))
        .and_then(|a| a.rsplit_once(':'))
        .map(|(_, p)| p.to_string())
        .expect("peer address");
    let admin = ring.cells[0]
        .admin
        .expect("an admin port")
        .port()
        .to_string();
    let args = ["-m", "32", "--peer-port", &peer, "--admin-port", &admin]
        .map(String::from)
        .to_vec();
    (ring, args)
}

fn ring_id(ring: &Ring, i: usize) -> String {
    ring.status(i)[0]
        .split(' ')
        .nth(9)
        .expect("RING")
        .to_string()
}

fn every_key_readable(ring: &Ring, among: &[usize]) {
    for &i in among {
        let mut c = ring.cells[i].connect();
        for k in 0..KEYS {
            assert_eq!(
                get(&mut c, &format!("key{k}")),
                Some(format!("v{k}")),
                "key{k} via {i}"
            );
        }
    }
}

#[test]
fn a_restarted_first_cell_rejoins_its_ring_as_a_new_cell() {
    if common::is_memcached() {
        return;
    }
    let (mut ring, args) = ring_with_keys();
    let old_id = ring.id(0);
    let old_ring = ring_id(&ring, 1);
    let port = ring.cells[0].addr.port();
    ring.cells[0].kill9();
    // Started again at once, exactly as the first time.
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (restarted, ready) = Server::restart_on(port, &args, None);
    assert!(ready, "the restarted cell serves");
    ring.cells[0] = restarted;
    ring.wait_formed(3);
    assert_ne!(ring.id(0), old_id, "it came back as a new cell");
    for i in 0..3 {
        assert_eq!(ring_id(&ring, i), old_ring, "one ring: cell {i}");
    }
    every_key_readable(&ring, &[0, 1, 2]);
}

#[test]
fn a_restarted_first_cell_without_its_membership_file_stops_when_its_ring_calls() {
    if common::is_memcached() {
        return;
    }
    let (mut ring, args) = ring_with_keys();
    let port = ring.cells[0].addr.port();
    ring.cells[0].kill9();
    let mut args: Vec<&str> = args.iter().map(String::as_str).collect();
    args.extend(["--state-dir", "off"]);
    let (mut restarted, _) = Server::restart_on(port, &args, Some("off"));
    let status = restarted.exit_within(Duration::from_secs(30));
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(3),
        "it stops rather than serve beside its old ring"
    );
    // The old ring absorbed the dead cell and lost nothing.
    ring.wait_formed_among(2, &[1, 2]);
    every_key_readable(&ring, &[1, 2]);
}

/// Every cell given the same `--join` — the first cell's own peer address, as a StatefulSet
/// gives each pod the first pod's name: the first starts the ring, the others join it, one
/// ring.
#[test]
fn cells_all_told_to_join_the_first_make_one_ring() {
    if common::is_memcached() {
        return;
    }
    let first_peer = common::free_peer_port().to_string();
    let join = format!("127.0.0.1:{first_peer}");
    let mut cells = vec![Server::start(&[
        "-m",
        "32",
        "--peer-port",
        &first_peer,
        "--join",
        &join,
    ])];
    for _ in 1..3 {
        let peer = common::free_peer_port().to_string();
        cells.push(Server::start(&[
            "-m",
            "32",
            "--peer-port",
            &peer,
            "--join",
            &join,
        ]));
    }
    let ring = Ring { cells };
    ring.wait_formed(3);
    let first_ring = ring_id(&ring, 0);
    for i in 1..3 {
        assert_eq!(ring_id(&ring, i), first_ring, "one ring");
    }
}
