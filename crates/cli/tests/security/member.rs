//! What a member — a peer that proves the ring's secret, as a compromised cell or host can —
//! can no longer do to a ring, tried with real processes: stop a backup's replication with
//! a frame numbered far ahead, replicate or flush keys it does not master, forward requests
//! while not in the map, or push a map numbered far ahead. After each attempt the ring keeps
//! serving, and no write acknowledged after it is lost when a master is then killed.

use super::*;
use cellcache_cluster::HashRange;
use cellcache_cluster::auth::{self, Secret};
use cellcache_cluster::wire::HEADER_BYTES;
use cellcache_cluster::wire::payload::{RangeSeq, ReplicationOp, ReplicationRecord};

/// A peer connection that proved the ring's secret and introduced itself as a cell.
struct Member {
    stream: TcpStream,
    wire: WireConfig,
    next_id: u64,
}

impl Member {
    /// Connects to `peer`, proves the secret in `secret_file` and says `Hello` as `cell` of
    /// ring `ring`.
    fn connect(peer: &str, secret_file: &std::path::Path, ring: u64, cell: &str) -> Member {
        let text = std::fs::read_to_string(secret_file).expect("the secret file");
        let secret = Secret::parse(&text).expect("a secret");
        let stream = TcpStream::connect(peer).expect("the peer port accepts");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let mut m = Member {
            stream,
            wire: WireConfig::default(),
            next_id: 1,
        };
        let nc: [u8; auth::NONCE_BYTES] = rand::random();
        m.write(FrameKind::AuthInit, 0, 0, &nc);
        let (kind, _, challenge) = m.read();
        assert_eq!(kind, FrameKind::AuthChallenge);
        let (ns, proof) = auth::decode_challenge(&challenge).expect("a challenge");
        secret
            .verify_accept(&nc, &ns, proof)
            .expect("the cell proves the secret");
        m.write(
            FrameKind::AuthResponse,
            0,
            0,
            &secret.connect_proof(&nc, &ns),
        );
        let hello = payload::encode_hello(&payload::Hello {
            cell: cell.parse().expect("a cell id"),
            ring,
            client: "127.0.0.1:1".into(),
        });
        m.write(FrameKind::Hello, 0, 0, &hello);
        m
    }

    fn write(&mut self, kind: FrameKind, epoch: u64, id: u64, payload: &[u8]) {
        let mut out = Vec::new();
        wire::encode(&self.wire, kind, epoch, id, payload, &mut out).expect("a frame");
        self.stream.write_all(&out).expect("sent");
    }

    /// One frame: (kind, request id, payload).
    fn read(&mut self) -> (FrameKind, u64, Vec<u8>) {
        let mut buf = vec![0u8; HEADER_BYTES];
        self.stream.read_exact(&mut buf).expect("a frame header");
        let total = wire::frame_bytes(&self.wire, &buf).expect("a frame length");
        buf.resize(total, 0);
        self.stream
            .read_exact(&mut buf[HEADER_BYTES..])
            .expect("the frame");
        match wire::decode(&self.wire, &buf).expect("a frame") {
            wire::Decoded::Complete { frame, .. } => {
                (frame.kind, frame.request_id, frame.payload.to_vec())
            }
            wire::Decoded::Incomplete => panic!("a whole frame was read"),
        }
    }

    /// Sends a request and returns its reply: (kind, payload).
    fn call(&mut self, kind: FrameKind, epoch: u64, payload: &[u8]) -> (FrameKind, Vec<u8>) {
        let id = self.next_id;
        self.next_id += 1;
        self.write(kind, epoch, id, payload);
        loop {
            let (kind, reply_to, payload) = self.read();
            if reply_to == id {
                return (kind, payload);
            }
        }
    }

    /// The position the receiver applied last in this member's live lane (an empty
    /// `Replicate` frame is answered with it).
    fn live_position(&mut self, epoch: u64) -> u64 {
        let (kind, ack) = self.call(FrameKind::Replicate, epoch, &[]);
        assert_eq!(
            kind,
            FrameKind::ReplicateAck,
            "{}",
            String::from_utf8_lossy(&ack)
        );
        RangeSeq::decode(&ack).expect("an acknowledgement").seq
    }
}

