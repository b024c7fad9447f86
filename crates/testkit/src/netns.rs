//! Real network partitions: N network namespaces joined by a bridge, with links cut and
//! healed by nftables drop rules.
//!
//! Layout of one [`Netns`] (names carry a per-instance prefix, so parallel tests never
//! collide):
//!
//! ```text
//!   <prefix>-n0            <prefix>-n1          ...    <prefix>-hub
//!   eth0 10.199.0.1/24     eth0 10.199.0.2/24          br0 ── p0, p1, ... (veth peers)
//! ```
//!
//! The bridge lives in a hub namespace of its own instead of the host's: nothing is added
//! to the host's interfaces or firewall, and the host's firewall does not see the traffic.
//! That matters where dockerd runs: with `br_netfilter` loaded, bridged packets traverse
//! the host's `FORWARD` chain, whose policy dockerd sets to drop, and an nftables accept in
//! a table of our own could not override that (a drop in any base chain is final). The hub
//! namespace has no rules, so its bridge forwards.
//!
//! Partitions are nftables rules inside the node namespaces (table `inet
//! cellcache_partition`, chains `input` and `output`): cutting a link drops every packet
//! between the two addresses in both namespaces, so open TCP connections stall and new ones
//! time out, as in a real partition (no RST, no ICMP). [`Netns::heal`] flushes the rules.
//!
//! Processes run inside a node with `ip netns exec` (see [`Netns::place`]); test code runs
//! inside one with [`in_namespace`], which moves one fresh thread there (threads it spawns
//! inherit the namespace). Needs root, iproute2 and nftables; [`Netns::create`] returns
//! [`NetnsError::Unavailable`] with the reason otherwise, for the test to print and skip.

use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use nix::sched::{CloneFlags, setns};

use crate::process::ServerSpec;

#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    #[error("network namespaces are unavailable here: {0}")]
    Unavailable(String),
    #[error("`{command}` failed: {stderr}")]
    Command { command: String, stderr: String },
    #[error("entering namespace {name}: {reason}")]
    Enter { name: String, reason: String },
}

/// Most nodes per instance (addresses 10.199.0.1 .. .250).
pub const NODES_MAX: usize = 250;

const TABLE: &str = "cellcache_partition";

/// A set of node namespaces on one bridge; deleted (with everything in them) when dropped.
/// Drop the processes running inside first.
pub struct Netns {
    prefix: String,
    nodes: Vec<String>,
}

impl Netns {
    /// Builds `nodes` namespaces on a bridge, each with loopback and `eth0` up.
    pub fn create(nodes: usize) -> Result<Self, NetnsError> {
        if nodes == 0 || nodes > NODES_MAX {
            return Err(NetnsError::Unavailable(format!(
                "{nodes} nodes asked, 1..={NODES_MAX} supported"
            )));
        }
        for (tool, package) in [("ip", "iproute2"), ("nft", "nftables")] {
            if let Err(error) = Command::new(tool).arg("-V").output() {
                return Err(NetnsError::Unavailable(format!(
                    "`{tool}` not runnable ({error}); install {package}"
                )));
            }
        }
        remove_leftovers();
        static INSTANCE: AtomicU32 = AtomicU32::new(0);
        let prefix = format!(
            "cc{}-{}",
            std::process::id(),
            INSTANCE.fetch_add(1, Ordering::Relaxed)
        );
        let mut netns = Self {
            prefix,
            nodes: Vec::new(),
        };
        let hub = netns.hub();
        // the first step tells whether we may create namespaces at all
        if let Err(error) = run(&["ip", "netns", "add", &hub]) {
            return Err(NetnsError::Unavailable(format!(
                "{error} (creating network namespaces needs root or CAP_SYS_ADMIN)"
            )));
        }
        netns.build(nodes)?;
        Ok(netns)
    }

    fn hub(&self) -> String {
        format!("{}-hub", self.prefix)
    }

