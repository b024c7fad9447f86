//! The policy's settings and what makes them unusable.

use serde::{Deserialize, Serialize};

/// The policy's settings (`[autoscale]` in the node's TOML, which adds the provisioner).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyConfig {
    /// Fill (live bytes / memory limit) at or above which a cell divides.
    pub high_water: f64,
    /// Fill below which a provisioned cell is absorbed.
    pub low_water: f64,
    /// How long a cell must stay beyond a watermark before it counts.
    pub window_ms: u64,
    /// Quiet time after a change before the next one (a division racing eviction excepted).
    pub cooldown_ms: u64,
    /// The ring never absorbs below this many cells.
    pub min_cells: usize,
    /// The ring never divides beyond this many cells.
    pub max_cells: usize,
    /// What a division is assumed to take until one has been measured.
    pub division_lead_ms: u64,
    /// A decision not visible in the map this long after it was made has failed.
    pub join_timeout_ms: u64,
    /// Wait after a failed decision, doubled per consecutive failure.
    pub retry_backoff_ms: u64,
    /// Most wait after failures.
    pub retry_backoff_max_ms: u64,
    /// The ring's data counts as growing only when it gains more than this fraction of a
    /// cell's memory per window. A smoothed rate decays towards zero but never reaches it
    /// (the last hand-off's growth would otherwise block every absorption for good).
    pub steady_fill: f64,
    /// Neighbours count as skewed when the heavier masters more than `1 + balance_skew`
    /// times the lighter's bytes (0: never balance).
    pub balance_skew: f64,
    /// ... and at least this fraction of its memory more: smaller differences are not worth
    /// a move.
    pub balance_min_fill: f64,
    /// Neighbours count as skewed in load when the busier executes more than
    /// `1 + balance_load_skew` times the other's key requests per second (0: never by load).
    pub balance_load_skew: f64,
    /// ... and at least this many more per second.
    pub balance_min_load: f64,
    /// A move of less than this share of the giver's range is not worth a shift.
    pub balance_min_share: f64,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            high_water: 0.8,
            low_water: 0.3,
            window_ms: 30_000,
            cooldown_ms: 60_000,
            min_cells: 1,
            max_cells: 32,
            division_lead_ms: 10_000,
            join_timeout_ms: 60_000,
            retry_backoff_ms: 5_000,
            retry_backoff_max_ms: 120_000,
            steady_fill: 0.01,
            balance_skew: 0.5,
            balance_min_fill: 0.05,
            balance_load_skew: 1.0,
            balance_min_load: 1000.0,
            balance_min_share: 0.02,
        }
    }
}

/// Why a policy's settings cannot work.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PolicyConfigError {
    #[error("autoscale watermarks must satisfy 0 < low_water ({low}) < high_water ({high}) <= 1")]
    Watermarks { low: f64, high: f64 },
    #[error("autoscale min_cells ({min}) must be at least 1 and at most max_cells ({max})")]
    Cells { min: usize, max: usize },
    #[error("autoscale steady_fill ({0}) must be at least 0 and below low_water")]
    SteadyFill(f64),
    #[error(
        "autoscale balance_skew ({skew}) must be at least 0 and balance_min_fill ({min}) within [0, 1]"
    )]
    Balance { skew: f64, min: f64 },
    #[error("autoscale balance_load_skew ({skew}) and balance_min_load ({min}) must be at least 0")]
    BalanceLoad { skew: f64, min: f64 },
    #[error("autoscale balance_min_share ({0}) must be within (0, 0.5)")]
    BalanceShare(f64),
}

impl PolicyConfig {
    pub fn validate(&self) -> Result<(), PolicyConfigError> {
        let (low, high) = (self.low_water, self.high_water);
        if !(low > 0.0 && low < high && high <= 1.0) {
            return Err(PolicyConfigError::Watermarks { low, high });
        }
        if self.min_cells == 0 || self.min_cells > self.max_cells {
            return Err(PolicyConfigError::Cells {
                min: self.min_cells,
                max: self.max_cells,
            });
        }
        if !(self.steady_fill >= 0.0 && self.steady_fill < low) {
            return Err(PolicyConfigError::SteadyFill(self.steady_fill));
        }
        let (skew, min) = (self.balance_skew, self.balance_min_fill);
        if !(skew >= 0.0 && skew.is_finite() && (0.0..=1.0).contains(&min)) {
            return Err(PolicyConfigError::Balance { skew, min });
        }
        let (skew, min) = (self.balance_load_skew, self.balance_min_load);
        if !(skew >= 0.0 && skew.is_finite() && min >= 0.0 && min.is_finite()) {
            return Err(PolicyConfigError::BalanceLoad { skew, min });
        }
        if !(self.balance_min_share > 0.0 && self.balance_min_share < 0.5) {
            return Err(PolicyConfigError::BalanceShare(self.balance_min_share));
        }
        Ok(())
    }

    /// The fill no cell may reach through an absorption: halfway between the watermarks.
    pub(super) fn absorb_ceiling(&self) -> f64 {
        (self.low_water + self.high_water) / 2.0
    }
}
