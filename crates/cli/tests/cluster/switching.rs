//! Building blocks switched live in a ring (`ctl switch`, docs/switching.md): every cell at
//! once (`--ring`) and one by one, back and forth, while clients write and read through
//! every cell; and the replication block taking effect the moment it is switched.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crate::common::{self, Ring, Server};

/// Switches made while the clients run (each one a block on every cell): every block the ring
/// switches (eviction, replication) goes back and forth 100 times.
const SWITCHES: usize = 200;
/// Writer threads, one per cell of the ring, each with its own keys.
const WRITERS: usize = 3;
/// Keys per writer: 3 × 2,000 × ~330 bytes stay far below every cell's memory, so no key
/// is evicted and every read must find the latest acknowledged value.
const KEYS_PER_WRITER: usize = 2_000;
/// Writes (all writers) between two switches.
const WRITES_BETWEEN_SWITCHES: u64 = 300;
/// Bound on each writer's rounds, whatever the switches' pace.
const ROUNDS_MAX: u64 = 200_000;

/// One writer: sets its keys through `server` and reads them back; every set is stored and
/// every read finds exactly the version last stored (none is evicted). Returns its reads.
fn write_and_read(server: &Server, w: usize, done: &AtomicBool, writes: &AtomicU64) -> u64 {
    let mut c = server.connect();
    let mut latest = vec![0u64; KEYS_PER_WRITER];
    let mut reads = 0;
    for round in 0..ROUNDS_MAX {
        if done.load(Ordering::Relaxed) {
            break;
        }
        let k = (round * 7919 + w as u64) as usize % KEYS_PER_WRITER;
        let value = format!("{:0300}", round + 1);
        c.send(format!("set w{w}-{k} 0 0 300\r\n{value}\r\n").as_bytes());
        let reply = c.line();
        assert_eq!(reply, "STORED", "set w{w}-{k} in round {round}");
        latest[k] = round + 1;
        writes.fetch_add(1, Ordering::Relaxed);
        let k = (round * 104_729 + 13) as usize % KEYS_PER_WRITER;
        if latest[k] == 0 {
            continue;
        }
        let got = c.get_value(&format!("w{w}-{k}"));
        let version: Option<u64> = got.as_deref().map(|v| v.parse().unwrap());
        assert_eq!(version, Some(latest[k]), "key w{w}-{k}: lost or stale");
        reads += 1;
    }
    // Every key this writer stored, read back at the end.
    for (k, &v) in latest.iter().enumerate().filter(|(_, v)| **v > 0) {
        let got = c.get_value(&format!("w{w}-{k}"));
        assert_eq!(got.map(|g| g.parse::<u64>().unwrap()), Some(v), "w{w}-{k}");
    }
    reads
}

