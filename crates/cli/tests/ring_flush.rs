//! `flush_all` through a ring of three real processes: it empties every cell's master range
//! and every backup copy exactly once, a write acknowledged after its `OK` survives (also
//! when a cell is then killed), master and backup agree on every key even with writes
//! running during the flush, and a delayed flush takes effect once, at its second.

mod common;

use common::{Client, Ring};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const KEYS: usize = 200;
/// How long a finished flush is watched for echoes (a flush passed on forever wiped every
/// later write within milliseconds).
const ECHO_WATCH: Duration = Duration::from_millis(1500);

fn set(c: &mut Client, key: &str, value: &str) {
    c.roundtrip(
        format!("set {key} 0 0 {}\r\n{value}\r\n", value.len()).as_bytes(),
        b"STORED\r\n",
    );
}

fn get(c: &mut Client, key: &str) -> Option<String> {
    c.get_value(key)
}

/// A cell's own copy of `key` (never forwarded).
fn peek(c: &mut Client, key: &str) -> Option<String> {
    match c.peek_lines(key).as_slice() {
        [] => None,
        [_, v] => Some(v.clone()),
        other => panic!("unexpected peek reply {other:?}"),
    }
}

fn stat(ring: &Ring, i: usize, name: &str) -> u64 {
    ring.cells[i].connect().stat(name).parse().unwrap()
}

/// Every cell's own copies of `key`: exactly the master's and its backup's once written.
fn copies(ring: &Ring, key: &str) -> Vec<Option<String>> {
    (0..ring.cells.len())
        .map(|i| peek(&mut ring.cells[i].connect(), key))
        .collect()
}

fn total_items(ring: &Ring, among: &[usize]) -> u64 {
    among.iter().map(|&i| ring.ranges(i).1).sum()
}

#[test]
fn flush_all_empties_the_ring_once_and_later_writes_survive_a_kill() {
    if common::is_memcached() {
        return;
    }
    let mut ring = Ring::start(3, &["-m", "32"]);
    let mut c0 = ring.cells[0].connect();
    for i in 0..KEYS {
        set(&mut c0, &format!("old{i}"), "x");
    }
    assert_eq!(total_items(&ring, &[0, 1, 2]), 2 * KEYS as u64);

    let mut c1 = ring.cells[1].connect();
    c1.roundtrip(b"flush_all\r\n", b"OK\r\n");
    // Gone from every cell's master range and every backup copy.
    assert_eq!(total_items(&ring, &[0, 1, 2]), 0);
    for c in [&mut c0, &mut c1] {
        assert_eq!(get(c, "old7"), None);
    }

    // Written after the OK: survives, twice (master and backup), and stays.
    let mut c2 = ring.cells[2].connect();
    for i in 0..KEYS {
        set(&mut c2, &format!("new{i}"), &format!("v{i}"));
    }
    std::thread::sleep(ECHO_WATCH);
    assert_eq!(total_items(&ring, &[0, 1, 2]), 2 * KEYS as u64);
    // Each cell flushed its own range once and applied its predecessor's flush once.
    for i in 0..3 {
        assert_eq!(stat(&ring, i, "cluster_flushes"), 1, "cell {i}");
        assert_eq!(stat(&ring, i, "cluster_flushes_applied"), 1, "cell {i}");
    }

    // A retried flush_all (and its noreply form) is the same flush again.
    c1.roundtrip(b"flush_all\r\n", b"OK\r\n");
    c1.send(b"flush_all noreply\r\n");
    c1.roundtrip(b"version\r\n", b"");
    assert!(c1.line().starts_with("VERSION "));
    assert_eq!(total_items(&ring, &[0, 1, 2]), 0);
    for i in 0..KEYS {
        set(&mut c2, &format!("new{i}"), &format!("w{i}"));
    }

    // The acknowledged writes survive the loss of any one cell.
    ring.cells[0].kill9();
    ring.wait_formed_among(2, &[1, 2]);
    for i in [1, 2] {
        let mut c = ring.cells[i].connect();
        for k in 0..KEYS {
            assert_eq!(
                get(&mut c, &format!("new{k}")),
                Some(format!("w{k}")),
                "new{k} via {i}"
            );
        }
    }
}

#[test]
fn master_and_backup_agree_after_a_flush_among_concurrent_writes() {
    if common::is_memcached() {
        return;
    }
    let ring = Ring::start(3, &["-m", "32"]);
    let stop = Arc::new(AtomicBool::new(false));
    // Writers through two cells, each over its own keys, acknowledging every write.
    let writers: Vec<_> = [0usize, 2]
        .into_iter()
        .map(|w| {
            let addr = ring.cells[w].addr;
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut c = Client::to(addr);
                let mut acked = Vec::new();
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) && n < 20_000 {
                    let key = format!("w{w}-{}", n % 150);
                    let value = format!("{n}");
                    set(&mut c, &key, &value);
                    acked.push((key, value, Instant::now()));
                    n += 1;
                }
                acked
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let mut c1 = ring.cells[1].connect();
    c1.roundtrip(b"flush_all\r\n", b"OK\r\n");
    let flushed = Instant::now();
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    let acked: Vec<_> = writers
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    assert!(
        acked.iter().any(|(_, _, t)| *t > flushed),
        "writes after the flush"
    );
    // The last acknowledged value of each key written after the flush was acknowledged is
    // readable, and every cell holding a copy holds that same value.
    let mut last = std::collections::BTreeMap::new();
    for (k, v, t) in &acked {
        last.insert(k.clone(), (v.clone(), *t));
    }
    let mut c = ring.cells[1].connect();
    for (k, (v, t)) in &last {
        let copies: Vec<String> = copies(&ring, k).into_iter().flatten().collect();
        if *t > flushed {
            assert_eq!(get(&mut c, k).as_ref(), Some(v), "{k}");
            assert_eq!(copies, vec![v.clone(), v.clone()], "{k}: master and backup");
        } else {
            // Written before the OK: gone, or (written concurrently) on both copies.
            assert!(
                copies.is_empty() || copies == vec![v.clone(), v.clone()],
                "{k}: copies {copies:?}"
            );
        }
    }
}

#[test]
fn a_delayed_flush_takes_effect_once_at_its_second() {
    if common::is_memcached() {
        return;
    }
    let ring = Ring::start(3, &["-m", "32"]);
    let mut c = ring.cells[0].connect();
    for i in 0..KEYS {
        set(&mut c, &format!("k{i}"), "x");
    }
    c.roundtrip(b"flush_all 2\r\n", b"OK\r\n");
    assert_eq!(get(&mut c, "k3"), Some("x".into()), "not before its second");
    common::wait_until(
        "the delayed flush takes effect",
        Duration::from_secs(15),
        Duration::from_millis(50),
        || total_items(&ring, &[0, 1, 2]) == 0,
    );
    for i in 0..KEYS {
        set(&mut c, &format!("k{i}"), "after");
    }
    std::thread::sleep(ECHO_WATCH);
    assert_eq!(total_items(&ring, &[0, 1, 2]), 2 * KEYS as u64);
    for i in 0..3 {
        assert_eq!(stat(&ring, i, "cluster_flushes"), 1, "cell {i}");
    }
}
