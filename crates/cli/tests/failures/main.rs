//! Fault tests with real processes: a ring of three `cellcache serve` cells (replication
//! factor 2) under a recorded client workload (registers and append logs, every request's
//! outcome ok / failed / unknown), while a nemesis kills a cell with `kill -9` (a cell that
//! is not the consensus leader, then the leader; with r = 2 each cell is the master of its
//! range and the backup of its predecessor's, so every kill loses a master and a backup),
//! pauses one with SIGSTOP past the suspicion timeout, and restarts a killed cell. With
//! real network separation (testkit netns: namespaces on a bridge, nftables drop rules;
//! skipped with the reason printed without root, iproute2 or nftables) it cuts one cell
//! from its peers while clients still reach it, and partitions a minority (one cell and
//! the clients on its side) from the majority.
//!
//! After the fault the ring must heal by itself (the dead cell absorbed: two Active cells,
//! no migration, one epoch everywhere), then the checker runs on the history: every
//! acknowledged write readable with its latest value (or a later unknown one), no phantom
//! values, append logs with every acknowledged token once and in order. Besides the
//! workload, keys written (and acknowledged) before the fault must all still be readable
//! through every live cell, and each held by exactly two cells with the same value and CAS
//! (a backup converged with its master).
//!
//! Each test runs a few seconds of load; no assertion is about a duration. Every wait is
//! bounded. Cell logs are kept in `target/testkit-logs/<pid>/`.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use cellcache_testkit::history::Outcome;
use cellcache_testkit::netns::{Netns, NetnsError};
use cellcache_testkit::process::{
    Server, ServerSpec, default_log_dir, free_port, free_port_besides,
};
use cellcache_testkit::workload::{Run, Shape, Workload, WorkloadConfig};

/// Keys written before the fault and checked after healing.
const PRE_KEYS: usize = 300;
/// Bound of every wait for the ring to settle.
const SETTLE: Duration = Duration::from_secs(60);

/// One cell as `cluster status` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct CellView {
    id: String,
    state: String,
    client: String,
}

/// A cell's view of the ring.
#[derive(Debug, Clone)]
struct Status {
    epoch: u64,
    leader: String,
    me: String,
    cells: Vec<CellView>,
    migrations: usize,
}

/// A short-lived text connection to one cell.
fn connect(addr: SocketAddr) -> std::io::Result<TcpStream> {
    let s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.set_write_timeout(Some(Duration::from_secs(10)))?;
    Ok(s)
}

/// The admin token every cell of these tests requires (their admin planes listen on the
/// nodes' addresses in the partition tests, which needs a token): (file, token).
fn admin_token() -> &'static (PathBuf, String) {
    static TOKEN: std::sync::OnceLock<(PathBuf, String)> = std::sync::OnceLock::new();
    TOKEN.get_or_init(|| {
        let dir = cellcache_testkit::process::default_log_dir();
        std::fs::create_dir_all(&dir).expect("the test's log directory");
        let path = dir.join("admin.token");
        let token = format!("failures-token-{}", std::process::id());
        std::fs::write(&path, &token).expect("write the admin token file");
        (path, token)
    })
}

/// The admin address of a cell started from [`spec`] (`--admin-listen`, `--admin-port`).
fn admin_of(server: &Server) -> SocketAddr {
    let args = &server.spec().args;
    let after = |flag: &str| {
        args.windows(2)
            .find(|w| w[0] == flag)
            .map(|w| w[1].clone())
            .expect("the cell's admin flags")
    };
    SocketAddr::new(
        after("--admin-listen").parse().expect("an admin address"),
        after("--admin-port").parse().expect("an admin port"),
    )
}

