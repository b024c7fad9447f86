//! The cell as a member of a ring: peer plane, consensus group, ring driver, forwarding and
//! replication. See docs/cluster.md sections 5–7 for the design.
//!
//! Threads: the client I/O engines stay as they are. Everything inter-cell runs on a small
//! tokio runtime owned by the [`Cluster`] (`cellcache-peer` threads): the peer listener
//! ([`server`]), one connection task per peer ([`link`]), openraft's tasks ([`group`]), one
//! replication sender per backup ([`repl`]) and the ring driver, which ticks the
//! deterministic `cellcache_cluster::Ring` every few milliseconds and executes what it asks
//! for (messages, proposals, map confirmations, hand-offs, re-replication, trimming). The
//! request path ([`route`]) reads the ring under a short lock to decide where a request
//! runs, and hands forwarded work to the runtime without ever blocking an engine worker.

pub mod ext;
pub mod flush;
pub mod group;
pub mod link;
pub mod order;
pub mod repl;
pub mod restart;
pub mod route;
pub mod server;
pub mod stats;

use std::collections::{BTreeSet, HashMap};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::Context;
use cellcache_cluster::raft::RaftGroup;
use cellcache_cluster::wire::FrameKind;
use cellcache_cluster::{
    CellAddress, CellId, CellState, Change, ClusterMap, Consensus, HashRange, Migration, Output,
    Proposal, Ring, RingMessage,
};
use parking_lot::Mutex;

use crate::cell::Cell;
use crate::config::ClusterConfig;
use link::Link;
use repl::Replicator;

/// Cluster counters for `stats` and `ctl status`.
#[derive(Debug, Default)]
pub struct ClusterStats {
    pub forwarded: AtomicU64,
    pub refused: AtomicU64,
    pub unavailable: AtomicU64,
    pub replicate_refused: AtomicU64,
    pub maps_installed: AtomicU64,
    /// Crash suspicions this cell, as the consensus leader, refused because the suspect
    /// answered its probe ([`group::vet`]).
    pub suspicions_refuted: AtomicU64,
    /// Replicated items that arrived in parts (values over `replication_chunk_bytes`) and
    /// were rebuilt and stored.
    pub values_rebuilt: AtomicU64,
    /// Snapshot streams started as a division's parent (a restart counts again).
    pub handoff_streams: AtomicU64,
    /// Snapshot streams started to re-replicate a range to a backup.
    pub resync_streams: AtomicU64,
    /// Flushes of this cell's master range (a client's `flush_all`, or a delayed one due).
    pub flushes: AtomicU64,
    /// Flush records applied as a backup (one per flush of each master this cell backs up).
    pub flushes_applied: AtomicU64,
}

/// This cell's membership of a ring; see the module docs.
pub struct Cluster {
    pub me: CellId,
    /// The ring's identity ([`ClusterMap::ring`]): peers of another ring are refused.
    pub ring_id: u64,
    pub address: CellAddress,
    pub config: ClusterConfig,
    pub cell: Arc<Cell>,
    pub handle: tokio::runtime::Handle,
    pub ring: Mutex<Ring>,
    /// The installed map's epoch, stamped on every frame.
    pub epoch: Arc<AtomicU64>,
    pub repl: Arc<Replicator>,
    pub raft: OnceLock<RaftGroup>,
    pub stats: ClusterStats,
    /// Replication receiver: highest sequence applied per sending master, per lane.
    pub applied: Mutex<HashMap<CellId, Applied>>,
    /// Outbound links by peer and [`Channel`].
    links: Mutex<HashMap<(CellId, Channel), Arc<Link>>>,
    raft_ids: Mutex<HashMap<u64, CellId>>,
    streams: Mutex<BTreeSet<(CellId, (u64, u64))>>,
    reconciling: AtomicBool,
    /// This cell is leaving the ring: it stops the process once removed from the map.
    leaving: AtomicBool,
    /// Delayed `flush_all`s this cell must keep or may have to (see [`flush`]).
    flushes: Mutex<flush::PendingFlushes>,
    /// What the membership file says now (see [`restart`]).
    membership: Mutex<Option<restart::Membership>>,
    /// Per-key order of routed requests (see [`order`]).
    order: order::Order,
    clock: Instant,
}

