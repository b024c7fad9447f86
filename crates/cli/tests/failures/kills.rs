//! Cells killed with `kill -9` (a follower, the leader), paused past the suspicion timeout,
//! restarted (the first cell with its own command line too), and a `flush_all` through a kill;
//! `measure_kill9` prints the figures of docs/failures.md.

use super::*;

#[test]
fn kill9_of_a_cell_loses_no_acknowledged_write() {
    kill_scenario("kill-follower", false);
}

#[test]
fn kill9_of_the_consensus_leader_loses_no_acknowledged_write() {
    kill_scenario("kill-leader", true);
}

/// A killed cell started again with the same addresses comes back as a new cell (a new id,
/// its old one gone from the map) and takes a share of the ring without resurrecting
/// anything: every key is still held by exactly two cells, equal.
#[test]
fn a_restarted_cell_rejoins_as_a_new_cell() {
    let mut ring = Ring::start("restart");
    write_pre_keys(&ring);
    let load = workloads(&ring, 21);
    load_flows(&load, 300);
    let (_, victim) = ring.leader_and_follower();
    let old = ring.status(victim).expect("status").me;
    ring.kill(victim);
    ring.wait_stable(2, "after the kill");
    load_flows(&load, 200);
    let new = ring.restart(victim);
    assert_ne!(new, old, "the restarted cell has a new id");
    let st = ring.wait_stable(3, "after the restart");
    assert!(!ids(&st).contains(&old), "{old} is gone from {st:?}");
    load_flows(&load, 300);
    finish(load, "restart");
    check_pre_keys(&ring);
}

/// A cell frozen with SIGSTOP past the suspicion timeout is declared dead and absorbed
/// while it sleeps; resumed, it finds itself fenced and acknowledges nothing as a master
/// (its clients' requests are relayed or refused), and a restart brings it back as new.
#[test]
fn a_paused_cell_is_fenced_and_rejoins_after_restart() {
    let mut ring = Ring::start("pause");
    write_pre_keys(&ring);
    let load = workloads(&ring, 31);
    load_flows(&load, 300);
    let (_, victim) = ring.leader_and_follower();
    let old = ring.status(victim).expect("status").me;
    ring.cells[victim].pause().expect("SIGSTOP");
    ring.down.push(victim);
    let st = ring.wait_stable(2, "while the cell is paused");
    assert!(!ids(&st).contains(&old), "{old} was absorbed: {st:?}");
    // Slowly: a third of the requests go to the frozen cell and wait out their timeout.
    load_flows(&load, 5);
    ring.cells[victim].resume().expect("SIGCONT");
    // The zombie serves its clients for a while (relaying or refusing) under load.
    load_flows(&load, 200);
    let zombie = ring.status(victim).expect("a resumed cell answers");
    assert_eq!(zombie.me, old);
    let new = ring.restart(victim);
    assert_ne!(new, old, "the restarted cell has a new id");
    load_flows(&load, 300);
    finish(load, "pause");
    check_pre_keys(&ring);
}