/// GETs `path` from the admin plane at `admin` (with the tests' token) and returns its
/// lines up to `END` (excluded); a refusal is an error.
fn admin_lines(admin: SocketAddr, path: &str) -> std::io::Result<Vec<String>> {
    let token = admin_token().1.as_str();
    let reply = cellcache_node::admin::client::call(
        &admin.to_string(),
        "GET",
        path,
        Some(token),
        Duration::from_secs(10),
    )
    .map_err(std::io::Error::other)?;
    if !reply.ok() {
        return Err(std::io::Error::other(reply.body));
    }
    Ok(reply
        .body
        .lines()
        .take_while(|l| *l != "END")
        .map(str::to_string)
        .collect())
}

/// Sends `req` and reads lines up to `END` (excluded), or one line if it is not a list.
fn lines(addr: SocketAddr, req: &str) -> std::io::Result<Vec<String>> {
    let mut s = connect(addr)?;
    s.write_all(req.as_bytes())?;
    let mut r = BufReader::new(s);
    let mut out = Vec::new();
    loop {
        let mut line = String::new();
        if r.read_line(&mut line)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let line = line.trim_end_matches("\r\n").to_string();
        if line == "END" {
            return Ok(out);
        }
        if line.starts_with("SERVER_ERROR") || line.starts_with("CLIENT_ERROR") {
            return Err(std::io::Error::other(line));
        }
        out.push(line);
    }
}

fn status(admin: SocketAddr) -> Option<Status> {
    let lines = admin_lines(admin, "/cluster/status").ok()?;
    let head: Vec<&str> = lines.first()?.split(' ').collect();
    // EPOCH e RF r LEADER l SELF s
    let mut st = Status {
        epoch: head.get(1)?.parse().ok()?,
        leader: head.get(5)?.to_string(),
        me: head.get(7)?.to_string(),
        cells: Vec::new(),
        migrations: 0,
    };
    for l in &lines[1..] {
        let w: Vec<&str> = l.split(' ').collect();
        match w[0] {
            "CELL" => st.cells.push(CellView {
                id: w[1].to_string(),
                state: w[2].to_string(),
                client: w[3].strip_prefix("client=")?.to_string(),
            }),
            "MIGRATION" => st.migrations += 1,
            _ => {}
        }
    }
    Some(st)
}

/// A cell's own copy of `key`: (value, cas), never forwarded.
fn peek(admin: SocketAddr, key: &str) -> Option<(String, u64)> {
    let l = admin_lines(admin, &format!("/cluster/peek/{key}")).expect("peek answers");
    match l.as_slice() {
        [] => None,
        [header, v] => Some((v.clone(), header.split(' ').nth(4)?.parse().ok()?)),
        other => panic!("unexpected peek reply {other:?}"),
    }
}

/// `get key` through `addr`: Ok(value or None), Err on an error reply or I/O error.
fn get(addr: SocketAddr, key: &str) -> std::io::Result<Option<String>> {
    let l = lines(addr, &format!("get {key}\r\n"))?;
    match l.as_slice() {
        [] => Ok(None),
        [_, v] => Ok(Some(v.clone())),
        other => Err(std::io::Error::other(format!("unexpected {other:?}"))),
    }
}

/// `set` through `addr`; returns the reply line.
fn set(addr: SocketAddr, key: &str, value: &str) -> std::io::Result<String> {
    one_line(
        addr,
        &format!("set {key} 0 0 {}\r\n{value}\r\n", value.len()),
    )
}

/// Sends `req` through `addr`; returns the one-line reply.
fn one_line(addr: SocketAddr, req: &str) -> std::io::Result<String> {
    let mut s = connect(addr)?;
    s.write_all(req.as_bytes())?;
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line)?;
    Ok(line.trim_end().to_string())
}

/// A ring of cells under a nemesis' control.
struct Ring {
    cells: Vec<Server>,
    /// Cells the nemesis killed and did not restart.
    down: Vec<usize>,
    /// With real partitions: cell `i` runs in node `i`, the test talks from node `.1`.
    netns: Option<(std::sync::Arc<Netns>, usize)>,
}

