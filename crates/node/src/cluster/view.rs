//! The ring as one cell sees it, gathered once and shown two ways: the text of `cluster
//! status` / `GET /cluster/status` (`ctl status`), and the JSON of `GET /cells` (dashboards,
//! scripts). Each cell's memory is asked of that cell (its `stats`), within 500 ms, else it
//! is reported unreachable.

use std::sync::Arc;
use std::time::Duration;

use cellcache_cluster::wire::FrameKind;
use cellcache_cluster::{CellState, HashRange, Migration};
use serde::Serialize;

use super::Cluster;

/// How long a cell's own figures are waited for.
const MEMORY_WAIT: Duration = Duration::from_millis(500);

/// The ring: its map, who leads its consensus group, and every cell.
#[derive(Debug, Serialize)]
pub struct RingView {
    pub epoch: u64,
    pub replication_factor: u8,
    /// The consensus group's leader, if one is known.
    pub leader: Option<String>,
    /// The cell that answered.
    #[serde(rename = "self")]
    pub me: String,
    /// The ring's identity (hex), drawn when its first cell started.
    pub ring: String,
    /// What the peer port requires: `secret+tls`, `secret`, `tls` or `open`.
    pub peers: &'static str,
    pub cells: Vec<CellView>,
    pub migrations: Vec<MigrationView>,
}

#[derive(Debug, Serialize)]
pub struct CellView {
    pub id: String,
    /// `joining`, `active`, `leaving` or `dead`.
    pub state: &'static str,
    pub client: String,
    pub peer: String,
    /// The range it masters (`[start, end]`, inclusive, hex), if any.
    pub range: Option<[String; 2]>,
    /// The ranges it holds backup copies of, with the cell that masters each.
    pub backups: Vec<BackupView>,
    /// In the consensus group: `voter`, `learner` or `none`.
    pub role: &'static str,
    /// Its memory, or `None` when it did not answer in time (`unreachable`).
    pub memory: Option<MemoryView>,
    /// Its request counters (since its start or `stats reset`), when it answered: a
    /// dashboard turns two readings into ops/s and a hit ratio.
    pub counters: Option<CountersView>,
}

#[derive(Debug, Serialize)]
pub struct CountersView {
    pub cmd_get: u64,
    pub cmd_set: u64,
    pub get_hits: u64,
    pub get_misses: u64,
}

#[derive(Debug, Serialize)]
pub struct BackupView {
    pub master: String,
    pub range: [String; 2],
}

#[derive(Debug, Serialize)]
pub struct MemoryView {
    pub bytes: u64,
    pub limit: u64,
    pub items: u64,
}

#[derive(Debug, Serialize)]
pub struct MigrationView {
    /// `division`, `absorption` or `shift`.
    pub kind: &'static str,
    /// The cell giving the range (the parent, the departed cell, or the shift's giver).
    pub from: String,
    /// The cell taking it (the child, the successor, or the neighbour a shift moves it to).
    pub to: String,
    pub range: [String; 2],
}

fn hex(r: HashRange) -> [String; 2] {
    [format!("{:016x}", r.start), format!("{:016x}", r.end)]
}

fn stat(stats: &str, name: &str) -> Option<u64> {
    stats.lines().find_map(|l| {
        let mut w = l.split(' ');
        (w.next() == Some("STAT") && w.next() == Some(name))
            .then(|| w.next()?.parse().ok())
            .flatten()
    })
}

/// Which `stats` a cell is asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CellStats {
    /// `stats` (this cell's own general figures; of another cell, its `stats cell
    /// estimate`, whose general figures are the same and which walks nothing).
    General,
    /// `stats cell estimate`: the general figures, `stats cellcache` and the bytes of what it
    /// masters, estimated from its ranges without walking its items (the autoscaler asks
    /// every cell every sample).
    Estimate,
}

/// Every cell's `stats` reply, in map order (`None`: it did not answer within
/// [`MEMORY_WAIT`]); the cells are asked at once, so a ring of many cells answers within
/// one wait.
pub async fn cell_stats(
    cl: &Arc<Cluster>,
    map: &cellcache_cluster::ClusterMap,
    which: CellStats,
) -> Vec<Option<Vec<u8>>> {
    let mut asks = Vec::with_capacity(map.cells().len());
    for c in map.cells() {
        if c.id == cl.me {
            let mut o = Vec::new();
            match which {
                CellStats::General => crate::stats::reply(
                    &cl.cell,
                    &cellcache_proto::StatsGroup::General,
                    cl.cell.now(),
                    &mut o,
                ),
                CellStats::Estimate => super::stats::local_cell_stats_estimate(cl, &mut o),
            }
            asks.push(tokio::spawn(async move { Some(o) }));
        } else if let Some(link) = cl.link(&c.id) {
            asks.push(tokio::spawn(async move {
                let request = super::stats::CELL_ESTIMATE_STATS.to_vec();
                let call = link.call(FrameKind::ForwardRequest, request);
                match tokio::time::timeout(MEMORY_WAIT, call).await {
                    Ok(Ok(f)) if f.kind == FrameKind::ForwardReply => Some(f.payload),
                    _ => None,
                }
            }));
        } else {
            asks.push(tokio::spawn(async { None }));
        }
    }
    let mut out = Vec::with_capacity(asks.len());
    for a in asks {
        out.push(a.await.ok().flatten());
    }
    out
}

