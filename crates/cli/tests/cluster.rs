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
    // Meta commands travel too.
    c[1].roundtrip(b"ms meta1 2 T0\r\nhi\r\n", b"HD\r\n");
    same_on_both(&mut c, "meta1").unwrap();
    c[2].roundtrip(b"mg meta1 v\r\n", b"VA 2\r\nhi\r\n");
    // flush_all through one cell empties every cell, masters and backups.
    c[0].roundtrip(b"flush_all\r\n", b"OK\r\n");
    for i in 0..3 {
        assert_eq!(ring.ranges(i).1, 0, "cell {i} is empty after flush_all");
    }
}

/// Frames a deposed master would send, written by hand: a backup must refuse replication
/// from an older epoch, and accept the same record at the current one.
#[test]
fn a_backup_refuses_replication_from_an_older_epoch() {
    use cellcache_cluster::wire::payload::{ReplicationOp, ReplicationRecord, encode_hello};
    use cellcache_cluster::wire::{self, Decoded, FrameKind, WireConfig};
    use cellcache_cluster::{CellId, HashRange};
    if common::is_memcached() {
        return;
    }
    let ring = Ring::start(2, &["-m", "32"]);
    let status = ring.status(1);
    let epoch: u64 = status[0].split(' ').nth(1).unwrap().parse().unwrap();
    let peer = status
        .iter()
        .find(|l| {
            l.starts_with("CELL ")
                && l.contains(" active ")
                && l.contains(&format!("client={}", ring.cells[1].addr))
        })
        .and_then(|l| l.split(' ').find_map(|w| w.strip_prefix("peer=")))
        .unwrap()
        .to_string();
    let cfg = WireConfig::default();
    let mut s = std::net::TcpStream::connect(&peer).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let mut out = Vec::new();
    // Pretends to be cell 1, the other member, at an old epoch, then at the current one.
    wire::encode(
        &cfg,
        FrameKind::Hello,
        epoch,
        0,
        &encode_hello(&CellId::whole(1)),
        &mut out,
    )
    .unwrap();
    let record = |seq: u64, v: &'static [u8]| {
        let mut b = Vec::new();
        ReplicationRecord {
            range: HashRange::FULL,
            seq,
            op: ReplicationOp::Set {
                key: b"fenced",
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
    wire::encode(
        &cfg,
        FrameKind::Replicate,
        epoch - 1,
        7,
        &record(1 << 50, b"old"),
        &mut out,
    )
    .unwrap();
    wire::encode(
        &cfg,
        FrameKind::Replicate,
        epoch,
        8,
        &record((1 << 50) + 1, b"new"),
        &mut out,
    )
    .unwrap();
    s.write_all(&out).unwrap();
    let mut buf = Vec::new();
    let mut replies = Vec::new();
    while replies.len() < 2 {
        let mut chunk = [0u8; 4096];
        let n = s.read(&mut chunk).unwrap();
        assert!(n > 0, "peer closed");
        buf.extend_from_slice(&chunk[..n]);
        while let Ok(Decoded::Complete { frame, consumed }) = wire::decode(&cfg, &buf) {
            replies.push((frame.kind, frame.request_id));
            buf.drain(..consumed);
        }
    }
    assert_eq!(replies[0], (FrameKind::Refused, 7), "stale epoch refused");
    assert_eq!(
        replies[1],
        (FrameKind::ReplicateAck, 8),
        "current epoch acknowledged"
    );
    let mut c = ring.cells[1].connect();
    assert_eq!(peek(&mut c, "fenced").map(|p| p.0), Some("new".to_string()));
}