fn spec(name: &str, peer_port: u16, join: Option<String>) -> ServerSpec {
    let port = free_port_besides(&[peer_port]).expect("free port");
    let mut args: Vec<String> = ["serve", "-l", "127.0.0.1", "-p", &port.to_string()]
        .map(String::from)
        .to_vec();
    args.extend(["-m", "64", "--peer-port"].map(String::from));
    args.push(peer_port.to_string());
    let admin_port = free_port_besides(&[peer_port, port])
        .expect("free port")
        .to_string();
    let token_file = admin_token().0.to_string_lossy().into_owned();
    args.extend(["--admin-listen".into(), "127.0.0.1".into()]);
    args.extend(["--admin-port".into(), admin_port]);
    args.extend(["--admin-token-file".into(), token_file]);
    if let Some(j) = join {
        args.extend(["--join".to_string(), j]);
    }
    ServerSpec {
        name: name.to_string(),
        program: PathBuf::from(env!("CARGO_BIN_EXE_cellcache")),
        args,
        env: vec![
            ("NO_COLOR".into(), "1".into()),
            (
                "CELLCACHE_LOG__LEVEL".into(),
                "info,cellcache_node::cluster=debug".into(),
            ),
            // Each cell its own membership file, none left for a later run's port.
            (
                "CELLCACHE_CLUSTER__STATE_DIR".into(),
                cellcache_testkit::process::default_log_dir()
                    .join(format!("state-{port}"))
                    .to_string_lossy()
                    .into_owned(),
            ),
        ],
        addr: SocketAddr::from(([127, 0, 0, 1], port)),
        log_dir: default_log_dir(),
        ready_timeout: Duration::from_secs(30),
        netns: None,
    }
}

impl Ring {
    /// Three cells on loopback: the first bootstraps, the others join through it.
    fn start(name: &str) -> Ring {
        Self::start_in(name, None, &[])
    }

    /// A division as `cellcache ctl split PARENT --new NEW` does it: a new cell started with
    /// `serve --standby` is invited (`cluster invite`) to take the second half of `parent`'s
    /// range. Returns once the division has begun (the invitation is answered when the map
    /// with the migration is committed).
    fn split_to_new_cell(&mut self, name: &str, parent: usize, env: &[(&str, &str)]) -> usize {
        let peer = free_port().expect("free port");
        let mut spec = spec(name, peer, None).arg("--standby");
        for (k, v) in env {
            spec = spec.env(*k, *v);
        }
        self.cells
            .push(Server::start(spec).expect("standby cell starts"));
        let new = self.cells.len() - 1;
        let parent_id = self.status(parent).expect("status").me;
        let via = self.peer_of(parent);
        let reply = cellcache_node::admin::client::call(
            &admin_of(&self.cells[new]).to_string(),
            "POST",
            &format!("/cluster/invite?via={via}&parent={parent_id}"),
            Some(admin_token().1.as_str()),
            SETTLE,
        )
        .expect("invitation answered");
        assert!(reply.body.starts_with("OK "), "{reply:?}");
        new
    }

    /// Three cells, in nodes 0..3 of `netns` when given (the test's own requests go from
    /// the node named with it).
    fn start_in(
        name: &str,
        netns: Option<(std::sync::Arc<Netns>, usize)>,
        env: &[(&str, &str)],
    ) -> Ring {
        let mut ring = Ring {
            cells: Vec::new(),
            down: Vec::new(),
            netns,
        };
        for i in 0..3 {
            // A free port found now may be taken by another test's process before the cell
            // binds it: the cell then exits, and starts again on other ports.
            let mut attempts = 0;
            let server = loop {
                let join = (!ring.cells.is_empty()).then(|| ring.peer_of(0));
                let peer = free_port().expect("free port");
                let mut spec = spec(&format!("{name}-{i}"), peer, join);
                for (k, v) in env {
                    spec = spec.env(*k, *v);
                }
                if let Some((ns, _)) = &ring.netns {
                    spec = ns.place(i, spec);
                }
                match Server::start(spec) {
                    Ok(server) => break server,
                    Err(e)
                        if attempts < 3 && format!("{e:?}").contains("Address already in use") =>
                    {
                        attempts += 1;
                    }
                    Err(e) => panic!("cell starts: {e:?}"),
                }
            };
            ring.cells.push(server);
            ring.wait_stable(i + 1, "forming");
        }
        ring
    }

