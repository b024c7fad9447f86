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

pub mod autoscale;
mod catchup;
mod counters;
pub mod events;
pub mod ext;
pub mod flush;
pub mod group;
pub mod handshake;
mod join;
pub mod view;
pub use join::{AttemptError, JoinError, invite};
pub use slot::Slot;
pub mod link;
pub use link::Channel;
mod membership;
pub mod order;
mod receive;
pub mod repl;
pub mod restart;
pub mod route;
pub mod server;
mod serving;
mod slot;
mod split;
pub mod stats;
mod streams;
mod tail;
pub mod transport;
mod trim;
pub use streams::RunningStream;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use cellcache_cluster::raft::{RaftGroup, RaftGroupError};
use cellcache_cluster::wire::FrameKind;
use cellcache_cluster::{
    CellAddress, CellId, CellState, Change, ClusterMap, Consensus, HashRange, Migration, Output,
    Proposal, Ring, RingMessage,
};
use parking_lot::Mutex;

use crate::cell::Cell;
use crate::config::{ClusterConfig, ReplicationMode};
pub use counters::ClusterCounters;
use counters::ClusterStats;
use link::Link;
use repl::Replicator;

/// This cell's membership of a ring; see the module docs.
///
/// # Lock order
///
/// The node's locks (all `parking_lot`), with the store's shard locks, in one rank: a lock
/// may only be taken while holding locks ranked before it. The arrows say which nestings
/// exist (directly, or through a call made while the guard is alive).
///
/// 0. `Cluster::map_gate` (a read-write lock): read by [`route::here`] around one
///    request's placement and local execution (→ 8 `ring`, 2 and through the change feed
///    3, 5, 6; a `flush_all` → 7); written by [`Cluster::install_map`] around the ring's
///    installation of the map and [`Cluster::refresh_layout`] (→ 8, 3, 5). Never held
///    while anything runs that could route a request, so it is never taken twice by one
///    thread.
/// 1. `Cluster::applied`: a replication receiver applies a batch under it (`server`):
///    store writes (→ 2, and through the change feed 3, 5, 6) and replicated flushes
///    (→ 7). What it needs of the map (`keep`, `flushable`) is copied out of the ring
///    before it is taken, never read under it.
/// 2. A store shard lock (`cellcache_store::Store`): several at once only in
///    `Store::flush_range`, every shard in index order. The change feed calls
///    `Replicator::record` under it (→ 3, 5, 6), and `Replicator::stream` pushes scanned
///    items from inside the scan, under it (→ 5). Read callbacks take no lock.
/// 3. `Replicator::layout`: takes `policy` under it (→ 6); released before a target's
///    state is locked.
/// 4. `Replicator::waiters`: `check_waiters` reads each position's target under it (→ 5);
///    waiters complete after it is released.
/// 5. `Target::state` (`repl/target.rs`): one target at a time; takes nothing.
/// 6. `Replicator::policy`: takes nothing.
/// 7. `Cluster::flushes`: takes nothing (a flush reaches the store after it is released).
/// 8. Leaf locks, never held with any other lock and taking none: `Cluster::ring`
///    ([`Cluster::lock_ring`]), `links`, `raft_ids`, `streams`, `membership`; the
///    [`order::Order`] state; in `route` a forward's `Flight`, its reply-once cell and a
///    `Gather`'s state; a link's `Pending` replies; `ConnRegistry`'s `conns` and
///    `listeners`; `Detail`'s `table`; [`Slot`]'s `runtime` and `standby_repl`;
///    `conn::Slot`'s `reply`.
///
/// No guard is held across an `.await` (parking_lot's guards are not `Send`, so a spawned
/// future holding one does not compile, and clippy's `await_holding_lock` is an error
/// under `-D warnings`), nor while a completion callback (`Done`, a link's `Reply`, a
/// waiter's) runs: those may fill a connection's slot or route a request anew. The
/// consensus group's own locks (`cellcache_cluster`) are never taken under one of these.
pub struct Cluster {
    /// This cell's id. Set at start, never changed.
    pub(crate) me: CellId,
    /// The ring's identity ([`ClusterMap::ring`]): peers of another ring are refused.
    ring_id: u64,
    /// What guards every peer connection: TLS (`[cluster.tls]`) and the ring's secret
    /// (`cluster.secret_file`), each if configured; neither: the peer plane is open (logged
    /// at start).
    auth: transport::PeerAuth,
    address: CellAddress,
    /// Set at start, never changed.
    pub(crate) config: ClusterConfig,
    cell: Arc<Cell>,
    /// The peer runtime, where work leaves the calling thread.
    pub(crate) handle: tokio::runtime::Handle,
    /// Locked only through [`Cluster::lock_ring`], whose doc says what may be done under it.
    /// Lock order: a leaf lock (see [`Cluster`]).
    ring: Mutex<Ring>,
    /// A request placed under one map executes under it: [`route::here`] holds it (read)
    /// from the placement to the end of the local execution, and [`Cluster::install_map`]
    /// (write) from the ring's installation of a map to the replicator's new layout. So a
    /// write placed here as this cell's is never run after the map moved its key away (it
    /// would change a copy this cell no longer masters and not be replicated: the client
    /// got the retryable error, `cluster_stray_writes`), and a read is never run after the
    /// new map's trim began. Lock order: rank 0 (see [`Cluster`]).
    map_gate: parking_lot::RwLock<()>,
    /// The installed map's epoch, stamped on every frame: stored only by
    /// [`Cluster::install_map`], under the ring lock, with the map; read through
    /// [`Cluster::epoch`] (tasks stamping frames, a link's or the listener's writer, load
    /// their clone of it).
    epoch: Arc<AtomicU64>,
    repl: Arc<Replicator>,
    raft: OnceLock<RaftGroup>,
    stats: ClusterStats,
    /// Replication receiver: last position applied per sending master, per lane. Lock
    /// order: first of all, see [`Cluster`].
    applied: Mutex<HashMap<CellId, receive::Applied>>,
    /// Outbound links by peer and [`Channel`]. Lock order: a leaf lock, see [`Cluster`].
    links: Mutex<HashMap<(CellId, Channel), Arc<Link>>>,
    /// Consensus node ids to cells. Lock order: a leaf lock, see [`Cluster`].
    raft_ids: Mutex<HashMap<u64, CellId>>,
    /// Snapshot streams running, by target and range. Lock order: a leaf lock, see
    /// [`Cluster`].
    streams: Mutex<streams::Running>,
    /// A reconciliation of the consensus membership runs ([`Cluster::reconcile_membership`]).
    reconciling: AtomicBool,
    /// A reconciliation was asked for since the running pass read the map.
    reconcile_wanted: AtomicBool,
    /// A catch-up with the voters' maps runs (see [`catchup`]).
    catching_up: AtomicBool,
    /// When the last catch-up started ([`Cluster::now_ms`]; 0: never).
    catch_up_at: AtomicU64,
    /// This cell is leaving the ring: it stops the process once removed from the map.
    leaving: AtomicBool,
    /// Delayed `flush_all`s this cell must keep or may have to (see [`flush`]). Lock order:
    /// after `applied`, see [`Cluster`].
    flushes: Mutex<flush::PendingFlushes>,
    /// The ring's recent events (see [`events`]). Lock order: a leaf lock, see [`Cluster`].
    events: Mutex<events::Recent>,
    /// Autoscaling (see [`autoscale`]), once its provisioner is built.
    pub autoscale: OnceLock<Arc<autoscale::Autoscale>>,
    /// What the membership file says now (see [`restart`]). Lock order: a leaf lock, see
    /// [`Cluster`].
    membership: Mutex<Option<restart::Membership>>,
    /// Per-key order of routed requests (see [`order`]).
    order: order::Order,
    /// Dropping what this cell no longer holds (see [`trim`]).
    trim: Arc<trim::Trim>,
    /// When the installed map was installed ([`Cluster::now_ms`]).
    map_installed_ms: AtomicU64,
    /// How long this cell waited to serve its range after a map change (see [`serving`]):
    /// noted on every tick and after every ring message, so the logged wait ends within a
    /// message of the moment it did, not at the next tick.
    waited: Mutex<serving::WaitLog>,
    /// Writes are acknowledged after their backups applied them (`cluster.replication =
    /// "sync"`) or at once: starts as configured, switched live ([`Cluster::set_replication`]).
    replication_sync: AtomicBool,
    clock: Instant,
}

