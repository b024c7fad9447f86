//! Restarting a cell with its original command line is safe: it never serves beside, or
//! as a second ring next to, the ring it belonged to.
//!
//! A cell's store is memory: a restarted process is a new, empty cell, whatever its command
//! line says. A cell started with `--join` asks its ring to admit it, which the ring does as a
//! new cell once it has absorbed the old one. The first cell of a ring has no `--join`, so it
//! keeps a *membership file* while its ring has other cells: the ring's identity and the
//! cells' peer addresses ([`Membership`]). Started again without `--join`, a cell with such
//! a file asks those cells, one by one, over the peer plane (proving the ring's secret),
//! whether they are still that ring (`cluster status` shows its identity); the first that is admits it as a new cell, exactly as `--join` would.
//! Only when none answers as that ring does the cell start a new ring.
//!
//! Without the file (`cluster.state_dir = "off"`, or a file lost), the cells of the old ring
//! still call the address they knew. Every peer connection starts with a `Hello` naming the
//! sender's ring, and a cell refuses a ring other than its own before reading any other
//! frame, so nothing of the old ring reaches the new one. A ring of one that is called by
//! another ring holding its address is such a restarted first cell: it stops, saying which
//! `--join` to run.

use super::transport::PeerAuth;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cellcache_cluster::wire::WireConfig;
use cellcache_cluster::wire::payload::Hello;
use cellcache_cluster::{CellAddress, CellState, ClusterMap};
use serde::{Deserialize, Serialize};

use super::Cluster;

/// The process exit code of a restarted first cell that found its old ring alive.
pub const EXIT_RING_ALIVE: i32 = 3;

/// What a cell remembers of its ring across a restart.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Membership {
    /// The ring's identity, in hex.
    pub ring: String,
    /// Peer addresses of the ring's cells, this one's included (asked over the peer
    /// plane, with the ring's secret when it has one).
    #[serde(default)]
    pub peers: Vec<String>,
}

impl Membership {
    /// The membership `map` implies, or `None` when the ring has no cell but `me`
    /// (nothing to rejoin: a restarted ring of one starts anew).
    pub fn of(map: &ClusterMap, me: &CellAddress) -> Option<Membership> {
        let peers: Vec<String> = map
            .cells()
            .iter()
            .filter(|c| c.state != CellState::Dead)
            .map(|c| c.address.peer.clone())
            .collect();
        peers.iter().any(|p| *p != me.peer).then(|| Membership {
            ring: format!("{:x}", map.ring()),
            peers,
        })
    }
}

/// The membership file of the cell at client address `client` in `state_dir` (see
/// `cluster.state_dir`); `None` when disabled or no default location exists.
pub fn file_path(state_dir: &str, client: &str) -> Option<PathBuf> {
    let dir = match state_dir {
        "off" => return None,
        "" => std::env::var_os("XDG_STATE_HOME")
            .filter(|d| !d.is_empty())
            .map(PathBuf::from)
            .or_else(|| {
                std::env::var_os("HOME")
                    .filter(|d| !d.is_empty())
                    .map(|h| PathBuf::from(h).join(".local/state"))
            })?
            .join("cellcache"),
        dir => PathBuf::from(dir),
    };
    let name: String = client
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    Some(dir.join(format!("ring-{name}.toml")))
}

