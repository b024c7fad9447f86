//! `[switching]`: the automatic policy that switches a cell's building blocks by the access
//! pattern it sees (docs/switching.md). Only the eviction policy is chosen automatically: it
//! is the one block whose best implementation depends on the workload and can be read off
//! the store's own counters.

use serde::{Deserialize, Serialize};

/// `[switching]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SwitchingConfig {
    /// Switch the eviction policy by itself (`serve --auto-switch`; `ctl autoswitch on|off`
    /// at run time). Off, the cell still samples and shows what the policy would decide.
    pub auto: bool,
    /// How often the store's counters are sampled.
    pub sample_interval_ms: u64,
    /// The span a signal is measured over; a decision needs a whole window of samples taken
    /// under the running policy.
    pub window_ms: u64,
    /// The least time between two switches of the eviction policy (a switch by hand
    /// included).
    pub cooldown_ms: u64,
    /// Fewer items evicted in a window than this: the cache holds its working set and no
    /// policy is chosen.
    pub min_evictions: u64,
    /// Under slab LRU: the share of evicted items that were never read at or above which the
    /// cell switches to S3-FIFO (scans and one-hit wonders push out what is read again).
    pub to_s3fifo_unread: f64,
    /// Under S3-FIFO: the share of new items that its ghost table remembered at or above
    /// which the cell switches to slab LRU (most keys come back after they were dropped:
    /// the workload re-reads too widely for a small queue to filter).
    pub to_lru_ghost_hits: f64,
    /// Decisions kept for `ctl autoswitch status` and `ctl status`.
    pub events_kept: usize,
}

impl Default for SwitchingConfig {
    fn default() -> Self {
        // The thresholds are measured (docs/benchmarks/switching.md, "The automatic
        // policy"): the gap between them keeps the cell from switching back and forth.
        SwitchingConfig {
            auto: false,
            sample_interval_ms: 1_000,
            window_ms: 30_000,
            cooldown_ms: 300_000,
            min_evictions: 10_000,
            to_s3fifo_unread: 0.70,
            to_lru_ghost_hits: 0.40,
            events_kept: 32,
        }
    }
}

impl SwitchingConfig {
    /// Why these settings cannot run.
    pub fn validate(&self) -> Result<(), String> {
        let share = |name: &str, v: f64| {
            if v > 0.0 && v <= 1.0 {
                Ok(())
            } else {
                Err(format!("switching.{name} = {v}: a share in (0, 1]"))
            }
        };
        share("to_s3fifo_unread", self.to_s3fifo_unread)?;
        share("to_lru_ghost_hits", self.to_lru_ghost_hits)?;
        if self.sample_interval_ms == 0 || self.window_ms < self.sample_interval_ms {
            return Err(format!(
                "switching.window_ms ({}) must hold at least one switching.sample_interval_ms \
                 ({}), which must be above 0",
                self.window_ms, self.sample_interval_ms
            ));
        }
        Ok(())
    }
}