    fn build(&mut self, nodes: usize) -> Result<(), NetnsError> {
        let hub = self.hub();
        run(&["ip", "-n", &hub, "link", "set", "lo", "up"])?;
        run(&["ip", "-n", &hub, "link", "add", "br0", "type", "bridge"])?;
        run(&["ip", "-n", &hub, "link", "set", "br0", "up"])?;
        for i in 0..nodes {
            let name = format!("{}-n{i}", self.prefix);
            run(&["ip", "netns", "add", &name])?;
            self.nodes.push(name.clone());
            let peer = format!("p{i}");
            let address = format!("{}/24", Self::address(i));
            run(&["ip", "-n", &name, "link", "set", "lo", "up"])?;
            run(&[
                "ip", "link", "add", "eth0", "netns", &name, "type", "veth", "peer", "name", &peer,
                "netns", &hub,
            ])?;
            run(&["ip", "-n", &hub, "link", "set", &peer, "master", "br0"])?;
            run(&["ip", "-n", &hub, "link", "set", &peer, "up"])?;
            run(&["ip", "-n", &name, "addr", "add", &address, "dev", "eth0"])?;
            run(&["ip", "-n", &name, "link", "set", "eth0", "up"])?;
            let ruleset = format!(
                "table inet {TABLE} {{\n\
                 chain input {{ type filter hook input priority 0; policy accept; }}\n\
                 chain output {{ type filter hook output priority 0; policy accept; }}\n\
                 }}\n"
            );
            nft(&name, &ruleset)?;
        }
        Ok(())
    }

    /// The address of node `i` (10.199.0.`i + 1`).
    pub fn address(i: usize) -> Ipv4Addr {
        Ipv4Addr::new(10, 199, 0, (i + 1) as u8)
    }

    /// The namespace name of node `i`, as `ip netns` knows it.
    pub fn name(&self, i: usize) -> &str {
        &self.nodes[i]
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Moves a server spec into node `i`: it runs under `ip netns exec`, listens on the
    /// node's address instead of 127.0.0.1, and is probed from inside the namespace.
    pub fn place(&self, i: usize, mut spec: ServerSpec) -> ServerSpec {
        let address = Self::address(i);
        for arg in &mut spec.args {
            if arg == "127.0.0.1" {
                *arg = address.to_string();
            }
        }
        spec.addr.set_ip(address.into());
        spec.netns = Some(self.nodes[i].clone());
        spec
    }

    /// A command that runs `program` inside node `i` (`ip netns exec`); add arguments and
    /// spawn it as usual.
    pub fn command(&self, i: usize, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.nodes[i]]).arg(program);
        command
    }

    /// Runs `f` on a thread inside node `i`'s namespace.
    pub fn run_in<T: Send>(&self, i: usize, f: impl FnOnce() -> T + Send) -> Result<T, NetnsError> {
        in_namespace(&self.nodes[i], f)
    }

    /// Drops every packet between nodes `a` and `b`, both directions.
    pub fn cut(&self, a: usize, b: usize) -> Result<(), NetnsError> {
        tracing::info!(a, b, "netns: cut link");
        for (here, there) in [(a, b), (b, a)] {
            let there = Self::address(there);
            let rules = format!(
                "add rule inet {TABLE} input ip saddr {there} drop\n\
                 add rule inet {TABLE} output ip daddr {there} drop\n"
            );
            nft(&self.nodes[here], &rules)?;
        }
        Ok(())
    }

    /// Cuts every link between a node of `side` and a node outside it (isolating a
    /// minority: `partition(&[0, 1])` of five nodes).
    pub fn partition(&self, side: &[usize]) -> Result<(), NetnsError> {
        for &a in side {
            for b in (0..self.nodes.len()).filter(|b| !side.contains(b)) {
                self.cut(a, b)?;
            }
        }
        Ok(())
    }

    /// Cuts node `i` from every other node.
    pub fn isolate(&self, i: usize) -> Result<(), NetnsError> {
        self.partition(&[i])
    }

    /// Removes every drop rule.
    pub fn heal(&self) -> Result<(), NetnsError> {
        tracing::info!("netns: heal all links");
        for name in &self.nodes {
            nft(name, &format!("flush table inet {TABLE}\n"))?;
        }
        Ok(())
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // deleting a namespace destroys its veth end, and with the hub the bridge
        for name in self.nodes.iter().chain(std::iter::once(&self.hub())) {
            if let Err(error) = run(&["ip", "netns", "del", name]) {
                eprintln!("netns cleanup: {error}");
            }
        }
    }
}