impl Cluster {
    /// Milliseconds on this cell's monotonic clock (the ring's time).
    pub fn now_ms(&self) -> u64 {
        self.clock.elapsed().as_millis() as u64 + 1
    }

    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Joins through `join` (as a division of `parent`, default the largest range) or, with
    /// `join` empty, bootstraps; starts the peer plane and the consensus group, and installs
    /// the result in `cell.cluster`. Blocks until the cell has a map it is part of.
    pub fn start(
        cell: Arc<Cell>,
        repl: Arc<Replicator>,
        join: &str,
        parent: Option<&CellId>,
    ) -> anyhow::Result<Arc<Cluster>> {
        let config = cell.config.cluster.clone();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("cellcache-peer")
            .enable_all()
            .build()
            .context("starting the peer runtime")?;
        let client = cell.config.server.addr();
        let peer_listener = bind_peer(client, config.peer_port)?;
        let peer = peer_listener.local_addr()?;
        let host = if config.advertise_host.is_empty() {
            client.ip().to_string()
        } else {
            config.advertise_host.clone()
        };
        let join_host = |port: u16| match host.parse::<std::net::IpAddr>() {
            Ok(ip) => SocketAddr::new(ip, port).to_string(),
            Err(_) => format!("{host}:{port}"),
        };
        let address = CellAddress {
            client: join_host(client.port()),
            peer: join_host(peer.port()),
        };
        tracing::info!(client = %address.client, peer = %address.peer, "peer listener bound");
        // A first cell restarted with its original command line rejoins its ring, if that is
        // still alive, instead of starting a second one (see `restart`).
        let rejoin = if join.is_empty() {
            let file = restart::file_path(&config.state_dir, &address.client);
            restart::ring_to_rejoin(
                file.as_deref(),
                &address,
                Duration::from_millis(config.request_timeout_ms),
            )?
        } else {
            None
        };
        let join = rejoin.as_deref().unwrap_or(join);
        let (me, map, bootstrap) = if join.is_empty() {
            let me = CellId::whole(1);
            let map = ClusterMap::bootstrap_ring(
                me.clone(),
                address.clone(),
                config.replication_factor,
                new_ring_id(),
            )
            .context("bootstrap map")?;
            (me, map, true)
        } else {
            let map = join_ring(
                join,
                &address,
                parent,
                config.request_timeout_ms,
                &cell.shutdown,
            )?;
            let me = map
                .cells()
                .iter()
                .find(|c| c.address == address)
                .map(|c| c.id.clone())
                .context("the ring's map does not contain this cell")?;
            (me, map, false)
        };
        tracing::info!(cell = %me, epoch = map.epoch(), bootstrap, "ring membership");
        let clock = Instant::now();
        let ring = Ring::new(me.clone(), map.clone(), config.ring, 1);
        let cluster = Arc::new(Cluster {
            me: me.clone(),
            ring_id: map.ring(),
            address,
            config: config.clone(),
            cell,
            handle: runtime.handle().clone(),
            ring: Mutex::new(ring),
            epoch: Arc::new(AtomicU64::new(map.epoch())),
            repl,
            raft: OnceLock::new(),
            stats: ClusterStats::default(),
            applied: Mutex::new(HashMap::new()),
            links: Mutex::new(HashMap::new()),
            raft_ids: Mutex::new(HashMap::new()),
            streams: Mutex::new(BTreeSet::new()),
            reconciling: AtomicBool::new(false),
            leaving: AtomicBool::new(false),
            flushes: Mutex::new(flush::PendingFlushes::default()),
            membership: Mutex::new(None),
            order: order::Order::default(),
            clock,
        });
        cluster.learn_ids(&map);
        cluster.remember_membership(&map);
        let transport = Arc::new(group::Transport {
            cluster: Arc::downgrade(&cluster),
        });
        let raft = runtime.block_on(async {
            let listener = tokio::net::TcpListener::from_std(peer_listener)?;
            tokio::spawn(server::accept_loop(cluster.clone(), listener));
            let raft =
                RaftGroup::start(group::raft_id(&me), map.clone(), config.raft, transport).await?;
            if bootstrap {
                let voters = [(group::raft_id(&me), me.clone())].into_iter().collect();
                raft.initialize(&voters).await?;
            }
            anyhow::Ok(raft)
        })?;
        let _ = cluster.raft.set(raft);
        let outputs = cluster.ring.lock().drain_outputs();
        cluster.refresh_layout();
        cluster.process(outputs);
        runtime.spawn(cluster.clone().drive());
        let _ = cluster.cell.cluster.set(cluster.clone());
        *cluster.cell.cluster_runtime.lock() = Some(runtime);
        Ok(cluster)
    }

