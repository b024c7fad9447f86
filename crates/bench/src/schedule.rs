//! Open-loop arrival schedule: when each request *should* be sent.
//!
//! The schedule is a pure function of the rate, the arrival process and a seed; it never looks
//! at when requests were actually sent. The engine asks it which arrivals are due at `now` and
//! measures each request's latency from its intended time. If the server (or the generator)
//! stalls for 100 ms at 1000 req/s, the 100 arrivals that fell due in the stall keep their
//! intended times, so their latencies include the stall — the load generator cannot hide
//! queueing by slowing down, which is what "coordinated omission" would do.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

/// The arrival process of an open loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Arrival {
    /// Evenly spaced arrivals, one every `1/rate`.
    Uniform,
    /// A Poisson process: exponentially distributed gaps with mean `1/rate`.
    Poisson,
}

/// The intended send times of one generator thread, in nanoseconds on the run's clock.
#[derive(Debug, Clone)]
pub struct Schedule {
    arrival: Arrival,
    interval_ns: f64,
    /// Kept fractional so that rounding does not drift the rate over a long run.
    next_ns: f64,
    rng: SmallRng,
}

impl Schedule {
    /// A schedule of `rate_per_sec` arrivals whose first arrival is at `start_ns`.
    /// `rate_per_sec` must be positive and finite (checked by the caller's config validation;
    /// a non-positive rate yields a schedule whose first arrival never comes).
    pub fn new(rate_per_sec: f64, arrival: Arrival, start_ns: u64, seed: u64) -> Self {
        let interval_ns = if rate_per_sec > 0.0 && rate_per_sec.is_finite() {
            1e9 / rate_per_sec
        } else {
            f64::INFINITY
        };
        let mut schedule = Self {
            arrival,
            interval_ns,
            next_ns: if interval_ns.is_finite() {
                start_ns as f64
            } else {
                f64::INFINITY
            },
            rng: SmallRng::seed_from_u64(seed),
        };
        if arrival == Arrival::Poisson {
            schedule.next_ns += schedule.gap();
        }
        schedule
    }

    fn gap(&mut self) -> f64 {
        match self.arrival {
            Arrival::Uniform => self.interval_ns,
            Arrival::Poisson => {
                // Inverse-CDF of the exponential distribution; 1-u is in (0, 1], so ln is finite.
                let u: f64 = self.rng.r#gen();
                -(1.0 - u).ln() * self.interval_ns
            }
        }
    }

    /// The intended time of the next arrival (due or not).
    pub fn peek_ns(&self) -> u64 {
        if self.next_ns.is_finite() {
            self.next_ns as u64
        } else {
            u64::MAX
        }
    }

    /// The next arrival if it is due at `now_ns`, advancing the schedule. Call repeatedly to
    /// collect every arrival that fell due; each keeps its own intended time.
    pub fn next_due(&mut self, now_ns: u64) -> Option<u64> {
        let intended = self.peek_ns();
        if !self.next_ns.is_finite() || intended > now_ns {
            return None;
        }
        self.next_ns += self.gap();
        Some(intended)
    }
}

/// Latency of a request as the open loop defines it: from intended send time to reply.
pub fn latency_ns(intended_ns: u64, replied_ns: u64) -> u64 {
    replied_ns.saturating_sub(intended_ns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stall_keeps_intended_times() {
        // 1000 req/s starting at t = 5 ms; the generator is stalled until t = 105 ms.
        let mut s = Schedule::new(1000.0, Arrival::Uniform, 5_000_000, 0);
        let now = 105_000_000;
        let due: Vec<u64> = std::iter::from_fn(|| s.next_due(now)).take(1_000).collect();
        assert_eq!(due.len(), 101, "arrivals at 5, 6, ..., 105 ms");
        for (i, &t) in due.iter().enumerate() {
            assert_eq!(
                t,
                5_000_000 + i as u64 * 1_000_000,
                "arrival {i} keeps its slot"
            );
        }
        // Sent now and answered 1 ms later, the first arrival's latency includes the stall.
        assert_eq!(latency_ns(due[0], now + 1_000_000), 101_000_000);
        assert_eq!(s.next_due(now), None);
        assert_eq!(s.peek_ns(), 106_000_000);
    }

    #[test]
    fn poisson_has_the_requested_rate_and_exponential_gaps() {
        let rate = 20_000.0;
        let mut s = Schedule::new(rate, Arrival::Poisson, 0, 11);
        let horizon_ns = 10_000_000_000u64; // 10 s of arrivals, generated instantly
        let times: Vec<u64> = std::iter::from_fn(|| s.next_due(horizon_ns))
            .take(1_000_000)
            .collect();
        let n = times.len() as f64;
        let expected = rate * 10.0;
        // Poisson count: sd = sqrt(200000) ≈ 447; allow 5 sd.
        assert!((n - expected).abs() < 5.0 * expected.sqrt(), "{n} arrivals");
        // Exponential gaps: coefficient of variation 1 (uniform spacing would give 0).
        let gaps: Vec<f64> = times.windows(2).map(|w| (w[1] - w[0]) as f64).collect();
        let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
        let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64;
        let cv = var.sqrt() / mean;
        assert!((cv - 1.0).abs() < 0.02, "cv {cv}");
        assert!(times.windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn nothing_is_due_before_its_time_and_bad_rates_never_fire() {
        let mut s = Schedule::new(50.0, Arrival::Uniform, 1_000, 0);
        assert_eq!(s.next_due(999), None);
        assert_eq!(s.next_due(1_000), Some(1_000));
        assert_eq!(s.next_due(20_000_999), None);
        assert_eq!(s.next_due(20_001_000), Some(20_001_000));
        let mut never = Schedule::new(0.0, Arrival::Uniform, 0, 0);
        assert_eq!(never.next_due(u64::MAX), None);
        assert_eq!(never.peek_ns(), u64::MAX);
    }
}
