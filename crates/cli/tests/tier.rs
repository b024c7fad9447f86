//! The cache tier with real processes (docs/tier.md): a standalone `cellcache serve` in
//! front of redb or a real PostgreSQL server (testkit's `TempPostgres`, Debian's package),
//! `kill -9` at a point in the middle of the load, restarted with the same command line.
//!
//! - write-through loses nothing: the register and append-log workloads' histories, across
//!   the kill and through read-through after the restart, pass the history checker;
//! - a lone write-back cell loses only what was dirty at the kill: everything the store had
//!   confirmed (drained, seen in `stats cellcache`) survives, nothing goes back in time;
//! - dirty items evicted from memory are re-inserted from the write-back engine (T3);
//! - PostgreSQL stopped: the cell keeps serving from memory, refuses writes past its dirty
//!   bound, then drains everything once PostgreSQL is back;
//! - eight concurrent misses on one key cost one load (single flight);
//! - the write policy switched four times under load: no request fails.
//!
//! Every wait is a bounded loop on a condition; no duration is asserted.

use cellcache_testkit::postgres::TempPostgres;
use cellcache_testkit::process::{Server, ServerSpec, free_port};
use cellcache_testkit::workload::{Shape, Workload, WorkloadConfig};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::Duration;

fn cell(name: &str, args: &[&str]) -> Server {
    let mut spec = ServerSpec::cellcache(name).expect("spec");
    spec.program = PathBuf::from(env!("CARGO_BIN_EXE_cellcache"));
    spec = spec
        .arg("--standalone")
        .arg("--admin-port")
        .arg(free_port().expect("port").to_string());
    for a in args {
        spec = spec.arg(*a);
    }
    Server::start(spec).expect("the cell starts")
}

fn admin_port(server: &Server) -> u16 {
    let args = &server.spec().args;
    let i = args
        .iter()
        .position(|a| a == "--admin-port")
        .expect("--admin-port");
    args[i + 1].parse().expect("a port")
}

fn redb_path(name: &str) -> String {
    let dir = cellcache_testkit::process::scratch_dir("tier");
    let path = dir.join(format!("{name}.redb"));
    let _ = std::fs::remove_file(&path);
    format!("redb:{}", path.display())
}

/// A plain text-protocol connection.
struct Client {
    stream: TcpStream,
}

impl Client {
    fn to(addr: SocketAddr) -> Client {
        let stream = TcpStream::connect(addr).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .expect("timeout");
        Client { stream }
    }

    /// Sends `request` and reads until the reply ends with one of `ends`.
    fn call(&mut self, request: &[u8], ends: &[&[u8]]) -> String {
        self.stream.write_all(request).expect("send");
        let mut reply = Vec::new();
        let mut buf = [0u8; 65536];
        loop {
            let n = self.stream.read(&mut buf).expect("a reply");
            assert!(
                n > 0,
                "connection closed after {:?}",
                String::from_utf8_lossy(&reply)
            );
            reply.extend_from_slice(&buf[..n]);
            if ends.iter().any(|e| reply.ends_with(e))
                && (reply.ends_with(b"END\r\n") || !ends.contains(&&b"END\r\n"[..]))
            {
                return String::from_utf8_lossy(&reply).into_owned();
            }
        }
    }

    fn set(&mut self, key: &str, value: &str) -> String {
        let request = format!("set {key} 0 0 {}\r\n{value}\r\n", value.len());
        self.call(request.as_bytes(), &[b"\r\n"])
            .trim_end()
            .to_string()
    }

    fn get(&mut self, key: &str) -> Option<String> {
        let reply = self.call(format!("get {key}\r\n").as_bytes(), &[b"END\r\n"]);
        let mut lines = reply.split("\r\n");
        let header = lines.next()?;
        header
            .starts_with("VALUE ")
            .then(|| lines.next().unwrap_or("").to_string())
    }

    fn stat(&mut self, name: &str) -> u64 {
        let reply = self.call(b"stats cellcache\r\n", &[b"END\r\n"]);
        let prefix = format!("STAT {name} ");
        reply
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .unwrap_or_else(|| panic!("no {name} in stats cellcache"))
            .parse()
            .expect("a number")
    }
}

