//! The cache tier of a standalone cell (docs/tier.md): the cell fronts a durable
//! [`BackingStore`]; a miss loads from it, every client write reaches it.
//!
//! How the pieces meet:
//! - the store's change feed ([`Tier`] is its [`ChangeSink`]) records every client write,
//!   delete, touch and `flush_all`, under the shard lock, into the write-back engine
//!   ([`WriteBack`], cellcache-tier) with the feed's sequence number as the key's version,
//!   and tells the single-flight table ([`Flights`]) that the key changed;
//! - [`path`] decides, per request, whether its keys must be loaded first (a miss), runs it,
//!   and holds a write-through reply until the engine confirms its version durable;
//! - [`flusher`] cuts batches from the engine and applies them to the backing store on the
//!   tier's own tokio runtime, never on an engine thread.
//!
//! Lock order: a store shard lock, then `engine` or `flights` (the feed and a fill's admit
//! run under the shard lock); `engine` and `flights` are never held together, and nothing
//! here calls the store or a reply callback while holding either.
//!
//! Write-back keeps a dirty value in the engine until the store confirms it, so the cache
//! may evict its own copy freely: a request for an evicted dirty key re-inserts it from the
//! engine (seed 000's re-insertion), never from the older copy in the store.

mod flusher;
pub mod path;

use crate::config::{TierConfig, WritePolicy};
use cellcache_store::{Change, ChangeKind, ChangeSink};
use cellcache_tier::{BackingStore, Flights, Op, Record, Spec, WriteBack};
use parking_lot::Mutex;
use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

pub use path::{Later, Route};

/// Fills a connection's reply slot (from any thread).
pub type Fill = Box<dyn FnOnce(Vec<u8>) + Send>;

/// Why the tier did not start.
#[derive(Debug, thiserror::Error)]
pub enum TierStartError {
    #[error("starting the tier's runtime")]
    Runtime(#[source] std::io::Error),
    #[error("opening the backing store {spec}")]
    Open {
        spec: String,
        #[source]
        source: cellcache_tier::TierError,
    },
}

/// The tier's counters (`stats cellcache`'s `tier_*`).
#[derive(Default)]
pub struct TierCounters {
    pub loads: AtomicU64,
    pub load_hits: AtomicU64,
    pub load_misses: AtomicU64,
    pub load_errors: AtomicU64,
    pub loads_overtaken: AtomicU64,
    pub loads_refused: AtomicU64,
    pub reinserted: AtomicU64,
    pub write_through_timeouts: AtomicU64,
}

/// A write-through reply held until its versions are durable.
pub struct Held {
    remaining: AtomicUsize,
    reply: Mutex<Option<(Vec<u8>, Fill)>>,
}

impl Held {
    /// One of its versions is durable; the last one sends the reply.
    fn release(&self) {
        if self.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            let taken = self.reply.lock().take();
            if let Some((reply, fill)) = taken {
                fill(reply);
            }
        }
    }

    /// Gives up waiting: the client gets `line` instead (if the reply was not sent yet).
    fn expire(&self, line: &[u8]) -> bool {
        let taken = self.reply.lock().take();
        match taken {
            Some((_, fill)) => {
                fill(line.to_vec());
                true
            }
            None => false,
        }
    }
}

/// What a waiting request does once its keys landed (`true`: a load failed).
type Rerun = Box<dyn FnOnce(bool) + Send>;

/// A request waiting for its keys' loads.
pub struct Job {
    remaining: AtomicUsize,
    failed: AtomicBool,
    run: Mutex<Option<Rerun>>,
}

impl Job {
    /// One of its keys landed (`ok`: loaded, or known absent); the last one runs it.
    fn landed(&self, ok: bool) {
        if !ok {
            self.failed.store(true, Ordering::Release);
        }
        if self.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            let run = self.run.lock().take();
            if let Some(run) = run {
                run(self.failed.load(Ordering::Acquire));
            }
        }
    }
}

/// What one request's writes took in the feed: the key (`None` for `flush_all`) and version.
type Captured = Vec<(Option<Vec<u8>>, u64)>;