/// One replication record at position `seq`.
fn record(seq: u64, op: ReplicationOp<'_>) -> Vec<u8> {
    let mut b = Vec::new();
    ReplicationRecord {
        range: HashRange::FULL,
        seq,
        op,
    }
    .encode(&mut b)
    .expect("a record");
    b
}

fn set_op<'a>(key: &'a str, value: &'a str) -> ReplicationOp<'a> {
    ReplicationOp::Set {
        key: key.as_bytes(),
        value: value.as_bytes(),
        flags: 0,
        expiry_unix_secs: 0,
        cas: 1,
        stale: false,
    }
}

/// The epoch of cell `i`'s map.
fn epoch(ring: &Ring, i: usize) -> u64 {
    ring.status(i)[0]
        .split(' ')
        .nth(1)
        .and_then(|e| e.parse().ok())
        .expect("EPOCH in the status")
}

/// The index of the cell that backs up cell `i` (its successor in the map).
fn backup_of(ring: &Ring, i: usize) -> usize {
    let status = ring.status(0);
    let cells: Vec<&String> = status.iter().filter(|l| l.starts_with("CELL ")).collect();
    let index_of = |line: &str| {
        ring.cells
            .iter()
            .position(|s| line.contains(&format!("client={} ", s.addr)))
            .expect("a cell of the ring")
    };
    let at = cells
        .iter()
        .position(|l| index_of(l) == i)
        .expect("the cell's line");
    index_of(cells[(at + 1) % cells.len()])
}

/// `n` keys whose master is cell `i`.
fn keys_of(ring: &Ring, i: usize, n: usize) -> Vec<String> {
    let range = ring
        .range_of(&format!("client={} ", ring.cells[i].addr))
        .expect("the cell's range");
    (0..)
        .map(|k| format!("key-{k}"))
        .filter(|k| range.contains(cellcache_cluster::key_hash(k.as_bytes())))
        .take(n)
        .collect()
}

/// `get` that waits out a ring still healing (`SERVER_ERROR`, retryable) within a bound.
fn get_healed(server: &common::Server, key: &str) -> Option<String> {
    for _ in 0..600 {
        let mut c = server.connect();
        c.send(format!("get {key}\r\n").as_bytes());
        let first = c.line();
        if first.starts_with("SERVER_ERROR") {
            std::thread::sleep(Duration::from_millis(100));
            continue;
        }
        if first == "END" {
            return None;
        }
        let value = c.line();
        assert_eq!(c.line(), "END");
        return Some(value);
    }
    panic!("{key}: the ring never served it again");
}

/// Writes `keys` through cell `via`, each value "v-<key>", all acknowledged.
fn write_all(ring: &Ring, via: usize, keys: &[String]) {
    let mut c = ring.cells[via].connect();
    for k in keys {
        let v = format!("v-{k}");
        c.roundtrip(
            format!("set {k} 0 0 {}\r\n{v}\r\n", v.len()).as_bytes(),
            b"STORED\r\n",
        );
    }
}

/// Kills cell `dead` with SIGKILL, waits until the others healed into a ring of their own,
/// then checks every key of `keys` reads its acknowledged value through cell `via`.
fn kill_and_read_back(ring: &mut Ring, dead: usize, via: usize, keys: &[String]) {
    ring.cells[dead].kill9();
    let alive: Vec<usize> = (0..ring.cells.len()).filter(|i| *i != dead).collect();
    ring.wait_formed_among(alive.len(), &alive);
    let lost: Vec<&String> = keys
        .iter()
        .filter(|k| get_healed(&ring.cells[via], k) != Some(format!("v-{k}")))
        .collect();
    assert!(lost.is_empty(), "acknowledged writes lost: {lost:?}");
}