/// Polls `tier_dirty_keys` until it is 0 (bounded); true if it got there.
fn drained(client: &mut Client) -> bool {
    for _ in 0..3000 {
        if client.stat("tier_dirty_keys") == 0 {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

/// The write policy switched through the building blocks' `ctl switch`.
fn ctl_switch(server: &Server, policy: &str) {
    ctl(
        server,
        &["switch", "write-policy", policy],
        &format!("-> {policy}"),
    );
}

/// The same through `ctl tier policy`.
fn ctl_policy(server: &Server, policy: &str) {
    ctl(
        server,
        &["tier", "policy", policy],
        &format!("OK write policy {policy}"),
    );
}

/// Runs `cellcache ctl ARGS -s ADMIN` against `server` and checks it printed `expected`.
fn ctl(server: &Server, args: &[&str], expected: &str) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cellcache"))
        .arg("ctl")
        .args(args)
        .arg("-s")
        .arg(format!("127.0.0.1:{}", admin_port(server)))
        .output()
        .expect("ctl runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(expected), "ctl: {text} {out:?}");
}

/// Write-through under load, `kill -9` mid-run, restart: the histories check.
fn write_through_survives_kill9(name: &str, backing_store: &str) {
    let mut server = cell(
        name,
        &[
            "--backing-store",
            backing_store,
            "--write-policy",
            "through",
        ],
    );
    let registers = Workload::start(WorkloadConfig {
        clients: 4,
        keys: 12,
        ops_per_client: 3000,
        // Refused connections while the cell restarts fail fast: a pause keeps the budget.
        think_time: Duration::from_millis(2),
        shape: Shape::Registers { read_percent: 40 },
        seed: 18,
        ..WorkloadConfig::registers(vec![server.addr()])
    })
    .expect("register workload");
    let logs = Workload::start(WorkloadConfig {
        clients: 2,
        keys: 6,
        ops_per_client: 1500,
        think_time: Duration::from_millis(2),
        shape: Shape::AppendLogs { read_percent: 30 },
        seed: 19,
        ..WorkloadConfig::append_logs(vec![server.addr()])
    })
    .expect("append workload");
    // The kill lands in the middle of the load.
    assert!(
        registers.wait_completed(400, Duration::from_secs(120)),
        "load before the kill"
    );
    server.kill9().expect("kill -9");
    server
        .restart()
        .expect("restart with the same command line");
    // Counted from the restart: the refused requests while it was down count too.
    let after = registers.completed() + 1500;
    assert!(
        registers.wait_completed(after, Duration::from_secs(120)),
        "load after the restart"
    );
    let registers = registers.finish();
    let logs = logs.finish();
    eprintln!(
        "{name}: registers {:?}, append logs {:?}",
        registers.summary, logs.summary
    );
    assert!(
        registers.summary.ok > 400 && logs.summary.ok > 50,
        "the load ran"
    );
    registers.assert_valid(&format!("{name}-registers"));
    logs.assert_valid(&format!("{name}-append-logs"));
}

#[test]
fn write_through_on_redb_loses_nothing_across_kill9() {
    write_through_survives_kill9("tier-through-redb", &redb_path("through"));
}

#[test]
fn write_through_on_postgres_loses_nothing_across_kill9() {
    let pg = TempPostgres::start_new().expect("a throwaway PostgreSQL (Debian's package)");
    write_through_survives_kill9("tier-through-postgres", &pg.url());
}

#[test]
fn a_lone_write_back_cell_loses_only_what_was_dirty_at_a_kill9() {
    // A window far longer than the test: nothing is flushed by time, only by the switch.
    let store = redb_path("back");
    let mut server = cell(
        "tier-back-kill",
        &[
            "--backing-store",
            &store,
            "--write-policy",
            "back",
            "--write-back-window",
            "600000",
        ],
    );
    let mut c = Client::to(server.addr());
    let keys = 40;
    let mut acked: HashMap<String, Vec<String>> = HashMap::new();
    for round in 0..3 {
        write_round(&mut c, &mut acked, keys, round);
    }
    assert_eq!(
        c.stat("tier_dirty_keys"),
        keys as u64,
        "all dirty: nothing is due yet"
    );
    assert_eq!(c.stat("tier_flushed_ops"), 0);
    // Live switch to write-through: the dirty keys become due at once and drain.
    ctl_policy(&server, "through");
    assert!(drained(&mut c), "the switch drains the dirty keys");
    let durable: HashMap<String, String> = acked
        .iter()
        .map(|(k, v)| (k.clone(), v.last().expect("a value").clone()))
        .collect();
    ctl_policy(&server, "back");
    for round in 3..5 {
        write_round(&mut c, &mut acked, keys, round);
    }
    let dirty = c.stat("tier_dirty_keys");
    assert_eq!(dirty, keys as u64, "the later rounds are dirty at the kill");
    server.kill9().expect("kill -9");
    server.restart().expect("restart");
    let mut c = Client::to(server.addr());
    for (key, values) in &acked {
        let got = c
            .get(key)
            .unwrap_or_else(|| panic!("{key} lost, though drained"));
        let at = values
            .iter()
            .position(|v| *v == got)
            .expect("an acknowledged value");
        let floor = values
            .iter()
            .position(|v| *v == durable[key])
            .expect("durable value");
        assert!(
            at >= floor,
            "{key}: {got} is older than the drained {}",
            durable[key]
        );
        // With the window far away nothing after the drain reached the store: exactly the
        // drained value, so what was lost is exactly what was dirty.
        assert_eq!(got, durable[key], "{key}");
    }
}

/// Writes `r{round}-k{k}` to every key, recording the acknowledged values in order.
fn write_round(
    c: &mut Client,
    acked: &mut HashMap<String, Vec<String>>,
    keys: usize,
    round: usize,
) {
    for k in 0..keys {
        let (key, value) = (format!("k{k}"), format!("r{round}-k{k}"));
        assert_eq!(c.set(&key, &value), "STORED");
        acked.entry(key).or_default().push(value);
    }
}

#[test]
fn dirty_items_evicted_from_memory_are_reinserted_not_lost() {
    let store = redb_path("reinsert");
    let server = cell(
        "tier-reinsert",
        &[
            "--backing-store",
            &store,
            "--write-policy",
            "back",
            "--write-back-window",
            "600000",
            "--write-back-max-dirty",
            "67108864",
            // the smallest memory the store takes (two slabs and the index per shard)
            "-m",
            "1",
            "-I",
            "64k",
        ],
    );
    let mut c = Client::to(server.addr());
    let value = |k: usize| format!("{k:06}-{}", "x".repeat(8000));
    let keys = 2000; // about 16 MB of values in a cell of a few MB
    for k in 0..keys {
        assert_eq!(c.set(&format!("r{k}"), &value(k)), "STORED");
    }
    let evictions = {
        let reply = c.call(b"stats\r\n", &[b"END\r\n"]);
        reply
            .lines()
            .find_map(|l| l.strip_prefix("STAT evictions "))
            .and_then(|n| n.parse::<u64>().ok())
            .expect("evictions")
    };
    assert!(evictions > 0, "the arena evicted dirty items");
    assert_eq!(c.stat("tier_flushed_ops"), 0, "none was flushed yet");
    for k in 0..keys {
        assert_eq!(
            c.get(&format!("r{k}")).as_deref(),
            Some(value(k).as_str()),
            "r{k}"
        );
    }
    assert!(
        c.stat("tier_reinserted") > 0,
        "evicted dirty items came back from the engine"
    );
    assert_eq!(
        c.stat("tier_load_misses"),
        0,
        "no dirty key was ever missing"
    );
}

#[test]
fn a_stopped_postgres_bounds_the_dirty_set_then_drains_it() {
    let mut pg = TempPostgres::start_new().expect("a throwaway PostgreSQL (Debian's package)");
    let bound = 256 * 1024;
    let server = cell(
        "tier-pg-outage",
        &[
            "--backing-store",
            &pg.url(),
            "--write-policy",
            "back",
            "--write-back-window",
            "20",
            "--write-back-max-dirty",
            &bound.to_string(),
        ],
    );
    let mut c = Client::to(server.addr());
    assert_eq!(c.set("before", "outage"), "STORED");
    assert!(drained(&mut c));
    pg.stop().expect("stop PostgreSQL");
    // Writes go on from memory until the dirty bound, then are refused, never dropped.
    let mut last: HashMap<String, String> = HashMap::new();
    let mut refused = false;
    for i in 0..10_000 {
        let (key, value) = (format!("o{}", i % 500), format!("{i}-{}", "v".repeat(1000)));
        let reply = c.set(&key, &value);
        if reply.starts_with("SERVER_ERROR tier") {
            refused = true;
            break;
        }
        assert_eq!(reply, "STORED");
        last.insert(key, value);
    }
    assert!(refused, "past the bound writes are refused");
    assert!(
        c.stat("tier_dirty_bytes") >= bound as u64 - 2000,
        "the dirty set is at its bound"
    );
    // The flush in flight when PostgreSQL stopped may still be on its way to failing.
    let failed = (0..3000).any(|_| {
        let failed = c.stat("tier_failed_batches") > 0;
        if !failed {
            std::thread::sleep(Duration::from_millis(10));
        }
        failed
    });
    assert!(failed, "flushes failed while PostgreSQL was down");
    assert!(
        c.stat("tier_dirty_bytes") >= bound as u64 - 2000,
        "nothing dirty was dropped when the flushes failed"
    );
    // Reads are served from memory meanwhile.
    for (key, value) in &last {
        assert_eq!(
            c.get(key).as_deref(),
            Some(value.as_str()),
            "{key} from memory"
        );
    }
    pg.start().expect("start PostgreSQL again");
    assert!(
        drained(&mut c),
        "the dirty set drains once PostgreSQL is back"
    );
    assert_eq!(c.set("after", "outage"), "STORED", "writes are taken again");
    assert!(drained(&mut c));
    for (key, value) in &last {
        let stored = pg
            .psql(&format!(
                "SELECT convert_from(value, 'UTF8') FROM cellcache_items WHERE key = '{key}'::bytea"
            ))
            .expect("psql");
        assert_eq!(&stored, value, "{key} in PostgreSQL");
    }
}

#[test]
fn concurrent_misses_on_one_key_cost_one_load() {
    let pg = TempPostgres::start_new().expect("a throwaway PostgreSQL (Debian's package)");
    let url = pg.url();
    let mut server = cell("tier-single-flight", &["--backing-store", &url]);
    let mut c = Client::to(server.addr());
    assert_eq!(c.set("cold", "from-the-store"), "STORED");
    // A restart empties the memory; the key stays in PostgreSQL.
    server.kill9().expect("kill -9");
    server.restart().expect("restart");
    let mut c = Client::to(server.addr());
    let loads_before = c.stat("tier_loads");
    // Hold the table locked so the load waits, until every reader has asked.
    let locker = std::process::Command::new("psql")
        .args(["-X", "-q", "-d", &url, "-c"])
        .arg("BEGIN; LOCK TABLE cellcache_items IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(3); COMMIT;")
        .spawn()
        .expect("psql");
    let mut locked = false;
    for _ in 0..500 {
        let held = pg
            .psql("SELECT count(*) FROM pg_locks WHERE mode = 'AccessExclusiveLock' AND relation = 'cellcache_items'::regclass")
            .expect("psql");
        if held == "1" {
            locked = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(locked, "the table is locked");
    let readers: Vec<_> = (0..8)
        .map(|_| {
            let addr = server.addr();
            std::thread::spawn(move || Client::to(addr).get("cold"))
        })
        .collect();
    for r in readers {
        assert_eq!(r.join().expect("reader").as_deref(), Some("from-the-store"));
    }
    let mut locker = locker;
    assert!(locker.wait().expect("psql ends").success());
    assert_eq!(
        c.stat("tier_loads") - loads_before,
        1,
        "eight misses, one load"
    );
    assert_eq!(c.stat("tier_load_hits"), 1);
}

#[test]
fn switching_the_write_policy_under_load_fails_no_request() {
    let store = redb_path("switch");
    let server = cell("tier-switch", &["--backing-store", &store]);
    let load = Workload::start(WorkloadConfig {
        clients: 4,
        keys: 16,
        ops_per_client: 600,
        shape: Shape::Registers { read_percent: 50 },
        seed: 20,
        ..WorkloadConfig::registers(vec![server.addr()])
    })
    .expect("register workload");
    for (at, policy) in [
        (200, "back"),
        (600, "through"),
        (1000, "back"),
        (1400, "through"),
    ] {
        assert!(
            load.wait_completed(at, Duration::from_secs(120)),
            "load before {policy}"
        );
        // To write-back through the building blocks' `ctl switch`, back through `ctl tier`.
        if policy == "back" {
            ctl_switch(&server, policy);
        } else {
            ctl_policy(&server, policy);
        }
    }
    let run = load.finish();
    eprintln!("policy switches: {:?}", run.summary);
    assert_eq!(
        (run.summary.failed, run.summary.unknown),
        (0, 0),
        "no request failed"
    );
    assert!(run.summary.ok >= 1400);
    run.assert_valid("tier-switch");
}
