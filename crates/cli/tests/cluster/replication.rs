//! Synchronous replication of every mutation with its CAS, epoch fencing of a deposed
//! master, the policy for an unreachable backup, asynchronous replication converging.

use super::*;

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
/// it gets no acknowledgement and cannot clobber the key), and accepts records stamped with
/// the current epoch for keys the sender masters now, at the next positions of its lane.
#[test]
fn a_deposed_master_gets_no_acknowledgement() {
    use cellcache_cluster::wire::payload::{
        Hello, RangeSeq, ReplicationOp, ReplicationRecord, encode_hello,
    };
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
    // A key cell 1 (index 1) masters, written once through the ring; and one cell 0
    // masters (cell 1 holds its backup copy).
    let key = (0..)
        .map(|i| format!("fenced{i}"))
        .find(|k| mastered.contains(cellcache_cluster::key_hash(k.as_bytes())))
        .unwrap();
    let theirs = (0..)
        .map(|i| format!("backed{i}"))
        .find(|k| !mastered.contains(cellcache_cluster::key_hash(k.as_bytes())))
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
    let record = |key: &str, seq: u64, v: &[u8]| {
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
    // One replication frame (of `payload`), written to `s`.
    let replicate = |s: &mut std::net::TcpStream, epoch: u64, id: u64, payload: &[u8]| {
        let mut out = Vec::new();
        wire::encode(&cfg, FrameKind::Replicate, epoch, id, payload, &mut out).unwrap();
        s.write_all(&out).unwrap();
    };
    replicate(&mut s, epoch - 1, 7, &record(&key, 1, b"old"));
    // The next reply frame on a connection: (kind, request id, payload).
    let next_frame = |s: &mut std::net::TcpStream, buf: &mut Vec<u8>| loop {
        if let Ok(Decoded::Complete { frame, consumed }) = wire::decode(&cfg, buf) {
            let r = (frame.kind, frame.request_id, frame.payload.to_vec());
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
    let kind_id = |(kind, id, _): (FrameKind, u64, Vec<u8>)| (kind, id);
    assert_eq!(
        kind_id(next_reply(&mut s)),
        (FrameKind::Refused, 7),
        "stale epoch refused"
    );
    assert_eq!(peek(&mut c, &key).map(|p| p.0), Some("live".to_string()));
    // Where cell 0's lane to cell 1 stands: an empty frame is answered with it.
    replicate(&mut s, epoch, 8, &[]);
    let (kind, _, ack) = next_reply(&mut s);
    assert_eq!(kind, FrameKind::ReplicateAck);
    let seq = RangeSeq::decode(&ack).unwrap().seq + 1;
    replicate(&mut s, epoch, 9, &record(&theirs, seq, b"new"));
    assert_eq!(
        kind_id(next_reply(&mut s)),
        (FrameKind::ReplicateAck, 9),
        "current epoch acknowledged"
    );
    assert_eq!(peek(&mut c, &theirs).map(|p| p.0), Some("new".to_string()));

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
    wire::encode(&cfg, FrameKind::MapRequest, epoch, 10, &[], &mut out).unwrap();
    s2.write_all(&out).unwrap();
    let mut buf2 = Vec::new();
    let mut next_reply2 = |s: &mut std::net::TcpStream| kind_id(next_frame(s, &mut buf2));
    assert_eq!(next_reply2(&mut s2), (FrameKind::MapUpdate, 10));
    // Not superseded yet: the old connection still replicates.
    replicate(&mut s, epoch, 11, &record(&theirs, seq + 1, b"still"));
    assert_eq!(kind_id(next_reply(&mut s)), (FrameKind::ReplicateAck, 11));
    assert_eq!(
        peek(&mut c, &theirs).map(|p| p.0),
        Some("still".to_string())
    );
    replicate(&mut s2, epoch, 12, &record(&theirs, seq + 2, b"next"));
    assert_eq!(next_reply2(&mut s2), (FrameKind::ReplicateAck, 12));
    assert_eq!(peek(&mut c, &theirs).map(|p| p.0), Some("next".to_string()));
    replicate(&mut s, epoch, 13, &record(&theirs, seq + 3, b"late"));
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
    assert_eq!(peek(&mut c, &theirs).map(|p| p.0), Some("next".to_string()));
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
        let mut ring = Ring::two_cells_for_a_dead_backup(policy);
        let key = ring.key_mastered_by(0, "p");
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
