//! Measurement plumbing: HDR latency histograms and per-operation counters.
//!
//! Each generator thread owns its [`ThreadStats`] (no sharing, no atomics on the hot path);
//! after the run they are merged into one. Latencies are recorded in nanoseconds with three
//! significant digits over 1 ns..1 h, so every reported percentile is within 0.1 % of the true
//! value. A latency above the top of the range is recorded as the top and counted in
//! `clamped`, never dropped. Reports convert to microseconds.
//!
//! Beside the run's totals, each thread keeps a per-second timeline of the measured phase
//! ([`SecondStats`]: replies, errors, hits, misses and a small latency histogram per second),
//! merged second by second like the totals. Its histograms are coarser (microseconds, two
//! significant digits, grown only as far as the second's largest sample) and the timeline
//! stops after [`TIMELINE_DETAIL_SECONDS_MAX`] seconds, so its memory stays bounded: a few
//! kilobytes per second, tens of megabytes for an hour-long run.

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

/// Seconds of the measured phase the replies-per-second timeline covers; a reply later than
/// that (a drain after a very long run) is counted in the last second.
pub const TIMELINE_SECONDS_MAX: usize = 24 * 3600;
/// Seconds of the measured phase the detailed per-second timeline ([`SecondStats`]) covers;
/// later replies and errors are left out of it (they are in the totals and in the
/// replies-per-second timeline).
pub const TIMELINE_DETAIL_SECONDS_MAX: usize = 3600;
/// Significant decimal digits of the per-second latency histograms.
pub const TIMELINE_SIGNIFICANT_DIGITS: u8 = 2;

/// The latencies of one second's replies, in microseconds, two significant digits.
///
/// The histogram starts tiny and grows (hdrhistogram's auto-resize) only up to the largest
/// latency recorded in its second: about 6 KB for a second whose slowest reply took 100 ms,
/// 13 KB at the one-hour top.
#[derive(Debug, Clone)]
pub struct SecondLatency {
    hist: Histogram<u32>,
}

impl Default for SecondLatency {
    fn default() -> Self {
        Self::new()
    }
}

impl SecondLatency {
    /// An empty histogram.
    pub fn new() -> Self {
        // Valid constants (digits <= 5); auto-resizing from the smallest range.
        let mut hist =
            Histogram::new(TIMELINE_SIGNIFICANT_DIGITS).expect("constant histogram digits");
        hist.auto(true);
        Self { hist }
    }

    /// Records one latency given in nanoseconds (kept in microseconds, rounded up, at most
    /// one hour).
    pub fn record(&mut self, latency_ns: u64) {
        let us = latency_ns.min(LATENCY_NS_MAX).div_ceil(1_000);
        // `record` grows the histogram to hold `us` (`saturating_record` would clamp it to
        // the current top instead); it cannot fail for a value this bounded, but if it did
        // the sample is still counted, at the top.
        if self.hist.record(us).is_err() {
            self.hist.saturating_record(us);
        }
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
    pub fn merge(&mut self, other: &SecondLatency) {
        // Auto-resizing histograms of equal precision: `add` grows this one as needed.
        let _ = self.hist.add(&other.hist);
    }

    /// Latency at `quantile` in microseconds (the highest value equivalent to it at this
    /// precision), or `None` when nothing was recorded.
    pub fn quantile_us(&self, quantile: f64) -> Option<f64> {
        (!self.hist.is_empty()).then(|| self.hist.value_at_quantile(quantile) as f64)
    }

    /// The largest latency in microseconds, or `None` when nothing was recorded.
    pub fn max_us(&self) -> Option<f64> {
        (!self.hist.is_empty()).then(|| self.hist.max() as f64)
    }

    /// Bytes held by the histogram's counts (for the memory bound's test).
    pub fn count_bytes(&self) -> usize {
        self.hist.distinct_values() * std::mem::size_of::<u32>()
    }
}

/// What happened in one whole second of the measured phase, all operation kinds together.
#[derive(Debug, Clone, Default)]
pub struct SecondStats {
    /// Replies completed in this second.
    pub replies: u64,
    /// Errors counted in this second: an error reply or a lost connection when it was seen,
    /// a request left unanswered at the end of the drain.
    pub errors: u64,
    /// Keys found by the gets completed in this second.
    pub hits: u64,
    /// Keys not found by the gets completed in this second.
    pub misses: u64,
    /// Open loop: requests intended in this second that were sent late (see
    /// [`ThreadStats::late_sends`]).
    pub late_sends: u64,
    /// The part of `late_sends` late by the generator's own lag.
    pub late_sends_generator: u64,
    /// Latency of the replies completed in this second.
    pub latency: SecondLatency,
}

impl SecondStats {
    fn merge(&mut self, other: &SecondStats) {
        self.replies += other.replies;
        self.errors += other.errors;
        self.hits += other.hits;
        self.misses += other.misses;
        self.late_sends += other.late_sends;
        self.late_sends_generator += other.late_sends_generator;
        self.latency.merge(&other.latency);
    }
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
    /// Replies completed per whole second of the measured phase, all kinds together (at
    /// most [`TIMELINE_SECONDS_MAX`] + 1 entries).
    pub timeline: Vec<u64>,
    /// Per whole second of the measured phase: replies, errors, hits, misses, latency (at
    /// most [`TIMELINE_DETAIL_SECONDS_MAX`] entries).
    pub seconds: Vec<SecondStats>,
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

