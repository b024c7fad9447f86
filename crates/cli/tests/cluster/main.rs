//! A ring of three real processes on loopback: forwarding, multi-key gets split by owner,
//! synchronous replication of every mutation, backups holding exactly their predecessor's
//! range, CAS coherent on backups, and epoch fencing of a deposed master's replication.

#[path = "../common/mod.rs"]
mod common;

use common::{Client, Ring};
use std::io::{Read, Write};

const KEYS: usize = 300;

fn value(i: usize, round: usize) -> String {
    format!("v{i}-{round}")
}

fn get(c: &mut Client, key: &str) -> Option<String> {
    c.get_value(key)
}

/// Writes `key0` .. `key{KEYS - 1}` through `c`, each with [`value`] of round 0.
fn set_keys(c: &mut Client) {
    for i in 0..KEYS {
        let v = value(i, 0);
        c.roundtrip(
            format!("set key{i} 0 0 {}\r\n{v}\r\n", v.len()).as_bytes(),
            b"STORED\r\n",
        );
    }
}

/// Every key [`set_keys`] wrote reads back through `c` with its value; `via` names `c`.
fn check_keys(c: &mut Client, via: &str) {
    for i in 0..KEYS {
        assert_eq!(
            get(c, &format!("key{i}")),
            Some(value(i, 0)),
            "key{i} via {via}"
        );
    }
}

/// A cell's own copy of `key` (never forwarded): (value, cas).
fn peek(c: &mut Client, key: &str) -> Option<(String, u64)> {
    match c.peek_lines(key).as_slice() {
        [] => None,
        [header, v] => Some((
            v.clone(),
            header.split(' ').nth(4).unwrap().parse().unwrap(),
        )),
        other => panic!("unexpected peek reply {other:?}"),
    }
}

#[test]
fn three_cells_serve_one_cache() {
    if common::is_memcached() {
        return;
    }
    let ring = Ring::start(3, &["-m", "32"]);
    let mut clients: Vec<Client> = ring.cells.iter().map(|s| s.connect()).collect();
    // Writes through every cell.
    for i in 0..KEYS {
        let v = value(i, 0);
        let c = &mut clients[i % 3];
        c.roundtrip(
            format!("set key{i} 7 0 {}\r\n{v}\r\n", v.len()).as_bytes(),
            b"STORED\r\n",
        );
    }
    // Every key readable through every cell.
    for (i, c) in clients.iter_mut().enumerate() {
        check_keys(c, &format!("cell {i}"));
    }
    // A multi-key get spanning every master comes back whole and in request order,
    // duplicates included.
    let keys: Vec<String> = (0..60).map(|i| format!("key{i}")).collect();
    let mut req = format!("get {} key3 nosuchkey key0\r\n", keys.join(" "));
    clients[1].send(req.as_bytes());
    let lines = clients[1].lines_until_end();
    let got: Vec<&str> = lines
        .iter()
        .filter(|l| l.starts_with("VALUE"))
        .map(|l| l.split(' ').nth(1).unwrap())
        .collect();
    let mut want: Vec<String> = keys.clone();
    want.extend(["key3".to_string(), "key0".to_string()]);
    assert_eq!(got, want);
    // Pipelined mixed local/forwarded requests keep their order.
    req.clear();
    for i in 0..50 {
        let v = value(i, 1);
        req.push_str(&format!(
            "set key{i} 0 0 {}\r\n{v}\r\nget key{i}\r\n",
            v.len()
        ));
    }
    clients[2].send(req.as_bytes());
    for i in 0..50 {
        assert_eq!(clients[2].line(), "STORED");
        let v = value(i, 1);
        assert_eq!(clients[2].line(), format!("VALUE key{i} 0 {}", v.len()));
        assert_eq!(clients[2].line(), v);
        assert_eq!(clients[2].line(), "END");
    }
    // Each backup holds exactly its predecessor's range (r = 2): the count one cell
    // reports for its master range, its successor reports for the backup of it.
    let views: Vec<_> = (0..3).map(|i| ring.ranges(i)).collect();
    let mut masters = 0;
    for (rows, total) in &views {
        let master = rows.iter().find(|r| r.0 == "master").unwrap();
        let backup = rows.iter().find(|r| r.0 == "backup").unwrap();
        assert_eq!(rows.len(), 2, "{rows:?}");
        assert_eq!(
            *total,
            master.2 + backup.2,
            "nothing outside the two ranges"
        );
        masters += master.2;
        let holder = views
            .iter()
            .find(|(r, _)| r.iter().any(|b| b.0 == "backup" && b.1 == master.1))
            .expect("someone backs up every master");
        let backed = holder.0.iter().find(|b| b.0 == "backup").unwrap().2;
        assert_eq!(backed, master.2, "backup of cell {} is complete", master.1);
    }
    assert_eq!(masters as usize, KEYS);
    // `quit` behind forwarded requests still delivers their replies, then closes.
    let remote = (0..KEYS)
        .find(|&i| ring.master_of(&format!("key{i}")) != 0)
        .unwrap();
    let mut c = ring.cells[0].connect();
    c.send(format!("get key{remote}\r\nquit\r\n").as_bytes());
    assert_eq!(c.lines_until_end().len(), 2);
    assert!(c.is_closed());
}

