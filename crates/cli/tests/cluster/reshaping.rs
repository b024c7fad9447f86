//! The ring changing shape under load: divisions and absorptions, a killed cell absorbed,
//! a silent master that must not hold a forwarded request forever.

use super::*;

/// Online division and leave under continuous load from several clients: no client sees
/// an error, and the history checker finds every acknowledged write readable with its
/// latest value afterwards (registers), and every acknowledged append exactly once and in
/// order (append logs).
#[test]
fn split_and_leave_under_load_lose_nothing() {
    use std::time::Duration;
    if common::is_memcached() {
        return;
    }
    let mut ring = Ring::start(3, &["-m", "32"]);
    let standby = ring.add_standby(&["-m", "32"]);
    // Clients use the cells that stay in the ring for the whole run (cell 2 leaves).
    let servers = vec![ring.cells[0].addr, ring.cells[1].addr];
    let (registers, logs) = load(servers, 7);
    let during = Duration::from_secs(30);
    assert!(registers.wait_completed(200, during) && logs.wait_completed(200, during));
    // Division: the standby cell takes the second half of cell 0's range.
    let parent = ring.id(0);
    let reply = ring.invite(standby, 0, &parent);
    assert!(reply.starts_with("OK "), "{reply}");
    ring.wait_formed(4);
    let (r, l) = (registers.completed(), logs.completed());
    assert!(registers.wait_completed(r + 200, during) && logs.wait_completed(l + 200, during));
    // Leave: cell 2 hands its range to its successor and exits.
    let leaving = ring.id(2);
    let reply = ring.leave(0, &leaving);
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
    lost_nothing([("registers", registers), ("append logs", logs)]);
    ring.assert_no_stray_writes();
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
    set_keys(&mut c);
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
        check_keys(&mut ring.cells[i].connect(), &format!("cell {i}"));
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

/// A ring of one that divided has one voter, the first cell, and the new cell as a
/// learner: when the new cell dies the first one absorbs it alone and serves every key,
/// those the dead cell mastered from their backup copies (with two voters the ring could
/// not change its map, and stopped serving every range once its map lease lapsed).
#[test]
fn a_ring_of_two_absorbs_its_dead_new_cell() {
    if common::is_memcached() {
        return;
    }
    let mut ring = Ring::start(2, &["-m", "32"]);
    let mut c = ring.cells[0].connect();
    set_keys(&mut c);
    let dead = ring.key_mastered_by(1, "key");
    let dead_id = ring.id(1);
    ring.cells[1].kill9();
    ring.wait_formed_among(1, &[0]);
    let status = ring.status(0);
    assert!(
        !status
            .iter()
            .any(|l| l.starts_with(&format!("CELL {dead_id} "))),
        "{status:?}"
    );
    let mut c = ring.cells[0].connect();
    check_keys(&mut c, "cell 0");
    c.roundtrip(
        format!("set {dead} 0 0 3\r\nnew\r\n").as_bytes(),
        b"STORED\r\n",
    );
    assert_eq!(get(&mut c, &dead).as_deref(), Some("new"));
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
    let key = ring.key_mastered_by(2, "s");
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

/// The consensus leader, the one voter of a ring of two, leaves: the cell left alone can
/// elect itself only if the leaving cell handed the vote over before it stopped. The
/// 1 → N → 1 run found a last cell without a leader, serving no key request ever after.
#[test]
fn the_leader_leaving_a_ring_of_two_leaves_a_cell_that_leads_and_serves() {
    use std::time::Duration;
    if common::is_memcached() {
        return;
    }
    // No linger: the leaving cell stops as soon as it is out of the map, which in a ring
    // this small is before the voters' change commits, unless it waits for it.
    let wait = std::env::var("CELLCACHE_TEST_LEAVE_VOTERS_WAIT_MS").unwrap_or("10000".into());
    let env = [
        ("CELLCACHE_CLUSTER__LEAVE_LINGER_MS", "0"),
        ("CELLCACHE_CLUSTER__LEAVE_VOTERS_WAIT_MS", wait.as_str()),
    ];
    let mut ring = Ring::start_with_env(2, &["-m", "32"], &env);
    let leader = |ring: &Ring, i: usize| {
        ring.status(i)[0]
            .split(' ')
            .skip_while(|w| *w != "LEADER")
            .nth(1)
            .map(str::to_string)
    };
    let first = ring.id(0);
    common::wait_until(
        "both cells know cell 0 leads",
        Duration::from_secs(20),
        Duration::from_millis(50),
        || {
            leader(&ring, 0).as_deref() == Some(first.as_str())
                && leader(&ring, 1) == leader(&ring, 0)
        },
    );
    let mut c = ring.cells[1].connect();
    set_keys(&mut c);
    let reply = ring.leave(1, &first);
    assert!(reply.starts_with("OK "), "{reply}");
    common::wait_until(
        "the leaving leader exits",
        Duration::from_secs(30),
        Duration::from_millis(50),
        || !ring.cells[0].is_running(),
    );
    ring.wait_formed_among(1, &[1]);
    let me = ring.id(1);
    common::wait_until(
        "the cell left leads",
        Duration::from_secs(20),
        Duration::from_millis(50),
        || leader(&ring, 1).as_deref() == Some(me.as_str()),
    );
    let mut c = ring.cells[1].connect();
    check_keys(&mut c, "cell 1");
    c.roundtrip(b"set after 0 0 1\r\nv\r\n", b"STORED\r\n");
}

/// A cell that cannot have one of its client ports (here its second `-l` address, taken by
/// someone else) fails its start before the ring hears of it: the ring's map keeps no
/// member that never serves and no division waiting on it, and the same cell joins once
/// the port is free.
#[test]
fn a_joining_cell_whose_port_is_taken_leaves_no_member_behind() {
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};
    if common::is_memcached() {
        return;
    }
    let mut ring = Ring::start(1, &["-m", "32"]);
    let join = format!("127.0.0.1:{}", ring.peer_port(0));
    let squatter = std::net::TcpListener::bind("127.0.0.2:0").expect("a port on 127.0.0.2");
    let port = squatter.local_addr().unwrap().port();
    let admin = common::free_peer_port();
    let peer = cellcache_testkit::process::free_port_besides(&[port, admin]).unwrap();
    let mut joiner = Command::new(env!("CARGO_BIN_EXE_cellcache"))
        .args(["serve", "-m", "32", "-l", "127.0.0.1,127.0.0.2"])
        .args(["-p", &port.to_string(), "--admin-port", &admin.to_string()])
        .args(["--peer-port", &peer.to_string(), "--join", &join])
        .env("CELLCACHE_CLUSTER__STATE_DIR", common::state_dir(port))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cellcache starts");
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = joiner.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = joiner.kill();
            panic!("a cell whose client port is taken kept running");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut joiner.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(!status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("127.0.0.2:{port}")) && stderr.contains("in use"),
        "{stderr}"
    );
    let status = ring.status(0);
    let members = status.iter().filter(|l| l.starts_with("CELL ")).count();
    assert_eq!(members, 1, "{status:?}");
    assert!(
        !status.iter().any(|l| l.starts_with("MIGRATION")),
        "{status:?}"
    );
    // The port free again, a cell listening on both addresses joins and serves on both.
    drop(squatter);
    let cell = common::Server::start(&["-m", "32", "-l", "127.0.0.2", "--join", &join]);
    let second = std::net::SocketAddr::from(([127, 0, 0, 2], cell.addr.port()));
    ring.cells.push(cell);
    ring.wait_formed(2);
    let mut c = Client::to(second);
    c.roundtrip(b"set joined 0 0 1\r\nx\r\n", b"STORED\r\n");
    assert_eq!(
        ring.cells[0].connect().get_value("joined").as_deref(),
        Some("x")
    );
}