/// Gathers the view: the map under its lock, then each cell's memory without it.
pub async fn gather(cl: &Arc<Cluster>) -> RingView {
    let map = cl.lock_ring().map().clone();
    let (voters, learners, leader) = match cl.raft.get() {
        Some(r) => {
            use cellcache_cluster::Consensus;
            let m = r.membership();
            let leader = r.leader().and_then(|l| cl.cell_of_raft_id(l));
            (m.voters, m.learners, leader)
        }
        None => Default::default(),
    };
    let mut cells = Vec::new();
    let answers = cell_stats(cl, &map, CellStats::General).await;
    for (c, stats) in map.cells().iter().zip(answers) {
        let text = stats.map(|s| String::from_utf8_lossy(&s).into_owned());
        let memory = text.as_deref().and_then(|s| {
            Some(MemoryView {
                bytes: stat(s, "bytes")?,
                limit: stat(s, "limit_maxbytes")?,
                items: stat(s, "curr_items")?,
            })
        });
        let counters = text.as_deref().and_then(|s| {
            Some(CountersView {
                cmd_get: stat(s, "cmd_get")?,
                cmd_set: stat(s, "cmd_set")?,
                get_hits: stat(s, "get_hits")?,
                get_misses: stat(s, "get_misses")?,
            })
        });
        let role = if voters.contains(&c.id) {
            "voter"
        } else if learners.contains(&c.id) {
            "learner"
        } else {
            "none"
        };
        let state = match c.state {
            CellState::Joining => "joining",
            CellState::Active => "active",
            CellState::Leaving => "leaving",
            CellState::Dead => "dead",
        };
        let backups = map
            .backup_ranges(&c.id)
            .into_iter()
            .map(|(master, r)| BackupView {
                master: master.id.to_string(),
                range: hex(r),
            })
            .collect();
        cells.push(CellView {
            id: c.id.to_string(),
            state,
            client: c.address.client.to_string(),
            peer: c.address.peer.to_string(),
            range: c.range.map(hex),
            backups,
            role,
            memory,
            counters,
        });
    }
    let migrations = map
        .migrations()
        .iter()
        .map(|m| match m {
            Migration::Division {
                parent,
                child,
                range,
                ..
            } => MigrationView {
                kind: "division",
                from: parent.to_string(),
                to: child.to_string(),
                range: hex(*range),
            },
            Migration::Absorption {
                departed,
                successor,
                range,
                ..
            } => MigrationView {
                kind: "absorption",
                from: departed.to_string(),
                to: successor.to_string(),
                range: hex(*range),
            },
            Migration::Shift {
                from, to, range, ..
            } => MigrationView {
                kind: "shift",
                from: from.to_string(),
                to: to.to_string(),
                range: hex(*range),
            },
        })
        .collect();
    RingView {
        epoch: map.epoch(),
        replication_factor: map.replication_factor(),
        leader: leader.map(|l| l.to_string()),
        me: cl.me.to_string(),
        ring: format!("{:x}", map.ring()),
        // Said on every status: a ring without a secret or TLS is open to anyone on its
        // network.
        peers: cl.auth.mode(),
        cells,
        migrations,
    }
}

impl RingView {
    /// `cluster status`'s text (docs/protocol.md, "Admin interface").
    pub fn text(&self) -> String {
        let mut out = format!(
            "EPOCH {} RF {} LEADER {} SELF {} RING {} PEERS {}\r\n",
            self.epoch,
            self.replication_factor,
            self.leader.as_deref().unwrap_or("-"),
            self.me,
            self.ring,
            self.peers
        );
        for c in &self.cells {
            let range = c
                .range
                .as_ref()
                .map_or("-".to_string(), |[a, b]| format!("{a}-{b}"));
            let memory = c.memory.as_ref().map_or("unreachable".to_string(), |m| {
                format!("bytes={} limit={} items={}", m.bytes, m.limit, m.items)
            });
            out.push_str(&format!(
                "CELL {} {} client={} peer={} range={} role={} {}\r\n",
                c.id, c.state, c.client, c.peer, range, c.role, memory
            ));
        }
        for m in &self.migrations {
            let (from, to) = match m.kind {
                "division" => ("parent", "child"),
                "shift" => ("from", "to"),
                _ => ("departed", "successor"),
            };
            out.push_str(&format!(
                "MIGRATION {} {from}={} {to}={} range={}-{}\r\n",
                m.kind, m.from, m.to, m.range[0], m.range[1]
            ));
        }
        out.push_str("END\r\n");
        out
    }
}

/// An Active cell's client address, as auto discovery and DNS give it out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveCell {
    pub id: String,
    pub host: String,
    /// Only when the cell is advertised by an IP: a host name is not resolved here (this
    /// runs on engine threads, which never block).
    pub ip: Option<std::net::IpAddr>,
    pub port: u16,
}

impl Cluster {
    /// The map's epoch and its Active cells' client addresses (`config get cluster`, DNS).
    pub fn live_cells(&self) -> (u64, Vec<LiveCell>) {
        let map = self.lock_ring().map().clone();
        let cells = map
            .cells()
            .iter()
            .filter(|c| c.state == CellState::Active)
            .filter_map(|c| {
                let (host, port) = c.address.client.rsplit_once(':')?;
                let host = host.trim_start_matches('[').trim_end_matches(']');
                Some(LiveCell {
                    id: c.id.to_string(),
                    host: host.to_string(),
                    ip: host.parse().ok(),
                    port: port.parse().ok()?,
                })
            })
            .collect();
        (map.epoch(), cells)
    }
}
