//! The ring as one cell sees it, gathered once and shown two ways: the text of `cluster
//! status` / `GET /cluster/status` (`ctl status`), and the JSON of `GET /cells` (dashboards,
//! scripts). Each cell's memory is asked of that cell (its `stats`, and for `/cells` its
//! `stats cellcache` too: service times and replication lag), within 500 ms, else it is
//! reported unreachable.

use std::sync::Arc;
use std::time::Duration;

use cellcache_cluster::wire::FrameKind;
use cellcache_cluster::{CellState, HashRange, Migration};
use serde::Serialize;

use super::Cluster;

/// The request that asks one cell for its own `stats cellcache`.
const OWN_STATS: &[u8] = b"stats cellcache\r\n";

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
    /// Its request service time histogram (`crate::latency`, since its start or `stats
    /// reset`), when it answered: a dashboard takes a percentile of two readings' difference.
    pub latency: Option<LatencyView>,
    /// What it has queued for its replication targets and not yet had acknowledged, and
    /// its snapshot streams running, when it answered.
    pub replication: Option<ReplicationView>,
}

#[derive(Debug, Serialize)]
pub struct LatencyView {
    /// Bucket bounds in microseconds (a last, unbounded bucket is implied).
    pub bounds_us: Vec<u64>,
    /// Requests at or under each bound (cumulative).
    pub cumulative: Vec<u64>,
    /// Every request measured (the unbounded bucket's cumulative count).
    pub count: u64,
}

#[derive(Debug, Serialize)]
pub struct ReplicationView {
    /// Records queued for all its targets and not yet acknowledged.
    pub lag_records: u64,
    /// Their bytes.
    pub queue_bytes: u64,
    /// Snapshot streams (hand-off, re-replication) it runs.
    pub streams_active: u64,
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

/// A cell's histogram from its `stats cellcache` lines, if they are all there.
fn latency_view(stats: &str) -> Option<LatencyView> {
    let bounds_us: Vec<u64> = (0..crate::latency::BUCKETS)
        .map(crate::latency::bound_us)
        .collect();
    let cumulative = bounds_us
        .iter()
        .map(|b| stat(stats, &format!("request_duration_us_le_{b}")))
        .collect::<Option<Vec<u64>>>()?;
    Some(LatencyView {
        bounds_us,
        cumulative,
        count: stat(stats, "request_duration_count")?,
    })
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
    /// `stats cellcache` (this cell's own: a cell asked by another answers for itself).
    Own,
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
                CellStats::Own => crate::stats::reply(
                    &cl.cell,
                    &cellcache_proto::StatsGroup::Other(b"cellcache"),
                    cl.cell.now(),
                    &mut o,
                ),
            }
            asks.push(tokio::spawn(async move { Some(o) }));
        } else if let Some(link) = cl.link(&c.id) {
            // Another cell's general figures come with its `stats cell estimate`.
            let request = match which {
                CellStats::Own => OWN_STATS,
                _ => super::stats::CELL_ESTIMATE_STATS,
            };
            asks.push(tokio::spawn(async move {
                let call = link.call(FrameKind::ForwardRequest, request.to_vec());
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

/// How much of each cell [`gather`] asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gather {
    /// Its memory and counters (`stats`): `cluster status`.
    Memory,
    /// Those, its service times and its replication lag (`stats cellcache` too): `/cells`.
    Figures,
}

/// Gathers the view: the map under its lock, then each cell's figures without it.
pub async fn gather(cl: &Arc<Cluster>, what: Gather) -> RingView {
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
    let (answers, own) = if what == Gather::Figures {
        tokio::join!(
            cell_stats(cl, &map, CellStats::General),
            cell_stats(cl, &map, CellStats::Own)
        )
    } else {
        let answers = cell_stats(cl, &map, CellStats::General).await;
        let own = vec![None; answers.len()];
        (answers, own)
    };
    for ((c, stats), own) in map.cells().iter().zip(answers).zip(own) {
        let text = stats.map(|s| String::from_utf8_lossy(&s).into_owned());
        let own = own.map(|s| String::from_utf8_lossy(&s).into_owned());
        let latency = own.as_deref().and_then(latency_view);
        let replication = own.as_deref().and_then(|s| {
            Some(ReplicationView {
                lag_records: stat(s, "cluster_replication_lag_records")?,
                queue_bytes: stat(s, "cluster_replication_queue_bytes")?,
                streams_active: stat(s, "cluster_streams_active")?,
            })
        });
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
            latency,
            replication,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cells_histogram_is_read_from_its_stats_cellcache() {
        let cell = crate::latency::Latency::default();
        let mut local = crate::latency::LocalLatency::default();
        local.record(Duration::from_micros(3), 4);
        local.record(Duration::from_millis(1), 1);
        cell.absorb(&mut local);
        let mut raw = b"STAT protocol_errors 0\r\n".to_vec();
        cell.write_stats(&mut raw);
        let view = latency_view(&String::from_utf8_lossy(&raw)).expect("every line is there");
        assert_eq!(view.count, 5);
        assert_eq!(view.bounds_us.len(), crate::latency::BUCKETS);
        assert_eq!(view.bounds_us[..3], [1, 2, 4]);
        assert_eq!(view.cumulative[..3], [0, 0, 4]);
        assert_eq!(view.cumulative.last(), Some(&5));
        // A cell whose stats lack the lines (an older version) shows none.
        assert!(latency_view("STAT request_duration_count 5\r\n").is_none());
    }
}
