//! The autoscaler's driver (SPEC E1–E2): on the consensus leader — one per ring, and the
//! next leader takes over after a failover — every `autoscale.sample_interval_ms` it asks
//! every cell for its memory (`stats cell estimate`: live bytes, limit, the bytes of what
//! it masters — estimated from its ranges, so no cell walks its items each second —,
//! evictions, whether a provisioner started it), hands the sample to the pure policy
//! (`cellcache_cluster::autoscale`) and carries out its decision:
//! - **divide**: the provisioner starts a cell that joins through this cell as a division of
//!   the full one (`cluster.divide`); a start that fails, a cell that dies before joining,
//!   or one not in the map within `join_timeout_ms` is reported and retried with backoff,
//!   the ring serving (and, if full, evicting as memcached would) meanwhile;
//! - **absorb**: proposes the idle provisioned cell's absorption (as `ctl leave`); once it
//!   is gone from the map its provisioner stops what is left of it.
//!
//! Every decision is one `autoscale` log line with its reason, an event of the ring's recent
//! events (`GET /events`) and a record kept for `ctl autoscale status` (`GET /autoscale`).
//! `ctl autoscale on|off` switches every cell of the ring.

use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use cellcache_cluster::autoscale::{Autoscaler, CellReport, Decision, Figures, Observation};
use cellcache_cluster::{CellId, CellState, ClusterMap};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use super::Cluster;
use crate::provision::{Provisioner, StartRequest, Started, StopRequest};

/// One cell's autoscaling: the switch, the provisioner and the decider's state.
pub struct Autoscale {
    enabled: AtomicBool,
    provisioner: Arc<dyn Provisioner>,
    /// Lock order: a leaf lock (never held across an `.await`).
    state: Mutex<State>,
}

struct State {
    policy: Autoscaler,
    /// Started cells not yet in the map, by the cell they divide.
    attempts: Vec<(CellId, Started)>,
    /// Whether this cell decided at the last sample (it was the leader).
    deciding: bool,
    decisions: VecDeque<Record>,
    kept: usize,
    /// Decisions this cell made, by action: divide, absorb, failed.
    counts: [u64; 4],
}

/// One decision and what became of it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Record {
    /// Seconds since the Unix epoch.
    pub at: u64,
    /// `divide`, `absorb`, or `failed` (a start or absorption that did not happen).
    pub action: String,
    pub cell: String,
    pub reason: String,
}

/// `GET /autoscale`: the switch, the decider and its recent decisions.
#[derive(Debug, Serialize, Deserialize)]
pub struct Status {
    pub enabled: bool,
    pub provisioner: String,
    /// The cell that answered decides (it leads the consensus group).
    pub deciding: bool,
    pub cell: String,
    /// The policy's settings.
    #[serde(flatten)]
    pub policy: cellcache_cluster::autoscale::PolicyConfig,
    /// What a division is expected to take (learned from the last ones).
    pub division_expected_ms: u64,
    pub pending: Vec<serde_json::Value>,
    pub failures: u32,
    pub decisions: Vec<Record>,
}

impl Status {
    /// The text `ctl autoscale status` prints.
    pub fn text(&self) -> String {
        let mut out = format!(
            "AUTOSCALE {} provisioner={} decider={} high_water={} low_water={} window_ms={} \
             cooldown_ms={} cells={}..{} division_expected_ms={} failures={}\r\n",
            if self.enabled { "on" } else { "off" },
            self.provisioner,
            // Off and not deciding: nobody decides, which "elsewhere" would deny.
            match (self.deciding, self.enabled) {
                (true, _) => &self.cell,
                (false, true) => "elsewhere",
                (false, false) => "none",
            },
            self.policy.high_water,
            self.policy.low_water,
            self.policy.window_ms,
            self.policy.cooldown_ms,
            self.policy.min_cells,
            self.policy.max_cells,
            self.division_expected_ms,
            self.failures,
        );
        for p in &self.pending {
            out.push_str(&format!("PENDING {p}\r\n"));
        }
        for d in &self.decisions {
            out.push_str(&format!(
                "DECISION {} {} {} {}\r\n",
                d.at, d.action, d.cell, d.reason
            ));
        }
        out.push_str("END\r\n");
        out
    }
}