/// Why a cell could not become a ring member.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("starting the peer runtime")]
    Runtime(#[source] std::io::Error),
    #[error(transparent)]
    PeerAuth(#[from] transport::PeerAuthError),
    #[error(transparent)]
    Join(#[from] JoinError),
    #[error(transparent)]
    Membership(#[from] restart::MembershipFileError),
    #[error("bootstrap map")]
    Bootstrap(#[source] cellcache_cluster::MapError),
    #[error("the ring's map does not contain this cell")]
    NotInMap,
    #[error("starting the consensus group")]
    Consensus(#[from] RaftGroupError),
}

impl Cluster {
    /// Milliseconds on this cell's monotonic clock (the ring's time).
    pub fn now_ms(&self) -> u64 {
        self.clock.elapsed().as_millis() as u64 + 1
    }

    /// The installed map's epoch, without a lock. It changes only with the map, in
    /// [`Cluster::install_map`], before that map's outputs (trims included) are executed.
    /// When this cell acknowledges a write it masters: the configured mode until a switch.
    pub fn replication(&self) -> ReplicationMode {
        if self.replication_sync.load(Ordering::Acquire) {
            ReplicationMode::Sync
        } else {
            ReplicationMode::Async
        }
    }

    /// Switches the replication mode live; returns the one it replaces. A write executed
    /// from now on is acknowledged as `mode` says; a reply already held for its backups
    /// still waits for them. Nothing else changes: frames go to the backups as they did,
    /// in order, in both modes, so a switch to `sync` waits for the writes of the `async`
    /// time too (positions are acknowledged in order).
    pub fn set_replication(&self, mode: ReplicationMode) -> ReplicationMode {
        let was = self
            .replication_sync
            .swap(mode == ReplicationMode::Sync, Ordering::AcqRel);
        if was {
            ReplicationMode::Sync
        } else {
            ReplicationMode::Async
        }
    }

    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Locks the ring state machine, which holds the installed map.
    ///
    /// Under it: read the map and decide from it (owners, `can_serve`, backups, copies of
    /// what is needed later), step the ring (`tick`, `step`, `map_confirmed`,
    /// `handoff_caught_up`, `resync_done`, `resync_received`) and `drain_outputs`. Not under
    /// it: another lock (the ring's is a leaf lock, see [`Cluster`]), the store, a link, an
    /// `.await`, or [`Cluster::process`] (the drained outputs run after it is released);
    /// and no `Ring::install_map`: [`Cluster::install_map`] is the one place a map is
    /// installed, so that the map and [`Cluster::epoch`] change together. The request path
    /// takes it for every keyed request ([`route::place`]): hold it briefly.
    fn lock_ring(&self) -> parking_lot::MutexGuard<'_, Ring> {
        self.ring.lock()
    }

    /// Joins through `join` (as a division of `parent`, default the largest range) or, with
    /// `join` empty, bootstraps; starts the peer plane and the consensus group, and installs
    /// the result in `slot`. Blocks until the cell has a map it is part of.
    pub fn start(
        cell: Arc<Cell>,
        repl: Arc<Replicator>,
        join: &str,
        parent: Option<&CellId>,
        slot: &Slot,
    ) -> Result<Arc<Cluster>, StartError> {
        let config = cell.config.cluster.clone();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(config.peer_threads)
            .thread_name("cellcache-peer")
            .enable_all()
            .build()
            .map_err(StartError::Runtime)?;
        let auth = transport::PeerAuth::load(&config)?;
        let client = cell.config.server.addr();
        let peer_listener = join::bind_peer(client, config.peer_port)?;
        let peer = peer_listener.local_addr().map_err(StartError::Runtime)?;
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
        if auth.tls.is_some() {
            tracing::info!(
                server_name = %config.tls.server_name,
                "peer connections use mutual TLS (cluster.tls)"
            );
        }
        // With TLS, only a holder of a certificate from the ring's CA reaches the peer plane.
        if auth.secret.is_none() && auth.tls.is_none() {
            tracing::warn!(
                peer = %address.peer,
                "no cluster secret (cluster.secret_file, --cluster-secret-file): anyone who \
                 reaches the peer port can act as a cell of this ring; see docs/security.md"
            );
            if cell.credentials.is_some() {
                // Forwarded requests are not checked against client logins: the peer port
                // is a way around them unless the ring's secret guards it.
                tracing::warn!(
                    "client logins (server.auth_file, -Y) without a cluster secret: a forged \
                     cell on the peer port reaches every key without one"
                );
            }
        }
        // Every cell of a StatefulSet is told to join the first; the first starts the ring.
        let join = if join::names_this_cell(join, &address.peer) {
            tracing::info!(%join, "the cell to join is this cell itself: it starts the ring");
            ""
        } else {
            join
        };
        // A first cell restarted with its original command line rejoins its ring, if that is
        // still alive, instead of starting a second one (see `restart`).
        let rejoin = if join.is_empty() {
            let file = restart::file_path(&config.state_dir, &address.client);
            restart::ring_to_rejoin(
                file.as_deref(),
                &address,
                Duration::from_millis(config.request_timeout_ms),
                &auth,
                &config.wire,
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
                join::new_ring_id(),
            )
            .map_err(StartError::Bootstrap)?;
            (me, map, true)
        } else {
            let map = join::join_ring(
                join,
                &address,
                parent,
                config.request_timeout_ms,
                &cell.shutdown,
                &auth,
                &config.wire,
            )?;
            let me = map
                .cells()
                .iter()
                .find(|c| c.address == address)
                .map(|c| c.id.clone())
                .ok_or(StartError::NotInMap)?;
            (me, map, false)
        };
        tracing::info!(cell = %me, epoch = map.epoch(), bootstrap, "ring membership");
        let clock = Instant::now();
        let ring = Ring::new(me.clone(), map.clone(), config.ring, 1);
        let cluster = Arc::new(Cluster {
            me: me.clone(),
            ring_id: map.ring(),
            auth,
            address,
            config: config.clone(),
            cell,
            handle: runtime.handle().clone(),
            ring: Mutex::new(ring),
            map_gate: parking_lot::RwLock::new(()),
            epoch: Arc::new(AtomicU64::new(map.epoch())),
            repl,
            raft: OnceLock::new(),
            stats: ClusterStats::default(),
            applied: Mutex::new(HashMap::new()),
            links: Mutex::new(HashMap::new()),
            raft_ids: Mutex::new(HashMap::new()),
            streams: Mutex::new(BTreeMap::new()),
            reconciling: AtomicBool::new(false),
            replication_sync: AtomicBool::new(config.replication == ReplicationMode::Sync),
            reconcile_wanted: AtomicBool::new(false),
            catching_up: AtomicBool::new(false),
            catch_up_at: AtomicU64::new(0),
            leaving: AtomicBool::new(false),
            flushes: Mutex::new(flush::PendingFlushes::default()),
            events: Mutex::new(events::Recent::new(config.events_kept)),
            autoscale: OnceLock::new(),
            membership: Mutex::new(None),
            order: order::Order::default(),
            trim: Arc::default(),
            map_installed_ms: AtomicU64::new(0),
            waited: Mutex::default(),
            clock,
        });
        cluster.learn_ids(&map);
        cluster.remember_membership(&map);
        let transport = Arc::new(group::Transport {
            cluster: Arc::downgrade(&cluster),
        });
        let raft = runtime.block_on(async {
            let listener =
                tokio::net::TcpListener::from_std(peer_listener).map_err(StartError::Runtime)?;
            tokio::spawn(server::accept_loop(cluster.clone(), listener));
            let raft =
                RaftGroup::start(group::raft_id(&me), map.clone(), config.raft, transport).await?;
            if bootstrap {
                let voters = [(group::raft_id(&me), me.clone())].into_iter().collect();
                raft.initialize(&voters).await?;
            }
            Ok::<_, StartError>(raft)
        })?;
        let _ = cluster.raft.set(raft);
        let outputs = cluster.lock_ring().drain_outputs();
        cluster.refresh_layout();
        cluster.process(outputs);
        runtime.spawn(cluster.clone().drive());
        runtime.spawn(trim::run(cluster.trim.clone(), Arc::downgrade(&cluster)));
        let _ = slot.cluster.set(cluster.clone());
        *slot.runtime.lock() = Some(runtime);
        let _ = cluster.cell.ring_figures.set(cluster.clone());
        match crate::provision::build(&cluster.cell.config) {
            Ok(p) => {
                let scale = Arc::new(autoscale::Autoscale::new(&cluster.cell.config, p));
                let _ = cluster.autoscale.set(scale.clone());
                autoscale::spawn(&cluster, scale);
            }
            Err(e) => tracing::warn!(error = %e, "autoscale unavailable"),
        }
        Ok(cluster)
    }

    /// This cell has left the ring, or is leaving it (absorbed), rather than being stopped
    /// as a member: the cells it started stay, since they hold ranges of the ring.
    pub fn left(&self) -> bool {
        self.leaving.load(Ordering::Acquire) || self.lock_ring().map().cell(&self.me).is_none()
    }

    /// What this cell is in the middle of, in words, for the log line of a cell stopped by
    /// a signal: receiving its range (joining), handing its range over (leaving), sending
    /// a range to a new cell or a backup. Empty when it is simply serving.
    pub fn in_progress(&self) -> Vec<String> {
        let mut work = Vec::new();
        let state = self.lock_ring().map().cell(&self.me).map(|c| c.state);
        match state {
            Some(CellState::Joining) => {
                work.push("joining the ring (its range had not all arrived)".to_string())
            }
            Some(CellState::Leaving) => {
                work.push("leaving the ring (its successor was taking its range over)".into())
            }
            // Asked to leave, not yet Leaving (a cell no longer in the map has left).
            Some(_) if self.leaving.load(Ordering::Acquire) => {
                work.push("leaving the ring (its successor was taking its range over)".into())
            }
            _ => {}
        }
        for (to, (start, end)) in self.streams.lock().keys() {
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

    /// The ring driver: ticks, installs maps the consensus group committed, expires waits.
    async fn drive(self: Arc<Self>) {
        let mut every = tokio::time::interval(Duration::from_millis(10));
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        // A map the group applied is installed at once: every cell of a flip waiting for
        // its next tick added up to a tick to what the moved range's clients wait.
        let changed = self.raft.get().map(|r| r.map_changed());
        let mut leading = false;
        loop {
            match &changed {
                Some(changed) => tokio::select! {
                    _ = every.tick() => {}
                    () = changed.notified() => {}
                },
                None => {
                    every.tick().await;
                }
            }
            if let Some(raft) = self.raft.get() {
                // The epoch first: copying the map every tick was 7% of an idle
                // debug-build cell's CPU (perf).
                if raft.current_epoch() > self.epoch() {
                    self.install_map(raft.current_map());
                }
                // A new leader makes the membership follow the map at once: the one before
                // may have stopped (left the ring) between a map change and its reconciling.
                let leads = raft.leader() == Some(raft.id());
                if leads && !leading {
                    self.reconcile_membership();
                }
                leading = leads;
            }
            let now = self.now_ms();
            let (outputs, wait) = {
                let mut ring = self.lock_ring();
                ring.tick(now);
                (ring.drain_outputs(), ring.serve_wait(now))
            };
            self.process(outputs);
            self.note_wait(wait, now);
            self.flush_when_due();
            self.repl.check_waiters();
            for t in self.repl.targets() {
                if t.take_needs_resync() {
                    let (range, handoff) = {
                        let ring = self.lock_ring();
                        let map = ring.map();
                        let handoff = self.handoffs_in(map).into_iter().find(|(c, _)| *c == t.to);
                        match handoff {
                            Some((_, range)) => (Some(range), true),
                            None => (map.cell(&self.me).and_then(|c| c.range), false),
                        }
                    };
                    if let Some(range) = range {
                        self.start_stream(t.to.clone(), range, handoff);
                    }
                }
            }
        }
    }

    /// The hand-offs this cell leads in `map`, with what each receives: a division's child
    /// (this cell's whole range, of which it keeps its half) and a shift's targets (the part
    /// that moves).
    fn handoffs_in(&self, map: &ClusterMap) -> Vec<(CellId, HashRange)> {
        let mine = map.cell(&self.me).and_then(|c| c.range);
        let mut out = Vec::new();
        for m in map.migrations() {
            match m {
                Migration::Division { parent, child, .. } if *parent == self.me => {
                    out.push((child.clone(), mine.unwrap_or(HashRange::FULL)));
                }
                Migration::Shift {
                    from,
                    targets,
                    range,
                    ..
                } if *from == self.me => {
                    out.extend(targets.iter().map(|t| (t.clone(), *range)));
                }
                _ => {}
            }
        }
        out
    }

    /// Handles a ring message from a peer.
    pub fn step(self: &Arc<Self>, m: RingMessage) {
        let now = self.now_ms();
        let (outputs, wait) = {
            let mut ring = self.lock_ring();
            ring.step(m, now);
            (ring.drain_outputs(), ring.serve_wait(now))
        };
        self.process(outputs);
        self.note_wait(wait, now);
    }

    /// Notes what this cell waits for to serve its range (logged when a wait ends).
    fn note_wait(&self, wait: Option<cellcache_cluster::ServeWait>, now: u64) {
        self.waited.lock().note(
            self.epoch(),
            self.map_installed_ms.load(Ordering::Acquire),
            wait,
            now,
        );
    }

    /// Installs a committed map if it is newer than ours: the one place a map is installed.
    /// The ring takes it and the epoch is stored under one hold of the ring lock, then the
    /// outputs run (a trim among them), so whoever sees a data range dropped by the new map
    /// also sees its epoch (see `route::after`).
    ///
    /// Callers hand it only maps consensus committed: this cell's replica's
    /// (`RaftGroup::current_map`, in [`Cluster::drive`]), the leader's answer to this cell's
    /// own proposal ([`group::propose`]), or one a majority of the voters reported
    /// ([`catchup`]). A map one peer sends is never passed here.
    fn install_map(self: &Arc<Self>, map: ClusterMap) {
        let now = self.now_ms();
        // No request is between its placement and its execution while the map and the
        // replicator's layout change (see `map_gate`).
        let gate = self.map_gate.write();
        let (outputs, changes) = {
            let mut ring = self.lock_ring();
            if map.epoch() <= ring.map().epoch() || map.ring() != self.ring_id {
                return;
            }
            let changes = events::diff(ring.map(), &map, crate::cell::unix_now_secs());
            ring.install_map(map.clone(), now);
            self.map_installed_ms.store(now, Ordering::Release);
            self.epoch.store(ring.map().epoch(), Ordering::Release);
            (ring.drain_outputs(), changes)
        };
        self.refresh_layout();
        drop(gate);
        for e in changes {
            self.note_event(e);
        }
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
            let ring = self.lock_ring();
            let map = ring.map();
            let me = map.cell(&self.me);
            let active = me.is_some_and(|c| c.state == CellState::Active);
            let master = me.and_then(|c| c.range).filter(|_| active);
            let mut targets: Vec<CellId> = if active {
                map.backups(&self.me).iter().map(|c| c.id.clone()).collect()
            } else {
                Vec::new()
            };
            let children: Vec<CellId> = self.handoffs_in(map).into_iter().map(|(c, _)| c).collect();
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
        for (to, _) in self.streams.lock().keys() {
            if !targets.contains(to) && reachable.contains(to) {
                targets.push(to.clone());
            }
        }
        let weak = Arc::downgrade(self);
        let link_for: repl::LinkFor =
            Arc::new(move |c: &CellId| weak.upgrade().and_then(|cl| cl.bulk_link(c)));
        let weak = Arc::downgrade(self);
        let on_refused: repl::OnRefused = Arc::new(move |_: &CellId, epoch: u64| {
            if let Some(cl) = weak.upgrade() {
                if epoch > cl.epoch() {
                    cl.catch_up();
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
                } => self.release_after_tail(to, message),
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
                Output::Holdings {
                    epoch,
                    master,
                    backups,
                } => self.trim.hold(epoch, master, backups),
                Output::DeliverTail { range } => self.deliver_tail(range),
                Output::StartHandOff { child, range } => self.start_stream(child, range, true),
                Output::Resync { to, range } => self.start_stream(to, range, false),
                Output::NeedMap { .. } => self.catch_up(),
                Output::ConfirmMap { epoch, sent_at_ms } => {
                    let cl = self.clone();
                    self.handle.spawn(async move {
                        if group::confirm(&cl, epoch).await {
                            tracing::trace!(
                                epoch,
                                waited_ms = cl.now_ms().saturating_sub(sent_at_ms),
                                "map confirmed"
                            );
                            let outputs = {
                                let mut ring = cl.lock_ring();
                                ring.map_confirmed(epoch, sent_at_ms);
                                ring.answer_deferred(cl.now_ms());
                                ring.drain_outputs()
                            };
                            cl.process(outputs);
                        } else {
                            // The group may have moved on without this cell (it was paused
                            // or cut off, and removed meanwhile: the cells that could tell
                            // it no longer send it the log). The fault tests found a resumed
                            // cell that never learnt it had been removed and kept every
                            // client waiting for the full request timeout.
                            cl.catch_up();
                        }
                    });
                }
                Output::Fenced if self.leaving.load(Ordering::Acquire) => {
                    // A cell with an older map may still forward a request here: refused
                    // (removed), it catches up and goes to the new master. Stopping at once
                    // would drop such a request with the connection, its outcome unknown.
                    let linger = Duration::from_millis(self.config.leave_linger_ms);
                    tracing::info!(cell = %self.me, ?linger, "left the ring: stopping after the linger");
                    let cl = self.clone();
                    self.handle.spawn(async move {
                        tokio::time::sleep(linger).await;
                        cl.leave_the_voters().await;
                        cl.cell.shutdown.trigger();
                    });
                }
                Output::Fenced => {
                    tracing::error!(cell = %self.me, "this cell was removed from the ring: it no longer serves keys; restart it to rejoin as a new cell");
                }
            }
        }
    }

    /// Whether `cell` is in this cell's map (in any state, fenced cells are not).
    pub(crate) fn is_member(&self, cell: &CellId) -> bool {
        self.lock_ring().map().cell(cell).is_some()
    }
}