    /// Counts one error of kind `kind` against `op`, not placed in the timeline.
    pub fn error(&mut self, op: OpKind, kind: &str) {
        self.op(op).errors += 1;
        *self.errors_by_kind.entry(kind.to_owned()).or_default() += 1;
    }

    /// Counts one error of kind `kind` against `op`, seen `since_start_ns` after measurement
    /// began (also in that second of the timeline).
    pub fn error_at(&mut self, op: OpKind, kind: &str, since_start_ns: u64) {
        self.error(op, kind);
        if let Some(second) = self.second(since_start_ns) {
            second.errors += 1;
        }
    }

    /// Counts one completed reply in the timeline, `since_start_ns` after measurement began.
    pub fn tick(&mut self, since_start_ns: u64) {
        let second = (since_start_ns / 1_000_000_000) as usize;
        // The timeline is bounded by the run's length; a reply long after the end (drain)
        // lands in the last bucket that exists rather than growing the vector without limit.
        let second = second.min(TIMELINE_SECONDS_MAX);
        if self.timeline.len() <= second {
            self.timeline.resize(second + 1, 0);
        }
        self.timeline[second] += 1;
        self.last_reply_ns = self.last_reply_ns.max(since_start_ns);
    }

    /// Counts one completed reply, `since_start_ns` after measurement began, with its latency
    /// and the keys its get found and missed, in both timelines.
    pub fn reply_at(&mut self, since_start_ns: u64, latency_ns: u64, hits: u64, misses: u64) {
        self.tick(since_start_ns);
        if let Some(second) = self.second(since_start_ns) {
            second.replies += 1;
            second.hits += hits;
            second.misses += misses;
            second.latency.record(latency_ns);
        }
    }

    /// Counts one late send of a request intended `intended_since_start_ns` after measurement
    /// began; `generator` when it had not waited for a connection slot (the generator's own
    /// lag).
    pub fn late_send_at(&mut self, intended_since_start_ns: u64, generator: bool) {
        self.late_sends += 1;
        self.late_sends_generator += u64::from(generator);
        if let Some(second) = self.second(intended_since_start_ns) {
            second.late_sends += 1;
            second.late_sends_generator += u64::from(generator);
        }
    }

