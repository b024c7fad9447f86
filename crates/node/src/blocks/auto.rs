//! The automatic policy (`[switching] auto`, `serve --auto-switch`, `ctl autoswitch`): a cell
//! switches its eviction policy by the access pattern it sees, read off the store's own
//! counters — no request pays for it.
//!
//! Each sample (every `sample_interval_ms`) goes to the [`Decider`], a pure function of the
//! samples it was given. Over the last `window_ms` of samples taken under the running
//! policy it measures one signal per policy:
//!
//! - under slab LRU, the share of evicted items that were never read: scans and one-hit
//!   wonders are pushing out what is read again, which S3-FIFO's small queue filters
//!   (at or above `to_s3fifo_unread`, switch to `s3fifo`);
//! - under S3-FIFO, the share of new items its ghost table remembered: most keys come back
//!   after they were dropped unread, so the small queue only costs items (at or above
//!   `to_lru_ghost_hits`, switch to `lru`).
//!
//! Hysteresis: the two signals are different measures with a gap between their thresholds,
//! chosen so that no workload measured crosses both (docs/benchmarks/switching.md); a
//! decision needs a whole window measured under the running policy (a switch, by hand or
//! by this, starts the window over), at least `min_evictions` evictions in it (a cache that
//! holds its working set keeps its policy), and `cooldown_ms` since the last switch. Every
//! switch is logged with its reason and kept (the last `events_kept`) for `ctl status`.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cellcache_store::EvictionPolicyKind;
use serde::Serialize;

use crate::cell::Cell;
use crate::config::SwitchingConfig;

/// How often the sampling thread looks at the shutdown flag while it waits.
const SHUTDOWN_POLL: Duration = Duration::from_millis(100);

/// The eviction policies the automatic policy chooses between.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Eviction {
    Lru,
    S3fifo,
}

impl Eviction {
    /// The policy a store runs, if it is one of these.
    pub fn of(kind: EvictionPolicyKind) -> Option<Eviction> {
        match kind {
            EvictionPolicyKind::SlabLru => Some(Eviction::Lru),
            EvictionPolicyKind::S3Fifo { .. } => Some(Eviction::S3fifo),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Eviction::Lru => "lru",
            Eviction::S3fifo => "s3fifo",
        }
    }

    fn kind(self) -> EvictionPolicyKind {
        match self {
            Eviction::Lru => EvictionPolicyKind::SlabLru,
            Eviction::S3fifo => EvictionPolicyKind::S3FIFO,
        }
    }
}

/// The store's counters at one moment (cumulative, as `stats` shows them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sample {
    /// Milliseconds on a clock that only goes forward.
    pub at_ms: u64,
    /// The running policy (`None`: one this does not choose between).
    pub policy: Option<Eviction>,
    pub evicted: u64,
    pub evicted_unread: u64,
    pub inserted: u64,
    pub ghost_hits: u64,
}

/// The signals over the last window.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Default)]
pub struct Signal {
    /// The span measured.
    pub window_ms: u64,
    /// Items evicted in it.
    pub evicted: u64,
    /// Share of them never read.
    pub unread_evicted: f64,
    /// Share of the items stored in it that S3-FIFO's ghost remembered.
    pub ghost_hits: f64,
}

/// What the policy decides after a sample: a switch, or why not.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Verdict {
    pub switch_to: Option<Eviction>,
    pub reason: String,
}

impl Verdict {
    fn hold(reason: String) -> Verdict {
        Verdict {
            switch_to: None,
            reason,
        }
    }
}

/// The pure policy: samples in, verdicts out.
#[derive(Debug)]
pub struct Decider {
    config: SwitchingConfig,
    samples: VecDeque<Sample>,
    /// When the running policy was first seen to differ from the one before.
    last_change_ms: Option<u64>,
    signal: Option<Signal>,
}

