//! `cellcache ctl …` and `cellcache cluster up`: operator tools speaking the client port's
//! `cluster …` extension commands (docs/protocol.md).

use anyhow::Context;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct CtlArgs {
    /// Client address of any cell of the ring (the split's standby cell is `--new`).
    #[arg(
        short = 's',
        long,
        global = true,
        value_name = "HOST:PORT",
        default_value = "127.0.0.1:11211"
    )]
    server: String,
    #[command(subcommand)]
    command: CtlCommand,
}

#[derive(clap::Subcommand)]
enum CtlCommand {
    /// Print the ring: cells, ids, addresses, ranges, roles, epoch, memory.
    Status,
    /// Items a cell holds per range it masters or backs up.
    Ranges,
    /// Bring a cell started with `serve --standby` (at --new) into the ring as a division of
    /// CELL: it takes the second half of CELL's range once it caught up.
    Split {
        /// The dividing cell's id (as `ctl status` prints it).
        cell: String,
        /// Client address of the standby cell.
        #[arg(long, value_name = "HOST:PORT")]
        new: String,
    },
    /// Begin the graceful absorption of CELL by its successor; CELL exits once done.
    Leave {
        /// The cell id (as `ctl status` prints it).
        cell: String,
    },
}

/// Sends one extension command and returns the reply (up to `END` or one line).
pub fn command(server: &str, line: &str) -> anyhow::Result<String> {
    let mut s = TcpStream::connect(server).with_context(|| format!("connecting to {server}"))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(s, "{line}\r\n")?;
    let mut r = BufReader::new(s);
    let mut out = String::new();
    loop {
        let mut l = String::new();
        if r.read_line(&mut l)? == 0 {
            break;
        }
        let done = l == "END\r\n"
            || !(l.starts_with("CELL")
                || l.starts_with("EPOCH")
                || l.starts_with("MIGRATION")
                || l.starts_with("RANGE")
                || l.starts_with("TOTAL"));
        out.push_str(&l);
        if done {
            break;
        }
    }
    Ok(out)
}

pub fn run(args: CtlArgs) -> anyhow::Result<()> {
    let server = &args.server;
    let (server, line) = match &args.command {
        CtlCommand::Status => (server, "cluster status".to_string()),
        CtlCommand::Ranges => (server, "cluster ranges".to_string()),
        CtlCommand::Leave { cell } => (server, format!("cluster leave {cell}")),
        CtlCommand::Split { cell, new } => (new, format!("cluster invite {server} {cell}")),
    };
    let reply = command(server, &line)?;
    print!("{}", reply.replace("\r\n", "\n"));
    anyhow::ensure!(
        !reply.starts_with("SERVER_ERROR") && !reply.starts_with("CLIENT_ERROR"),
        "the cell refused the command"
    );
    Ok(())
}

#[derive(clap::Args)]
pub struct ClusterArgs {
    #[command(subcommand)]
    command: ClusterCommand,
}

#[derive(clap::Subcommand)]
enum ClusterCommand {
    /// Start N local cells (first bootstraps, the others join), print how to reach them,
    /// stop them all on Ctrl-C.
    Up {
        #[arg(long, default_value_t = 3)]
        cells: u16,
        /// Client port of the first cell; cell i listens on base + i (peer ports + 10000).
        #[arg(long, default_value_t = 11211)]
        base_port: u16,
        /// Memory per cell, megabytes.
        #[arg(short = 'm', long, default_value_t = 64)]
        memory_limit: usize,
        /// Extra flags for every `cellcache serve`.
        #[arg(last = true)]
        serve_args: Vec<String>,
    },
}

struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = Command::new("kill")
                .args(["-TERM", &c.id().to_string()])
                .status();
        }
        for c in &mut self.0 {
            let _ = c.wait();
        }
    }
}

/// Waits until `ctl status` through `server` shows `cells` cells, all active.
fn wait_active(server: &str, cells: usize, timeout: Duration) -> anyhow::Result<String> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(s) = command(server, "cluster status") {
            let n = s.lines().filter(|l| l.starts_with("CELL")).count();
            let active = s
                .lines()
                .filter(|l| l.starts_with("CELL") && l.contains(" active "))
                .count();
            if n == cells && active == cells {
                return Ok(s);
            }
        }
        anyhow::ensure!(Instant::now() < deadline, "the ring did not form in time");
        std::thread::sleep(Duration::from_millis(100));
    }
}

pub fn run_cluster(args: ClusterArgs) -> anyhow::Result<()> {
    let ClusterCommand::Up {
        cells,
        base_port,
        memory_limit,
        serve_args,
    } = args.command;
    anyhow::ensure!(cells >= 1, "--cells must be at least 1");
    let exe = std::env::current_exe()?;
    let mut children = Children(Vec::new());
    let first = format!("127.0.0.1:{base_port}");
    for i in 0..cells {
        let port = base_port.checked_add(i).context("port overflow")?;
        let mut cmd = Command::new(&exe);
        cmd.args(["serve", "-l", "127.0.0.1", "-p", &port.to_string()])
            .args(["-m", &memory_limit.to_string()])
            .args(&serve_args)
            .stdin(Stdio::null());
        if i > 0 {
            cmd.args(["--join", &first]);
        }
        children.0.push(cmd.spawn().context("starting a cell")?);
        wait_active(&first, usize::from(i) + 1, Duration::from_secs(60))?;
        println!("cell {} up: client 127.0.0.1:{port}", i + 1);
    }
    let status = wait_active(&first, usize::from(cells), Duration::from_secs(60))?;
    print!("{}", status.replace("\r\n", "\n"));
    println!(
        "ring of {cells} up. Try: cellcache ctl status -s {first}   (Ctrl-C stops every cell)"
    );
    let (tx, rx) = std::sync::mpsc::channel();
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
    ])?;
    std::thread::spawn(move || {
        if signals.forever().next().is_some() {
            let _ = tx.send(());
        }
    });
    loop {
        if rx.recv_timeout(Duration::from_millis(200)).is_ok() {
            println!("stopping {} cells", children.0.len());
            break;
        }
        for c in &mut children.0 {
            if let Ok(Some(status)) = c.try_wait() {
                println!("a cell exited ({status})");
            }
        }
        children.0.retain_mut(|c| matches!(c.try_wait(), Ok(None)));
    }
    drop(children);
    Ok(())
}