    /// Runs `f` where the test's requests come from (its own namespace, or the client node).
    fn at<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        match &self.netns {
            Some((ns, node)) => ns.run_in(*node, f).expect("enter the client node"),
            None => f(),
        }
    }

    fn status(&self, i: usize) -> Option<Status> {
        let admin = admin_of(&self.cells[i]);
        self.at(|| status(admin))
    }

    /// Cell `i`'s peer address (`--peer-port` on its listening address).
    fn peer_of(&self, i: usize) -> String {
        let args = &self.cells[i].spec().args;
        let port = args
            .windows(2)
            .find(|w| w[0] == "--peer-port")
            .map(|w| w[1].clone())
            .expect("a peer port");
        format!("{}:{port}", self.cells[i].addr().ip())
    }

    fn addrs(&self) -> Vec<SocketAddr> {
        self.cells.iter().map(Server::addr).collect()
    }

    fn live(&self) -> Vec<usize> {
        (0..self.cells.len())
            .filter(|i| !self.down.contains(i))
            .collect()
    }

    /// Waits until every live cell reports `n` cells, all Active, no migration, one epoch.
    fn wait_stable(&self, n: usize, what: &str) -> Status {
        self.wait_settled(&self.live(), Some(n), what)
    }

    /// Waits until cells `among` report one epoch, no migration, every cell Active (and `n`
    /// cells, if given).
    fn wait_settled(&self, among: &[usize], n: Option<usize>, what: &str) -> Status {
        let deadline = Instant::now() + SETTLE;
        loop {
            let views: Vec<Option<Status>> = among.iter().map(|&i| self.status(i)).collect();
            let ok = views.iter().all(|v| {
                v.as_ref().is_some_and(|v| {
                    n.is_none_or(|n| v.cells.len() == n)
                        && v.cells.iter().all(|c| c.state == "active")
                        && v.migrations == 0
                        && v.leader != "-"
                        && Some(v.epoch) == views[0].as_ref().map(|f| f.epoch)
                })
            });
            if ok {
                return views[0].clone().expect("checked");
            }
            assert!(
                Instant::now() < deadline,
                "ring did not settle ({what}) to {n:?} active cells: {views:#?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Index of the cell whose id is `id` in a status.
    fn index_of(&self, st: &Status, id: &str) -> usize {
        let client = &st
            .cells
            .iter()
            .find(|c| c.id == id)
            .unwrap_or_else(|| panic!("{id} in {st:?}"))
            .client;
        self.cells
            .iter()
            .position(|s| s.addr().to_string() == *client)
            .expect("a cell of ours")
    }

    /// The consensus leader's index and one cell that is not the leader.
    fn leader_and_follower(&self) -> (usize, usize) {
        let st = self.wait_stable(3, "before the fault");
        let leader = self.index_of(&st, &st.leader);
        (leader, (leader + 1) % 3)
    }

    fn kill(&mut self, i: usize) {
        self.cells[i].kill9().expect("kill -9");
        self.down.push(i);
    }

    /// Starts cell `i` again (killing it first if it still runs) with the same addresses,
    /// joining through a live cell; returns its new id once the ring has three active cells.
    fn restart(&mut self, i: usize) -> String {
        self.down.retain(|&d| d != i);
        let through = self
            .live()
            .into_iter()
            .find(|&j| j != i)
            .expect("a live cell");
        let mut args = self.cells[i].spec().args.clone();
        if let Some(at) = args.iter().position(|a| a == "--join") {
            args.drain(at..at + 2);
        }
        // a cell that came in with `ctl split` rejoins by itself
        args.retain(|a| a != "--standby");
        args.extend(["--join".to_string(), self.peer_of(through)]);
        self.cells[i].set_args(args);
        self.cells[i].restart().expect("restart");
        self.wait_stable(3, "after the restart");
        self.status(i).expect("status").me
    }

    /// Starts cell `i` again with exactly the command line it was first started with (the
    /// operator's restart); returns its new id once the ring has three active cells.
    fn restart_as_started(&mut self, i: usize) -> String {
        self.down.retain(|&d| d != i);
        self.cells[i].restart().expect("restart");
        self.wait_stable(3, "after the restart");
        self.status(i).expect("status").me
    }
}

/// Writes `PRE_KEYS` keys through the cells in turn; each must be acknowledged.
fn write_pre_keys(ring: &Ring) {
    let addrs = ring.addrs();
    for k in 0..PRE_KEYS {
        let addr = addrs[k % addrs.len()];
        let reply = ring
            .at(|| set(addr, &format!("pre{k}"), &format!("p{k}")))
            .unwrap();
        assert_eq!(reply, "STORED", "pre{k}");
    }
}

/// A counter of one cell's own figures (`stats cell`; `stats` is the ring's).
fn stat(ring: &Ring, i: usize, name: &str) -> Option<u64> {
    let addr = ring.cells[i].addr();
    let l = ring.at(|| lines(addr, "stats cell\r\n")).ok()?;
    l.iter()
        .find_map(|l| l.strip_prefix(&format!("STAT {name} ")))
        .and_then(|v| v.parse().ok())
}

/// After healing: every pre-fault key readable through every live cell, and held by
/// exactly two live cells with the same value and CAS; and no live cell ran a client's
/// write after the map had moved its key away (`cluster_stray_writes`, which the map gate
/// rules out: such a write was answered with the retryable error).
fn check_pre_keys(ring: &Ring) {
    let live = ring.live();
    for &i in &live {
        assert_eq!(
            stat(ring, i, "cluster_stray_writes"),
            Some(0),
            "cell {i} ran writes outside its master range"
        );
    }
    for k in 0..PRE_KEYS {
        let key = format!("pre{k}");
        for &i in &live {
            let addr = ring.cells[i].addr();
            let v = ring
                .at(|| get(addr, &key))
                .unwrap_or_else(|e| panic!("{key} through cell {i}: {e}"));
            assert_eq!(v, Some(format!("p{k}")), "{key} through cell {i}");
        }
    }
    check_replicas(ring, (0..PRE_KEYS).map(|k| format!("pre{k}")));
}

/// Every key present is held by exactly two live cells (master and backup), equal.
fn check_replicas(ring: &Ring, keys: impl Iterator<Item = String>) {
    let live = ring.live();
    for key in keys {
        let copies: BTreeMap<usize, (String, u64)> = live
            .iter()
            .filter_map(|&i| {
                let admin = admin_of(&ring.cells[i]);
                ring.at(|| peek(admin, &key)).map(|c| (i, c))
            })
            .collect();
        if copies.is_empty() {
            continue;
        }
        assert_eq!(copies.len(), 2, "{key}: copies {copies:?}");
        let mut values = copies.values();
        let first = values.next();
        assert!(
            values.all(|v| Some(v) == first),
            "{key}: backup differs from master: {copies:?}"
        );
    }
}

/// Registers and append logs through every cell of the ring, from the test's node.
fn workloads(ring: &Ring, seed: u64) -> [Workload; 2] {
    let netns = ring
        .netns
        .as_ref()
        .map(|(ns, node)| ns.name(*node).to_string());
    workloads_from(ring, seed, netns)
}

/// The same from network namespace `netns`.
fn workloads_from(ring: &Ring, seed: u64, netns: Option<String>) -> [Workload; 2] {
    let servers = ring.addrs();
    let base = WorkloadConfig {
        clients: 3,
        keys: 24,
        key_prefix: format!("reg{seed}-"),
        ops_per_client: 1_000_000,
        // longer than the cells' own request timeout (3 s): a definite answer when there
        // is one
        request_timeout: Duration::from_secs(5),
        think_time: Duration::from_millis(1),
        attempts_max: 100,
        seed,
        netns,
        ..WorkloadConfig::registers(servers.clone())
    };
    let registers = Workload::start(base.clone()).expect("register workload");
    let logs = Workload::start(WorkloadConfig {
        clients: 2,
        keys: 6,
        key_prefix: format!("log{seed}-"),
        shape: Shape::AppendLogs { read_percent: 20 },
        seed: seed + 1,
        ..base
    })
    .expect("append workload");
    [registers, logs]
}

/// Waits until each workload completed `more` operations past now (bounded).
fn load_flows(w: &[Workload; 2], more: u64) {
    for w in w {
        let done = w.completed();
        assert!(
            w.wait_completed(done + more, SETTLE),
            "load flows ({} completed)",
            w.completed()
        );
    }
}

/// Finishes both workloads and checks their histories; returns the runs.
fn finish(w: [Workload; 2], name: &str) -> Vec<Run> {
    check_runs(w.into_iter().map(Workload::finish).collect(), name)
}

/// Checks finished runs' histories; returns them.
fn check_runs(runs: Vec<Run>, name: &str) -> Vec<Run> {
    for (i, run) in runs.iter().enumerate() {
        eprintln!("{name} workload {i}: {:?}", run.summary);
        assert_eq!(run.summary.final_reads_missing, 0, "{:?}", run.summary);
        run.assert_valid(&format!("{name}-{i}"));
    }
    runs
}

/// The whole scenario around one `kill -9`.
fn kill_scenario(name: &str, kill_leader: bool) {
    let mut ring = Ring::start(name);
    write_pre_keys(&ring);
    let load = workloads(&ring, 11);
    load_flows(&load, 300);
    let (leader, follower) = ring.leader_and_follower();
    let victim = if kill_leader { leader } else { follower };
    ring.kill(victim);
    ring.wait_stable(2, "after the kill");
    load_flows(&load, 300);
    let runs = finish(load, name);
    check_pre_keys(&ring);
    check_replicas(&ring, keys_of(&runs).into_iter());
}

/// Every key the runs' histories touched.
fn keys_of(runs: &[Run]) -> std::collections::BTreeSet<String> {
    runs.iter()
        .flat_map(|r| r.history.operations().expect("well formed"))
        .map(|o| o.op.key().to_string())
        .collect()
}

/// Ids of the cells in a status.
fn ids(st: &Status) -> Vec<String> {
    st.cells.iter().map(|c| c.id.clone()).collect()
}

/// Waits until a write through cell `i` gets the removed-from-the-ring error (bounded).
fn wait_fenced(ring: &Ring, i: usize) {
    let addr = ring.cells[i].addr();
    let deadline = Instant::now() + SETTLE;
    loop {
        let reply = ring.at(|| set(addr, "fence-probe", "x"));
        if let Ok(r) = &reply {
            assert_ne!(r, "STORED", "a removed cell acknowledged a write");
            if r.contains("removed from the ring") {
                return;
            }
        }
        assert!(
            Instant::now() < deadline,
            "cell {i} never fenced: {reply:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The ranges a cell holds: its master line (the range it masters), None if unreachable.
fn master_line(ring: &Ring, i: usize) -> Option<String> {
    let admin = admin_of(&ring.cells[i]);
    let l = ring.at(|| admin_lines(admin, "/cluster/ranges")).ok()?;
    l.into_iter()
        .find(|l| l.starts_with("RANGE master"))
        .map(|l| {
            // drop the item count: only the range matters
            l.rsplit_once(' ')
                .map_or(l.clone(), |(head, _)| head.to_string())
        })
}

mod division;
mod kills;
mod partitions;