fn share(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

fn percent(v: f64) -> String {
    format!("{:.0}%", v * 100.0)
}

impl Decider {
    pub fn new(config: SwitchingConfig) -> Decider {
        Decider {
            config,
            samples: VecDeque::new(),
            last_change_ms: None,
            signal: None,
        }
    }

    /// The signals of the last full window, if one was measured under the running policy.
    pub fn signal(&self) -> Option<Signal> {
        self.signal
    }

    /// Takes one sample (later than the one before) and says what to do now.
    pub fn observe(&mut self, s: Sample) -> Verdict {
        let c = &self.config;
        if let Some(last) = self.samples.back() {
            if last.policy != s.policy {
                // Switched (by hand or by this): measure the new policy afresh.
                self.samples.clear();
                self.signal = None;
                self.last_change_ms = Some(s.at_ms);
            } else if s.evicted < last.evicted
                || s.evicted_unread < last.evicted_unread
                || s.inserted < last.inserted
                || s.ghost_hits < last.ghost_hits
            {
                // `stats reset` cleared the counters: what came before is not comparable.
                self.samples.clear();
                self.signal = None;
            }
        }
        self.samples.push_back(s);
        // Keep the newest sample at least a window older than `s` as the window's start.
        while self.samples.len() > 2 && s.at_ms - self.samples[1].at_ms >= c.window_ms {
            self.samples.pop_front();
        }
        let Some(policy) = s.policy else {
            return Verdict::hold(
                "the running eviction policy is not one the automatic policy chooses (lru, \
                 s3fifo)"
                    .into(),
            );
        };
        let first = self.samples[0];
        let span = s.at_ms - first.at_ms;
        if span < c.window_ms {
            return Verdict::hold(format!(
                "measuring {}: {span} of {} ms",
                policy.name(),
                c.window_ms
            ));
        }
        let evicted = s.evicted - first.evicted;
        let signal = Signal {
            window_ms: span,
            evicted,
            unread_evicted: share(s.evicted_unread - first.evicted_unread, evicted),
            ghost_hits: share(s.ghost_hits - first.ghost_hits, s.inserted - first.inserted),
        };
        self.signal = Some(signal);
        if evicted < c.min_evictions {
            return Verdict::hold(format!(
                "{evicted} items evicted in the window (fewer than {}): the cache holds its \
                 working set",
                c.min_evictions
            ));
        }
        let (to, reason) = match policy {
            Eviction::Lru if signal.unread_evicted >= c.to_s3fifo_unread => (
                Eviction::S3fifo,
                format!(
                    "{} of the items evicted were never read (switch at {}): scans or one-hit \
                     wonders push out what is read again",
                    percent(signal.unread_evicted),
                    percent(c.to_s3fifo_unread)
                ),
            ),
            Eviction::S3fifo if signal.ghost_hits >= c.to_lru_ghost_hits => (
                Eviction::Lru,
                format!(
                    "{} of the new items came back from the ghost (switch at {}): keys are \
                     re-read too widely for a small queue to filter",
                    percent(signal.ghost_hits),
                    percent(c.to_lru_ghost_hits)
                ),
            ),
            Eviction::Lru => {
                return Verdict::hold(format!(
                    "lru fits: {} of the items evicted were never read (switch at {})",
                    percent(signal.unread_evicted),
                    percent(c.to_s3fifo_unread)
                ));
            }
            Eviction::S3fifo => {
                return Verdict::hold(format!(
                    "s3fifo fits: {} of the new items came back from the ghost (switch at {})",
                    percent(signal.ghost_hits),
                    percent(c.to_lru_ghost_hits)
                ));
            }
        };
        if let Some(t) = self.last_change_ms
            && s.at_ms - t < c.cooldown_ms
        {
            return Verdict::hold(format!(
                "would switch to {} ({reason}), but the last switch was {} ms ago (cooldown {} \
                 ms)",
                to.name(),
                s.at_ms - t,
                c.cooldown_ms
            ));
        }
        Verdict {
            switch_to: Some(to),
            reason,
        }
    }
}

/// One automatic switch.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Event {
    /// Seconds since the Unix epoch.
    pub at: u64,
    pub block: &'static str,
    pub from: &'static str,
    pub to: &'static str,
    pub reason: String,
    pub signal: Signal,
}

