//! A ring of three real processes on loopback: forwarding, multi-key gets split by owner,
//! synchronous replication of every mutation, backups holding exactly their predecessor's
//! range, CAS coherent on backups, and epoch fencing of a deposed master's replication.

mod common;

use common::{Client, Ring};
use std::io::{Read, Write};

const KEYS: usize = 300;

fn value(i: usize, round: usize) -> String {
    format!("v{i}-{round}")
}

fn get(c: &mut Client, key: &str) -> Option<String> {
    c.send(format!("get {key}\r\n").as_bytes());
    let lines = c.lines_until_end();
    match lines.as_slice() {
        [] => None,
        [_header, v] => Some(v.clone()),
        other => panic!("unexpected get reply {other:?}"),
    }
}

/// A cell's own copy of `key` (never forwarded): (value, cas).
fn peek(c: &mut Client, key: &str) -> Option<(String, u64)> {
    c.send(format!("cluster peek {key}\r\n").as_bytes());
    let lines = c.lines_until_end();
    match lines.as_slice() {
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
    for c in clients.iter_mut() {
        for i in 0..KEYS {
            assert_eq!(get(c, &format!("key{i}")), Some(value(i, 0)), "key{i}");
        }
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

/// The cell (index) mastering `key` and the one backing it up, by asking each cell's own
/// copy: exactly two cells hold a written key.
fn holders(clients: &mut [Client], key: &str) -> Vec<usize> {
    (0..clients.len())
        .filter(|&i| peek(&mut clients[i], key).is_some())
        .collect()
}

#[test]
fn every_mutation_replicates_with_its_cas() {
    if common::is_memcached() {
        return;
    }
    let ring = Ring::start(3, &["-m", "32"]);
    let mut c: Vec<Client> = ring.cells.iter().map(|s| s.connect()).collect();
    let same_on_both = |c: &mut [Client], key: &str| {
        let h = holders(c, key);
        assert_eq!(h.len(), 2, "{key} held by {h:?}");
        let a = peek(&mut c[h[0]], key);
        let b = peek(&mut c[h[1]], key);
        assert_eq!(a, b, "{key}: master and backup agree, CAS included");
        a
    };
    for i in 0..20 {
        let k = format!("m{i}");
        let via = i % 3;
        c[via].roundtrip(format!("set {k} 0 0 2\r\n10\r\n").as_bytes(), b"STORED\r\n");
        c[via].roundtrip(format!("incr {k} 5\r\n").as_bytes(), b"15\r\n");
        c[(via + 1) % 3].roundtrip(format!("decr {k} 3\r\n").as_bytes(), b"12\r\n");
        c[(via + 2) % 3].roundtrip(
            format!("append {k} 0 0 1\r\nx\r\n").as_bytes(),
            b"STORED\r\n",
        );
        c[via].roundtrip(
            format!("prepend {k} 0 0 1\r\ny\r\n").as_bytes(),
            b"STORED\r\n",
        );
        c[via].roundtrip(format!("touch {k} 1000\r\n").as_bytes(), b"TOUCHED\r\n");
        let (v, cas) = same_on_both(&mut c, &k).unwrap();
        assert_eq!(v, "y12x");
        // gets/cas through a forwarding cell uses the master's CAS, which the backup has.
        c[(via + 1) % 3].send(format!("gets {k}\r\n").as_bytes());
        let lines = c[(via + 1) % 3].lines_until_end();
        assert_eq!(lines[0], format!("VALUE {k} 0 4 {cas}"));
        c[(via + 2) % 3].roundtrip(
            format!("cas {k} 0 0 1 {cas}\r\nz\r\n").as_bytes(),
            b"STORED\r\n",
        );
        c[via].roundtrip(
            format!("cas {k} 0 0 1 {cas}\r\nw\r\n").as_bytes(),
            b"EXISTS\r\n",
        );
        let (v, _) = same_on_both(&mut c, &k).unwrap();
        assert_eq!(v, "z");
        if i % 2 == 0 {
            c[(via + 1) % 3].roundtrip(format!("delete {k}\r\n").as_bytes(), b"DELETED\r\n");
            assert!(
                holders(&mut c, &k).is_empty(),
                "{k} deleted on master and backup"
            );
        }
    }
    // An eventual read (`mg … Y`) is answered from the backup's own copy, without
    // forwarding; a plain read through the backup is forwarded to the master.
    let k = "m1";
    let master = ring.master_of(k);
    let backup = holders(&mut c, k)
        .into_iter()
        .find(|&i| i != master)
        .unwrap();
    let forwarded = |c: &mut Client| c.stat("cluster_forwarded").parse::<u64>().unwrap();
    let before = forwarded(&mut c[backup]);
    c[backup].roundtrip(format!("mg {k} v Y\r\n").as_bytes(), b"VA 1\r\nz\r\n");
    assert_eq!(
        forwarded(&mut c[backup]),
        before,
        "eventual read served by the backup"
    );
    c[backup].roundtrip(format!("mg {k} v\r\n").as_bytes(), b"VA 1\r\nz\r\n");
    assert_eq!(
        forwarded(&mut c[backup]),
        before + 1,
        "plain read forwarded"
    );
    // Meta commands travel too.
    c[1].roundtrip(b"ms meta1 2 T0\r\nhi\r\n", b"HD\r\n");
    same_on_both(&mut c, "meta1").unwrap();
    c[2].roundtrip(b"mg meta1 v\r\n", b"VA 2\r\nhi\r\n");
    // An invalidation (`md … I`) marks the item stale on the backup too: an eventual read
    // there sees the stale flag, as a read at the master does.
    c[1].roundtrip(b"ms meta2 2 T0\r\nhi\r\n", b"HD\r\n");
    c[2].roundtrip(b"md meta2 I\r\n", b"HD\r\n");
    for i in holders(&mut c, "meta2") {
        c[i].send(b"mg meta2 v Y\r\n");
        let header = c[i].line();
        assert!(
            header.starts_with("VA 2 ") && header.split(' ').any(|f| f == "X"),
            "cell {i}: {header}"
        );
        assert_eq!(c[i].line(), "hi");
    }
    // flush_all through one cell empties every cell, masters and backups.
    c[0].roundtrip(b"flush_all\r\n", b"OK\r\n");
    for i in 0..3 {
        assert_eq!(ring.ranges(i).1, 0, "cell {i} is empty after flush_all");
    }
}

/// Frames a deposed master would send, written by hand: a cell refuses replication
/// produced under an older map for a key it now serves as master (the sender was deposed,
/// it gets no acknowledgement and cannot clobber the key), and accepts the same record
/// stamped with the current epoch.
#[test]
fn a_deposed_master_gets_no_acknowledgement() {
    use cellcache_cluster::wire::payload::{Hello, ReplicationOp, ReplicationRecord, encode_hello};
    use cellcache_cluster::wire::{self, Decoded, FrameKind, WireConfig};
    use cellcache_cluster::{CellId, HashRange};
    if common::is_memcached() {
        return;
    }
    let ring = Ring::start(2, &["-m", "32"]);
    let status = ring.status(1);
    let epoch: u64 = status[0].split(' ').nth(1).unwrap().parse().unwrap();
    let line = status
        .iter()
        .find(|l| l.starts_with("CELL ") && l.contains(&format!("client={} ", ring.cells[1].addr)))
        .unwrap()
        .clone();
    let field = |name: &str| {
        line.split(' ')
            .find_map(|w| w.strip_prefix(name))
            .unwrap()
            .to_string()
    };
    let peer = field("peer=");
    let range = field("range=");
    let (start, end) = range.split_once('-').unwrap();
    let (start, end) = (
        u64::from_str_radix(start, 16).unwrap(),
        u64::from_str_radix(end, 16).unwrap(),
    );
    let mastered = HashRange::new(start, end);
    // A key cell 1 (index 1) masters, written once through the ring.
    let key = (0..)
        .map(|i| format!("fenced{i}"))
        .find(|k| mastered.contains(cellcache_cluster::key_hash(k.as_bytes())))
        .unwrap();
    let mut c = ring.cells[1].connect();
    c.roundtrip(
        format!("set {key} 0 0 4\r\nlive\r\n").as_bytes(),
        b"STORED\r\n",
    );
    let other = ring.id(0).parse::<CellId>().unwrap();
    let hello = encode_hello(&Hello {
        cell: other.clone(),
        ring: u64::from_str_radix(status[0].split(' ').nth(9).unwrap(), 16).unwrap(),
        client: ring.cells[0].addr.to_string(),
    });
    let cfg = WireConfig::default();
    let mut s = std::net::TcpStream::connect(&peer).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let mut out = Vec::new();
    // Pretends to be the other cell, once at an old epoch, then at the current one.
    wire::encode(&cfg, FrameKind::Hello, epoch, 0, &hello, &mut out).unwrap();
    s.write_all(&out).unwrap();
    let record = |seq: u64, v: &[u8]| {
        let mut b = Vec::new();
        ReplicationRecord {
            range: HashRange::FULL,
            seq,
            op: ReplicationOp::Set {
                stale: false,
                key: key.as_bytes(),
                value: v,
                flags: 0,
                expiry_unix_secs: 0,
                cas: 1 << 40,
            },
        }
        .encode(&mut b)
        .unwrap();
        b
    };
    let seq = 1 << 50;
    // One replication frame of one record, written to `s`.
    let replicate = |s: &mut std::net::TcpStream, epoch: u64, id: u64, seq: u64, v: &[u8]| {
        let mut out = Vec::new();
        wire::encode(
            &cfg,
            FrameKind::Replicate,
            epoch,
            id,
            &record(seq, v),
            &mut out,
        )
        .unwrap();
        s.write_all(&out).unwrap();
    };
    replicate(&mut s, epoch - 1, 7, seq, b"old");
    // The next reply frame on a connection: (kind, request id).
    let next_frame = |s: &mut std::net::TcpStream, buf: &mut Vec<u8>| loop {
        if let Ok(Decoded::Complete { frame, consumed }) = wire::decode(&cfg, buf) {
            let r = (frame.kind, frame.request_id);
            buf.drain(..consumed);
            return r;
        }
        let mut chunk = [0u8; 4096];
        let n = s.read(&mut chunk).unwrap();
        assert!(n > 0, "peer closed");
        buf.extend_from_slice(&chunk[..n]);
    };
    let mut buf = Vec::new();
    let mut next_reply = |s: &mut std::net::TcpStream| next_frame(s, &mut buf);
    assert_eq!(
        next_reply(&mut s),
        (FrameKind::Refused, 7),
        "stale epoch refused"
    );
    assert_eq!(peek(&mut c, &key).map(|p| p.0), Some("live".to_string()));
    replicate(&mut s, epoch, 8, seq + 1, b"new");
    assert_eq!(
        next_reply(&mut s),
        (FrameKind::ReplicateAck, 8),
        "current epoch acknowledged"
    );
    assert_eq!(peek(&mut c, &key).map(|p| p.0), Some("new".to_string()));

    // The same sender opens a new connection (as its bulk link does after giving the old
    // one up) and replicates through it: records still arriving on the old connection are
    // not applied from then on, so a frame that was buffered there can never overwrite what
    // came through the new one. (A connection that carries no replication, like a sender's
    // control link, supersedes nothing.)
    let mut s2 = std::net::TcpStream::connect(&peer).unwrap();
    s2.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    out.clear();
    wire::encode(&cfg, FrameKind::Hello, epoch, 0, &hello, &mut out).unwrap();
    wire::encode(&cfg, FrameKind::MapRequest, epoch, 9, &[], &mut out).unwrap();
    s2.write_all(&out).unwrap();
    let mut buf2 = Vec::new();
    let mut next_reply2 = |s: &mut std::net::TcpStream| next_frame(s, &mut buf2);
    assert_eq!(next_reply2(&mut s2), (FrameKind::MapUpdate, 9));
    // Not superseded yet: the old connection still replicates.
    replicate(&mut s, epoch, 10, seq + 2, b"still");
    assert_eq!(next_reply(&mut s), (FrameKind::ReplicateAck, 10));
    assert_eq!(peek(&mut c, &key).map(|p| p.0), Some("still".to_string()));
    replicate(&mut s2, epoch, 11, seq + 3, b"next");
    assert_eq!(next_reply2(&mut s2), (FrameKind::ReplicateAck, 11));
    assert_eq!(peek(&mut c, &key).map(|p| p.0), Some("next".to_string()));
    replicate(&mut s, epoch, 12, seq + 4, b"late");
    let mut rest = Vec::new();
    let closed = s.read_to_end(&mut rest).is_ok();
    assert!(
        closed,
        "the superseded connection is closed by the receiver"
    );
    assert!(
        wire::decode(&cfg, &rest).map_or(true, |d| !matches!(
            d,
            Decoded::Complete { ref frame, .. } if frame.kind == FrameKind::ReplicateAck
        )),
        "no acknowledgement on the superseded connection"
    );
    assert_eq!(peek(&mut c, &key).map(|p| p.0), Some("next".to_string()));
}

/// Online division and leave under continuous load from several clients: no client sees
/// an error, and the history checker finds every acknowledged write readable with its
/// latest value afterwards (registers), and every acknowledged append exactly once and in
/// order (append logs).
#[test]
fn split_and_leave_under_load_lose_nothing() {
    use cellcache_testkit::history::{CheckConfig, check};
    use cellcache_testkit::workload::{Workload, WorkloadConfig};
    use std::time::Duration;
    if common::is_memcached() {
        return;
    }
    let mut ring = Ring::start(3, &["-m", "32"]);
    let standby = ring.add_standby(&["-m", "32"]);
    // Clients use the cells that stay in the ring for the whole run (cell 2 leaves).
    let servers = vec![ring.cells[0].addr, ring.cells[1].addr];
    let tune = |mut c: WorkloadConfig, seed: u64| {
        c.clients = 3;
        c.keys = 24;
        c.ops_per_client = 100_000;
        // A range taken over from a departing cell is served after the map lease (2.1 s).
        c.request_timeout = Duration::from_secs(8);
        c.think_time = Duration::from_millis(2);
        c.seed = seed;
        c
    };
    let registers = Workload::start(tune(WorkloadConfig::registers(servers.clone()), 7)).unwrap();
    let logs = Workload::start(tune(WorkloadConfig::append_logs(servers), 8)).unwrap();
    let during = Duration::from_secs(30);
    assert!(registers.wait_completed(200, during) && logs.wait_completed(200, during));
    // Division: the standby cell takes the second half of cell 0's range.
    let parent = ring.id(0);
    let server = ring.cells[0].addr.to_string();
    let reply = ring.command(standby, &format!("cluster invite {server} {parent}"));
    assert!(reply.starts_with("OK "), "{reply}");
    ring.wait_formed(4);
    let (r, l) = (registers.completed(), logs.completed());
    assert!(registers.wait_completed(r + 200, during) && logs.wait_completed(l + 200, during));
    // Leave: cell 2 hands its range to its successor and exits.
    let leaving = ring.id(2);
    let reply = ring.command(0, &format!("cluster leave {leaving}"));
    assert!(reply.starts_with("OK "), "{reply}");
    ring.wait_formed_among(3, &[0, 1, standby]);
    common::wait_until(
        "the leaving cell exits",
        Duration::from_secs(20),
        Duration::from_millis(50),
        || !ring.cells[2].is_running(),
    );
    let (r, l) = (registers.completed(), logs.completed());
    assert!(registers.wait_completed(r + 200, during) && logs.wait_completed(l + 200, during));
    for (name, w) in [("registers", registers), ("append logs", logs)] {
        let run = w.finish();
        eprintln!("{name}: {:?}", run.summary);
        for op in run.history.operations().unwrap() {
            if !matches!(op.outcome, cellcache_testkit::history::Outcome::Ok(_)) {
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

/// With the backup killed, a write the master may still serve (its lease from the backup
/// has not run out) is refused by default (`no_backup = "refuse"`) and acknowledged, counted,
/// with `accept`. Long leases (backup and map) keep the master serving for the whole test.
#[test]
fn an_unreachable_backup_refuses_or_accepts_writes_by_policy() {
    if common::is_memcached() {
        return;
    }
    for (policy, reply) in [
        (
            "refuse",
            "SERVER_ERROR cluster: write not confirmed by its backup (it may or may not be applied)",
        ),
        ("accept", "STORED"),
    ] {
        let env = [
            ("CELLCACHE_CLUSTER__NO_BACKUP", policy),
            ("CELLCACHE_CLUSTER__RING__LEASE_MS", "20000"),
            ("CELLCACHE_CLUSTER__RING__SUSPICION_TIMEOUT_MS", "60000"),
            // Two voters: with one dead the map can no longer be confirmed.
            ("CELLCACHE_CLUSTER__RING__MAP_LEASE_MS", "20000"),
        ];
        let mut ring = Ring::start_with_env(2, &["-m", "32"], &env);
        let key = (0..)
            .map(|i| format!("p{i}"))
            .find(|k| ring.master_of(k) == 0)
            .unwrap();
        let mut c = ring.cells[0].connect();
        c.roundtrip(
            format!("set {key} 0 0 1\r\na\r\n").as_bytes(),
            b"STORED\r\n",
        );
        ring.cells[1].kill9();
        c.send(format!("set {key} 0 0 1\r\nb\r\n").as_bytes());
        assert_eq!(c.line(), reply, "policy {policy}");
        let unreplicated: u64 = c.stat("cluster_unreplicated_acks").parse().unwrap();
        assert_eq!(unreplicated > 0, policy == "accept", "policy {policy}");
    }
}

/// `replication = "async"`: writes are acknowledged at once and the backups converge.
#[test]
fn async_replication_converges() {
    if common::is_memcached() {
        return;
    }
    let ring = Ring::start_with_env(
        3,
        &["-m", "32"],
        &[("CELLCACHE_CLUSTER__REPLICATION", "async")],
    );
    let mut clients: Vec<Client> = ring.cells.iter().map(|s| s.connect()).collect();
    for i in 0..KEYS {
        clients[i % 3].roundtrip(format!("set a{i} 0 0 1\r\nx\r\n").as_bytes(), b"STORED\r\n");
    }
    common::wait_until(
        "backups converge",
        std::time::Duration::from_secs(20),
        std::time::Duration::from_millis(50),
        || {
            let views: Vec<_> = (0..3).map(|i| ring.ranges(i).0).collect();
            let count = |role: &str| -> u64 {
                views
                    .iter()
                    .map(|r| r.iter().find(|x| x.0 == role).unwrap().2)
                    .sum()
            };
            count("master") == KEYS as u64 && count("backup") == KEYS as u64
        },
    );
}

/// kill -9 of a cell: its successor takes its range over from its backup copy, both
/// survivors re-replicate so each holds the other's range again, the absorption completes
/// (the dead cell leaves every map) and every key written before stays readable through
/// every survivor.
#[test]
fn a_killed_cell_is_absorbed_without_losing_keys() {
    if common::is_memcached() {
        return;
    }
    let mut ring = Ring::start(3, &["-m", "32"]);
    let mut c = ring.cells[0].connect();
    for i in 0..KEYS {
        let v = value(i, 0);
        c.roundtrip(
            format!("set key{i} 0 0 {}\r\n{v}\r\n", v.len()).as_bytes(),
            b"STORED\r\n",
        );
    }
    let dead_id = ring.id(1);
    ring.cells[1].kill9();
    ring.wait_formed_among(2, &[0, 2]);
    // The absorption completed: the dead cell is gone from every map.
    for i in [0, 2] {
        assert!(
            !ring
                .status(i)
                .iter()
                .any(|l| l.starts_with(&format!("CELL {dead_id} ")))
        );
    }
    for i in [0, 2] {
        let mut c = ring.cells[i].connect();
        for k in 0..KEYS {
            assert_eq!(
                get(&mut c, &format!("key{k}")),
                Some(value(k, 0)),
                "key{k} via {i}"
            );
        }
    }
    common::wait_until(
        "re-replication completes",
        std::time::Duration::from_secs(30),
        std::time::Duration::from_millis(100),
        || {
            [0, 2].iter().map(|&i| ring.ranges(i)).all(|(rows, total)| {
                rows.iter().map(|r| r.2).sum::<u64>() == KEYS as u64 && total == KEYS as u64
            })
        },
    );
}

/// A request forwarded to a master that never answers (SIGSTOP: its kernel still
/// acknowledges the bytes, so the connection does not fail) is given up on with the
/// retryable error after the deadline plus one more timeout, and the client's next request
/// reaches the cell that took the range over.
#[test]
fn a_silent_master_does_not_hold_a_forwarded_request_forever() {
    if common::is_memcached() {
        return;
    }
    let ring = Ring::start(3, &["-m", "32"]);
    let key = (0..)
        .map(|i| format!("s{i}"))
        .find(|k| ring.master_of(k) == 2)
        .unwrap();
    let mut c = ring.cells[0].connect();
    c.roundtrip(
        format!("set {key} 0 0 1\r\nv\r\n").as_bytes(),
        b"STORED\r\n",
    );
    let pid = ring.cells[2].pid().to_string();
    assert!(
        std::process::Command::new("kill")
            .args(["-STOP", &pid])
            .status()
            .unwrap()
            .success()
    );
    let started = std::time::Instant::now();
    c.send(format!("get {key}\r\n").as_bytes());
    let first = c.line();
    let waited = started.elapsed();
    eprintln!("first reply {first:?} after {waited:?}");
    // Either the watchdog answered, or the request was re-routed after the map changed.
    assert!(
        first.starts_with("SERVER_ERROR cluster: no master available")
            || first.starts_with("VALUE"),
        "{first} after {waited:?}"
    );
    if first.starts_with("VALUE") {
        assert_eq!(c.line(), "v");
        assert_eq!(c.line(), "END");
    }
    // The range moves to the stopped cell's successor; the key is served again.
    common::wait_until(
        "the key is served again",
        std::time::Duration::from_secs(30),
        std::time::Duration::from_millis(10),
        || get(&mut ring.cells[1].connect(), &key).as_deref() == Some("v"),
    );
    let _ = std::process::Command::new("kill")
        .args(["-CONT", &pid])
        .status();
}

/// What the slow-link tests share: a one-cell ring holding 400 items of 1,000 bytes for a
/// snapshot to carry, 16 KiB replication chunks, a `--standby` cell whose peers reach it
/// through a fault proxy (it advertises 127.0.0.2, where the proxy listens), and a client
/// writing through the parent, one synchronous `set` at a time, until stopped.
mod slow_link {
    use super::common::{self, Ring, Server};
    use cellcache_testkit::proxy::{Faults, Proxy};
    use std::collections::HashMap;
    use std::net::SocketAddr;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::thread::JoinHandle;
    use std::time::Duration;

    pub const ENV: [(&str, &str); 1] = [("CELLCACHE_CLUSTER__REPLICATION_CHUNK_BYTES", "16384")];
    pub const BALLAST_ITEMS: usize = 400;

    pub fn ballast() -> String {
        "b".repeat(1000)
    }

    /// The parent (cell 0, filled) and the child (cell 1, standby) behind the proxy.
    pub fn parent_and_child(faults: Faults) -> (Ring, Proxy) {
        let mut ring = Ring::start_with_env(1, &["-m", "32"], &ENV);
        let mut c = ring.cells[0].connect();
        let ballast = ballast();
        for i in 0..BALLAST_ITEMS {
            c.roundtrip(
                format!("set ballast{i} 0 0 1000\r\n{ballast}\r\n").as_bytes(),
                b"STORED\r\n",
            );
        }
        let peer = common::free_peer_port();
        let proxy = Proxy::start(
            SocketAddr::from(([127, 0, 0, 2], peer)),
            SocketAddr::from(([127, 0, 0, 1], peer)),
        )
        .expect("proxy");
        proxy.set_faults(faults);
        let peer_arg = peer.to_string();
        let mut child_env = ENV.to_vec();
        child_env.push(("CELLCACHE_CLUSTER__ADVERTISE_HOST", "127.0.0.2"));
        ring.cells.push(Server::start_with_env(
            &["-m", "32", "--standby", "--peer-port", &peer_arg],
            &child_env,
        ));
        (ring, proxy)
    }

    /// What the writer saw: the last acknowledged value per key (a key whose last write
    /// got an error is left out: its outcome is unknown), and every error reply.
    pub type Written = (HashMap<String, String>, Vec<String>);

    /// Writes `set w{i % 50}` through `addr` until `stop`.
    pub fn writer(addr: SocketAddr, stop: Arc<AtomicBool>) -> JoinHandle<Written> {
        std::thread::spawn(move || {
            let mut c = common::Client::to(addr);
            let mut acked = HashMap::new();
            let mut refused = Vec::new();
            for i in 0..100_000u64 {
                if stop.load(Ordering::Acquire) {
                    break;
                }
                let (key, value) = (format!("w{}", i % 50), format!("v{i}"));
                c.send(format!("set {key} 0 0 {}\r\n{value}\r\n", value.len()).as_bytes());
                match c.line().as_str() {
                    "STORED" => {
                        acked.insert(key, value);
                    }
                    other => {
                        refused.push(other.to_string());
                        acked.remove(&key);
                    }
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            (acked, refused)
        })
    }

    /// Brings the child in as a division of the parent.
    pub fn invite(ring: &Ring) {
        let (addr, parent) = (ring.cells[0].addr, ring.id(0));
        let reply = ring.command(1, &format!("cluster invite {addr} {parent}"));
        assert!(reply.starts_with("OK "), "{reply}");
    }
}

/// Issues 6 and 7: during a hand-off over a slow link (the child's peer address is a proxy
/// capped at 50 kB/s, so the ~400 KB snapshot takes seconds to cross), writes through the
/// parent are never refused: before the child has the snapshot they do not wait for it at
/// all, after it they wait for their own record, which goes ahead of any snapshot chunk
/// still queued (16 KiB here). With one queue for both, each write waited for the snapshot
/// items queued before it, more than the 3 s request timeout. Checked by outcome: no write
/// refused, and every acknowledged value readable after the hand-off.
#[test]
fn writes_during_a_slow_hand_off_do_not_wait_for_the_snapshot() {
    use cellcache_testkit::proxy::Faults;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;
    if common::is_memcached() {
        return;
    }
    let (ring, proxy) = slow_link::parent_and_child(Faults {
        bandwidth_bytes_per_sec: Some(50_000),
        ..Faults::default()
    });
    let stop = Arc::new(AtomicBool::new(false));
    let writer = slow_link::writer(ring.cells[0].addr, stop.clone());
    std::thread::sleep(Duration::from_millis(200));
    let before = proxy.bytes_forwarded();
    slow_link::invite(&ring);
    ring.wait_formed(2);
    stop.store(true, Ordering::Release);
    let (acked, refused) = writer.join().expect("writer");
    assert!(
        proxy.bytes_forwarded() - before > 400_000,
        "the snapshot crossed the proxy"
    );
    assert_eq!(refused, Vec::<String>::new(), "no write refused");
    assert_eq!(acked.len(), 50, "every key written");
    // Reads check values, not speed: the link is fast again for them.
    proxy.set_faults(Faults::default());
    let mut c = ring.cells[0].connect();
    for (key, value) in &acked {
        assert_eq!(get(&mut c, key).as_deref(), Some(value.as_str()), "{key}");
    }
}

/// The link to a division's child is cut mid-snapshot for longer than the suspicion
/// timeout: the hand-off pauses (nothing waits for a child that has not caught up) and,
/// once the child is reachable again, resumes from the last acknowledged record rather
/// than aborting or starting over. Writes through the parent succeed throughout.
#[test]
fn a_hand_off_cut_off_mid_snapshot_resumes_where_it_stopped() {
    use cellcache_testkit::proxy::{Faults, Mode};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;
    if common::is_memcached() {
        return;
    }
    // 100 kB/s: the 400 kB snapshot is still streaming when the cut comes.
    let slow = Faults {
        bandwidth_bytes_per_sec: Some(100_000),
        ..Faults::default()
    };
    let (ring, proxy) = slow_link::parent_and_child(slow);
    let stop = Arc::new(AtomicBool::new(false));
    let writer = slow_link::writer(ring.cells[0].addr, stop.clone());
    let stat =
        |ring: &Ring, name: &str| -> u64 { ring.cells[0].connect().stat(name).parse().unwrap() };
    let before = proxy.bytes_forwarded();
    slow_link::invite(&ring);
    common::wait_until(
        "a quarter of the snapshot crossed",
        Duration::from_secs(30),
        Duration::from_millis(10),
        || proxy.bytes_forwarded() - before > 100_000,
    );
    // Cut: every connection to the child and every reconnection is reset, for three times
    // the suspicion timeout.
    proxy.set_faults(Faults {
        mode: Mode::Reset,
        ..slow
    });
    std::thread::sleep(Duration::from_millis(2_100));
    let status = ring.status(0);
    assert_eq!(
        status
            .iter()
            .filter(|l| l.starts_with("CELL") && l.contains(" active "))
            .count(),
        1,
        "the division is still under way after the cut: {status:?}"
    );
    proxy.set_faults(slow);
    ring.wait_formed(2);
    stop.store(true, Ordering::Release);
    let (acked, refused) = writer.join().expect("writer");
    assert_eq!(refused, Vec::<String>::new(), "no write refused");
    assert_eq!(
        stat(&ring, "cluster_handoff_streams"),
        1,
        "one snapshot stream, resumed, not restarted"
    );
    assert_eq!(acked.len(), 50, "every key written");
    proxy.set_faults(Faults::default());
    let mut c = ring.cells[1].connect();
    for (key, value) in &acked {
        assert_eq!(get(&mut c, key).as_deref(), Some(value.as_str()), "{key}");
    }
    let ballast = slow_link::ballast();
    for i in 0..slow_link::BALLAST_ITEMS {
        assert_eq!(get(&mut c, &format!("ballast{i}")), Some(ballast.clone()));
    }
}

/// Measurement, not a check (docs/benchmarks/cluster.md): how long `get`s forwarded by the
/// parent to a child behind a 50 kB/s link take while replication to the child is busy
/// (the re-replication after the flip, and live writes). Prints each latency.
#[test]
#[ignore = "measurement, run by hand (see docs/benchmarks/cluster.md)"]
fn measure_forwarding_beside_a_busy_replication_stream() {
    use cellcache_testkit::proxy::Faults;
    use std::io::BufRead;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};
    let (ring, proxy) = slow_link::parent_and_child(Faults {
        bandwidth_bytes_per_sec: Some(50_000),
        ..Faults::default()
    });
    let stop = Arc::new(AtomicBool::new(false));
    let writer = slow_link::writer(ring.cells[0].addr, stop.clone());
    let started = Instant::now();
    slow_link::invite(&ring);
    common::wait_until(
        "the division completes",
        Duration::from_secs(300),
        Duration::from_millis(100),
        || {
            ring.status(0)
                .iter()
                .filter(|l| l.starts_with("CELL") && l.contains(" active "))
                .count()
                == 2
        },
    );
    let division = started.elapsed();
    println!("division {:.1} s", division.as_secs_f64());
    // A plain connection with a generous timeout: a get stuck for longer than the test
    // client's 10 s is a figure here, not a failure.
    let stream = std::net::TcpStream::connect(ring.cells[0].addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(120)))
        .unwrap();
    let mut rd = std::io::BufReader::new(stream.try_clone().unwrap());
    let mut wr = stream;
    let mut stats = ring.cells[0].connect();
    let forwarded = |c: &mut Client| c.stat("cluster_forwarded").parse::<u64>().unwrap();
    let mut times = Vec::new();
    for i in 0..slow_link::BALLAST_ITEMS {
        let n = forwarded(&mut stats);
        let t0 = Instant::now();
        wr.write_all(format!("get ballast{i}\r\n").as_bytes())
            .unwrap();
        let mut line = String::new();
        let mut error = None;
        loop {
            line.clear();
            rd.read_line(&mut line).unwrap();
            if line.starts_with("SERVER_ERROR") {
                error = Some(line.trim_end().to_string());
                break;
            }
            if line == "END\r\n" {
                break;
            }
        }
        let took = t0.elapsed();
        if forwarded(&mut stats) > n {
            if let Some(e) = error {
                println!("ballast{i}: {e} after {took:?}");
            }
            times.push(took);
            if times.len() == 20 {
                break;
            }
        }
    }
    stop.store(true, Ordering::Release);
    writer.join().expect("writer");
    drop(proxy);
    let ms: Vec<String> = times
        .iter()
        .map(|d| format!("{:.1}", d.as_secs_f64() * 1000.0))
        .collect();
    let mut sorted = times.clone();
    sorted.sort();
    println!(
        "division {:.1} s; forwarded gets (ms): {}\nmedian {:.1} ms, max {:.1} ms",
        division.as_secs_f64(),
        ms.join(" "),
        sorted[sorted.len() / 2].as_secs_f64() * 1000.0,
        sorted.last().map_or(0.0, |d| d.as_secs_f64() * 1000.0),
    );
}

/// Values longer than `replication_chunk_bytes` are replicated, and handed over in a
/// division, in parts: backups and the child rebuild them byte for byte (counted by
/// `cluster_values_rebuilt`), and every value reads back whole through every cell.
#[test]
fn large_values_replicate_and_move_in_parts() {
    use std::time::Duration;
    if common::is_memcached() {
        return;
    }
    const CHUNK: usize = 16_384;
    let chunk = CHUNK.to_string();
    let env = [("CELLCACHE_CLUSTER__REPLICATION_CHUNK_BYTES", chunk.as_str())];
    let mut ring = Ring::start_with_env(2, &["-m", "64"], &env);
    let sizes = [1, 16_000, CHUNK, CHUNK + 1, 40_000, 300_000, 900_000];
    let value = |size: usize, i: usize| -> String {
        (0..size)
            .map(|j| (b'a' + ((i * 7 + j) % 26) as u8) as char)
            .collect()
    };
    let mut written = Vec::new();
    let mut c = ring.cells[0].connect();
    for (s, &size) in sizes.iter().enumerate() {
        for k in 0..4 {
            let (key, v) = (format!("big{s}-{k}"), value(size, s * 4 + k));
            c.roundtrip(
                format!("set {key} 0 0 {size}\r\n{v}\r\n").as_bytes(),
                b"STORED\r\n",
            );
            written.push((key, v));
        }
    }
    let in_parts = 4 * sizes.iter().filter(|&&s| s > CHUNK).count() as u64;
    let rebuilt = |ring: &Ring, i: usize| -> u64 {
        ring.cells[i]
            .connect()
            .stat("cluster_values_rebuilt")
            .parse()
            .unwrap()
    };
    // Two cells, r = 2: both hold every item, and each large write was rebuilt once, on
    // its master's backup, before the client got STORED.
    let mut clients: Vec<Client> = ring.cells.iter().map(|s| s.connect()).collect();
    for (key, v) in &written {
        assert_eq!(holders(&mut clients, key), vec![0, 1], "{key}");
        let copies: Vec<_> = clients.iter_mut().map(|c| peek(c, key)).collect();
        assert_eq!(copies[0], copies[1], "{key}: same value and cas on both");
        assert_eq!(copies[0].as_ref().map(|c| &c.0), Some(v), "{key}");
    }
    assert_eq!(rebuilt(&ring, 0) + rebuilt(&ring, 1), in_parts);
    // Division: the child gets cell 0's range as a snapshot, large items in parts.
    let standby = ring.add_standby_with_env(&["-m", "64"], &env);
    let (parent, server) = (ring.id(0), ring.cells[0].addr.to_string());
    let reply = ring.command(standby, &format!("cluster invite {server} {parent}"));
    assert!(reply.starts_with("OK "), "{reply}");
    ring.wait_formed(3);
    common::wait_until(
        "the child rebuilt the large items of its ranges",
        Duration::from_secs(30),
        Duration::from_millis(50),
        || rebuilt(&ring, standby) > 0,
    );
    for c in ring.cells.iter() {
        let mut c = c.connect();
        for (key, v) in &written {
            assert_eq!(get(&mut c, key).as_ref(), Some(v), "{key}");
        }
    }
    let mut clients: Vec<Client> = ring.cells.iter().map(|s| s.connect()).collect();
    common::wait_until(
        "every item has exactly two copies again",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || {
            written
                .iter()
                .all(|(key, _)| holders(&mut clients, key).len() == 2)
        },
    );
}