    /// What this cell is in the middle of, in words, for the log line of a cell stopped by
    /// a signal: receiving its range (joining), handing its range over (leaving), sending
    /// a range to a new cell or a backup. Empty when it is simply serving.
    pub fn in_progress(&self) -> Vec<String> {
        let mut work = Vec::new();
        let state = self.ring.lock().map().cell(&self.me).map(|c| c.state);
        match state {
            Some(CellState::Joining) => {
                work.push("joining the ring (its range had not all arrived)".to_string())
            }
            Some(CellState::Leaving) => {
                work.push("leaving the ring (its successor was taking its range over)".into())
            }
            _ if self.leaving.load(Ordering::Acquire) => {
                work.push("leaving the ring (its successor was taking its range over)".into())
            }
            _ => {}
        }
        for (to, (start, end)) in self.streams.lock().iter() {
            work.push(format!(
                "sending range {start:016x}-{end:016x} to cell {to} (hand-off or re-replication)"
            ));
        }
        work
    }

    fn learn_ids(&self, map: &ClusterMap) {
        let mut ids = self.raft_ids.lock();
        for c in map.cells() {
            ids.insert(group::raft_id(&c.id), c.id.clone());
        }
    }

    pub fn cell_of_raft_id(&self, id: u64) -> Option<CellId> {
        self.raft_ids.lock().get(&id).cloned()
    }

    /// The control link to `to`: forwarded requests, ring messages, consensus, maps.
    /// `None` if `to` is not a live cell of the installed map.
    pub fn link(&self, to: &CellId) -> Option<Arc<Link>> {
        self.link_on(to, Channel::Control)
    }

    /// The bulk link to `to`: replication and snapshot streams, so that a busy stream never
    /// queues a forwarded request, a heartbeat or a lease grant behind its chunks.
    pub fn bulk_link(&self, to: &CellId) -> Option<Arc<Link>> {
        self.link_on(to, Channel::Bulk)
    }

    /// The link to `to` on `channel`, created on first use from its address in the map.
    /// None for a cell the map no longer has or declared dead: its address may now belong
    /// to a new process (a restarted cell rejoins as a new cell at the same address), which
    /// must never be taken for the old one; the fault tests found a consensus leader
    /// replicating its log to such a process as if it were the departed member, and
    /// panicking on its empty log.
    fn link_on(&self, to: &CellId, channel: Channel) -> Option<Arc<Link>> {
        let addr = {
            let ring = self.ring.lock();
            ring.map()
                .cell(to)
                .filter(|c| c.state != CellState::Dead)
                .map(|c| c.address.peer.clone())
        };
        let mut links = self.links.lock();
        let key = (to.clone(), channel);
        let Some(addr) = addr else {
            links.retain(|(c, _), _| c != to);
            return None;
        };
        if let Some(l) = links.get(&key) {
            if l.addr == addr {
                return Some(l.clone());
            }
        }
        let link = Link::start(
            &self.handle,
            cellcache_cluster::wire::payload::Hello {
                cell: self.me.clone(),
                ring: self.ring_id,
                client: self.address.client.clone(),
            },
            to.clone(),
            addr,
            self.config.wire,
            self.epoch.clone(),
            link::LinkTimeouts {
                connect: Duration::from_millis(self.config.peer_connect_timeout_ms),
                reply: Duration::from_millis(self.config.peer_reply_timeout_ms),
            },
        );
        links.insert(key, link.clone());
        Some(link)
    }

