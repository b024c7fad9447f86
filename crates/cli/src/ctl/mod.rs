//! `cellcache ctl …` and `cellcache cluster up`: operator tools speaking a cell's admin
//! plane (HTTP on its admin port, `cellcache_node::admin`; docs/protocol.md "Admin
//! interface").

use anyhow::Context;
use cellcache_node::admin::client;
use cellcache_node::config::ADMIN_PORT_OFFSET;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod text;
use text::{autoswitch_text, switch_list};

/// How long `ctl` waits for a cell's answer (a split waits for the whole hand-off start).
const CTL_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(clap::Args)]
pub struct CtlArgs {
    /// Admin address of any cell of the ring (its client port + 20000 by default: a cell on
    /// 11211 has its admin port on 127.0.0.1:31211).
    #[arg(
        short = 's',
        long,
        global = true,
        value_name = "HOST:PORT",
        default_value = "127.0.0.1:31211"
    )]
    server: String,
    /// The admin token file of the cells (`serve --admin-token-file`), when they have one.
    #[arg(
        long,
        global = true,
        value_name = "PATH",
        env = "CELLCACHE_ADMIN__TOKEN_FILE"
    )]
    admin_token_file: Option<String>,
    #[command(subcommand)]
    command: CtlCommand,
}

#[derive(clap::Subcommand)]
enum CtlCommand {
    /// Print the ring: cells, ids, addresses, ranges, roles, epoch, memory.
    Status,
    /// Items a cell holds per range it masters or backs up.
    Ranges,
    /// Bring a cell started with `serve --standby` (admin address --new) into the ring as a
    /// division of CELL: it takes the second half of CELL's range once it caught up.
    Split {
        /// The dividing cell's id (as `ctl status` prints it).
        cell: String,
        /// Admin address of the standby cell.
        #[arg(long, value_name = "HOST:PORT")]
        new: String,
    },
    /// Begin the graceful absorption of CELL by its successor; CELL exits once done.
    Leave {
        /// The cell id (as `ctl status` prints it).
        cell: String,
    },
    /// Move the boundary between CELL and its neighbour --to: SHARE of CELL's range, the end
    /// next to that neighbour, moves to it once streamed (balancing by hand; the autoscaler
    /// does it by itself when neighbours stay skewed).
    Shift {
        /// The giving cell's id (as `ctl status` prints it).
        cell: String,
        /// The neighbour (successor or predecessor) taking the part.
        #[arg(long, value_name = "CELL")]
        to: String,
        /// The fraction of CELL's range that moves, between 0 and 1.
        #[arg(long, default_value_t = 0.25)]
        share: f64,
    },
    /// The ring dividing and absorbing cells by itself (docs/elasticity.md).
    Autoscale {
        #[command(subcommand)]
        command: AutoscaleCommand,
    },
    /// This cell's cache tier (docs/tier.md): its figures, or a live write-policy switch.
    Tier {
        #[command(subcommand)]
        command: TierCommand,
    },
    /// Switch a building block of this cell live, while it serves: `ctl switch eviction
    /// s3fifo`; `--ring` switches every cell of its ring; `ctl switch --list [--json]` shows
    /// each block's implementation and the others (docs/switching.md).
    Switch {
        /// The block: eviction, layout, write_policy, replication.
        #[arg(required_unless_present = "list")]
        block: Option<String>,
        /// The implementation to switch to (eviction: lru, s3fifo; write_policy: through,
        /// back; replication: sync, async).
        #[arg(required_unless_present = "list")]
        implementation: Option<String>,
        /// Switch every cell of the ring this cell is a member of, this one first.
        #[arg(long, conflicts_with = "list")]
        ring: bool,
        /// List the blocks instead.
        #[arg(long, conflicts_with_all = ["block", "implementation"])]
        list: bool,
        /// With --list: as JSON.
        #[arg(long, requires = "list")]
        json: bool,
    },
    /// This cell's automatic policy, which switches its eviction policy by the access
    /// pattern it sees (`[switching]`, docs/switching.md).
    Autoswitch {
        #[command(subcommand)]
        command: AutoswitchCommand,
    },
    /// The ring's secret.
    Secret {
        #[command(subcommand)]
        command: SecretCommand,
    },
}