/// Figures for docs/failures.md, printed (never asserted): `kill -9` of a cell that is not
/// the consensus leader under a register workload, with the default configuration.
///
/// ```text
/// cargo test -p cellcache --test failures -- --ignored --nocapture measure_kill9
/// ```
///
/// - detection: from the kill to the successor's map showing it masters the dead cell's
///   range (the committed map change, polled every 5 ms);
/// - readable: from the kill to the end of the first pass in which every one of the
///   `PRE_KEYS` keys was read back through the survivors with its value;
/// - healed: from the kill to two Active cells and no migration (re-replication done);
/// - throughput (acknowledged operations per second) and client errors of the workload
///   before the kill, between the kill and `readable`, and after: `unknown` are timeouts and
///   `SERVER_ERROR`s, `refused` are connections refused by the dead cell's address (each
///   client still sends a third of its requests there).
#[test]
#[ignore = "measurement, run by hand (see docs/failures.md)"]
fn measure_kill9() {
    for run in 0..3 {
        let mut ring = Ring::start(&format!("measure{run}"));
        write_pre_keys(&ring);
        let started = Instant::now();
        let load = Workload::start(WorkloadConfig {
            clients: 4,
            keys: 64,
            key_prefix: format!("m{run}-"),
            ops_per_client: 1_000_000,
            request_timeout: Duration::from_secs(5),
            ..WorkloadConfig::registers(ring.addrs())
        })
        .expect("workload");
        std::thread::sleep(Duration::from_secs(3));
        let (_, victim) = ring.leader_and_follower();
        let survivors: Vec<usize> = (0..3).filter(|&i| i != victim).collect();
        let before: Vec<Option<String>> =
            survivors.iter().map(|&i| master_line(&ring, i)).collect();
        let killed = Instant::now();
        ring.kill(victim);
        let detected = loop {
            let now: Vec<Option<String>> =
                survivors.iter().map(|&i| master_line(&ring, i)).collect();
            if now != before {
                break killed.elapsed();
            }
            assert!(killed.elapsed() < SETTLE, "no map change");
            std::thread::sleep(Duration::from_millis(5));
        };
        let readable = loop {
            let clean = (0..PRE_KEYS).all(|k| {
                let addr = ring.cells[survivors[k % 2]].addr();
                get(addr, &format!("pre{k}")).is_ok_and(|v| v == Some(format!("p{k}")))
            });
            if clean {
                break killed.elapsed();
            }
            assert!(killed.elapsed() < SETTLE, "keys never readable");
        };
        ring.wait_stable(2, "after the kill");
        let healed = killed.elapsed();
        std::thread::sleep(Duration::from_secs(3));
        let run_out = load.finish();
        let at_kill = killed - started;
        let ops = run_out.history.operations().expect("well formed");
        let window = |from: Duration, to: Duration| {
            let in_window: Vec<_> = ops
                .iter()
                .filter(|o| o.completed_at.is_some_and(|t| t >= from && t < to))
                .collect();
            use cellcache_testkit::history::Outcome;
            let count =
                |f: fn(&Outcome) -> bool| in_window.iter().filter(|o| f(&o.outcome)).count();
            let ok = count(|o| matches!(o, Outcome::Ok(_)));
            let secs = (to - from).as_secs_f64();
            (
                ok as f64 / secs,
                format!(
                    "{} unknown/{} refused",
                    count(|o| matches!(o, Outcome::Unknown(_))),
                    count(|o| matches!(o, Outcome::Fail(_)))
                ),
            )
        };
        let end = ops
            .iter()
            .filter_map(|o| o.completed_at)
            .max()
            .unwrap_or_default();
        let (tp_before, err_before) = window(Duration::ZERO, at_kill);
        let (tp_during, err_during) = window(at_kill, at_kill + readable);
        let (tp_after, err_after) = window(at_kill + readable, end);
        println!(
            "MEASURE run {run}: detection {} ms, every key readable {} ms, healed {} ms; \
             ok ops/s before {tp_before:.0} during {tp_during:.0} after {tp_after:.0}; \
             errors before {err_before}, during {err_during}, after {err_after}",
            detected.as_millis(),
            readable.as_millis(),
            healed.as_millis()
        );
        run_out.assert_valid(&format!("measure{run}"));
    }
}

/// `flush_all` through one cell empties the ring once: every key written before it is gone
/// through every cell, and the writes acknowledged after its `OK` — by clients on every
/// cell, through a kill -9 of a cell and its failover — are all there, as the history
/// checker confirms (a flush passed on forever, or applied again after a failover, would
/// erase them).
#[test]
fn writes_acknowledged_after_a_flush_all_survive_it_and_a_kill() {
    let mut ring = Ring::start("flush");
    write_pre_keys(&ring);
    let before = workloads(&ring, 41);
    load_flows(&before, 200);
    finish(before, "flush-before");
    let addr = ring.cells[1].addr();
    let reply = ring
        .at(|| one_line(addr, "flush_all\r\n"))
        .expect("flush_all");
    assert_eq!(reply, "OK");
    // Nothing written before the flush is left, through any cell.
    for &i in &ring.live() {
        let addr = ring.cells[i].addr();
        for k in (0..PRE_KEYS).step_by(7) {
            let key = format!("pre{k}");
            let v = ring.at(|| get(addr, &key)).expect("get");
            assert_eq!(v, None, "{key} through cell {i} after flush_all");
        }
    }
    // Written after the OK: survives, also across a kill and its failover.
    let after = workloads(&ring, 43);
    load_flows(&after, 300);
    let (_, follower) = ring.leader_and_follower();
    ring.kill(follower);
    ring.wait_stable(2, "after the kill");
    load_flows(&after, 300);
    let runs = finish(after, "flush-after");
    check_replicas(&ring, keys_of(&runs).into_iter());
}

/// The ring's first cell (started without `--join`) killed and started again with its
/// original command line rejoins its ring as a new cell — one ring, never two — and no
/// acknowledged write is lost, as the history checker confirms (it once adopted its old map
/// unfenced, lost half the keys and ran as a second ring).
#[test]
fn the_first_cell_restarted_with_its_command_line_rejoins_and_loses_nothing() {
    let mut ring = Ring::start("first-restart");
    write_pre_keys(&ring);
    let load = workloads(&ring, 51);
    load_flows(&load, 300);
    let old = ring.status(0).expect("status").me;
    ring.kill(0);
    ring.wait_stable(2, "after the kill");
    load_flows(&load, 200);
    let new = ring.restart_as_started(0);
    assert_ne!(new, old, "the restarted first cell has a new id");
    load_flows(&load, 300);
    let runs = finish(load, "first-restart");
    check_pre_keys(&ring);
    check_replicas(&ring, keys_of(&runs).into_iter());
}
