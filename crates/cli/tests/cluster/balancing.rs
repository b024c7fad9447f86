//! Balancing: the boundary between two neighbours moves (a shift) under load, down (the
//! successor takes the end of the giver's range it already backs up; the cell after it
//! receives the part first) and up (the predecessor takes the start of the giver's range,
//! streamed to it first).

use super::*;
use cellcache_cluster::HashRange;
use std::time::Duration;

/// The ids of the ring's cells in ring (id) order, from cell 0's status, with each one's
/// index in `ring.cells` and its range.
fn ring_order(ring: &Ring) -> Vec<(String, usize, HashRange)> {
    let status = ring.status(0);
    let mut out = Vec::new();
    for l in status.iter().filter(|l| l.starts_with("CELL ")) {
        let id = l.split(' ').nth(1).unwrap().to_string();
        let index = ring
            .cells
            .iter()
            .position(|s| l.contains(&format!("client={} ", s.addr)))
            .expect("a cell of the test");
        let range = ring.range_of(&format!("client={} ", ring.cells[index].addr));
        out.push((id, index, range.expect("an active cell")));
    }
    out
}

/// Asks cell `via` to move `share` of `from`'s range to its neighbour `to`; waits until the
/// ring shows it done (no migration, `from`'s range smaller) and returns the new ranges.
fn shift(ring: &Ring, via: usize, from: &(String, usize, HashRange), to: &str, share: f64) {
    let path = format!("/cluster/shift/{}?to={to}&share={share}", from.0);
    let (_, reply) = ring.cells[via].admin_call("POST", &path);
    assert!(reply.starts_with("OK "), "shift refused: {reply}");
    let marker = format!("client={} ", ring.cells[from.1].addr);
    common::wait_until(
        "the shift completes",
        Duration::from_secs(60),
        Duration::from_millis(50),
        || {
            let done = (0..ring.cells.len())
                .all(|i| !ring.status(i).iter().any(|l| l.starts_with("MIGRATION")));
            done && ring
                .range_of(&marker)
                .is_some_and(|r| r.len() < from.2.len())
        },
    );
}

/// Two shifts under continuous load from several clients through every cell: no client
/// sees an error, the history checker finds every acknowledged write readable with its
/// latest value (registers) and every acknowledged append once and in order (append logs),
/// the moved parts have their new masters, and every key has exactly two copies again.
#[test]
fn shifts_down_and_up_under_load_lose_nothing() {
    if common::is_memcached() {
        return;
    }
    let mut ring = Ring::start(3, &["-m", "32"]);
    let servers: Vec<_> = ring.cells.iter().map(|s| s.addr).collect();
    let (registers, logs) = load(servers, 17);
    // Keys written before, their copies counted after.
    let mut c = ring.cells[0].connect();
    for i in 0..KEYS {
        let v = value(i, 0);
        let req = format!("set b{i} 0 0 {}\r\n{v}\r\n", v.len());
        c.roundtrip(req.as_bytes(), b"STORED\r\n");
    }
    let during = Duration::from_secs(30);
    assert!(registers.wait_completed(200, during) && logs.wait_completed(200, during));

    // Down: the cell with the largest range gives a third of it to its successor.
    let order = ring_order(&ring);
    let n = order.len();
    let (big, _) = order
        .iter()
        .enumerate()
        .max_by_key(|(_, c)| c.2.len())
        .unwrap();
    let giver = order[big].clone();
    let successor = order[(big + 1) % n].clone();
    shift(&ring, 2, &giver, &successor.0, 0.33);
    let moved_down = HashRange::new(
        giver.2.end - ((giver.2.len() as f64 * 0.33) as u64 - 1),
        giver.2.end,
    );
    let after = ring_order(&ring);
    let now_of = |id: &str| after.iter().find(|c| c.0 == id).unwrap().2;
    assert!(now_of(&successor.0).covers(&moved_down), "{after:?}");
    assert!(!now_of(&giver.0).overlaps(&moved_down), "{after:?}");
    let (r, l) = (registers.completed(), logs.completed());
    assert!(registers.wait_completed(r + 200, during) && logs.wait_completed(l + 200, during));

    // Up: the successor gives the start of its range to its predecessor (streamed first).
    let order = ring_order(&ring);
    let at = order.iter().position(|c| c.0 == successor.0).unwrap();
    let giver = order[at].clone();
    let predecessor = order[(at + n - 1) % n].clone();
    shift(&ring, 1, &giver, &predecessor.0, 0.25);
    let after = ring_order(&ring);
    let grown = after.iter().find(|c| c.0 == predecessor.0).unwrap().2;
    assert!(grown.len() > predecessor.2.len(), "{after:?}");
    assert!(grown.contains(giver.2.start), "{after:?}");
    let (r, l) = (registers.completed(), logs.completed());
    assert!(registers.wait_completed(r + 200, during) && logs.wait_completed(l + 200, during));

    lost_nothing([("registers", registers), ("append logs", logs)]);
    ring.assert_no_stray_writes();
    // Every key written before: its value through every cell, and exactly two copies (the
    // shifts' extra copies dropped, none missing), on its master and the cell after it.
    let mut clients: Vec<Client> = ring.cells.iter().map(|s| s.connect()).collect();
    for i in 0..KEYS {
        let key = format!("b{i}");
        for c in clients.iter_mut() {
            assert_eq!(get(c, &key), Some(value(i, 0)), "{key}");
        }
        common::wait_until(
            "two copies of every key",
            Duration::from_secs(20),
            Duration::from_millis(100),
            || holders(&mut clients, &key).len() == 2,
        );
        assert!(
            holders(&mut clients, &key).contains(&ring.master_of(&key)),
            "{key}"
        );
    }
}