/// A cell refuses forwarded requests past `peer_forwards_in_flight_max` per connection
/// (busy) and the forwarding cell routes them again within its deadline: with a bound of
/// one, 60 pipelined writes through cell 0 for keys of cell 1 all succeed, and cell 1
/// counts its refusals. Without the bound nothing is refused (a forwarding cell could
/// queue work on a peer without end).
#[test]
fn forwards_past_the_in_flight_bound_are_refused_and_routed_again() {
    if common::is_memcached() {
        return;
    }
    let ring = Ring::start_with_env(
        2,
        &["-m", "32"],
        &[("CELLCACHE_CLUSTER__PEER_FORWARDS_IN_FLIGHT_MAX", "1")],
    );
    let keys: Vec<String> = (0..10_000)
        .map(|i| format!("busy{i}"))
        .filter(|k| ring.master_of(k) == 1)
        .take(60)
        .collect();
    assert_eq!(keys.len(), 60);
    let mut pipeline = Vec::new();
    for k in &keys {
        pipeline
            .extend_from_slice(format!("set {k} 0 0 2\r\n{}\r\n", &k[k.len() - 2..]).as_bytes());
    }
    let mut c = ring.cells[0].connect();
    c.send(&pipeline);
    for k in &keys {
        assert_eq!(c.line(), "STORED", "{k}");
    }
    for k in &keys {
        assert_eq!(get(&mut c, k).as_deref(), Some(&k[k.len() - 2..]), "{k}");
    }
    let busy: u64 = ring.cells[1]
        .connect()
        .stat_of("cellcache", "cluster_peer_busy")
        .parse()
        .expect("a count");
    assert!(busy > 0, "no forwarded request was refused as busy");
}

/// The cell (index) mastering `key` and the one backing it up, by asking each cell's own
/// copy: exactly two cells hold a written key.
fn holders(clients: &mut [Client], key: &str) -> Vec<usize> {
    (0..clients.len())
        .filter(|&i| peek(&mut clients[i], key).is_some())
        .collect()
}

/// Three register clients and three append-log clients (seeds `seed`, `seed + 1`) through
/// `servers`, running until stopped. A range taken over from a departing cell is served after
/// the map lease (2.1 s): requests wait up to 8 s.
fn load(
    servers: Vec<std::net::SocketAddr>,
    seed: u64,
) -> (
    cellcache_testkit::workload::Workload,
    cellcache_testkit::workload::Workload,
) {
    use cellcache_testkit::workload::{Workload, WorkloadConfig};
    let tune = |mut c: WorkloadConfig, seed: u64| {
        c.clients = 3;
        c.keys = 24;
        c.ops_per_client = 100_000;
        c.request_timeout = std::time::Duration::from_secs(8);
        c.think_time = std::time::Duration::from_millis(2);
        c.seed = seed;
        c
    };
    let registers = Workload::start(tune(WorkloadConfig::registers(servers.clone()), seed));
    let logs = Workload::start(tune(WorkloadConfig::append_logs(servers), seed + 1));
    (registers.unwrap(), logs.unwrap())
}

/// Stops each workload and requires its run clean: no client error or unknown outcome,
/// every key readable at the end, and a history the checker finds valid (every
/// acknowledged write readable with its latest value, every acknowledged append once and in
/// order).
fn lost_nothing(runs: [(&str, cellcache_testkit::workload::Workload); 2]) {
    use cellcache_testkit::history::{CheckConfig, Outcome, check};
    for (name, w) in runs {
        let run = w.finish();
        eprintln!("{name}: {:?}", run.summary);
        for op in run.history.operations().unwrap() {
            if !matches!(op.outcome, Outcome::Ok(_)) {
                eprintln!("{name}: {op}");
            }
        }
        assert_eq!(run.summary.failed, 0, "{name}: no client error");
        assert_eq!(run.summary.unknown, 0, "{name}: no unknown outcome");
        assert_eq!(
            run.summary.final_reads_missing, 0,
            "{name}: every key readable"
        );
        check(&run.history, CheckConfig::default()).assert_valid();
    }
}

mod balancing;
mod handoff;
mod replication;
mod reshaping;
mod switching;
