//! A cell killed while a division is in flight: the parent, the child, the successor.

use super::*;

/// Writes `count` keys of `bytes` bytes through `addr` (pipelined), each acknowledged:
/// ballast that makes a hand-off take a while.
fn write_ballast(addr: SocketAddr, count: usize, bytes: usize) {
    let mut s = connect(addr).expect("connect");
    let mut r = BufReader::new(s.try_clone().expect("clone"));
    let value = "b".repeat(bytes);
    for batch in (0..count).collect::<Vec<_>>().chunks(100) {
        let mut req = String::new();
        for k in batch {
            req.push_str(&format!("set ballast{k} 0 0 {bytes}\r\n{value}\r\n"));
        }
        s.write_all(req.as_bytes()).expect("write ballast");
        for k in batch {
            let mut line = String::new();
            r.read_line(&mut line).expect("ballast reply");
            assert_eq!(line, "STORED\r\n", "ballast{k}");
        }
    }
}

/// Which cell of a division the nemesis kills.
#[derive(Clone, Copy, Debug)]
enum DivisionRole {
    Parent,
    Child,
    /// The parent's successor, whose backup range the division shrinks.
    Successor,
}

/// A fourth cell divides cell 0's range (`ctl split`, streamed slowly), and one of the
/// three cells involved is killed while the division is in flight. The ring must settle
/// with no migration (the division completed or aborted), every cell left out of the
/// settled map (a child whose division was aborted) is restarted and rejoins as new, and
/// nothing acknowledged is lost.
fn crash_during_division(name: &str, role: DivisionRole) {
    // ~300 KB/s: the hand-off of ~1.5 MB takes seconds; killing takes milliseconds.
    let env = [("CELLCACHE_CLUSTER__HANDOFF_BYTES_PER_SEC", "300000")];
    let mut ring = Ring::start_in(name, None, &env);
    write_pre_keys(&ring);
    write_ballast(ring.cells[0].addr(), 1500, 2000);
    let load = workloads(&ring, 71);
    load_flows(&load, 300);
    let child = ring.split_to_new_cell(&format!("{name}-3"), 0, &env);
    let st = ring.status(child).expect("status of the joining cell");
    let division = admin_lines(admin_of(&ring.cells[child]), "/cluster/status")
        .expect("status")
        .into_iter()
        .find(|l| l.starts_with("MIGRATION division"))
        .unwrap_or_else(|| panic!("the division is in flight: {st:?}"));
    let field = |name: &str| {
        division
            .split(' ')
            .find_map(|w| w.strip_prefix(name))
            .expect("division fields")
            .to_string()
    };
    let parent = ring.index_of(&st, &field("parent="));
    assert_eq!(ring.index_of(&st, &field("child=")), child);
    // The parent's successor: the next active cell by id order, wrapping.
    let active: Vec<&CellView> = st.cells.iter().filter(|c| c.state == "active").collect();
    let at = active
        .iter()
        .position(|c| c.id == field("parent="))
        .expect("parent is active");
    let successor = ring.index_of(&st, &active[(at + 1) % active.len()].id);
    let victim = match role {
        DivisionRole::Parent => parent,
        DivisionRole::Child => child,
        DivisionRole::Successor => successor,
    };
    let victim_id = match role {
        DivisionRole::Parent => field("parent="),
        DivisionRole::Child => st.me.clone(),
        DivisionRole::Successor => active[(at + 1) % active.len()].id.clone(),
    };
    let victim_addr = ring.cells[victim].addr().to_string();
    ring.kill(victim);
    // The original cells that survive settle the ring between them.
    let observers: Vec<usize> = (0..3).filter(|&i| i != victim).collect();
    let marks = after_the_map_change(&ring, &observers, &victim_id, &load);
    let settled = ring.wait_settled(&observers, None, "after the crash during the division");
    load_flows(&load, 200);
    // A child whose division was aborted is out of the map: fenced; it rejoins as new.
    if victim != child && !ids(&settled).contains(&st.me) {
        wait_fenced(&ring, child);
        let new = ring.restart(child);
        assert_ne!(new, st.me, "the aborted child rejoins with a new id");
    }
    let n = ring.live().len();
    ring.wait_stable(n, "after the division's end");
    load_flows(&load, 300);
    let runs: Vec<Run> = load.into_iter().map(Workload::finish).collect();
    let late: Vec<Vec<String>> = runs
        .iter()
        .zip(marks)
        .map(|(run, mark)| errors_invoked_after(run, mark, &victim_addr))
        .collect();
    for (i, (run, late)) in runs.iter().zip(&late).enumerate() {
        eprintln!(
            "{name} workload {i}: {} errors invoked after the map change and its settling margin, of {:?}: {:?}",
            late.len(),
            run.summary,
            late.iter().take(5).collect::<Vec<_>>()
        );
    }
    check_runs(runs, name);
    // Where a late error came from, should there be one: each live cell's count of the
    // retryable error (a parked request's deadline, a link that gave up), of writes that
    // ran after the map moved their key away, and of forwards its masters refused.
    let counters: Vec<String> = ring
        .live()
        .into_iter()
        .map(|i| {
            let of = |n: &str| stat(&ring, i, n).map_or("?".into(), |v| v.to_string());
            format!(
                "cell {i}: unavailable {} stray_writes {} forward_refused {} peer_busy {}",
                of("cluster_unavailable"),
                of("cluster_stray_writes"),
                of("cluster_forward_refused"),
                of("cluster_peer_busy")
            )
        })
        .collect();
    for (i, late) in late.iter().enumerate() {
        assert!(
            late.is_empty(),
            "{name} workload {i}: {} requests sent after the map change (plus settling margin) failed: {:?}; {counters:?}",
            late.len(),
            late.iter().take(10).collect::<Vec<_>>()
        );
    }
    check_pre_keys(&ring);
}