thread_local! {
    /// The feed entries of the request running on this thread (see [`capture`]).
    static CAPTURE: RefCell<Option<Captured>> = const { RefCell::new(None) };
}

/// Runs `f` and returns the feed entries it caused on this thread (the feed is called
/// synchronously, on the writing thread).
pub(crate) fn capture<R>(f: impl FnOnce() -> R) -> (R, Captured) {
    CAPTURE.with(|c| *c.borrow_mut() = Some(Vec::new()));
    let r = f();
    let captured = CAPTURE.with(|c| c.borrow_mut().take()).unwrap_or_default();
    (r, captured)
}

fn captured(key: Option<&[u8]>, version: u64) {
    CAPTURE.with(|c| {
        if let Some(v) = c.borrow_mut().as_mut() {
            v.push((key.map(<[u8]>::to_vec), version));
        }
    });
}

/// A cell's tier.
pub struct Tier {
    pub config: TierConfig,
    store: Arc<dyn BackingStore>,
    runtime: tokio::runtime::Runtime,
    engine: Mutex<WriteBack<Arc<Held>>>,
    flights: Mutex<Flights<Arc<Job>>>,
    /// The write policy in force (0 through, 1 back): switched live.
    policy: AtomicU8,
    /// Wakes the flusher (a write to flush now, a batch answered, a policy switch).
    wake: tokio::sync::Notify,
    started: Instant,
    pub counters: TierCounters,
}

