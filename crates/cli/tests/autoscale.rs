//! The ring grows and shrinks by itself (SPEC E1–E2), with real processes and the `local`
//! provisioner: a cell started with `--autoscale` divides as a client's data set grows to
//! ten times one cell's memory, then absorbs its provisioned cells as the data set shrinks,
//! with every acknowledged write checked by the testkit's history checker; a provisioner
//! that fails leaves the ring serving and the decision retried; the deciding cell's death
//! hands the decisions to the next leader.
//!
//! Cells are small (`-m 4`, 64 KiB slabs, so a division moves little and evictions start
//! at about 90% of `-m` as in a large cell) and the clocks short (window and cooldown
//! under a second), so the whole 1→N→1 run fits in a few minutes.

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use cellcache_testkit::history::{self, CheckConfig, Op, Outcome, Recorder, Reply};
use common::{Client, Server};

/// Size of every value written.
const VALUE_BYTES: usize = 1000;
/// One cell's `-m` (MB).
const CELL_MB: usize = 4;

/// A temporary directory whose provisioned cells (processes whose command line names it)
/// are killed when it goes, so a failing test leaves nothing running.
struct Cells {
    dir: PathBuf,
}

impl Cells {
    fn new(name: &str) -> Cells {
        let dir = cellcache_testkit::process::scratch_dir(name);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Cells { dir }
    }

    /// Provisioned cells still running.
    fn running(&self) -> usize {
        let out = std::process::Command::new("pgrep")
            .args(["-f", &self.dir.display().to_string()])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).lines().count()
    }
}