impl Autoscale {
    pub fn new(config: &crate::config::NodeConfig, provisioner: Arc<dyn Provisioner>) -> Self {
        let a = &config.autoscale;
        Autoscale {
            enabled: AtomicBool::new(a.enabled),
            provisioner,
            state: Mutex::new(State {
                policy: Autoscaler::new(a.policy()),
                attempts: Vec::new(),
                deciding: false,
                decisions: VecDeque::new(),
                kept: a.decisions_kept,
                counts: [0; 4],
            }),
        }
    }

    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Acquire)
    }

    /// Switches this cell's autoscaling; returns whether it was on.
    pub fn set_enabled(&self, on: bool) -> bool {
        let was = self.enabled.swap(on, Ordering::AcqRel);
        if was != on {
            tracing::info!(on, "autoscale switched");
        }
        was
    }

    pub fn status(&self, cell: String) -> Status {
        let s = self.state.lock();
        Status {
            enabled: self.enabled(),
            provisioner: self.provisioner.kind().to_string(),
            deciding: s.deciding,
            cell,
            policy: s.policy.config().clone(),
            division_expected_ms: s.policy.division_lead_ms(),
            pending: s
                .policy
                .pending()
                .iter()
                .filter_map(|p| serde_json::to_value(p).ok())
                .collect(),
            failures: s.policy.failures(),
            decisions: s.decisions.iter().cloned().collect(),
        }
    }

    /// Decisions this cell made as the decider (`/metrics`), by action.
    pub fn counts(&self) -> [(&'static str, u64); 4] {
        let c = self.state.lock().counts;
        [
            ("divide", c[0]),
            ("absorb", c[1]),
            ("failed", c[2]),
            ("balance", c[3]),
        ]
    }

    /// The ring is shutting down: the provisioner stops what it started here.
    pub fn shutdown(&self) {
        self.provisioner.shutdown();
    }
}

impl State {
    fn record(&mut self, cl: &Cluster, action: &'static str, cell: String, reason: String) {
        tracing::info!(target: "cellcache::autoscale", action, %cell, %reason, "autoscale");
        let slot = match action {
            "divide" => 0,
            "absorb" => 1,
            "balance" => 3,
            _ => 2,
        };
        self.counts[slot] += 1;
        let at = crate::cell::unix_now_secs();
        cl.note_event(super::events::Event {
            epoch: cl.epoch(),
            at,
            kind: match action {
                "divide" => "autoscale_divide",
                "absorb" => "autoscale_absorb",
                "balance" => "autoscale_balance",
                _ => "autoscale_failed",
            },
            cell: cell.clone(),
            other: String::new(),
            range: ["".into(), "".into()],
            reason: reason.clone(),
        });
        if self.kept == 0 {
            return;
        }
        while self.decisions.len() >= self.kept {
            self.decisions.pop_front();
        }
        self.decisions.push_back(Record {
            at,
            action: action.to_string(),
            cell,
            reason,
        });
    }
}

/// Starts the decider on the peer runtime.
pub fn spawn(cl: &Arc<Cluster>, scale: Arc<Autoscale>) {
    let cl2 = cl.clone();
    let every = Duration::from_millis(cl.cell.config.autoscale.sample_interval_ms.max(10));
    cl.handle.spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if cl2.cell.shutdown.is_triggered() {
                break;
            }
            step(&cl2, &scale).await;
        }
    });
}

fn leads(cl: &Cluster) -> bool {
    cl.raft.get().is_some_and(|r| r.leader() == Some(r.id()))
}