/// Deletes namespaces this module made in test processes that no longer run (a test
/// killed by a CI timeout does not run its destructors). Only names of the form
/// `cc<pid>-<n>-hub` and `cc<pid>-<n>-n<i>` whose `<pid>` is gone are touched.
fn remove_leftovers() {
    let Ok(output) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let Some(name) = line.split_whitespace().next() else {
            continue;
        };
        let Some(pid) = leftover_pid(name) else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            tracing::info!(
                name,
                "removing a network namespace left by a dead test process"
            );
            let _ = run(&["ip", "netns", "del", name]);
        }
    }
}

/// The pid in a name this module makes, `None` for any other name.
fn leftover_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix("cc")?;
    let mut parts = rest.splitn(3, '-');
    let pid: u32 = parts.next()?.parse().ok()?;
    parts.next()?.parse::<u32>().ok()?;
    let node = parts.next()?;
    let ours = node == "hub"
        || node
            .strip_prefix('n')
            .is_some_and(|i| !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()));
    ours.then_some(pid)
}

/// Runs `f` on a new thread that first enters the network namespace `name` (as listed by
/// `ip netns`); threads spawned by `f` inherit it.
pub fn in_namespace<T: Send>(name: &str, f: impl FnOnce() -> T + Send) -> Result<T, NetnsError> {
    let path = format!("/run/netns/{name}");
    let enter_error = |reason: String| NetnsError::Enter {
        name: name.to_owned(),
        reason,
    };
    let file = std::fs::File::open(&path).map_err(|e| enter_error(format!("{path}: {e}")))?;
    std::thread::scope(|scope| {
        scope
            .spawn(move || {
                setns(&file, CloneFlags::CLONE_NEWNET).map_err(|e| enter_error(e.to_string()))?;
                Ok(f())
            })
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

fn run(args: &[&str]) -> Result<(), NetnsError> {
    let command = args.join(" ");
    let output = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| NetnsError::Command {
            command: command.clone(),
            stderr: e.to_string(),
        })?;
    if !output.status.success() {
        return Err(NetnsError::Command {
            command,
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        });
    }
    Ok(())
}

/// Feeds an nftables script to `nft -f -` inside namespace `name`.
fn nft(name: &str, script: &str) -> Result<(), NetnsError> {
    use std::io::Write;
    let command = format!("ip netns exec {name} nft -f - <<< {script:?}");
    let failed = |stderr: String| NetnsError::Command {
        command: command.clone(),
        stderr,
    };
    let mut child = Command::new("ip")
        .args(["netns", "exec", name, "nft", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| failed(e.to_string()))?;
    child
        .stdin
        .take()
        .expect("stdin is piped")
        .write_all(script.as_bytes())
        .map_err(|e| failed(e.to_string()))?;
    let output = child
        .wait_with_output()
        .map_err(|e| failed(e.to_string()))?;
    if !output.status.success() {
        return Err(failed(
            String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::leftover_pid;

    #[test]
    fn only_our_names_count_as_leftovers() {
        assert_eq!(leftover_pid("cc123-0-hub"), Some(123));
        assert_eq!(leftover_pid("cc123-4-n17"), Some(123));
        for other in [
            "cc123-0-n",
            "cc123-hub",
            "ccx-0-hub",
            "docker-1",
            "cc123-0-hubx",
            "n1",
        ] {
            assert_eq!(leftover_pid(other), None, "{other}");
        }
    }
}