/// Three cells of 32 MB deciding every second, for the autoscaler's balancing tests.
const AUTOSCALING: [&str; 7] = [
    "-m",
    "32",
    "--autoscale",
    "--scale-window",
    "1s",
    "--cooldown",
    "1s",
];

/// The autoscaler balances by itself: three cells formed by divisions master a half and two
/// quarters of the ring; with data in it, the leader sees neighbours skewed past
/// `balance_skew` for the window and moves a boundary — logged as a `balance` decision and
/// a finished shift — until no neighbours are skewed, with every key still readable.
#[test]
fn the_autoscaler_evens_out_skewed_neighbours() {
    if common::is_memcached() {
        return;
    }
    let env = [
        ("CELLCACHE_AUTOSCALE__SAMPLE_INTERVAL_MS", "200"),
        // No cell of the operator's is absorbed, none fills up: balancing is all there is.
        ("CELLCACHE_AUTOSCALE__BALANCE_SKEW", "0.5"),
        ("CELLCACHE_AUTOSCALE__BALANCE_MIN_FILL", "0.02"),
    ];
    let ring = Ring::start_with_env(3, &AUTOSCALING, &env);
    let shares = |ring: &Ring| -> Vec<f64> {
        ring_order(ring)
            .iter()
            .map(|c| c.2.len() as f64 / 2f64.powi(64))
            .collect()
    };
    let before = shares(&ring);
    let skewed = |s: &[f64]| {
        (0..s.len()).any(|i| {
            let (a, b) = (s[i], s[(i + 1) % s.len()]);
            a.max(b) > 1.5 * a.min(b)
        })
    };
    assert!(
        skewed(&before),
        "divisions leave halves beside quarters: {before:?}"
    );
    // About 6 MB of values: neighbours then differ by well over 2% of a cell's 32 MB.
    let mut c = ring.cells[0].connect();
    let big = "x".repeat(2000);
    for i in 0..3000 {
        let req = format!("set k{i} 0 0 {}\r\n{big}\r\n", big.len());
        c.roundtrip(req.as_bytes(), b"STORED\r\n");
    }
    common::wait_until(
        "the ring balances itself",
        Duration::from_secs(120),
        Duration::from_millis(200),
        || !skewed(&shares(&ring)),
    );
    let (_, events) = ring.cells[0].admin_call("GET", "/events");
    assert!(events.contains("shift_finished"), "{events}");
    let decisions = ring.cells[0].admin_lines("/cluster/autoscale");
    eprintln!("{decisions:#?}\nshares {before:?} -> {:?}", shares(&ring));
    for i in (0..3000).step_by(97) {
        let key = format!("k{i}");
        for s in &ring.cells {
            assert_eq!(
                s.connect().get_value(&key).as_deref(),
                Some(big.as_str()),
                "{key}"
            );
        }
    }
}

/// Balancing by load: three cells with next to nothing stored (even in memory); a client
/// hammers keys of one cell's range. The leader sees that cell execute more than `1 +
/// balance_load_skew` times a neighbour's key requests for the window and moves part of its
/// range over: a `balance` decision giving key requests as its reason, a finished shift,
/// the busy cell's range smaller, every key still readable from every cell.
#[test]
fn the_autoscaler_spreads_a_busy_cells_load() {
    if common::is_memcached() {
        return;
    }
    let env = [
        ("CELLCACHE_AUTOSCALE__SAMPLE_INTERVAL_MS", "200"),
        ("CELLCACHE_AUTOSCALE__BALANCE_MIN_LOAD", "100"),
    ];
    let ring = Ring::start_with_env(3, &AUTOSCALING, &env);
    let order = ring_order(&ring);
    let (hot_id, hot, range) = order[1].clone();
    let keys: Vec<String> = (0..20_000)
        .map(|i| format!("h{i}"))
        .filter(|k| range.contains(cellcache_cluster::key_hash(k.as_bytes())))
        .take(200)
        .collect();
    assert_eq!(keys.len(), 200);
    let mut c = ring.cells[hot].connect();
    for k in &keys {
        c.roundtrip(
            format!("set {k} 0 0 2\r\nv{}\r\n", k.len() % 10).as_bytes(),
            b"STORED\r\n",
        );
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let hammer = {
        let (stop, keys) = (stop.clone(), keys.clone());
        std::thread::spawn(move || {
            let mut gets = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let k = &keys[gets as usize % keys.len()];
                assert!(c.get_value(k).is_some(), "{k}");
                gets += 1;
            }
            gets
        })
    };
    let marker = format!("client={} ", ring.cells[hot].addr);
    common::wait_until(
        "the busy cell gives part of its range away",
        Duration::from_secs(120),
        Duration::from_millis(200),
        || {
            ring.range_of(&marker)
                .is_some_and(|r| r.len() < range.len())
        },
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let gets = hammer.join().expect("the client");
    let decisions = ring.cells[0].admin_lines("/cluster/autoscale");
    eprintln!("{gets} gets; {decisions:#?}");
    assert!(
        decisions
            .iter()
            .any(|d| d.contains("balance") && d.contains(&hot_id) && d.contains("key requests")),
        "{decisions:#?}"
    );
    let (_, events) = ring.cells[0].admin_call("GET", "/events");
    assert!(events.contains("shift_finished"), "{events}");
    for k in &keys {
        for s in &ring.cells {
            assert_eq!(
                s.connect().get_value(k).as_deref(),
                Some(format!("v{}", k.len() % 10).as_str()),
                "{k}"
            );
        }
    }
}