#[derive(clap::Subcommand)]
enum AutoscaleCommand {
    /// Turn autoscaling on, on every cell of the ring.
    On,
    /// Turn autoscaling off, on every cell of the ring (nothing in progress is undone).
    Off,
    /// The switch, the policy and the recent decisions, from the deciding cell.
    Status {
        /// As JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(clap::Subcommand)]
enum AutoswitchCommand {
    /// Let the cell switch its eviction policy by itself.
    On,
    /// Stop the automatic switches (the cell keeps its policy and goes on sampling).
    Off,
    /// On or off, the signals of the last window, the verdict and the recent switches.
    Status {
        /// As JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(clap::Subcommand)]
enum TierCommand {
    /// The backing store, the write policy and the tier's figures (dirty bytes, flushes,
    /// loads).
    Status,
    /// Switch the write policy of the running cell (through or back); no request fails.
    Policy {
        /// through or back.
        policy: String,
    },
}

#[derive(clap::Subcommand)]
enum SecretCommand {
    /// Write a fresh random secret to a new file PATH (mode 0600), for every cell's
    /// `--cluster-secret-file` (copy the same file to each host of the ring).
    New {
        /// The file to create; an existing file is left alone.
        path: PathBuf,
    },
}

/// The admin token in `path` (its first line), if a path is given.
fn read_token(path: Option<&str>) -> anyhow::Result<Option<String>> {
    let Some(path) = path.filter(|p| !p.is_empty()) else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the admin token file {path}"))?;
    Ok(Some(text.lines().next().unwrap_or("").trim().to_string()))
}

/// One admin request; a refusal (any status but 2xx) is an error carrying the cell's words.
fn admin(server: &str, method: &str, path: &str, token: Option<&str>) -> anyhow::Result<String> {
    let reply = client::call(server, method, path, token, CTL_TIMEOUT)?;
    anyhow::ensure!(
        reply.ok(),
        "{} (HTTP {})",
        reply.body.trim_end(),
        reply.status
    );
    Ok(reply.body)
}

/// The peer address of the cell whose admin address is `server`: its `SELF` id's `CELL`
/// line of `/cluster/status`.
fn peer_of(server: &str, token: Option<&str>) -> anyhow::Result<String> {
    let status = admin(server, "GET", "/cluster/status", token)?;
    let me = status
        .lines()
        .next()
        .and_then(|l| l.split(' ').skip_while(|w| *w != "SELF").nth(1))
        .with_context(|| format!("no SELF in the status of {server}"))?;
    status
        .lines()
        .find(|l| l.starts_with("CELL ") && l.split(' ').nth(1) == Some(me))
        .and_then(|l| l.split(' ').find_map(|w| w.strip_prefix("peer=")))
        .map(str::to_string)
        .with_context(|| format!("no peer address of cell {me} in the status of {server}"))
}

pub fn run(args: CtlArgs) -> anyhow::Result<()> {
    let server = &args.server;
    let token = read_token(args.admin_token_file.as_deref())?;
    let token = token.as_deref();
    let reply = match &args.command {
        CtlCommand::Status => {
            // A standalone cell has no ring to show, only its own blocks.
            let reply = client::call(server, "GET", "/cluster/status", token, CTL_TIMEOUT)?;
            let ring = match reply.status {
                409 => format!(
                    "STANDALONE {}",
                    reply.body.trim_start_matches("SERVER_ERROR ")
                ),
                _ => admin(server, "GET", "/cluster/status", token)?,
            };
            // The decider's state and recent decisions, when the cell has autoscaling.
            let scale = admin(server, "GET", "/cluster/autoscale", token).unwrap_or_default();
            let switching = admin(server, "GET", "/autoswitch", token)
                .ok()
                .and_then(|body| autoswitch_text(&body).ok())
                .unwrap_or_default();
            ring + scale.strip_prefix("SERVER_ERROR").map_or(&scale, |_| "") + &switching
        }
        CtlCommand::Switch {
            block,
            implementation,
            ring,
            list,
            json,
        } => match (block, implementation) {
            (Some(block), Some(implementation)) if !list => admin(
                server,
                "POST",
                &format!(
                    "{}/switch/{block}/{implementation}",
                    if *ring { "/cluster" } else { "" }
                ),
                token,
            )?,
            _ => switch_list(&admin(server, "GET", "/switch", token)?, *json)?,
        },
        CtlCommand::Autoscale { command } => match command {
            AutoscaleCommand::On => admin(server, "POST", "/cluster/autoscale/on", token)?,
            AutoscaleCommand::Off => admin(server, "POST", "/cluster/autoscale/off", token)?,
            AutoscaleCommand::Status { json: true } => {
                admin(server, "GET", "/autoscale", token)? + "\n"
            }
            AutoscaleCommand::Status { json: false } => {
                admin(server, "GET", "/cluster/autoscale", token)?
            }
        },
        CtlCommand::Autoswitch { command } => match command {
            AutoswitchCommand::On => admin(server, "POST", "/autoswitch/on", token)?,
            AutoswitchCommand::Off => admin(server, "POST", "/autoswitch/off", token)?,
            AutoswitchCommand::Status { json: true } => {
                admin(server, "GET", "/autoswitch", token)? + "\n"
            }
            AutoswitchCommand::Status { json: false } => {
                autoswitch_text(&admin(server, "GET", "/autoswitch", token)?)?
            }
        },
        CtlCommand::Tier { command } => match command {
            TierCommand::Status => admin(server, "GET", "/tier", token)?,
            TierCommand::Policy { policy } => {
                admin(server, "POST", &format!("/tier/policy/{policy}"), token)?
            }
        },
        CtlCommand::Ranges => admin(server, "GET", "/cluster/ranges", token)?,
        CtlCommand::Leave { cell } => {
            admin(server, "POST", &format!("/cluster/leave/{cell}"), token)?
        }
        CtlCommand::Shift { cell, to, share } => admin(
            server,
            "POST",
            &format!("/cluster/shift/{cell}?to={to}&share={share}"),
            token,
        )?,
        CtlCommand::Split { cell, new } => {
            let via = peer_of(server, token)?;
            let path = format!("/cluster/invite?via={via}&parent={cell}");
            admin(new, "POST", &path, token)?
        }
        CtlCommand::Secret {
            command: SecretCommand::New { path },
        } => {
            cellcache_node::cluster::handshake::write_new_secret(path)?;
            println!(
                "wrote a new secret to {} (mode 0600): use it as every cell's \
                 --cluster-secret-file, or as an --admin-token-file",
                path.display()
            );
            return Ok(());
        }
    };
    print!("{}", reply.replace("\r\n", "\n"));
    Ok(())
}

#[derive(clap::Args)]
pub struct ClusterArgs {
    #[command(subcommand)]
    command: ClusterCommand,
}

#[derive(clap::Subcommand)]
enum ClusterCommand {
    /// Start N local cells (first bootstraps, the others join), print each one's address and
    /// pid, write them to the run file, and stop them all on Ctrl-C, SIGTERM or
    /// `cluster down`. If a cell fails to start, stop the ones already started and fail.
    Up {
        /// Number of cells.
        #[arg(long, default_value_t = 3)]
        cells: u16,
        /// Client port of the first cell; cell i listens on base + i - 1 (peer ports + 10000).
        #[arg(long, default_value_t = 11211)]
        base_port: u16,
        /// Memory per cell, megabytes.
        #[arg(short = 'm', long, default_value_t = 64)]
        memory_limit: usize,
        /// Seconds each cell may take to start and join before `up` gives up.
        #[arg(long, value_name = "SECS", default_value_t = 60)]
        start_timeout: u64,
        /// Where to record the pids [default: $XDG_RUNTIME_DIR or the temp directory,
        /// cellcache-cluster-BASE_PORT.pids].
        #[arg(long, value_name = "FILE")]
        run_file: Option<PathBuf>,
        /// The ring's secret file, created (mode 0600) if missing [default: beside the run
        /// file, cellcache-cluster-BASE_PORT.secret].
        #[arg(long, value_name = "PATH")]
        cluster_secret_file: Option<PathBuf>,
        /// Run the ring without a secret: anyone who reaches a peer port can act as a cell.
        #[arg(long, conflicts_with = "cluster_secret_file")]
        open: bool,
        /// Extra flags for every `cellcache serve`.
        #[arg(last = true)]
        serve_args: Vec<String>,
    },
    /// Stop the ring that `cluster up --base-port PORT` started (and only its processes).
    Down {
        /// The base port `cluster up` was given.
        #[arg(long, default_value_t = 11211)]
        base_port: u16,
        /// Seconds to wait for every cell to stop.
        #[arg(long, value_name = "SECS", default_value_t = 30)]
        timeout: u64,
        /// The run file `cluster up` wrote (default as for `up`).
        #[arg(long, value_name = "FILE")]
        run_file: Option<PathBuf>,
    },
    /// Print the pid of cell N of the ring `cluster up --base-port PORT` started (for
    /// fault experiments: `kill -9 "$(cellcache cluster pid 1 --base-port PORT)"`).
    Pid {
        /// The cell's number as `cluster up` printed it (1 = the first).
        cell: u16,
        /// The base port `cluster up` was given.
        #[arg(long, default_value_t = 11211)]
        base_port: u16,
        /// The run file `cluster up` wrote (default as for `up`).
        #[arg(long, value_name = "FILE")]
        run_file: Option<PathBuf>,
    },
}

fn default_run_file(base_port: u16) -> PathBuf {
    let dir = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|d| d.is_dir())
        .unwrap_or_else(std::env::temp_dir);
    dir.join(format!("cellcache-cluster-{base_port}.pids"))
}

/// The run file: `up PID` for the supervising `cluster up`, then `cell N PORT PID` per cell.
struct RunFile {
    up: u32,
    cells: Vec<(u16, u16, u32)>,
}

impl RunFile {
    fn render(&self) -> String {
        let mut out = format!("up {}\n", self.up);
        for (n, port, pid) in &self.cells {
            out.push_str(&format!("cell {n} {port} {pid}\n"));
        }
        out
    }

    fn parse(text: &str) -> Option<RunFile> {
        let mut lines = text.lines();
        let up = lines.next()?.strip_prefix("up ")?.trim().parse().ok()?;
        let mut cells = Vec::new();
        for l in lines {
            let w: Vec<&str> = l.split_whitespace().collect();
            match w.as_slice() {
                ["cell", n, port, pid] => {
                    cells.push((n.parse().ok()?, port.parse().ok()?, pid.parse().ok()?))
                }
                _ => return None,
            }
        }
        Some(RunFile { up, cells })
    }

    fn read(path: &Path, base_port: u16) -> anyhow::Result<RunFile> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            anyhow::anyhow!(
                "no ring started by `cellcache cluster up --base-port {base_port}` is running \
                 here ({}: {e})",
                path.display()
            )
        })?;
        RunFile::parse(&text).with_context(|| format!("{} is not a run file", path.display()))
    }
}