/// A frame numbered 2^62 on the master's lane used to move the backup's watermark there:
/// every later record of the master was skipped as already applied, acknowledged all the
/// same, and the master's crash lost those writes.
#[test]
fn a_replication_frame_numbered_far_ahead_is_refused_and_replication_goes_on() {
    if common::is_memcached() {
        return;
    }
    let secret = secret_file("jump");
    let mut ring = ring_with_secret(3, &secret);
    let master = 0;
    let backup = backup_of(&ring, master);
    let other = (0..3)
        .find(|i| *i != master && *i != backup)
        .expect("a third");
    let (_, peer, ring_id) = addresses(&ring, backup);
    let keys = keys_of(&ring, master, 200);
    write_all(&ring, master, &keys[..100]);
    // As the master, to its backup: one record far ahead.
    let mut forger = Member::connect(&peer, &secret, ring_id, &ring.id(master));
    let forged = record(1 << 62, set_op(&keys[0], "forged"));
    let (kind, why) = forger.call(FrameKind::Replicate, epoch(&ring, backup), &forged);
    assert_eq!(
        kind,
        FrameKind::Refused,
        "the jump was taken: {}",
        String::from_utf8_lossy(&why)
    );
    assert!(String::from_utf8_lossy(&why).starts_with("sequence gap"));
    assert!(stat(&ring, backup, "cluster_replicate_gaps") >= 1);
    drop(forger);
    // Writes after it still reach the backup: the master's crash loses none of them.
    write_all(&ring, other, &keys[100..]);
    kill_and_read_back(&mut ring, master, other, &keys);
}

/// A member could inject values into, and flush, a range it does not master, and forward
/// requests while not in the map.
#[test]
fn a_member_cannot_replicate_flush_or_forward_for_keys_it_does_not_master() {
    if common::is_memcached() {
        return;
    }
    let secret = secret_file("entitled");
    let mut ring = ring_with_secret(3, &secret);
    let master = 0;
    let backup = backup_of(&ring, master);
    let third = backup_of(&ring, backup);
    let keys = keys_of(&ring, master, 100);
    write_all(&ring, master, &keys);
    // As the backup (which masters its own range, not the master's): a value for one of
    // the master's keys, at the next position of its own lane there.
    let (_, master_peer, ring_id) = addresses(&ring, master);
    let mut forger = Member::connect(&master_peer, &secret, ring_id, &ring.id(backup));
    let e = epoch(&ring, master);
    let next = forger.live_position(e) + 1;
    let injected = record(next, set_op(&keys[0], "evil"));
    let (kind, _) = forger.call(FrameKind::Replicate, e, &injected);
    assert_eq!(
        kind,
        FrameKind::ReplicateAck,
        "in sequence, so acknowledged"
    );
    drop(forger);
    // As the third cell, to the master's backup: a flush of the whole ring.
    let (_, backup_peer, _) = addresses(&ring, backup);
    let mut forger = Member::connect(&backup_peer, &secret, ring_id, &ring.id(third));
    let e = epoch(&ring, backup);
    let next = forger.live_position(e) + 1;
    let flush = record(next, ReplicationOp::Flush { at_unix_secs: 0 });
    let (kind, _) = forger.call(FrameKind::Replicate, e, &flush);
    assert_eq!(kind, FrameKind::ReplicateAck);
    drop(forger);
    // As a cell the map does not have: a forwarded flush_all to the master.
    let mut stranger = Member::connect(&master_peer, &secret, ring_id, "77");
    let (kind, why) = stranger.call(FrameKind::ForwardRequest, e, b"flush_all\r\n");
    assert_eq!(
        kind,
        FrameKind::Refused,
        "served: {}",
        String::from_utf8_lossy(&why)
    );
    drop(stranger);
    assert!(stat(&ring, master, "cluster_replicate_unentitled") >= 1);
    assert!(stat(&ring, backup, "cluster_replicate_unentitled") >= 1);
    assert!(stat(&ring, master, "cluster_forward_not_member") >= 1);
    let mut c = ring.cells[third].connect();
    assert_eq!(
        c.get_value(&keys[0]),
        Some(format!("v-{}", keys[0])),
        "the injected value is served"
    );
    // The backup still holds every key: the master's crash loses none.
    kill_and_read_back(&mut ring, master, third, &keys);
}