/// One sample and what follows from it.
async fn step(cl: &Arc<Cluster>, scale: &Arc<Autoscale>) {
    if !scale.enabled() || !leads(cl) {
        let mut s = scale.state.lock();
        if s.deciding {
            s.policy.reset();
            s.deciding = false;
            s.attempts.clear();
        }
        return;
    }
    let map = cl.lock_ring().map().clone();
    let low_water = cl.cell.config.autoscale.low_water;
    let cells = sample(cl, &map, scale.provisioner.as_ref(), low_water).await;
    let now = cl.now_ms();
    // A started cell that died (or whose container exited) before joining has failed.
    let attempts = scale.state.lock().attempts.clone();
    for (cell, started) in attempts {
        if !scale.provisioner.alive(&started).await {
            let mut s = scale.state.lock();
            s.policy.failed(&cell, now);
            s.attempts.retain(|(c, _)| *c != cell);
            s.record(
                cl,
                "failed",
                cell.to_string(),
                "the started cell stopped before joining".into(),
            );
        }
    }
    let busy: BTreeSet<CellId> = map
        .migrations()
        .iter()
        .flat_map(|m| m.involved().iter().cloned())
        .collect();
    let obs = Observation {
        now_ms: now,
        replication_factor: usize::from(map.replication_factor()),
        busy: &busy,
        cells: &cells,
    };
    let (step, abandoned) = {
        let mut s = scale.state.lock();
        s.deciding = true;
        let step = s.policy.observe(&obs);
        let mut abandoned = Vec::new();
        for d in step.done.iter().chain(&step.timed_out) {
            if let Some(i) = s.attempts.iter().position(|(c, _)| c == d.cell()) {
                let (_, started) = s.attempts.remove(i);
                if step.timed_out.contains(d) {
                    abandoned.push(started);
                }
            }
        }
        (step, abandoned)
    };
    for d in &step.timed_out {
        let reason = format!(
            "{} of {} not seen in the map within {} ms",
            match d {
                Decision::Divide { .. } => "the division",
                Decision::Absorb { .. } => "the absorption",
                Decision::Balance { .. } => "the shift",
            },
            d.cell(),
            cl.cell.config.autoscale.join_timeout_ms
        );
        scale
            .state
            .lock()
            .record(cl, "failed", d.cell().to_string(), reason);
    }
    for started in abandoned {
        stop_started(scale, started).await;
    }
    for d in step.decisions {
        match d {
            d @ Decision::Divide { .. } => divide(cl, scale, d).await,
            d @ Decision::Absorb { .. } => absorb(cl, scale, d, &map).await,
            d @ Decision::Balance { .. } => balance(cl, scale, d).await,
        }
    }
}

/// Moves the boundary between two neighbours (a shift): proposed here, carried out by the
/// giving cell (it streams the part to the cells that will hold it, then completes).
async fn balance(cl: &Arc<Cluster>, scale: &Arc<Autoscale>, d: Decision) {
    let Decision::Balance {
        cell, to, share, ..
    } = &d
    else {
        return;
    };
    scale
        .state
        .lock()
        .record(cl, "balance", cell.to_string(), d.reason().to_string());
    if let Err(e) = cl.shift(cell.clone(), to.clone(), *share).await {
        let mut s = scale.state.lock();
        s.policy.failed(cell, cl.now_ms());
        s.record(
            cl,
            "failed",
            cell.to_string(),
            format!("shift refused: {e}"),
        );
    }
}

async fn stop_started(scale: &Arc<Autoscale>, started: Started) {
    let request = StopRequest {
        cell: None,
        client: started.client.clone(),
        peer: None,
        handle: Some(started.handle.clone()),
    };
    if let Err(e) = scale.provisioner.stop(&request).await {
        tracing::warn!(error = %e, handle = %started.handle, "stopping a cell that did not join");
    }
}

async fn divide(cl: &Arc<Cluster>, scale: &Arc<Autoscale>, d: Decision) {
    let cell = d.cell().clone();
    scale
        .state
        .lock()
        .record(cl, "divide", cell.to_string(), d.reason().to_string());
    let request = StartRequest {
        join: cl.address.peer.clone(),
        divide: cell.to_string(),
        ring: format!("{:x}", cl.ring_id),
    };
    match scale.provisioner.start(&request).await {
        Ok(started) => scale.state.lock().attempts.push((cell, started)),
        Err(e) => {
            let mut s = scale.state.lock();
            s.policy.failed(&cell, cl.now_ms());
            s.record(
                cl,
                "failed",
                cell.to_string(),
                format!("starting a cell: {e}"),
            );
        }
    }
}