impl Tier {
    /// Opens the backing store (a failure stops the cell's start) and starts the flusher.
    pub fn start(config: &TierConfig) -> Result<Arc<Tier>, TierStartError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(config.runtime_threads)
            .thread_name("tier")
            .enable_all()
            .build()
            .map_err(TierStartError::Runtime)?;
        let open = |source| TierStartError::Open {
            spec: describe_spec(&config.backing_store),
            source,
        };
        let spec = Spec::parse(&config.backing_store).map_err(open)?;
        let store = runtime
            .block_on(cellcache_tier::open(&spec, &config.postgres()))
            .map_err(open)?;
        tracing::info!(
            backing_store = store.describe(),
            write_policy = config.write_policy.name(),
            "tier: backing store open"
        );
        let tier = Arc::new(Tier {
            engine: Mutex::new(WriteBack::new(config.engine(config.write_policy))),
            flights: Mutex::new(Flights::new(
                config.loads_in_flight_max,
                config.negative_cache_ms,
                config.negative_cache_keys_max,
            )),
            policy: AtomicU8::new(policy_code(config.write_policy)),
            config: config.clone(),
            store,
            runtime,
            wake: tokio::sync::Notify::new(),
            started: Instant::now(),
            counters: TierCounters::default(),
        });
        tier.runtime.spawn(flusher::run(tier.clone()));
        Ok(tier)
    }

    /// Milliseconds on the tier's monotonic clock.
    pub fn now_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// The write policy in force.
    pub fn policy(&self) -> WritePolicy {
        match self.policy.load(Ordering::Acquire) {
            0 => WritePolicy::Through,
            _ => WritePolicy::Back,
        }
    }

    /// Switches the write policy live: writes from now on follow `policy`; a write-through
    /// reply already held still waits for its write, and write-back's dirty keys become due
    /// at once when switching to write-through. No request fails.
    pub fn set_policy(&self, policy: WritePolicy) {
        let before = self.policy.swap(policy_code(policy), Ordering::AcqRel);
        if before != policy_code(policy) {
            let now = self.now_ms();
            self.engine
                .lock()
                .reconfigure(self.config.engine(policy), now);
            self.wake.notify_one();
            tracing::info!(write_policy = policy.name(), "tier: write policy switched");
        }
    }

    /// The backing store's name (no credentials).
    pub fn describe(&self) -> String {
        self.store.describe()
    }

    /// `stats cellcache`'s `tier_*` lines.
    pub fn write_stats(&self, out: &mut Vec<u8>) {
        use std::io::Write;
        let e = self.engine.lock().stats();
        let loading = self.flights.lock().len();
        let c = &self.counters;
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let _ = write!(
            out,
            "STAT tier_write_policy {}\r\nSTAT tier_dirty_bytes {}\r\nSTAT tier_dirty_keys {}\r\n\
             STAT tier_writes_recorded {}\r\nSTAT tier_writes_coalesced {}\r\n\
             STAT tier_flushed_ops {}\r\nSTAT tier_flushed_batches {}\r\n\
             STAT tier_failed_batches {}\r\nSTAT tier_refused_writes {}\r\n\
             STAT tier_loads {}\r\nSTAT tier_load_hits {}\r\nSTAT tier_load_misses {}\r\n\
             STAT tier_load_errors {}\r\nSTAT tier_loads_overtaken {}\r\n\
             STAT tier_loads_refused {}\r\nSTAT tier_loads_in_flight {}\r\n\
             STAT tier_reinserted {}\r\nSTAT tier_write_through_timeouts {}\r\n",
            self.policy().name(),
            e.dirty_bytes,
            e.dirty_keys,
            e.recorded,
            e.coalesced,
            e.flushed_ops,
            e.flushed_batches,
            e.failed_batches,
            e.refused,
            n(&c.loads),
            n(&c.load_hits),
            n(&c.load_misses),
            n(&c.load_errors),
            n(&c.loads_overtaken),
            n(&c.loads_refused),
            loading,
            n(&c.reinserted),
            n(&c.write_through_timeouts),
        );
    }

    /// Waits (bounded by `timeout`) until every dirty key is in the store: a graceful stop
    /// loses nothing. Returns whether it drained.
    pub fn drain(&self, timeout: Duration) -> bool {
        let until = Instant::now() + timeout;
        self.engine
            .lock()
            .reconfigure(self.config.engine(WritePolicy::Through), self.now_ms());
        self.wake.notify_one();
        loop {
            if self.engine.lock().is_clean() {
                return true;
            }
            if Instant::now() >= until {
                let left = self.engine.lock().stats();
                tracing::warn!(
                    dirty_keys = left.dirty_keys,
                    dirty_bytes = left.dirty_bytes,
                    "tier: stopped before the backing store had every write"
                );
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

fn policy_code(p: WritePolicy) -> u8 {
    match p {
        WritePolicy::Through => 0,
        WritePolicy::Back => 1,
    }
}

/// A specification for logs: a PostgreSQL URL without its credentials.
fn describe_spec(spec: &str) -> String {
    match spec.split_once("://") {
        Some((scheme, rest)) => match rest.rsplit_once('@') {
            Some((_, host)) => format!("{scheme}://{host}"),
            None => spec.to_string(),
        },
        None => spec.to_string(),
    }
}

impl ChangeSink for Tier {
    fn record(&self, change: &Change<'_>) {
        let (key, op) = match change.kind {
            ChangeKind::Put {
                key,
                value,
                flags,
                expiry,
                ..
            } => (
                key,
                Op::Put(Record {
                    value: Arc::from(value),
                    flags,
                    expiry_unix: expiry.as_unix_secs(),
                }),
            ),
            ChangeKind::Delete { key } => (key, Op::Delete),
            ChangeKind::Touch { key, expiry } => (
                key,
                Op::Touch {
                    expiry_unix: expiry.as_unix_secs(),
                },
            ),
            ChangeKind::Flush { .. } => {
                // A standalone cell flushes its whole store.
                self.flights.lock().overtake_all();
                self.engine.lock().record_clear(change.seq);
                captured(None, change.seq);
                self.wake.notify_one();
                return;
            }
        };
        self.flights.lock().overtake(key);
        let now = self.now_ms();
        self.engine.lock().record(key, op, change.seq, now);
        captured(Some(key), change.seq);
        self.wake.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::describe_spec;

    #[test]
    fn specs_are_logged_without_credentials() {
        assert_eq!(
            describe_spec("postgres://u:secret@db:5432/x"),
            "postgres://db:5432/x"
        );
        assert_eq!(describe_spec("redb:/var/a.redb"), "redb:/var/a.redb");
    }
}