/// Whether `pid` is a live process: not gone and not a zombie waiting for its parent to
/// reap it (where /proc shows that; elsewhere signal 0, which delivers nothing, checks).
fn alive(pid: u32) -> bool {
    if let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name, which may contain spaces.
        return stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X");
    }
    if std::path::Path::new("/proc/self/stat").exists() {
        return false; // /proc works and has no such process
    }
    Command::new("kill")
        .args(["-0", &pid.to_string()])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .args([sig, &pid.to_string()])
        .stderr(Stdio::null())
        .status();
}

/// The cells this `cluster up` started. Dropping it stops every one still running: SIGTERM,
/// then SIGKILL for any that outlive the grace period, so no cell is left behind.
struct Children {
    cells: Vec<(u16, u16, Child)>,
    grace: Duration,
}

impl Children {
    fn stop(&mut self) {
        for (_, _, c) in &mut self.cells {
            if matches!(c.try_wait(), Ok(None)) {
                signal(c.id(), "-TERM");
            }
        }
        let deadline = Instant::now() + self.grace;
        for (n, port, c) in &mut self.cells {
            loop {
                match c.try_wait() {
                    Ok(Some(_)) | Err(_) => break,
                    Ok(None) if Instant::now() >= deadline => {
                        eprintln!(
                            "cell {n} (port {port}, pid {}) ignored SIGTERM: killing it",
                            c.id()
                        );
                        let _ = c.kill();
                        let _ = c.wait();
                        break;
                    }
                    Ok(None) => std::thread::sleep(Duration::from_millis(50)),
                }
            }
        }
        self.cells.clear();
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Waits until cell `n` (client `port`) answers on its own admin port and the ring's
/// status, as seen through the first cell's admin port `first`, lists `expected` cells, all
/// active, this one among them. Fails at once if the cell's process exits or a signal
/// arrives.
fn wait_cell_up(
    first: &str,
    n: u16,
    port: u16,
    expected: usize,
    child: &mut Child,
    stop: &std::sync::mpsc::Receiver<()>,
    timeout: Duration,
) -> anyhow::Result<String> {
    let me = format!("client=127.0.0.1:{port} ");
    let own = format!("127.0.0.1:{}", admin_port(port)?);
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait()? {
            anyhow::bail!("cell {n} (port {port}) exited during start-up ({status})");
        }
        anyhow::ensure!(
            stop.try_recv().is_err(),
            "interrupted while cell {n} was starting"
        );
        let status = |at: &str| admin(at, "GET", "/cluster/status", None);
        if let (Ok(_), Ok(s)) = (status(&own), status(first)) {
            let cells: Vec<&str> = s.lines().filter(|l| l.starts_with("CELL")).collect();
            let all_active = cells.iter().all(|l| l.contains(" active "));
            let listed = cells
                .iter()
                .any(|l| l.contains(&me) && l.contains(" active "));
            if cells.len() == expected && all_active && listed {
                return Ok(s);
            }
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "cell {n} (port {port}) did not join the ring within {} s",
            timeout.as_secs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The admin port `cluster up` gives the cell on client port `port`.
fn admin_port(port: u16) -> anyhow::Result<u16> {
    port.checked_add(ADMIN_PORT_OFFSET)
        .context("admin port overflow (client port + 20000)")
}

/// The client, peer and admin ports of a cell must be free before it starts: a cell that
/// finds its client port taken only after joining leaves a member in the map that never
/// serves.
fn check_free(port: u16, what: &str) -> anyhow::Result<()> {
    std::net::TcpListener::bind(("127.0.0.1", port))
        .map(drop)
        .with_context(|| format!("{what} 127.0.0.1:{port} is not free"))
}

pub fn run_cluster(args: ClusterArgs) -> anyhow::Result<()> {
    match args.command {
        ClusterCommand::Up {
            cells,
            base_port,
            memory_limit,
            start_timeout,
            run_file,
            cluster_secret_file,
            open,
            serve_args,
        } => {
            let run_file = run_file.unwrap_or_else(|| default_run_file(base_port));
            let secret = (!open)
                .then(|| cluster_secret_file.unwrap_or_else(|| run_file.with_extension("secret")));
            up(
                cells,
                base_port,
                memory_limit,
                Duration::from_secs(start_timeout),
                run_file,
                secret,
                &serve_args,
            )
        }
        ClusterCommand::Down {
            base_port,
            timeout,
            run_file,
        } => down(
            base_port,
            Duration::from_secs(timeout),
            &run_file.unwrap_or_else(|| default_run_file(base_port)),
        ),
        ClusterCommand::Pid {
            cell,
            base_port,
            run_file,
        } => {
            let path = run_file.unwrap_or_else(|| default_run_file(base_port));
            let file = RunFile::read(&path, base_port)?;
            let (_, _, pid) = file
                .cells
                .iter()
                .find(|(n, _, _)| *n == cell)
                .with_context(|| format!("the ring on base port {base_port} has no cell {cell}"))?;
            println!("{pid}");
            Ok(())
        }
    }
}

fn up(
    cells: u16,
    base_port: u16,
    memory_limit: usize,
    start_timeout: Duration,
    run_file: PathBuf,
    secret: Option<PathBuf>,
    serve_args: &[String],
) -> anyhow::Result<()> {
    anyhow::ensure!(cells >= 1, "--cells must be at least 1");
    if let Some(path) = &secret {
        if !path.exists() {
            cellcache_node::cluster::handshake::write_new_secret(path)?;
        }
    }
    if let Ok(old) = RunFile::read(&run_file, base_port) {
        anyhow::ensure!(
            !alive(old.up),
            "a ring is already up on base port {base_port} (cluster up pid {}; stop it with \
             `cellcache cluster down --base-port {base_port}`)",
            old.up
        );
    }
    // Signals first: a Ctrl-C while cells start must stop the ones already started.
    let (tx, stop) = std::sync::mpsc::channel();
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
    ])
    .context("installing signal handlers")?;
    std::thread::spawn(move || {
        for _ in signals.forever() {
            if tx.send(()).is_err() {
                break;
            }
        }
    });
    let exe = std::env::current_exe()?;
    let mut children = Children {
        cells: Vec::new(),
        grace: Duration::from_secs(20),
    };
    let mut record = RunFile {
        up: std::process::id(),
        cells: Vec::new(),
    };
    let first_peer = format!(
        "127.0.0.1:{}",
        base_port
            .checked_add(10_000)
            .context("peer port overflow")?
    );
    let first = format!("127.0.0.1:{}", admin_port(base_port)?);
    let result = (|| -> anyhow::Result<String> {
        let mut status = String::new();
        for i in 0..cells {
            let n = i + 1;
            let port = base_port.checked_add(i).context("port overflow")?;
            let peer = port.checked_add(10_000).context("peer port overflow")?;
            check_free(port, &format!("cell {n}'s client port"))?;
            check_free(peer, &format!("cell {n}'s peer port"))?;
            let admin = admin_port(port)?;
            check_free(admin, &format!("cell {n}'s admin port"))?;
            let mut cmd = Command::new(&exe);
            cmd.args(["serve", "-l", "127.0.0.1", "-p", &port.to_string()])
                .args(["--peer-port", &peer.to_string()])
                .args(["--admin-port", &admin.to_string()])
                .args(["-m", &memory_limit.to_string()])
                .args(
                    secret
                        .iter()
                        .flat_map(|p| [OsStr::new("--cluster-secret-file"), p.as_os_str()]),
                )
                .args(serve_args)
                .stdin(Stdio::null());
            if i > 0 {
                cmd.args(["--join", &first_peer]);
            }
            let child = cmd.spawn().with_context(|| format!("starting cell {n}"))?;
            let pid = child.id();
            children.cells.push((n, port, child));
            let (_, _, child) = children.cells.last_mut().expect("just pushed");
            status = wait_cell_up(&first, n, port, usize::from(n), child, &stop, start_timeout)?;
            record.cells.push((n, port, pid));
            std::fs::write(&run_file, record.render())
                .with_context(|| format!("writing {}", run_file.display()))?;
            println!("cell {n} up: client 127.0.0.1:{port} admin 127.0.0.1:{admin} pid {pid}");
        }
        Ok(status)
    })();
    let status = match result {
        Ok(s) => s,
        Err(e) => {
            let started = children.cells.len();
            children.stop();
            let _ = std::fs::remove_file(&run_file);
            return Err(e.context(format!(
                "cluster up failed; stopped the {started} cell(s) it had started"
            )));
        }
    };
    print!("{}", status.replace("\r\n", "\n"));
    match &secret {
        Some(path) => println!(
            "cluster secret: {} (a cell joining this ring needs --cluster-secret-file {})",
            path.display(),
            path.display()
        ),
        None => {
            println!("no cluster secret (--open): anyone who reaches a peer port can act as a cell")
        }
    }
    println!(
        "ring of {cells} up (pids in {}). Try: cellcache ctl status -s {first}\n\
         Stop it with Ctrl-C or: cellcache cluster down --base-port {base_port}",
        run_file.display()
    );
    loop {
        if stop.recv_timeout(Duration::from_millis(200)).is_ok() {
            println!("stopping {} cells", children.cells.len());
            break;
        }
        for (n, port, c) in &mut children.cells {
            if let Ok(Some(status)) = c.try_wait() {
                println!("cell {n} (port {port}) exited ({status})");
            }
        }
        children
            .cells
            .retain_mut(|(_, _, c)| matches!(c.try_wait(), Ok(None)));
    }
    children.stop();
    let _ = std::fs::remove_file(&run_file);
    println!("stopped");
    Ok(())
}

/// Asks the `cluster up` that wrote `run_file` to stop its cells (SIGTERM to it: it stops
/// exactly the cells it started), and waits until it and they are gone.
fn down(base_port: u16, timeout: Duration, run_file: &Path) -> anyhow::Result<()> {
    let file = RunFile::read(run_file, base_port)?;
    let pids: Vec<u32> = std::iter::once(file.up)
        .chain(file.cells.iter().map(|c| c.2))
        .collect();
    if alive(file.up) {
        signal(file.up, "-TERM");
    } else {
        // The supervisor is gone (killed): stop the cells it recorded directly.
        for (_, _, pid) in &file.cells {
            signal(*pid, "-TERM");
        }
    }
    let deadline = Instant::now() + timeout;
    while pids.iter().any(|p| alive(*p)) {
        anyhow::ensure!(
            Instant::now() < deadline,
            "processes still running after {} s: {:?}",
            timeout.as_secs(),
            pids.iter().filter(|p| alive(**p)).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = std::fs::remove_file(run_file);
    println!(
        "stopped the ring on base port {base_port} (pids {})",
        pids.iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(" ")
    );
    Ok(())
}