async fn absorb(cl: &Arc<Cluster>, scale: &Arc<Autoscale>, d: Decision, map: &ClusterMap) {
    let id = d.cell().clone();
    scale
        .state
        .lock()
        .record(cl, "absorb", id.to_string(), d.reason().to_string());
    let address = map.cell(&id).map(|c| c.address.clone());
    if let Err(e) = cl.leave(id.clone()).await {
        let mut s = scale.state.lock();
        s.policy.failed(&id, cl.now_ms());
        s.record(
            cl,
            "failed",
            id.to_string(),
            format!("absorption refused: {e}"),
        );
        return;
    }
    // Once it is out of the map, what is left of it goes (it normally stops by itself).
    let cl = cl.clone();
    let scale = scale.clone();
    let wait = Duration::from_millis(cl.cell.config.autoscale.join_timeout_ms);
    tokio::spawn(async move {
        let until = tokio::time::Instant::now() + wait;
        while cl.lock_ring().map().cell(&id).is_some() && tokio::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let request = StopRequest {
            cell: Some(id.to_string()),
            client: address.as_ref().map(|a| a.client.clone()),
            peer: address.as_ref().map(|a| a.peer.clone()),
            handle: None,
        };
        if let Err(e) = scale.provisioner.stop(&request).await {
            tracing::warn!(cell = %id, error = %e, "stopping an absorbed cell");
        }
    });
}

/// The `stats` counters whose sum is a cell's load: the key requests it executed (as
/// master: a request is counted by the cell that runs it, not by one that forwards it).
const LOAD_COUNTERS: [&str; 9] = [
    "cmd_get",
    "cmd_set",
    "cmd_touch",
    "delete_hits",
    "delete_misses",
    "incr_hits",
    "incr_misses",
    "decr_hits",
    "decr_misses",
];

/// Every cell's figures (`None` for a cell that did not answer in time), in ring order,
/// and whether autoscaling may absorb it.
async fn sample(
    cl: &Arc<Cluster>,
    map: &ClusterMap,
    provisioner: &dyn Provisioner,
    low_water: f64,
) -> Vec<CellReport> {
    let mut out = Vec::with_capacity(map.cells().len());
    let answers = super::view::cell_stats(cl, map, super::view::CellStats::Estimate).await;
    for (c, text) in map.cells().iter().zip(answers) {
        let stats = text.as_deref().and_then(super::stats::parse);
        let num = |name: &str| -> Option<u64> {
            stats
                .as_ref()?
                .iter()
                .find(|(k, _)| k == name)
                .and_then(|(_, v)| v.parse().ok())
        };
        let figures = (|| {
            Some(Figures {
                bytes: num("bytes")?,
                limit: num("limit_maxbytes")?,
                master_bytes: num("cluster_master_bytes_estimate")?,
                evictions: num("evictions")?,
                requests: LOAD_COUNTERS.iter().map(|n| num(n)).sum::<Option<u64>>()?,
            })
        })();
        // Started by a provisioner, and one this provisioner can give back now (a
        // StatefulSet gives back its highest-ordinal pod only). Asked only of cells below
        // low water, the only ones the policy would absorb: for some provisioners it is a
        // call to their platform's API.
        let low = figures.is_some_and(|f| (f.bytes as f64) < low_water * f.limit as f64);
        let provisioned = num("cluster_provisioned") == Some(1)
            && low
            && provisioner.absorbable(&c.address.client).await;
        out.push(CellReport {
            id: c.id.clone(),
            active: c.state == CellState::Active,
            provisioned,
            figures,
            share: c
                .range
                .filter(|_| c.state == CellState::Active)
                .map_or(0.0, |r| r.len() as f64 / 2f64.powi(64)),
        });
    }
    out
}