/// Waits until every cell of `observers` has installed a map in which `victim` no longer
/// serves (it is dead or gone), then for a settling margin, and returns a mark in each
/// workload's history: requests invoked after it must succeed (what clients are promised:
/// while detection runs requests may wait or get a retryable error; after the map change
/// they succeed).
///
/// The margin is one backup grant's lifetime, `lease_ms + clock_drift_margin_ms` of the
/// default ring configuration the cells run with: within it a backup may still honour a
/// grant made under the old map, and past it every master of the new map can hold its
/// leases (renewed every heartbeat). Nothing else excuses an error afterwards: a range
/// taken over from the dead cell is served `map_lease_ms + clock_drift_margin_ms` after
/// the change, but requests wait for it (up to `request_timeout_ms`, which is longer)
/// rather than fail, and writes wait for the re-replication's live lane, not for its
/// snapshot. The criterion is a count of failed requests, not a duration: the mark is
/// taken in the history's own order, so a request counts only if it was sent after the
/// test saw every surviving cell on the new map and waited out the margin.
fn after_the_map_change(
    ring: &Ring,
    observers: &[usize],
    victim: &str,
    load: &[Workload; 2],
) -> Vec<u64> {
    let deadline = Instant::now() + SETTLE;
    loop {
        let changed = observers.iter().all(|&i| {
            ring.status(i)
                .is_some_and(|s| !s.cells.iter().any(|c| c.id == victim && c.state != "dead"))
        });
        if changed {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no map without {victim} was installed"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let ring_config = cellcache_cluster::RingConfig::default();
    std::thread::sleep(Duration::from_millis(
        ring_config.lease_ms + ring_config.clock_drift_margin_ms,
    ));
    load.iter().map(Workload::mark).collect()
}

/// The requests of `run` invoked at or after `mark` that did not succeed, as text, leaving
/// out those sent to the killed cell's address (refused connections: certainly not
/// applied, and expected for as long as the clients keep trying it).
fn errors_invoked_after(run: &Run, mark: u64, victim_addr: &str) -> Vec<String> {
    run.history
        .operations()
        .expect("a well-formed history")
        .into_iter()
        .filter(|o| o.invoked >= mark)
        .filter_map(|o| match &o.outcome {
            Outcome::Ok(_) => None,
            Outcome::Fail(why) | Outcome::Unknown(why) if why.contains(victim_addr) => None,
            _ => Some(o.to_string()),
        })
        .collect()
}

#[test]
fn crash_of_the_parent_during_a_division() {
    crash_during_division("div-parent", DivisionRole::Parent);
}

#[test]
fn crash_of_the_child_during_a_division() {
    crash_during_division("div-child", DivisionRole::Child);
}

#[test]
fn crash_of_the_successor_during_a_division() {
    crash_during_division("div-successor", DivisionRole::Successor);
}