    /// The detailed timeline's entry of the second holding `since_start_ns`, created (with
    /// the empty seconds before it) on first use; `None` past the timeline's end.
    fn second(&mut self, since_start_ns: u64) -> Option<&mut SecondStats> {
        let second = (since_start_ns / 1_000_000_000) as usize;
        if second >= TIMELINE_DETAIL_SECONDS_MAX {
            return None;
        }
        if self.seconds.len() <= second {
            self.seconds.resize_with(second + 1, SecondStats::default);
        }
        Some(&mut self.seconds[second])
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
        if self.seconds.len() < other.seconds.len() {
            self.seconds
                .resize_with(other.seconds.len(), SecondStats::default);
        }
        for (mine, theirs) in self.seconds.iter_mut().zip(&other.seconds) {
            mine.merge(theirs);
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
    fn per_second_timeline_places_replies_errors_and_keys_in_their_second() {
        let mut t = ThreadStats::default();
        // Second 0: four gets (one a miss) of 100, 200, 200 and 300 µs; second 2: a set of
        // 5 ms and an error. Second 1 had nothing.
        t.reply_at(10_000_000, 100_000, 1, 0);
        t.reply_at(500_000_000, 200_000, 1, 0);
        t.reply_at(600_000_000, 200_000, 1, 0);
        t.reply_at(999_999_999, 300_000, 0, 1);
        t.reply_at(2_000_000_000, 5_000_000, 0, 0);
        t.error_at(OpKind::Get, "server_error", 2_500_000_000);
        assert_eq!(t.seconds.len(), 3);
        assert_eq!(
            t.timeline,
            vec![4, 0, 1],
            "the replies-per-second timeline too"
        );
        let s0 = &t.seconds[0];
        assert_eq!((s0.replies, s0.errors, s0.hits, s0.misses), (4, 0, 3, 1));
        assert_eq!(s0.latency.quantile_us(0.5), Some(200.0));
        // 300 µs is past the unit-resolution part (2 × 128 values): within one step of 2.
        let max = s0.latency.max_us().unwrap();
        assert!((300.0..=302.0).contains(&max), "{max}");
        let s1 = &t.seconds[1];
        assert_eq!((s1.replies, s1.errors), (0, 0));
        assert_eq!(s1.latency.quantile_us(0.99), None);
        let s2 = &t.seconds[2];
        assert_eq!((s2.replies, s2.errors, s2.hits, s2.misses), (1, 1, 0, 0));
        assert_eq!(
            t.ops[&OpKind::Get].errors,
            1,
            "error_at also counts the error"
        );
        assert_eq!(t.errors_by_kind["server_error"], 1);
        // Two significant digits: within 1 % (hdrhistogram keeps 1/128 at 2 digits).
        let p99 = s2.latency.quantile_us(0.99).unwrap();
        assert!((5_000.0..=5_050.0).contains(&p99), "{p99}");
        t.late_send_at(1_100_000_000, true);
        t.late_send_at(1_200_000_000, false);
        assert_eq!((t.late_sends, t.late_sends_generator), (2, 1));
        let s1 = &t.seconds[1];
        assert_eq!((s1.late_sends, s1.late_sends_generator), (2, 1));
        // `error` alone stays out of the timeline (warm-up, callers without a time).
        t.error(OpKind::Set, "timeout");
        assert_eq!(t.seconds.iter().map(|s| s.errors).sum::<u64>(), 1);
    }

    #[test]
    fn per_second_timeline_is_bounded() {
        let mut t = ThreadStats::default();
        let past_end = TIMELINE_DETAIL_SECONDS_MAX as u64 * 1_000_000_000;
        t.reply_at(past_end, 1_000, 1, 0);
        t.error_at(OpKind::Get, "timeout", past_end + 5);
        assert!(
            t.seconds.is_empty(),
            "nothing past the detailed timeline's end"
        );
        assert_eq!(t.timeline.len(), TIMELINE_DETAIL_SECONDS_MAX + 1);
        t.reply_at(past_end - 1, 1_000, 1, 0);
        assert_eq!(t.seconds.len(), TIMELINE_DETAIL_SECONDS_MAX);
        // A second's histogram grows only as far as its largest sample: small for a
        // loopback second, bounded at the one-hour top.
        let mut small = SecondLatency::new();
        for us in 1..=100_000u64 {
            small.record(us * 1_000);
        }
        assert_eq!(small.max_us().map(|m| m >= 100_000.0), Some(true));
        assert!(small.count_bytes() <= 8 * 1024, "{}", small.count_bytes());
        let mut top = SecondLatency::new();
        top.record(u64::MAX);
        assert!(top.count_bytes() <= 16 * 1024, "{}", top.count_bytes());
        assert_eq!(top.len(), 1, "the sample is kept");
        let max = top.max_us().unwrap();
        assert!(max >= 3.59e9, "{max}");
    }

    #[test]
    fn merging_threads_merges_their_seconds() {
        let mut a = ThreadStats::default();
        let mut b = ThreadStats::default();
        for us in 1..=50u64 {
            a.reply_at(100, us * 1_000, 1, 0);
        }
        for us in 51..=100u64 {
            b.reply_at(200, us * 1_000, 0, 1);
        }
        b.error_at(OpKind::Get, "connection", 1_200_000_000);
        a.merge(&b);
        assert_eq!(a.seconds.len(), 2);
        let s0 = &a.seconds[0];
        assert_eq!((s0.replies, s0.hits, s0.misses), (100, 50, 50));
        assert_eq!(s0.latency.quantile_us(0.5), Some(50.0));
        assert_eq!(s0.latency.quantile_us(0.99), Some(99.0));
        assert_eq!(s0.latency.max_us(), Some(100.0));
        assert_eq!(a.seconds[1].errors, 1);
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