/// The `Control` commands of the peer plane (`cluster::ext`): `autoscale status` (this
/// cell's, as JSON) and `autoscale on|off` (this cell's switch).
pub fn control(cl: &Arc<Cluster>, word: &str) -> Vec<u8> {
    let Some(scale) = cl.autoscale.get() else {
        return b"SERVER_ERROR autoscale unavailable\r\n".to_vec();
    };
    match word {
        "status" => {
            let mut out = serde_json::to_vec(&scale.status(cl.me.to_string())).unwrap_or_default();
            out.extend_from_slice(b"\r\n");
            out
        }
        "on" | "off" => {
            scale.set_enabled(word == "on");
            b"OK\r\n".to_vec()
        }
        _ => b"CLIENT_ERROR unknown autoscale command (status, on, off)\r\n".to_vec(),
    }
}

/// Sends `line` to the cell whose peer address is `peer`; its reply, `None` (logged) if none.
async fn call(cl: &Arc<Cluster>, peer: String, line: &'static str) -> Option<String> {
    cl.operator_call(peer, line.to_string())
        .await
        .map_err(|error| tracing::info!(%error, "autoscale call"))
        .ok()
}

/// The ring's autoscaling as the deciding cell (the consensus leader) sees it: asked of it
/// when that is another cell, this cell's own otherwise or when it does not answer.
pub async fn ring_status(cl: &Arc<Cluster>) -> Option<Status> {
    let scale = cl.autoscale.get()?;
    let leader = cl
        .raft
        .get()
        .and_then(|r| r.leader())
        .and_then(|l| cl.cell_of_raft_id(l))
        .filter(|l| *l != cl.me);
    let peer = leader.and_then(|l| {
        cl.lock_ring()
            .map()
            .cell(&l)
            .map(|c| c.address.peer.clone())
    });
    if let Some(peer) = peer
        && let Some(reply) = call(cl, peer, "autoscale status").await
        && let Ok(v) = serde_json::from_str(reply.trim_end())
    {
        return Some(v);
    }
    Some(scale.status(cl.me.to_string()))
}

/// Switches autoscaling on every cell of the ring; `OK <switched> of <cells> cells`.
pub async fn switch_ring(cl: &Arc<Cluster>, on: bool) -> Vec<u8> {
    let Some(scale) = cl.autoscale.get() else {
        return b"SERVER_ERROR autoscale unavailable\r\n".to_vec();
    };
    scale.set_enabled(on);
    let peers: Vec<String> = cl.peers().into_iter().map(|(_, peer)| peer).collect();
    let line = if on { "autoscale on" } else { "autoscale off" };
    let mut switched = 1;
    for peer in &peers {
        if call(cl, peer.clone(), line)
            .await
            .is_some_and(|r| r.starts_with("OK"))
        {
            switched += 1;
        }
    }
    format!("OK {switched} of {} cells\r\n", peers.len() + 1).into_bytes()
}

#[cfg(test)]
mod tests {
    use super::Status;

    fn status(enabled: bool, deciding: bool) -> Status {
        Status {
            enabled,
            provisioner: "local".into(),
            deciding,
            cell: "2".into(),
            policy: cellcache_cluster::autoscale::PolicyConfig::default(),
            division_expected_ms: 0,
            pending: Vec::new(),
            failures: 0,
            decisions: Vec::new(),
        }
    }

    fn decider(s: &Status) -> String {
        let text = s.text();
        let word = text.split_whitespace().find(|w| w.starts_with("decider="));
        word.expect("a decider= field").to_string()
    }

    #[test]
    fn the_status_line_names_who_decides() {
        assert_eq!(decider(&status(true, true)), "decider=2");
        assert_eq!(decider(&status(true, false)), "decider=elsewhere");
        // Autoscaling off on the cell asked, the leader: nobody decides.
        assert_eq!(decider(&status(false, false)), "decider=none");
    }
}