impl Drop for Cells {
    fn drop(&mut self) {
        let _ = std::process::Command::new("pkill")
            .args(["-9", "-f", &self.dir.display().to_string()])
            .status();
        // A failed run keeps the cells' logs for a look.
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// How long a test cell waits for others before giving a request up (below).
const REQUEST_TIMEOUT_MS: &str = "10000";
/// A forwarded request is answered within its deadline plus one more request timeout (the
/// forward's watchdog): the client waits longer than that, so a slow reply on a starved
/// machine is not mistaken for a hang.
const CLIENT_WAIT: Duration = Duration::from_secs(30);

/// A cell with autoscaling on: small memory, short clocks, its provisioned cells in
/// `cells.dir`; `extra` flags and `env` on top.
fn autoscaling_cell(cells: &Cells, extra: &[&str], env: &[(&str, &str)]) -> Server {
    let dir = cells.dir.display().to_string();
    let mut env: Vec<(&str, &str)> = env.to_vec();
    env.extend([
        ("CELLCACHE_STORE__SLAB_SIZE_BYTES", "65536"),
        ("CELLCACHE_STORE__ITEM_SIZE_MAX_BYTES", "65536"),
        ("CELLCACHE_AUTOSCALE__SAMPLE_INTERVAL_MS", "250"),
        ("CELLCACHE_AUTOSCALE__LOCAL__DIR", &dir),
        ("CELLCACHE_AUTOSCALE__JOIN_TIMEOUT_MS", "20000"),
        // Dozens of debug-build cells share two cores: slower heartbeats (fewer wakeups)
        // and a longer wait before a request gives up, so a starved scheduler is not
        // mistaken for a failure. What is tested is the ring's shape, not its detection.
        ("CELLCACHE_CLUSTER__RAFT__HEARTBEAT_INTERVAL_MS", "300"),
        ("CELLCACHE_CLUSTER__RAFT__ELECTION_TIMEOUT_MIN_MS", "1500"),
        ("CELLCACHE_CLUSTER__RAFT__ELECTION_TIMEOUT_MAX_MS", "3000"),
        ("CELLCACHE_CLUSTER__RING__HEARTBEAT_INTERVAL_MS", "250"),
        ("CELLCACHE_CLUSTER__RING__SUSPICION_TIMEOUT_MS", "3000"),
        ("CELLCACHE_CLUSTER__REQUEST_TIMEOUT_MS", REQUEST_TIMEOUT_MS),
        ("CELLCACHE_CLUSTER__PEER_REPLY_TIMEOUT_MS", "20000"),
    ]);
    let mb = CELL_MB.to_string();
    // One worker thread a cell: dozens of cells share this machine's cores.
    let mut args = vec![
        "-m",
        &mb,
        "-t",
        "1",
        "--autoscale",
        "--scale-window",
        "500ms",
    ];
    args.extend(extra);
    Server::start_with_env(&args, &env)
}

/// The `CELL` lines of the ring's status (through `server`'s admin plane).
fn cells_in(server: &Server) -> Vec<String> {
    server
        .admin_lines("/cluster/status")
        .into_iter()
        .filter(|l| l.starts_with("CELL "))
        .collect()
}

fn autoscale_status(server: &Server) -> Vec<String> {
    server.admin_lines("/cluster/autoscale")
}

fn value_of(i: usize) -> Vec<u8> {
    let mut v = format!("v{i}-").into_bytes();
    v.resize(VALUE_BYTES, b'.');
    v
}

/// Writes `{prefix}0` .. `{prefix}{keys - 1}`, each acknowledged.
fn fill(c: &mut Client, prefix: &str, keys: usize) {
    for i in 0..keys {
        let mut req = format!("set {prefix}{i} 0 0 {VALUE_BYTES}\r\n").into_bytes();
        req.extend_from_slice(&value_of(i));
        req.extend_from_slice(b"\r\n");
        c.roundtrip(&req, b"STORED\r\n");
    }
}

/// `set` through `c`, recorded; the outcome.
fn set(c: &mut Client, rec: &Recorder, key: &str, value: &[u8]) -> Outcome {
    let at = rec.invoke(
        0,
        Op::Set {
            key: key.into(),
            value: value.to_vec(),
        },
    );
    let mut req = format!("set {key} 0 0 {}\r\n", value.len()).into_bytes();
    req.extend_from_slice(value);
    req.extend_from_slice(b"\r\n");
    c.send(&req);
    let line = c.line();
    let outcome = match line.as_str() {
        "STORED" => Outcome::Ok(Reply::Stored),
        other => Outcome::Unknown(other.to_string()),
    };
    rec.complete(at, outcome.clone());
    outcome
}

/// `get` through `c`, recorded.
fn get(c: &mut Client, rec: &Recorder, key: &str) -> Option<Vec<u8>> {
    let at = rec.invoke(0, Op::Get { key: key.into() });
    let value = c.get_value(key).map(String::into_bytes);
    rec.complete(at, Outcome::Ok(Reply::Value(value.clone())));
    value
}

/// Requests a pipelined batch holds: one round trip for them all instead of one each.
const PIPELINE: usize = 100;

/// `get` of every key through `c`, [`PIPELINE`] at a time, each recorded. The requests of a
/// batch are in flight together, so each is recorded as its own client's (the history's
/// clients run one operation at a time); the server answers them in order.
fn get_all(c: &mut Client, rec: &Recorder, keys: &[String]) {
    for batch in keys.chunks(PIPELINE) {
        let mut req = Vec::new();
        let mut invoked = Vec::with_capacity(batch.len());
        for (slot, key) in batch.iter().enumerate() {
            invoked.push(rec.invoke(slot as u64, Op::Get { key: key.clone() }));
            req.extend_from_slice(format!("get {key}\r\n").as_bytes());
        }
        c.send(&req);
        for (key, at) in batch.iter().zip(invoked) {
            let value = match c.lines_until_end().as_slice() {
                [] => None,
                [_header, v] => Some(v.clone().into_bytes()),
                other => panic!("unexpected reply to get {key}: {other:?}"),
            };
            rec.complete(at, Outcome::Ok(Reply::Value(value)));
        }
    }
}

/// `delete` of every key through `c`, [`PIPELINE`] at a time; each must answer `DELETED`.
fn delete_all(c: &mut Client, keys: &[String]) {
    for batch in keys.chunks(PIPELINE) {
        let req: String = batch.iter().map(|k| format!("delete {k}\r\n")).collect();
        c.send(req.as_bytes());
        for key in batch {
            assert_eq!(c.line(), "DELETED", "delete {key}");
        }
    }
}

/// Per 10 s window of a run: the most cells seen and the sets' latencies.
#[derive(Default)]
struct Timeline {
    windows: Vec<(usize, Vec<Duration>)>,
}

impl Timeline {
    const WINDOW: Duration = Duration::from_secs(10);

    fn at(&mut self, started: Instant) -> &mut (usize, Vec<Duration>) {
        let w = (started.elapsed().as_secs() / Self::WINDOW.as_secs()) as usize;
        while self.windows.len() <= w {
            let cells = self.windows.last().map_or(1, |l| l.0);
            self.windows.push((cells, Vec::new()));
        }
        &mut self.windows[w]
    }

    fn latency(&mut self, started: Instant, d: Duration) {
        self.at(started).1.push(d);
    }

    fn cells(&mut self, started: Instant, n: usize) {
        let w = self.at(started);
        w.0 = w.0.max(n);
    }

    fn print(&mut self) {
        println!("window_s cells sets p50_ms p99_ms max_ms");
        for (i, (cells, l)) in self.windows.iter_mut().enumerate() {
            l.sort();
            let q = |f: f64| {
                l.get(((l.len() as f64 * f) as usize).min(l.len().saturating_sub(1)))
                    .map_or(0.0, |d| d.as_secs_f64() * 1e3)
            };
            println!(
                "{:>8} {cells:>5} {:>4} {:>6.2} {:>6.2} {:>6.2}",
                i as u64 * Self::WINDOW.as_secs(),
                l.len(),
                q(0.5),
                q(0.99),
                q(1.0)
            );
        }
    }
}

/// From the deciding cell's events: how long each autoscaled division took from the
/// decision to the new cell serving (`division_finished`), in whole seconds.
fn print_division_times(server: &Server) {
    let (_, body) = server.admin_call("GET", "/events");
    let events: Vec<serde_json::Value> = serde_json::from_str(&body).unwrap_or_default();
    let mut took = Vec::new();
    for (i, e) in events.iter().enumerate() {
        if e["kind"] != "autoscale_divide" {
            continue;
        }
        let parent = &e["cell"];
        if let Some(done) = events[i..]
            .iter()
            .find(|d| d["kind"] == "division_finished" && &d["other"] == parent)
        {
            took.push(done["at"].as_u64().unwrap_or(0) - e["at"].as_u64().unwrap_or(0));
        }
    }
    took.sort();
    println!(
        "decision to new cell serving, s (of the last {} events): {took:?}",
        events.len()
    );
}

#[test]
fn a_ring_grows_from_one_cell_to_many_and_back_to_one_losing_nothing() {
    let cells = Cells::new("grow");
    let first = autoscaling_cell(
        &cells,
        &[
            "--cooldown",
            "500ms",
            "--max-cells",
            "48",
            "--high-water",
            "0.75",
        ],
        &[],
    );
    // Ten times one cell's memory, written at a steady rate and read back as it goes.
    let keys = 10 * CELL_MB * (1 << 20) / VALUE_BYTES;
    let per_sec = 400.0;
    let rec = Recorder::new();
    let mut c = first.connect().reply_timeout(CLIENT_WAIT);
    let started = Instant::now();
    let mut most = 1;
    let mut last_look = Instant::now();
    // The timeline printed at the end: per window, cells and the sets' latencies.
    let mut timeline = Timeline::default();
    for i in 0..keys {
        let key = format!("grow{i}");
        let sent = Instant::now();
        let outcome = set(&mut c, &rec, &key, &value_of(i));
        timeline.latency(started, sent.elapsed());
        if outcome != Outcome::Ok(Reply::Stored) {
            panic!(
                "set {key} after {:?}: {outcome:?}\nring: {:#?}\n{:#?}\nlogs in {}",
                started.elapsed(),
                cells_in(&first),
                autoscale_status(&first),
                cells.dir.display()
            );
        }
        if i % 10 == 9 {
            let back = (i * 7919) % (i + 1);
            get(&mut c, &rec, &format!("grow{back}"));
        }
        if last_look.elapsed() > Duration::from_secs(2) {
            let n = cells_in(&first).len();
            timeline.cells(started, n);
            most = most.max(n);
            last_look = Instant::now();
        }
        let due = Duration::from_secs_f64(i as f64 / per_sec);
        if let Some(wait) = due.checked_sub(started.elapsed()) {
            std::thread::sleep(wait);
        }
    }
    let all: Vec<String> = (0..keys).map(|i| format!("grow{i}")).collect();
    get_all(&mut c, &rec, &all);
    let grew = cells_in(&first).len();
    most = most.max(grew);
    let evicted = c.stat_of("", "evictions");
    let report = history::check(&rec.snapshot(), CheckConfig::default());
    println!(
        "{keys} keys of {VALUE_BYTES} B in {:.0} s: {grew} cells (most {most}), evictions {evicted}, \
         {} operations checked",
        started.elapsed().as_secs_f64(),
        report.operations_checked
    );
    timeline.print();
    print_division_times(&first);
    report.assert_valid();
    assert_eq!(evicted, "0", "no acknowledged item evicted");
    // Two copies of ten cells' worth need at least 20 cells at high water.
    assert!(grew >= 20, "the ring grew to {grew} cells only");
    let status = autoscale_status(&first);
    assert!(
        status
            .iter()
            .any(|l| l.starts_with("DECISION ") && l.contains(" divide ")),
        "{status:?}"
    );

    // The data set shrinks to one cell's fifth: the ring absorbs back to one cell.
    let kept: Vec<usize> = (0..keys).step_by(50).collect();
    let shrink = Instant::now();
    let gone: Vec<String> = (0..keys)
        .filter(|i| i % 50 != 0)
        .map(|i| format!("grow{i}"))
        .collect();
    delete_all(&mut c, &gone);
    println!("deleted in {:.0} s", shrink.elapsed().as_secs_f64());
    let deadline = Instant::now() + Duration::from_secs(400);
    while cells_in(&first).len() > 1 {
        assert!(
            Instant::now() < deadline,
            "still {:?} after {:?}",
            cells_in(&first),
            shrink.elapsed()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    println!(
        "absorbed back to one cell {:.0} s after the deletes began",
        shrink.elapsed().as_secs_f64()
    );
    let mut c = first.connect();
    for &i in &kept {
        let key = format!("grow{i}");
        assert_eq!(
            c.get_value(&key).map(String::into_bytes),
            Some(value_of(i)),
            "{key} kept"
        );
    }
    assert_eq!(c.get_value("grow1"), None, "a deleted key stays deleted");
    let status = autoscale_status(&first);
    assert!(
        status
            .iter()
            .any(|l| l.starts_with("DECISION ") && l.contains(" absorb ")),
        "{status:?}"
    );
    // Absorbed cells stopped by themselves and were reaped.
    let until = Instant::now() + Duration::from_secs(30);
    while cells.running() > 0 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(cells.running(), 0, "absorbed cells still running");
}

/// A provisioner that fails (the command exits nonzero) leaves the ring serving, and the
/// decision is retried with backoff.
#[test]
fn a_failing_provisioner_leaves_the_ring_serving_and_is_retried() {
    let cells = Cells::new("failing");
    let script = cells.dir.join("fail.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\ncat >/dev/null\necho 'no capacity' >&2\nexit 3\n",
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let program = script.display().to_string();
    let first = autoscaling_cell(
        &cells,
        &["--provisioner", "command", "--cooldown", "500ms"],
        &[
            ("CELLCACHE_AUTOSCALE__COMMAND__PROGRAM", &program),
            ("CELLCACHE_AUTOSCALE__RETRY_BACKOFF_MS", "300"),
        ],
    );
    let mut c = first.connect();
    // Fill to 85%: above high water, short of eviction.
    let keys = CELL_MB * (1 << 20) * 85 / 100 / VALUE_BYTES;
    fill(&mut c, "f", keys);
    let deadline = Instant::now() + Duration::from_secs(60);
    let failures = loop {
        let status = autoscale_status(&first);
        let n = status
            .iter()
            .filter(|l| l.starts_with("DECISION ") && l.contains(" failed "))
            .count();
        if n >= 2 {
            break status;
        }
        assert!(Instant::now() < deadline, "{status:?}");
        std::thread::sleep(Duration::from_millis(250));
    };
    assert!(
        failures.iter().any(|l| l.contains("no capacity")),
        "the command's reason is reported: {failures:?}"
    );
    assert!(
        failures[0].contains("failures=") && !failures[0].contains("failures=0"),
        "{failures:?}"
    );
    // Still one cell, serving every key.
    assert_eq!(cells_in(&first).len(), 1);
    for i in (0..keys).step_by(97) {
        assert_eq!(
            c.get_value(&format!("f{i}")).map(String::into_bytes),
            Some(value_of(i))
        );
    }
}

/// A provisioned cell that dies before it joins is reported, and the start retried.
#[test]
fn a_cell_that_dies_before_joining_is_reported_and_retried() {
    let cells = Cells::new("dies");
    let first = autoscaling_cell(
        &cells,
        &["--cooldown", "500ms"],
        // Every started cell fails at once: its binary is not cellcache.
        &[("CELLCACHE_AUTOSCALE__LOCAL__BINARY", "/bin/false")],
    );
    let mut c = first.connect();
    let keys = CELL_MB * (1 << 20) * 85 / 100 / VALUE_BYTES;
    fill(&mut c, "d", keys);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let status = autoscale_status(&first);
        let died = status
            .iter()
            .filter(|l| l.contains("stopped before joining"))
            .count();
        if died >= 2 {
            break;
        }
        assert!(Instant::now() < deadline, "{status:?}");
        std::thread::sleep(Duration::from_millis(250));
    }
    assert_eq!(cells_in(&first).len(), 1);
    assert_eq!(
        c.get_value("d0").map(String::into_bytes),
        Some(value_of(0)),
        "the ring keeps serving"
    );
}

/// The `command` provisioner with the example script of deploy/provisioners: a full cell
/// gets a second one started by the script, and once the data is deleted the ring absorbs
/// it and the script's stop runs.
#[test]
fn the_example_command_provisioner_starts_and_stops_cells() {
    let cells = Cells::new("command");
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/provisioners/process.py"
    );
    let dir = cells.dir.display().to_string();
    let args = format!("-m {CELL_MB} --state-dir {dir}/state");
    let first = autoscaling_cell(
        &cells,
        &[
            "--provisioner",
            "command",
            "--cooldown",
            "500ms",
            "--max-cells",
            "2",
        ],
        &[
            ("CELLCACHE_AUTOSCALE__COMMAND__PROGRAM", script),
            ("CELLCACHE_BIN", env!("CARGO_BIN_EXE_cellcache")),
            ("CELLCACHE_PROVISION_DIR", &dir),
            ("CELLCACHE_PROVISION_ARGS", &args),
        ],
    );
    let mut c = first.connect();
    let keys = CELL_MB * (1 << 20) * 85 / 100 / VALUE_BYTES;
    fill(&mut c, "c", keys);
    let deadline = Instant::now() + Duration::from_secs(60);
    while cells_in(&first).len() < 2 || cells_in(&first).iter().any(|l| !l.contains(" active ")) {
        assert!(Instant::now() < deadline, "{:?}", autoscale_status(&first));
        std::thread::sleep(Duration::from_millis(250));
    }
    assert_eq!(cells.running(), 1, "the script's cell runs");
    let all: Vec<String> = (0..keys).map(|i| format!("c{i}")).collect();
    delete_all(&mut c, &all);
    let deadline = Instant::now() + Duration::from_secs(60);
    while cells_in(&first).len() > 1 || cells.running() > 0 {
        assert!(Instant::now() < deadline, "{:?}", autoscale_status(&first));
        std::thread::sleep(Duration::from_millis(250));
    }
    c.roundtrip(b"set after 0 0 1\r\nx\r\n", b"STORED\r\n");
}

/// The id a cell has in the ring (`SELF` of its status).
fn self_id(server: &Server) -> String {
    let status = server.admin_lines("/cluster/status");
    status[0].split(' ').nth(7).expect("SELF id").to_string()
}

/// The deciding cell's id, as `server` reports it (`decider=` of `ctl autoscale status`).
fn decider(server: &Server) -> Option<String> {
    autoscale_status(server)
        .first()?
        .split(' ')
        .find_map(|w| w.strip_prefix("decider="))
        .map(str::to_string)
}

/// Waits until `server`'s map has a number of cells `n` accepts, all active, and no
/// migration in flight; the `CELL` lines.
fn wait_cells(server: &Server, n: impl Fn(usize) -> bool, timeout: Duration) -> Vec<String> {
    let deadline = Instant::now() + timeout;
    loop {
        let status = server.admin_lines("/cluster/status");
        let cells: Vec<String> = status
            .iter()
            .filter(|l| l.starts_with("CELL "))
            .cloned()
            .collect();
        let settled = !status.iter().any(|l| l.starts_with("MIGRATION"));
        if settled && n(cells.len()) && cells.iter().all(|l| l.contains(" active ")) {
            return cells;
        }
        assert!(
            Instant::now() < deadline,
            "not the cells awaited: {status:#?}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The decider is the consensus leader, so it survives the leader's death: kill -9 the
/// deciding cell of a ring of three, and the next leader carries on — it divides when the
/// data outgrows the survivors (starting the new cell with its own provisioner) and
/// absorbs that cell again when the data is gone, every key still readable in between.
#[test]
fn the_next_leader_decides_once_the_deciding_cell_is_killed() {
    let cells = Cells::new("failover");
    let extra = |join: Option<&str>, peer: &str| -> Vec<String> {
        let mut a = vec!["--cooldown", "500ms", "--peer-port", peer];
        if let Some(j) = join {
            a.extend(["--join", j]);
        }
        a.into_iter().map(str::to_string).collect()
    };
    let start = |join: Option<&str>, peer: &str| -> Server {
        let args = extra(join, peer);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        autoscaling_cell(&cells, &args, &[])
    };
    let peer = common::free_peer_port().to_string();
    let first = start(None, &peer);
    let join = format!("127.0.0.1:{peer}");
    let mut ring = vec![first];
    for _ in 0..2 {
        let peer = common::free_peer_port().to_string();
        ring.push(start(Some(&join), &peer));
    }
    wait_cells(&ring[0], |n| n == 3, Duration::from_secs(60));
    // Kill the decider (the consensus leader).
    let leader = decider(&ring[0]).expect("a decider");
    let at = ring
        .iter()
        .position(|s| self_id(s) == leader)
        .expect("the decider is one of the three");
    ring[at].kill9();
    ring.remove(at);
    wait_cells(&ring[0], |n| n == 2, Duration::from_secs(60));
    let next = (0..60)
        .find_map(|_| {
            // `elsewhere`: the cell asked cannot reach a deciding leader (yet).
            let d = decider(&ring[0]).filter(|d| *d != leader && d != "elsewhere");
            if d.is_none() {
                std::thread::sleep(Duration::from_millis(250));
            }
            d
        })
        .expect("another cell decides");
    // Two cells each hold everything: 85% of one cell's memory is past high water.
    let mut c = ring[0].connect().reply_timeout(CLIENT_WAIT);
    let keys = CELL_MB * (1 << 20) * 85 / 100 / VALUE_BYTES;
    fill(&mut c, "l", keys);
    // Then the ring settles (it may divide more than once, and balance).
    let grown = wait_cells(&ring[0], |n| n > 2, Duration::from_secs(90));
    assert!(
        cells.running() >= 1,
        "the new decider started the cells: {grown:#?}"
    );
    for i in (0..keys).step_by(53) {
        assert_eq!(
            c.get_value(&format!("l{i}")).map(String::into_bytes),
            Some(value_of(i)),
            "l{i}"
        );
    }
    delete_all(
        &mut c,
        &(0..keys).map(|i| format!("l{i}")).collect::<Vec<_>>(),
    );
    wait_cells(&ring[0], |n| n == 2, Duration::from_secs(120));
    let status = autoscale_status(&ring[0]);
    let decided = |action: &str| {
        status
            .iter()
            .any(|l| l.starts_with("DECISION ") && l.contains(&format!(" {action} ")))
    };
    assert!(
        decided("divide") && decided("absorb"),
        "decisions after {leader} died ({next} decided next): {status:#?}"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while cells.running() > 0 {
        assert!(
            Instant::now() < deadline,
            "the absorbed cell's process is gone"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}
