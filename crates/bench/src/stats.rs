//! Measurement plumbing: HDR latency histograms and per-operation counters.
//!
//! Each generator thread owns its [`ThreadStats`] (no sharing, no atomics on the hot path);
//! after the run they are merged into one. Latencies are recorded in nanoseconds with three
//! significant digits over 1 ns..1 h, so every reported percentile is within 0.1 % of the true
//! value. A latency above the top of the range is recorded as the top and counted in
//! `clamped`, never dropped. Reports convert to microseconds.

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use crate::workload::OpKind;

/// Highest latency the histograms resolve: one hour, in nanoseconds.
pub const LATENCY_NS_MAX: u64 = 3_600 * 1_000_000_000;
/// Significant decimal digits kept by the histograms.
pub const LATENCY_SIGNIFICANT_DIGITS: u8 = 3;

/// A latency histogram in nanoseconds.
#[derive(Debug, Clone)]
pub struct LatencyHistogram {
    hist: Histogram<u64>,
    clamped: u64,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self::new()
    }
}

impl LatencyHistogram {
    /// An empty histogram.
    pub fn new() -> Self {
        // The bounds are constants that hdrhistogram accepts (low >= 1, high >= 2*low,
        // digits <= 5); a failure here is a programming error caught by every test.
        let hist = Histogram::new_with_bounds(1, LATENCY_NS_MAX, LATENCY_SIGNIFICANT_DIGITS)
            .expect("constant histogram bounds are valid");
        Self { hist, clamped: 0 }
    }

    /// Records one latency.
    pub fn record(&mut self, latency_ns: u64) {
        if latency_ns > LATENCY_NS_MAX {
            self.clamped += 1;
        }
        self.hist
            .saturating_record(latency_ns.clamp(1, LATENCY_NS_MAX));
    }

    /// Number of recorded latencies.
    pub fn len(&self) -> u64 {
        self.hist.len()
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.hist.is_empty()
    }

    /// Adds every sample of `other`.
    pub fn merge(&mut self, other: &LatencyHistogram) {
        // Both histograms have the same bounds, so `add` cannot fail.
        let _ = self.hist.add(&other.hist);
        self.clamped += other.clamped;
    }

    /// Mean, percentiles and extremes in microseconds.
    pub fn summary(&self) -> LatencySummary {
        let us = |ns: u64| ns as f64 / 1_000.0;
        if self.hist.is_empty() {
            return LatencySummary::default();
        }
        LatencySummary {
            count: self.hist.len(),
            mean_us: self.hist.mean() / 1_000.0,
            min_us: us(self.hist.min()),
            p50_us: us(self.hist.value_at_quantile(0.50)),
            p90_us: us(self.hist.value_at_quantile(0.90)),
            p95_us: us(self.hist.value_at_quantile(0.95)),
            p99_us: us(self.hist.value_at_quantile(0.99)),
            p999_us: us(self.hist.value_at_quantile(0.999)),
            max_us: us(self.hist.max()),
            clamped: self.clamped,
        }
    }

    /// Latency at each quantile of [`SPECTRUM_QUANTILES`], for percentile plots.
    pub fn spectrum(&self) -> Vec<SpectrumPoint> {
        if self.hist.is_empty() {
            return Vec::new();
        }
        SPECTRUM_QUANTILES
            .iter()
            .map(|&q| SpectrumPoint {
                quantile: q,
                latency_us: self.hist.value_at_quantile(q) as f64 / 1_000.0,
            })
            .collect()
    }
}

/// Quantiles the percentile spectrum reports, from the median to five nines.
pub const SPECTRUM_QUANTILES: [f64; 12] = [
    0.0, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.995, 0.999, 0.9999, 0.99999, 1.0,
];

/// One point of a percentile spectrum.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SpectrumPoint {
    pub quantile: f64,
    pub latency_us: f64,
}

/// Latency statistics in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct LatencySummary {
    pub count: u64,
    pub mean_us: f64,
    pub min_us: f64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p95_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
    /// Samples above the histogram's range (recorded as its maximum).
    pub clamped: u64,
}

/// Counters and latencies of one operation kind.
#[derive(Debug, Clone, Default)]
pub struct OpStats {
    /// Requests written to a connection.
    pub sent: u64,
    /// Requests that got a well-formed, non-error reply.
    pub replies: u64,
    /// Requests that got an error reply, or none (connection lost, drain timeout).
    pub errors: u64,
    /// Keys found (gets) — one multi-get counts each key.
    pub hits: u64,
    /// Keys not found (gets).
    pub misses: u64,
    /// Sets answered with something other than `STORED` (e.g. `NOT_STORED`).
    pub not_stored: u64,
    /// Latency of every reply (errors excluded), from the intended send time.
    pub latency: LatencyHistogram,
}

impl OpStats {
    fn merge(&mut self, other: &OpStats) {
        self.sent += other.sent;
        self.replies += other.replies;
        self.errors += other.errors;
        self.hits += other.hits;
        self.misses += other.misses;
        self.not_stored += other.not_stored;
        self.latency.merge(&other.latency);
    }
}