/// Which cell of a just-finished division [`a_flipped_division_keeps_two_copies`] kills.
#[derive(Clone, Copy, Debug)]
enum FlipVictim {
    Parent,
    Child,
}

/// After a division's flip no cell re-replicates a range to a backup that already holds it
/// (the child caught up with all of the parent's range; the child's backup held the child's
/// half as the parent's backup). So this checks they really do hold it: a ring of two
/// divides cell 1, every key is written again after the flip, every key is on exactly two
/// cells once the trims are done, and after `kill -9` of `victim` every key reads back with
/// its newest value through both survivors.
fn a_flipped_division_keeps_two_copies(victim: FlipVictim) {
    use std::time::Duration;
    if common::is_memcached() {
        return;
    }
    let mut ring = Ring::start(2, &["-m", "32"]);
    let standby = ring.add_standby(&["-m", "32"]);
    set_keys(&mut ring.cells[0].connect());
    let parent = ring.id(1);
    let reply = ring.invite(standby, 0, &parent);
    assert!(reply.starts_with("OK "), "{reply}");
    ring.wait_formed(3);
    let mut c = ring.cells[0].connect();
    for i in 0..KEYS {
        let v = value(i, 1);
        c.roundtrip(
            format!("set key{i} 0 0 {}\r\n{v}\r\n", v.len()).as_bytes(),
            b"STORED\r\n",
        );
    }
    common::wait_until(
        "every key on exactly two cells",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || (0..3).map(|i| ring.ranges(i).1).sum::<u64>() == 2 * KEYS as u64,
    );
    let dead = match victim {
        FlipVictim::Parent => 1,
        FlipVictim::Child => standby,
    };
    ring.cells[dead].kill9();
    let survivors: Vec<usize> = (0..3).filter(|&i| i != dead).collect();
    ring.wait_formed_among(2, &survivors);
    for i in survivors {
        let mut c = ring.cells[i].connect();
        for k in 0..KEYS {
            assert_eq!(
                get(&mut c, &format!("key{k}")),
                Some(value(k, 1)),
                "key{k} via cell {i} after {victim:?} died"
            );
        }
    }
}

#[test]
fn the_parent_killed_after_a_flip_loses_no_key() {
    a_flipped_division_keeps_two_copies(FlipVictim::Parent);
}

#[test]
fn the_child_killed_after_a_flip_loses_no_key() {
    a_flipped_division_keeps_two_copies(FlipVictim::Child);
}