/// Why a membership file could not be read or kept.
#[derive(Debug, thiserror::Error)]
pub enum MembershipFileError {
    #[error("reading the membership file {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the membership file {path} is damaged")]
    Damaged {
        path: PathBuf,
        #[source]
        source: toml::de::Error,
    },
    #[error("writing the membership file {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("encoding the membership file")]
    Encode(#[from] toml::ser::Error),
}

/// Reads a membership file; a missing file is `None`, a damaged one an error.
pub fn load(path: &Path) -> Result<Option<Membership>, MembershipFileError> {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            toml::from_str(&text)
                .map(Some)
                .map_err(|source| MembershipFileError::Damaged {
                    path: path.to_path_buf(),
                    source,
                })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(MembershipFileError::Read {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Writes `m` to `path` atomically (a new file renamed over the old), or removes the file
/// when `m` is `None`.
pub fn store(path: &Path, m: Option<&Membership>) -> Result<(), MembershipFileError> {
    let write = |source| MembershipFileError::Write {
        path: path.to_path_buf(),
        source,
    };
    let Some(m) = m else {
        return match std::fs::remove_file(path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(write(e)),
            _ => Ok(()),
        };
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(write)?;
    }
    let tmp = path.with_extension("toml.new");
    std::fs::write(&tmp, toml::to_string(m)?).map_err(write)?;
    std::fs::rename(&tmp, path).map_err(write)?;
    Ok(())
}

/// How a known cell answered the question "are you still ring R?".
enum Answer {
    /// It is: join through it.
    SameRing,
    /// It is a cell of another ring, or not a cell at all, or nothing listens there.
    Other,
    /// No answer in time: it may be a cell that is busy or cut off.
    Silent,
}

fn ask(peer: &str, ring: &str, timeout: Duration, auth: &PeerAuth, wire: &WireConfig) -> Answer {
    use super::handshake::{HandshakeError, OperatorCallError};
    match super::handshake::operator_call(peer, auth, wire, "cluster status", timeout, None) {
        Ok(status) => {
            let theirs = status.lines().next().and_then(|l| {
                l.split_ascii_whitespace()
                    .skip_while(|w| *w != "RING")
                    .nth(1)
            });
            if theirs == Some(ring) {
                Answer::SameRing
            } else {
                Answer::Other
            }
        }
        // Nothing listens there, or a cell of another ring (another secret, or none).
        Err(OperatorCallError::Failed {
            source: HandshakeError::Io(e),
            ..
        }) if e.kind() == std::io::ErrorKind::ConnectionRefused => Answer::Other,
        Err(e) if e.is_final() => Answer::Other,
        Err(_) => Answer::Silent,
    }
}

/// For a cell started without `--join`: the client address of a live cell of the ring its
/// membership file names, to join through; `None` to bootstrap (no file, every listed
/// address refuses or belongs to another ring, or none answers within `wait`).
pub fn ring_to_rejoin(
    path: Option<&Path>,
    me: &CellAddress,
    wait: Duration,
    auth: &PeerAuth,
    wire: &WireConfig,
) -> Result<Option<String>, MembershipFileError> {
    let Some(path) = path else { return Ok(None) };
    let Some(m) = load(path)? else {
        return Ok(None);
    };
    let others: Vec<&String> = m.peers.iter().filter(|p| **p != me.peer).collect();
    tracing::info!(
        file = %path.display(),
        ring = %m.ring,
        cells = others.len(),
        "this cell was a member of a ring: asking its cells whether it is still there"
    );
    let deadline = Instant::now() + wait;
    let per_call = wait / 4;
    loop {
        let mut silent = false;
        for c in &others {
            match ask(c, &m.ring, per_call, auth, wire) {
                Answer::SameRing => {
                    tracing::warn!(
                        through = %c,
                        ring = %m.ring,
                        "the ring this cell belonged to is alive: rejoining it as a new, empty \
                         cell (this process's store starts empty)"
                    );
                    return Ok(Some((*c).clone()));
                }
                Answer::Other => {}
                Answer::Silent => silent = true,
            }
        }
        if !silent || Instant::now() >= deadline {
            tracing::warn!(
                ring = %m.ring,
                "no cell of the ring this cell belonged to answered: starting a new ring"
            );
            return Ok(None);
        }
        std::thread::sleep(per_call.min(Duration::from_millis(200)));
    }
}

impl Cluster {
    /// Keeps the membership file in step with `map` (see the module docs).
    pub fn remember_membership(&self, map: &ClusterMap) {
        let Some(path) = file_path(&self.config.state_dir, &self.address.client) else {
            return;
        };
        let leaving = self.leaving.load(std::sync::atomic::Ordering::Acquire);
        let m = if leaving {
            None
        } else {
            Membership::of(map, &self.address)
        };
        let mut last = self.membership.lock();
        if *last == m {
            return;
        }
        match store(&path, m.as_ref()) {
            Ok(()) => *last = m,
            Err(e) => tracing::warn!(
                file = %path.display(),
                error = %crate::error_chain(&e),
                "cannot keep the membership file: a restart of this cell without --join \
                 would start a new ring"
            ),
        }
    }

    /// A peer of another ring said `hello`: refused. If this cell is a ring of one, that
    /// ring still counts this address as one of its cells, so this process is a restart of
    /// one of them and must not serve beside it: it stops.
    pub fn foreign_hello(&self, hello: &Hello, from: &str) {
        let alone = {
            let ring = self.lock_ring();
            ring.map().cells().len() == 1
        };
        if !alone {
            tracing::warn!(
                cell = %hello.cell,
                ring = format!("{:x}", hello.ring),
                client = %hello.client,
                %from,
                "a cell of another ring connected: refused"
            );
            return;
        }
        tracing::error!(
            cell = %hello.cell,
            ring = format!("{:x}", hello.ring),
            client = %hello.client,
            "cell {} of a live ring calls this address, which was one of its cells: this \
             process is a restart of that cell and must not start a second ring beside it. \
             Stopping. Run it with `--join {}` to rejoin that ring as a new cell.",
            hello.cell,
            hello.client
        );
        // Not eprintln!: a closed stderr must not turn the stop into a panic.
        let _ = writeln!(
            std::io::stderr(),
            "cellcache: a live ring (cell {} at {}) still counts this address as one of its \
             cells; not starting a second ring. Restart with: --join {}",
            hello.cell,
            hello.client,
            hello.client
        );
        std::process::exit(EXIT_RING_ALIVE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cellcache_cluster::CellId;

    fn addr(port: u16) -> CellAddress {
        CellAddress {
            client: format!("127.0.0.1:{port}"),
            peer: format!("127.0.0.1:{}", port + 10_000),
        }
    }

    #[test]
    fn a_ring_of_one_leaves_no_membership_and_files_round_trip() {
        let map = ClusterMap::bootstrap_ring(CellId::whole(1), addr(1), 2, 0xabc).unwrap();
        assert_eq!(Membership::of(&map, &addr(1)), None);
        // Seen from another cell, the same ring is one to rejoin.
        let m = Membership::of(&map, &addr(2)).unwrap();
        assert_eq!(m.ring, "abc");
        let dir = std::env::temp_dir().join(format!("cellcache-restart-{}", std::process::id()));
        let path = file_path(dir.to_str().unwrap(), "127.0.0.1:11211").unwrap();
        assert!(path.ends_with("ring-127.0.0.1_11211.toml"));
        store(&path, Some(&m)).unwrap();
        assert_eq!(load(&path).unwrap(), Some(m));
        store(&path, None).unwrap();
        assert_eq!(load(&path).unwrap(), None);
        std::fs::write(&path, "not toml [").unwrap();
        assert!(load(&path).is_err());
        let _ = std::fs::remove_dir_all(dir);
        assert_eq!(file_path("off", "127.0.0.1:1"), None);
    }
}