/// Everything one generator thread measured during the measured phase.
#[derive(Debug, Clone, Default)]
pub struct ThreadStats {
    pub ops: BTreeMap<OpKind, OpStats>,
    /// Errors by cause (e.g. `server_error`, `connection`, `timeout`).
    pub errors_by_kind: BTreeMap<String, u64>,
    /// Open loop: requests whose actual send lagged their intended time by more than the
    /// late threshold.
    pub late_sends: u64,
    /// Open loop: late sends that had not waited for a free connection slot, i.e. the
    /// generator itself was late (descheduled or saturated).
    pub late_sends_generator: u64,
    /// Open loop: arrivals never sent because the backlog was full.
    pub dropped: u64,
    /// Replies completed per whole second of the measured phase, all kinds together.
    pub timeline: Vec<u64>,
    /// Requests sent during warm-up (not in any other counter).
    pub warmup_sent: u64,
    /// Nanoseconds from the start of measurement to the last measured reply.
    pub last_reply_ns: u64,
}

impl ThreadStats {
    /// The counters of `op`, created on first use.
    pub fn op(&mut self, op: OpKind) -> &mut OpStats {
        self.ops.entry(op).or_default()
    }

    /// Counts one error of kind `kind` against `op`.
    pub fn error(&mut self, op: OpKind, kind: &str) {
        self.op(op).errors += 1;
        *self.errors_by_kind.entry(kind.to_owned()).or_default() += 1;
    }

    /// Counts one completed reply in the timeline, `since_start_ns` after measurement began.
    pub fn tick(&mut self, since_start_ns: u64) {
        let second = (since_start_ns / 1_000_000_000) as usize;
        // The timeline is bounded by the run's length; a reply long after the end (drain)
        // lands in the last bucket that exists rather than growing the vector without limit.
        const TIMELINE_SECONDS_MAX: usize = 24 * 3600;
        let second = second.min(TIMELINE_SECONDS_MAX);
        if self.timeline.len() <= second {
            self.timeline.resize(second + 1, 0);
        }
        self.timeline[second] += 1;
        self.last_reply_ns = self.last_reply_ns.max(since_start_ns);
    }

    /// Adds everything `other` measured.
    pub fn merge(&mut self, other: &ThreadStats) {
        for (op, stats) in &other.ops {
            self.op(*op).merge(stats);
        }
        for (kind, n) in &other.errors_by_kind {
            *self.errors_by_kind.entry(kind.clone()).or_default() += n;
        }
        self.late_sends += other.late_sends;
        self.late_sends_generator += other.late_sends_generator;
        self.dropped += other.dropped;
        if self.timeline.len() < other.timeline.len() {
            self.timeline.resize(other.timeline.len(), 0);
        }
        for (mine, theirs) in self.timeline.iter_mut().zip(&other.timeline) {
            *mine += theirs;
        }
        self.warmup_sent += other.warmup_sent;
        self.last_reply_ns = self.last_reply_ns.max(other.last_reply_ns);
    }

    /// Latencies of all kinds together.
    pub fn all_latency(&self) -> LatencyHistogram {
        let mut all = LatencyHistogram::new();
        for stats in self.ops.values() {
            all.merge(&stats.latency);
        }
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_within_histogram_precision() {
        let mut h = LatencyHistogram::new();
        for us in 1..=10_000u64 {
            h.record(us * 1_000);
        }
        let s = h.summary();
        assert_eq!(s.count, 10_000);
        let close = |got: f64, want: f64| (got - want).abs() <= want * 0.001 + 0.001;
        assert!(close(s.p50_us, 5_000.0), "{s:?}");
        assert!(close(s.p90_us, 9_000.0), "{s:?}");
        assert!(close(s.p99_us, 9_900.0), "{s:?}");
        assert!(close(s.p999_us, 9_990.0), "{s:?}");
        assert!(close(s.max_us, 10_000.0), "{s:?}");
        assert!(close(s.min_us, 1.0), "{s:?}");
        assert!(close(s.mean_us, 5_000.5), "{s:?}");
        assert_eq!(h.spectrum().len(), SPECTRUM_QUANTILES.len());
    }

    #[test]
    fn out_of_range_samples_are_clamped_and_counted() {
        let mut h = LatencyHistogram::new();
        h.record(0);
        h.record(LATENCY_NS_MAX * 2);
        let s = h.summary();
        assert_eq!((s.count, s.clamped), (2, 1));
        assert!(s.max_us >= LATENCY_NS_MAX as f64 / 1_000.0 * 0.999);
        assert_eq!(LatencyHistogram::new().summary(), LatencySummary::default());
    }

    #[test]
    fn merging_threads_adds_everything() {
        let mut a = ThreadStats::default();
        let mut b = ThreadStats::default();
        a.op(OpKind::Get).sent = 3;
        a.op(OpKind::Get).latency.record(1_000);
        a.tick(500);
        b.op(OpKind::Get).sent = 2;
        b.op(OpKind::Get).latency.record(3_000);
        b.error(OpKind::Set, "timeout");
        b.tick(2_100_000_000);
        b.dropped = 4;
        a.merge(&b);
        assert_eq!(a.ops[&OpKind::Get].sent, 5);
        assert_eq!(a.ops[&OpKind::Get].latency.len(), 2);
        assert_eq!(a.ops[&OpKind::Set].errors, 1);
        assert_eq!(a.errors_by_kind["timeout"], 1);
        assert_eq!(a.timeline, vec![1, 0, 1]);
        assert_eq!(a.dropped, 4);
        assert_eq!(a.last_reply_ns, 2_100_000_000);
        assert_eq!(a.all_latency().len(), 2);
        assert!((a.all_latency().summary().mean_us - 2.0).abs() < 0.01);
    }
}