/// What `GET /autoswitch` answers.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Status {
    pub enabled: bool,
    pub eviction: String,
    pub verdict: Option<Verdict>,
    pub signal: Option<Signal>,
    pub switches: u64,
    /// The recent switches, oldest first.
    pub events: Vec<Event>,
}

struct State {
    decider: Decider,
    verdict: Option<Verdict>,
    events: VecDeque<Event>,
}

/// A cell's automatic policy: the decider, its switch and what it did.
pub struct AutoSwitch {
    enabled: AtomicBool,
    switches: AtomicU64,
    events_kept: usize,
    state: Mutex<State>,
}

impl AutoSwitch {
    pub fn new(config: &SwitchingConfig) -> AutoSwitch {
        AutoSwitch {
            enabled: AtomicBool::new(config.auto),
            switches: AtomicU64::new(0),
            events_kept: config.events_kept,
            state: Mutex::new(State {
                decider: Decider::new(config.clone()),
                verdict: None,
                events: VecDeque::new(),
            }),
        }
    }

    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// Turns the automatic switches on or off (sampling goes on either way).
    pub fn set_enabled(&self, on: bool) {
        if self.enabled.swap(on, Ordering::Relaxed) != on {
            tracing::info!(enabled = on, "automatic switching");
        }
    }

    /// Switches made since the cell started.
    pub fn switches(&self) -> u64 {
        self.switches.load(Ordering::Relaxed)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic elsewhere cannot leave the state half-written: every field is replaced whole.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn status(&self, cell: &Cell) -> Status {
        let st = self.state();
        Status {
            enabled: self.enabled(),
            eviction: cell.store.eviction().name().to_string(),
            verdict: st.verdict.clone(),
            signal: st.decider.signal(),
            switches: self.switches(),
            events: st.events.iter().cloned().collect(),
        }
    }

    /// One turn: samples `cell`'s store, decides, and switches when on.
    pub fn tick(&self, cell: &Cell, at_ms: u64) {
        let kind = cell.store.eviction();
        let s = cell.store.stats();
        let sample = Sample {
            at_ms,
            policy: Eviction::of(kind),
            evicted: s.evicted_items,
            evicted_unread: s.evicted_unfetched,
            inserted: s.total_items,
            ghost_hits: s.ghost_hits,
        };
        let mut st = self.state();
        let verdict = st.decider.observe(sample);
        st.verdict = Some(verdict.clone());
        let (Some(from), Some(to)) = (sample.policy, verdict.switch_to) else {
            return;
        };
        if !self.enabled() {
            return;
        }
        let kind = cell.store.eviction_named(to.name()).unwrap_or(to.kind());
        if let Err(e) = cell.store.switch_eviction(kind, cell.now()) {
            tracing::warn!(to = to.name(), error = %e, "automatic switch refused");
            return;
        }
        self.switches.fetch_add(1, Ordering::Relaxed);
        tracing::info!(
            block = "eviction",
            from = from.name(),
            to = to.name(),
            reason = verdict.reason,
            "switched automatically"
        );
        let event = Event {
            at: crate::cell::unix_now_secs(),
            block: "eviction",
            from: from.name(),
            to: to.name(),
            reason: verdict.reason,
            signal: st.decider.signal().unwrap_or_default(),
        };
        st.events.push_back(event);
        while st.events.len() > self.events_kept {
            st.events.pop_front();
        }
    }

    /// Samples `cell` every `switching.sample_interval_ms` until it shuts down.
    pub fn spawn(cell: Arc<Cell>) -> std::io::Result<()> {
        let interval = Duration::from_millis(cell.config.switching.sample_interval_ms);
        std::thread::Builder::new()
            .name("autoswitch".into())
            .spawn(move || {
                let started = Instant::now();
                let mut next = started + interval;
                while !cell.shutdown.is_triggered() {
                    let now = Instant::now();
                    if now < next {
                        std::thread::sleep((next - now).min(SHUTDOWN_POLL));
                        continue;
                    }
                    next = now + interval;
                    let at_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
                    cell.auto_switch.tick(&cell, at_ms);
                }
            })
            .map(drop)
    }
}

#[cfg(test)]
#[path = "auto_tests.rs"]
mod tests;