/// A map pushed by a member numbered 1000 epochs ahead used to be installed by every cell;
/// the group could never confirm it, so every cell stopped serving for good ("no master
/// available").
#[test]
fn a_map_pushed_by_a_member_is_not_installed() {
    if common::is_memcached() {
        return;
    }
    let secret = secret_file("map");
    let ring = ring_with_secret(3, &secret);
    let before = epoch(&ring, 0);
    let forged_epoch = before + 1000;
    for i in 0..3 {
        let (_, peer, ring_id) = addresses(&ring, i);
        let mut member = Member::connect(&peer, &secret, ring_id, &ring.id((i + 1) % 3));
        let (kind, map) = member.call(FrameKind::MapRequest, before, &[]);
        assert_eq!(kind, FrameKind::MapUpdate);
        let map = String::from_utf8(map).expect("a JSON map");
        let current = format!("\"epoch\":{before}");
        assert!(map.contains(&current), "{map}");
        let forged = map.replacen(&current, &format!("\"epoch\":{forged_epoch}"), 1);
        member.write(FrameKind::MapUpdate, forged_epoch, 0, forged.as_bytes());
        // A round trip on the same connection: the push was read before it.
        member.call(FrameKind::MapRequest, before, &[]);
    }
    for i in 0..3 {
        assert!(stat(&ring, i, "cluster_map_pushes_ignored") >= 1);
    }
    // Served on, past the map lease a forged map would have made lapse (a wait bounded by
    // a number of writes, not a claim about time).
    let started = std::time::Instant::now();
    let mut written = Vec::new();
    while started.elapsed() < Duration::from_secs(4) && written.len() < 2000 {
        let via = written.len() % 3;
        let key = format!("after-{}", written.len());
        write_all(&ring, via, std::slice::from_ref(&key));
        written.push(key);
    }
    for i in 0..3 {
        let e = epoch(&ring, i);
        assert!(
            e < forged_epoch,
            "cell {i} installed the pushed map: epoch {e}"
        );
    }
    let mut c = ring.cells[0].connect();
    for k in &written {
        assert_eq!(c.get_value(k), Some(format!("v-{k}")));
    }
}

/// A member's consensus messages count only as the cell it claims to be, and only if the
/// map has that cell: a vote request naming another node (an election in another cell's
/// name, with a term far ahead to unseat the leader) and any consensus frame from a cell the
/// map does not have are refused, and the ring serves on.
#[test]
fn a_member_cannot_vote_in_another_cells_name() {
    if common::is_memcached() {
        return;
    }
    let secret = secret_file("vote");
    let ring = ring_with_secret(3, &secret);
    let before = epoch(&ring, 0);
    const OP_VOTE: u8 = 2;
    let vote = br#"{"vote":{"leader_id":{"term":1000000,"node_id":12345},"committed":false},"last_log_id":null}"#;
    let request = [&[OP_VOTE][..], vote].concat();
    for i in 0..3 {
        let (_, peer, ring_id) = addresses(&ring, i);
        let mut member = Member::connect(&peer, &secret, ring_id, &ring.id((i + 1) % 3));
        let (kind, reply) = member.call(FrameKind::Consensus, before, &request);
        assert_eq!(kind, FrameKind::Consensus);
        assert!(
            reply.first() == Some(&1) && String::from_utf8_lossy(&reply).contains("another node"),
            "cell {i} answered {:?}",
            String::from_utf8_lossy(&reply)
        );
        let mut stranger = Member::connect(&peer, &secret, ring_id, "99");
        let (_, reply) = stranger.call(FrameKind::Consensus, before, &request);
        assert!(
            String::from_utf8_lossy(&reply).contains("not a cell of this map"),
            "cell {i} answered a stranger {:?}",
            String::from_utf8_lossy(&reply)
        );
        assert!(stat(&ring, i, "cluster_consensus_refused") >= 2);
    }
    let keys = keys_of(&ring, 0, 30);
    write_all(&ring, 1, &keys);
    let mut c = ring.cells[2].connect();
    for k in &keys {
        assert_eq!(c.get_value(k), Some(format!("v-{k}")));
    }
}