#[test]
fn blocks_switch_on_every_cell_back_and_forth_under_load_without_errors_or_lost_writes() {
    if common::is_memcached() {
        return;
    }
    let ring = Ring::start(WRITERS, &["-m", "32"]);
    let listed = ring.cells[0].blocks();
    assert_eq!(
        listed,
        serde_json::json!({
            "eviction": {"current": "lru", "available": ["lru", "s3fifo"]},
            "layout": {"current": "shared", "available": ["shared"]},
            "write_policy": {"current": "none", "available": []},
            "replication": {"current": "sync", "available": ["sync", "async"]},
        })
    );
    // Refused everywhere, changing nothing: an unknown block, an implementation a block
    // does not have, a block this cell lacks (no tier).
    for (block, implementation) in [
        ("arena", "x"),
        ("replication", "quorum"),
        ("write_policy", "back"),
        ("layout", "partitioned"),
    ] {
        let (status, body) =
            ring.cells[1].admin_call("POST", &format!("/cluster/switch/{block}/{implementation}"));
        assert_eq!(status, 400, "{block} {implementation}: {body}");
    }
    let done = AtomicBool::new(false);
    let writes = AtomicU64::new(0);
    let reads: u64 = std::thread::scope(|scope| {
        let writers: Vec<_> = (0..WRITERS)
            .map(|w| {
                let (server, done, writes) = (&ring.cells[w], &done, &writes);
                scope.spawn(move || write_and_read(server, w, done, writes))
            })
            .collect();
        for i in 0..SWITCHES {
            let (block, to) = match i % 4 {
                0 => ("replication", "async"),
                1 => ("eviction", "s3fifo"),
                2 => ("replication", "sync"),
                _ => ("eviction", "lru"),
            };
            if i % 8 < 4 {
                // Every cell at once, through the one cell's admin plane.
                let out = ring.cells[i % WRITERS].ctl(&["switch", "--ring", block, to]);
                assert!(
                    out.starts_with(&format!("OK {WRITERS} of {WRITERS} cells")),
                    "{out}"
                );
            } else {
                // One by one, each cell's own admin plane.
                for cell in &ring.cells {
                    let out = cell.ctl(&["switch", block, to]);
                    assert!(out.starts_with(&format!("OK {block} ")), "{out}");
                }
            }
            for cell in &ring.cells {
                let (_, list) = cell.admin_call("GET", "/switch");
                let list: serde_json::Value = serde_json::from_str(&list).unwrap();
                assert_eq!(list[block]["current"], to, "{list}");
            }
            // Let the writers make progress between switches (a bounded wait).
            let seen = writes.load(Ordering::Relaxed);
            common::wait_until(
                "writes between switches",
                Duration::from_secs(60),
                Duration::from_millis(2),
                || writes.load(Ordering::Relaxed) >= seen + WRITES_BETWEEN_SWITCHES,
            );
        }
        done.store(true, Ordering::Relaxed);
        writers.into_iter().map(|h| h.join().unwrap()).sum()
    });
    assert!(reads > 0);
    // The mode each cell reports is the one switched to last.
    for cell in &ring.cells {
        let mut c = cell.connect();
        assert_eq!(c.stat("cluster_replication"), "sync");
    }
}

/// The replication block changes when a write is acknowledged, at once: with its backup
/// dead (and not yet declared dead) a master refuses a write it cannot confirm in `sync`,
/// stores it in `async`, and refuses again once switched back.
#[test]
fn a_replication_switch_changes_the_next_writes_acknowledgement() {
    if common::is_memcached() {
        return;
    }
    let mut ring = Ring::two_cells_for_a_dead_backup("refuse");
    let key = ring.key_mastered_by(0, "r");
    let mut c = ring.cells[0].connect();
    c.roundtrip(
        format!("set {key} 0 0 1\r\na\r\n").as_bytes(),
        b"STORED\r\n",
    );
    let held: u64 = c.stat("cluster_replies_held").parse().unwrap();
    assert!(held >= 1, "a sync write's reply waits for its backup");
    ring.cells[1].kill9();
    let refused =
        "SERVER_ERROR cluster: write not confirmed by its backup (it may or may not be applied)";
    c.send(format!("set {key} 0 0 1\r\nb\r\n").as_bytes());
    assert_eq!(c.line(), refused);
    let out = ring.cells[0].ctl(&["switch", "replication", "async"]);
    assert_eq!(out.trim_end(), "OK replication sync -> async");
    let held = c.stat("cluster_replies_held");
    for value in ["c", "d"] {
        c.roundtrip(
            format!("set {key} 0 0 1\r\n{value}\r\n").as_bytes(),
            b"STORED\r\n",
        );
    }
    assert_eq!(c.stat("cluster_replies_held"), held, "async holds no reply");
    assert_eq!(c.get_value(&key).as_deref(), Some("d"));
    let out = ring.cells[0].ctl(&["switch", "replication", "sync"]);
    assert_eq!(out.trim_end(), "OK replication async -> sync");
    c.send(format!("set {key} 0 0 1\r\ne\r\n").as_bytes());
    assert_eq!(c.line(), refused);
}