    /// The ring driver: ticks, installs maps the consensus group committed, expires waits.
    async fn drive(self: Arc<Self>) {
        let mut every = tokio::time::interval(Duration::from_millis(10));
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            every.tick().await;
            if let Some(raft) = self.raft.get() {
                let committed = raft.current_map();
                if committed.epoch() > self.epoch() {
                    self.install_map(committed);
                }
            }
            let now = self.now_ms();
            let outputs = {
                let mut ring = self.ring.lock();
                ring.tick(now);
                ring.drain_outputs()
            };
            self.process(outputs);
            self.flush_when_due();
            self.repl.check_waiters();
            for t in self.repl.targets() {
                if t.take_needs_resync() {
                    let (range, handoff) = {
                        let ring = self.ring.lock();
                        let map = ring.map();
                        let range = map.cell(&self.me).and_then(|c| c.range);
                        (range, self.children_in(map).contains(&t.to))
                    };
                    if let Some(range) = range {
                        self.start_stream(t.to.clone(), range, handoff);
                    }
                }
            }
        }
    }

    /// The children of the divisions this cell leads as parent in `map`.
    fn children_in(&self, map: &ClusterMap) -> Vec<CellId> {
        map.migrations()
            .iter()
            .filter_map(|m| match m {
                Migration::Division { parent, child, .. } if *parent == self.me => {
                    Some(child.clone())
                }
                _ => None,
            })
            .collect()
    }

    /// Handles a ring message from a peer.
    pub fn step(self: &Arc<Self>, m: RingMessage) {
        let now = self.now_ms();
        let outputs = {
            let mut ring = self.ring.lock();
            ring.step(m, now);
            ring.drain_outputs()
        };
        self.process(outputs);
    }

    /// Installs a committed map if it is newer than ours.
    pub fn install_map(self: &Arc<Self>, map: ClusterMap) {
        let now = self.now_ms();
        let outputs = {
            let mut ring = self.ring.lock();
            if map.epoch() <= ring.map().epoch() {
                return;
            }
            ring.install_map(map.clone(), now);
            self.epoch.store(ring.map().epoch(), Ordering::Release);
            ring.drain_outputs()
        };
        self.stats.maps_installed.fetch_add(1, Ordering::Relaxed);
        if map
            .cell(&self.me)
            .is_some_and(|c| c.state == CellState::Leaving)
        {
            self.leaving.store(true, Ordering::Release);
        }
        tracing::info!(
            epoch = map.epoch(),
            cells = map.cells().len(),
            "map installed"
        );
        self.learn_ids(&map);
        self.remember_membership(&map);
        self.refresh_layout();
        self.process(outputs);
        self.reconcile_membership();
    }

    /// Replication targets and range under the installed map: backups, plus division
    /// children this cell parents, plus cells it streams to right now that the map still
    /// has alive. A stream to a cell gone from the map (a division child whose division
    /// was aborted, a dead cell) is dropped: [`Cluster::link`] no longer reaches such a
    /// cell, so as a target it would stay unreachable, fail every write of this cell's
    /// range (policy `refuse`), and its stream, which ends only when its target is
    /// closed, would never end. The fault tests found a parent whose successor was killed
    /// mid-division refusing every write of its range until the end of the test.
    fn refresh_layout(self: &Arc<Self>) {
        let (epoch, master, mut targets, children, reachable) = {
            let ring = self.ring.lock();
            let map = ring.map();
            let me = map.cell(&self.me);
            let active = me.is_some_and(|c| c.state == CellState::Active);
            let master = me.and_then(|c| c.range).filter(|_| active);
            let mut targets: Vec<CellId> = if active {
                map.backups(&self.me).iter().map(|c| c.id.clone()).collect()
            } else {
                Vec::new()
            };
            let children = self.children_in(map);
            for child in &children {
                if !targets.contains(child) {
                    targets.push(child.clone());
                }
            }
            // The cells `link` reaches: in the map and not dead.
            let reachable: BTreeSet<CellId> = map
                .cells()
                .iter()
                .filter(|c| c.state != CellState::Dead)
                .map(|c| c.id.clone())
                .collect();
            (map.epoch(), master, targets, children, reachable)
        };
        for (to, _) in self.streams.lock().iter() {
            if !targets.contains(to) && reachable.contains(to) {
                targets.push(to.clone());
            }
        }
        let weak = Arc::downgrade(self);
        let link_for: repl::LinkFor =
            Arc::new(move |c: &CellId| weak.upgrade().and_then(|cl| cl.bulk_link(c)));
        let weak = Arc::downgrade(self);
        let on_refused: repl::OnRefused = Arc::new(move |c: &CellId, epoch: u64| {
            if let Some(cl) = weak.upgrade() {
                if epoch > cl.epoch() {
                    cl.fetch_map_from(c.clone());
                }
            }
        });
        self.repl.set_layout(
            epoch,
            master,
            &targets,
            &children,
            &self.handle,
            &link_for,
            &on_refused,
        );
        self.announce_pending_flushes();
    }

    /// Executes the ring's outputs.
    pub fn process(self: &Arc<Self>, outputs: Vec<Output>) {
        for o in outputs {
            match o {
                Output::Send {
                    to,
                    message: message @ RingMessage::LeaseRelease { .. },
                } => {
                    // The successor of this range may serve it as soon as the backup learns
                    // of the release: first deliver every write made under the lease (the
                    // hand-off's drained tail), then release.
                    let cl = self.clone();
                    self.handle.spawn(async move {
                        let budget = Duration::from_millis(cl.config.ring.lease_ms);
                        if !cl.repl.drained(budget).await {
                            tracing::warn!(to = %to, "replication tail not drained; the lease will expire instead");
                            return;
                        }
                        if let Some(link) = cl.link(&to) {
                            link.send(FrameKind::Heartbeat, message.encode());
                        }
                    });
                }
                Output::Send { to, message } => {
                    let kind = match message {
                        RingMessage::HeartbeatAck { .. } => FrameKind::HeartbeatAck,
                        _ => FrameKind::Heartbeat,
                    };
                    if let Some(link) = self.link(&to) {
                        link.send(kind, message.encode());
                    }
                }
                Output::Propose(p) => {
                    let cl = self.clone();
                    self.handle.spawn(async move {
                        let change = format!("{:?}", p.change);
                        let t = Duration::from_millis(cl.config.ring.proposal_retry_ms);
                        match group::propose(&cl, p, t).await {
                            Ok(map) => cl.install_map(map),
                            Err(e) => {
                                tracing::debug!(%change, error = %e, "proposal not committed")
                            }
                        }
                    });
                }
                Output::Holdings { master, backups } => self.trim(master, backups),
                Output::StartHandOff { child, range } => self.start_stream(child, range, true),
                Output::Resync { to, range } => self.start_stream(to, range, false),
                Output::NeedMap { from } => self.fetch_map_from(from),
                Output::ConfirmMap { epoch, sent_at_ms } => {
                    let cl = self.clone();
                    self.handle.spawn(async move {
                        if group::confirm(&cl, epoch).await {
                            let outputs = {
                                let mut ring = cl.ring.lock();
                                ring.map_confirmed(epoch, sent_at_ms);
                                ring.drain_outputs()
                            };
                            cl.process(outputs);
                        } else {
                            cl.ask_for_map(sent_at_ms);
                        }
                    });
                }
                Output::Fenced if self.leaving.load(Ordering::Acquire) => {
                    tracing::info!(cell = %self.me, "left the ring: stopping");
                    self.cell.shutdown.trigger();
                }
                Output::Fenced => {
                    tracing::error!(cell = %self.me, "this cell was removed from the ring: it no longer serves keys; restart it to rejoin as a new cell");
                }
            }
        }
    }

    /// The consensus group did not confirm our map: it may have moved on without us (this
    /// cell was paused or cut off and removed meanwhile, and the cells that could tell us no
    /// longer talk to a cell outside their map). Ask one other cell of our map for its map,
    /// a different one each round. The fault tests found a resumed cell that never learnt
    /// it had been removed and kept every client waiting for the full request timeout.
    fn ask_for_map(self: &Arc<Self>, round: u64) {
        let others: Vec<CellId> = {
            let ring = self.ring.lock();
            ring.map()
                .cells()
                .iter()
                .filter(|c| c.id != self.me && c.state != CellState::Dead)
                .map(|c| c.id.clone())
                .collect()
        };
        if others.is_empty() {
            return;
        }
        let step = self.config.ring.heartbeat_interval_ms.max(1);
        let pick = (round / step) as usize % others.len();
        self.fetch_map_from(others[pick].clone());
    }

    /// Fetches `from`'s map and installs it if newer.
    pub fn fetch_map_from(self: &Arc<Self>, from: CellId) {
        let Some(link) = self.link(&from) else { return };
        let cl = self.clone();
        self.handle.spawn(async move {
            if let Ok(f) = link.call(FrameKind::MapRequest, Vec::new()).await {
                if f.kind == FrameKind::MapUpdate {
                    if let Ok(m) = ClusterMap::decode(
                        &f.payload,
                        cellcache_cluster::map::MAP_BYTES_MAX_DEFAULT,
                    ) {
                        cl.install_map(m);
                    }
                }
            }
        });
    }

    /// Drops what this cell no longer holds (only once it is Active: a joining cell keeps
    /// what its parent streams).
    fn trim(&self, master: Option<HashRange>, backups: Vec<HashRange>) {
        let Some(master) = master else { return };
        let keep: Vec<HashRange> = std::iter::once(master).chain(backups).collect();
        let dropped: usize = gaps(&keep)
            .into_iter()
            .map(|g| {
                self.cell
                    .store
                    .drop_range(cellcache_store::HashRange::new(g.start, g.end))
            })
            .sum();
        if dropped > 0 {
            tracing::info!(dropped, "items outside this cell's ranges dropped");
        }
    }

    /// Streams a snapshot of `range` (plus live writes) to `to`; reports to the ring.
    fn start_stream(self: &Arc<Self>, to: CellId, range: HashRange, handoff: bool) {
        if !self
            .streams
            .lock()
            .insert((to.clone(), (range.start, range.end)))
        {
            return;
        }
        self.refresh_layout();
        let started = if handoff {
            &self.stats.handoff_streams
        } else {
            &self.stats.resync_streams
        };
        started.fetch_add(1, Ordering::Relaxed);
        let cl = self.clone();
        tracing::info!(to = %to, %range, handoff, "streaming range");
        self.handle.spawn(async move {
            let started = Instant::now();
            let ok = cl.repl.stream(&cl.cell.store, &to, range).await;
            cl.streams.lock().remove(&(to.clone(), (range.start, range.end)));
            tracing::info!(to = %to, %range, ok, ms = started.elapsed().as_millis() as u64, "stream finished");
            if ok {
                let outputs = {
                    let mut ring = cl.ring.lock();
                    if handoff {
                        ring.handoff_caught_up(&to);
                    } else {
                        ring.resync_done(&to, range);
                    }
                    ring.drain_outputs()
                };
                cl.process(outputs);
            }
            cl.refresh_layout();
        });
    }

    /// A predecessor finished re-sending `range` to this cell, under its map `epoch`. The
    /// ring learns it only once this cell installed that map too: the fault tests found a
    /// short re-replication finishing before the map that asked for it was installed here,
    /// so the ring, which starts waiting for it on that install, waited forever and the
    /// absorption never completed.
    pub async fn resync_received(self: &Arc<Self>, from: &CellId, range: HashRange, epoch: u64) {
        let deadline = Instant::now() + Duration::from_millis(self.config.request_timeout_ms);
        while self.epoch() < epoch && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tracing::debug!(%from, %range, epoch, "re-replication received");
        let outputs = {
            let mut ring = self.ring.lock();
            ring.resync_received(from);
            ring.drain_outputs()
        };
        self.process(outputs);
    }

    /// On the leader: makes the consensus group's membership follow the map (new cells
    /// learn, `Membership::from_map` votes).
    fn reconcile_membership(self: &Arc<Self>) {
        if self.reconciling.swap(true, Ordering::AcqRel) {
            return;
        }
        let cl = self.clone();
        self.handle.spawn(async move {
            for _ in 0..10 {
                let Some(raft) = cl.raft.get() else { break };
                if raft.leader() != Some(raft.id()) {
                    break;
                }
                let map = raft.current_map();
                let want = cellcache_cluster::Membership::from_map(&map, cl.config.voters_max);
                let have = raft.membership();
                let mut changed = false;
                for c in map.cells() {
                    if !have.voters.contains(&c.id) && !have.learners.contains(&c.id) {
                        tracing::info!(cell = %c.id, "adding cell to the consensus group as a learner");
                        let add = raft.add_learner(group::raft_id(&c.id), &c.id);
                        match tokio::time::timeout(Duration::from_secs(10), add).await {
                            Ok(Ok(())) => changed = true,
                            Ok(Err(e)) => tracing::warn!(cell = %c.id, error = %e, "add learner failed"),
                            Err(_) => tracing::warn!(cell = %c.id, "add learner timed out"),
                        }
                    }
                }
                if want.voters != raft.membership().voters {
                    let ids = want.voters.iter().map(group::raft_id).collect();
                    match raft.change_voters(ids).await {
                        Ok(()) => {
                            changed = true;
                            tracing::info!(voters = ?want.voters, "consensus voters changed");
                        }
                        Err(e) => tracing::warn!(error = %e, "changing voters failed"),
                    }
                }
                // Departed cells (kept as learners when they stopped voting) leave the group.
                let gone: BTreeSet<CellId> = raft
                    .membership()
                    .learners
                    .into_iter()
                    .filter(|c| !want.learners.contains(c) && !want.voters.contains(c))
                    .collect();
                if !gone.is_empty() {
                    let ids = gone.iter().map(group::raft_id).collect();
                    match raft.remove_members(ids).await {
                        Ok(()) => {
                            changed = true;
                            tracing::info!(cells = ?gone, "departed cells left the consensus group");
                        }
                        Err(e) => tracing::warn!(error = %e, "removing departed cells failed"),
                    }
                }
                if !changed {
                    break;
                }
            }
            cl.reconciling.store(false, Ordering::Release);
        });
    }

    /// `cluster join`: a new cell at `address` divides `parent` (default: the cell with the
    /// largest range). Resolves to the committed map.
    pub async fn admit(
        self: &Arc<Self>,
        address: CellAddress,
        parent: Option<CellId>,
    ) -> Result<ClusterMap, String> {
        let deadline = Instant::now() + Duration::from_millis(self.config.request_timeout_ms * 4);
        loop {
            let map = self.ring.lock().map().clone();
            if let Some(c) = map.cells().iter().find(|c| c.address == address) {
                if c.state == CellState::Joining {
                    // Already admitted (a retried join): answer with the map that has it.
                    return Ok(map);
                }
                // A cell that died at this address is still being absorbed: the new process
                // must come in as a new cell (empty store, new id) once that is done.
                return Err(format!(
                    "address {} still belongs to cell {} ({:?}); retry after its absorption",
                    address.client, c.id, c.state
                ));
            }
            let parent = match &parent {
                Some(p) => p.clone(),
                None => map
                    .active_cells()
                    .max_by_key(|c| c.range.map_or(0, |r| r.len()))
                    .map(|c| c.id.clone())
                    .ok_or("no active cell")?,
            };
            let p = Proposal {
                based_on_epoch: map.epoch(),
                change: Change::BeginDivision {
                    parent,
                    child_address: address.clone(),
                },
            };
            match group::propose(
                self,
                p,
                Duration::from_millis(self.config.request_timeout_ms),
            )
            .await
            {
                Ok(m) => {
                    self.install_map(m.clone());
                    return Ok(m);
                }
                Err(e) if Instant::now() >= deadline => return Err(e.to_string()),
                Err(e) => {
                    tracing::debug!(error = %e, "join proposal not committed; retrying");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    }

    /// `cluster leave CELL` / the ring's own leave: proposes the cell's absorption.
    pub async fn leave(self: &Arc<Self>, cell: CellId) -> Result<ClusterMap, String> {
        let map = self.ring.lock().map().clone();
        let p = Proposal {
            based_on_epoch: map.epoch(),
            change: Change::BeginAbsorption {
                departed: cell,
                reason: cellcache_cluster::AbsorptionReason::Leaving,
            },
        };
        let m = group::propose(
            self,
            p,
            Duration::from_millis(self.config.request_timeout_ms),
        )
        .await
        .map_err(|e| e.to_string())?;
        self.install_map(m.clone());
        Ok(m)
    }
}

/// The parts of the hash ring that none of `keep` covers, as non-wrapping ranges.
fn gaps(keep: &[HashRange]) -> Vec<HashRange> {
    let mut spans: Vec<(u64, u64)> = Vec::new();
    for r in keep {
        if r.start <= r.end {
            spans.push((r.start, r.end));
        } else {
            spans.push((r.start, u64::MAX));
            spans.push((0, r.end));
        }
    }
    spans.sort_unstable();
    let mut out = Vec::new();
    let mut next: u64 = 0;
    for (s, e) in spans {
        if s > next {
            out.push(HashRange::new(next, s - 1));
        }
        if e == u64::MAX {
            return out;
        }
        next = next.max(e + 1);
    }
    out.push(HashRange::new(next, u64::MAX));
    out
}

/// Binds the peer listener: `port`, or client port + 10000, or any free port.
fn bind_peer(client: SocketAddr, port: u16) -> anyhow::Result<std::net::TcpListener> {
    let bind = |p: u16| {
        let l = std::net::TcpListener::bind(SocketAddr::new(client.ip(), p))?;
        l.set_nonblocking(true)?;
        std::io::Result::Ok(l)
    };
    if port != 0 {
        return bind(port).with_context(|| format!("binding the peer port {port}"));
    }
    if let Some(p) = client
        .port()
        .checked_add(10_000)
        .filter(|_| client.port() != 0)
    {
        if let Ok(l) = bind(p) {
            return Ok(l);
        }
    }
    bind(0).context("binding a peer port")
}

/// Asks the cell at `join` (client port) to admit this cell; returns the map that has it.
/// A random ring identity: the clock's nanoseconds mixed with this process's id and a
/// per-process random state, never 0 (0 is a map from before ring identities).
fn new_ring_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.write_u32(std::process::id());
    h.finish().max(1)
}

/// How often a blocked join looks at the shutdown flag: a signal stops a joining cell
/// within about this long (plus one connect attempt), not after the whole join timeout.
const JOIN_SHUTDOWN_POLL: Duration = Duration::from_millis(100);

fn join_ring(
    join: &str,
    me: &CellAddress,
    parent: Option<&CellId>,
    timeout_ms: u64,
    shutdown: &cellcache_io::Shutdown,
) -> anyhow::Result<ClusterMap> {
    let deadline = Instant::now() + Duration::from_millis(timeout_ms * 10);
    let abandoned = || {
        anyhow::anyhow!(
            "stopped by a signal while joining the ring through {join}: abandoned the join \
             (if the ring had already admitted this cell, it declares it dead as for a crash)"
        )
    };
    loop {
        match try_join(join, me, parent, timeout_ms, shutdown) {
            Ok(m) => return Ok(m),
            Err(_) if shutdown.is_triggered() => return Err(abandoned()),
            Err(e) if Instant::now() < deadline => {
                tracing::info!(error = %e, "join not accepted yet; retrying");
                let retry_at = Instant::now() + Duration::from_millis(300);
                while Instant::now() < retry_at {
                    if shutdown.is_triggered() {
                        return Err(abandoned());
                    }
                    std::thread::sleep(JOIN_SHUTDOWN_POLL);
                }
            }
            Err(e) => return Err(e.context(format!("joining the ring through {join}"))),
        }
    }
}

/// Reads into `buf` until `done(buf)` holds, in slices of [`JOIN_SHUTDOWN_POLL`], giving up
/// after `timeout` or once `shutdown` is triggered.
fn read_until(
    s: &mut TcpStream,
    buf: &mut Vec<u8>,
    timeout: Duration,
    shutdown: &cellcache_io::Shutdown,
    done: impl Fn(&[u8]) -> bool,
) -> anyhow::Result<()> {
    s.set_read_timeout(Some(JOIN_SHUTDOWN_POLL))?;
    let deadline = Instant::now() + timeout;
    let mut chunk = [0u8; 4096];
    while !done(buf) {
        anyhow::ensure!(!shutdown.is_triggered(), "interrupted");
        anyhow::ensure!(Instant::now() < deadline, "no answer to the join request");
        match s.read(&mut chunk) {
            Ok(0) => anyhow::bail!("the cell closed the connection"),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

fn try_join(
    join: &str,
    me: &CellAddress,
    parent: Option<&CellId>,
    timeout_ms: u64,
    shutdown: &cellcache_io::Shutdown,
) -> anyhow::Result<ClusterMap> {
    let mut s = TcpStream::connect(join)?;
    let timeout = Duration::from_millis(timeout_ms * 5);
    let parent = parent.map(|p| format!(" {p}")).unwrap_or_default();
    write!(s, "cluster join {} {}{parent}\r\n", me.client, me.peer)?;
    let mut buf = Vec::new();
    read_until(&mut s, &mut buf, timeout, shutdown, |b| b.contains(&b'\n'))?;
    let eol = buf
        .iter()
        .position(|&b| b == b'\n')
        .expect("read up to a line end");
    let line = String::from_utf8_lossy(&buf[..=eol]).into_owned();
    let Some(len) = line.strip_prefix("JOINED ") else {
        anyhow::bail!("{}", line.trim_end());
    };
    let len: usize = len.trim_end().parse().context("bad JOINED line")?;
    anyhow::ensure!(
        len <= cellcache_cluster::map::MAP_BYTES_MAX_DEFAULT,
        "map too large"
    );
    let start = eol + 1;
    read_until(&mut s, &mut buf, timeout, shutdown, |b| {
        b.len() >= start + len + 2
    })?;
    Ok(ClusterMap::decode(
        &buf[start..start + len],
        cellcache_cluster::map::MAP_BYTES_MAX_DEFAULT,
    )?)
}

/// The two connections a cell keeps to each peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Channel {
    /// Requests, replies, ring messages, consensus: small frames that must not wait.
    Control,
    /// Replication and snapshot streams: throughput, one batch in flight per target.
    Bulk,
}

/// A replication receiver's watermarks for one sending master: live records (`Replicate`)
/// and snapshot items (`SnapshotChunk`, `SnapshotDone`) arrive in two lanes, each in order
/// but interleaved with the other (see `repl`), so each has its own.
///
/// `connection` numbers the sender's replication-carrying connections to this cell (its bulk
/// link's; a connection gets its number with its first replication frame). The lanes'
/// order holds only within one connection: a sender opens a new one after giving the old
/// one up (its link dropped it), and frames still buffered on the old one may be read after
/// the new one's — an old snapshot copy of a key could then overwrite a newer live write.
/// So records are applied only from the sender's latest such connection (checked under the
/// same lock as the apply); the sender resends what the old one did not get acknowledged.
#[derive(Default)]
pub struct Applied {
    pub live: u64,
    pub snapshot: u64,
    pub connection: u64,
    /// Values arriving in parts from this sender.
    pub parts: repl::Assembly,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(a: u64, b: u64) -> HashRange {
        HashRange::new(a, b)
    }

    #[test]
    fn gaps_are_the_complement() {
        assert_eq!(gaps(&[HashRange::FULL]), vec![]);
        assert_eq!(gaps(&[r(0, 9)]), vec![r(10, u64::MAX)]);
        assert_eq!(
            gaps(&[r(10, 19), r(30, 39)]),
            vec![r(0, 9), r(20, 29), r(40, u64::MAX)]
        );
        // Adjacent and overlapping ranges leave no gap between them.
        assert_eq!(gaps(&[r(0, 9), r(10, 19), r(5, 25)]), vec![r(26, u64::MAX)]);
        // A wrapping range covers both ends.
        assert_eq!(gaps(&[r(u64::MAX - 9, 9)]), vec![r(10, u64::MAX - 10)]);
        assert_eq!(gaps(&[r(u64::MAX - 9, 9), r(10, u64::MAX - 10)]), vec![]);
    }
}
