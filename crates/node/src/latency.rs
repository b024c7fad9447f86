//! Request service time, as a histogram: `stats cellcache`'s `request_duration_*` fields
//! and `/metrics`' `cellcache_request_duration_seconds`.
//!
//! What is measured: from the moment a connection's engine thread starts on a batch of
//! input to the moment a request's reply is ready to write. A request answered here is
//! ready at the end of its batch (the engine writes the batch's replies together), so the
//! batch's time counts once for each request it executed — two clock reads per batch, none
//! per request. A request that waits (forwarded to its master, or held until its backups
//! acknowledged it) is ready when the other thread fills its reply slot, which reads the
//! clock then; the engine thread records it when it moves the reply out. Time in the
//! kernel's socket buffers and the client's network is not included.
//!
//! Like [`crate::counters`], each connection counts into its own [`LocalLatency`] and folds
//! it into the cell's atomics once per batch, so engine threads never share a cache line
//! per request.
//!
//! The buckets are fixed, powers of two of a microsecond (1 µs … about 4 s, then +Inf), and
//! the same in every cell: the ring's histogram is the sum of its cells' (`sum by (le)`), which
//! needs the same bounds everywhere, and the bucket of a duration is found with one
//! `leading_zeros`. A factor of two per bucket is enough to set and watch a p99 alert.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Bounded buckets: the upper bound of bucket `i` is `2^i` µs. The last one, `2^22` µs
/// (about 4.2 s), is above the longest a request is held by default
/// (`cluster.request_timeout_ms`); longer ones count in +Inf only.
pub const BUCKETS: usize = 23;

/// The upper bound of bucket `i`, in microseconds.
pub const fn bound_us(i: usize) -> u64 {
    1 << i
}

/// The bucket of a duration: the first whose bound is at least it ([`BUCKETS`]: +Inf).
pub fn bucket(d: Duration) -> usize {
    let us = u64::try_from(d.as_nanos().div_ceil(1000)).unwrap_or(u64::MAX);
    if us <= 1 {
        return 0;
    }
    // The smallest i with 2^i >= us.
    let i = (u64::BITS - (us - 1).leading_zeros()) as usize;
    i.min(BUCKETS)
}

/// One connection's observations since its last fold.
#[derive(Debug, Default, Clone)]
pub struct LocalLatency {
    /// Per bucket (not cumulative); the last is +Inf.
    counts: [u64; BUCKETS + 1],
    sum_ns: u64,
    any: bool,
}

impl LocalLatency {
    /// `n` requests that each took `d`.
    pub fn record(&mut self, d: Duration, n: u64) {
        if n == 0 {
            return;
        }
        self.counts[bucket(d)] += n;
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.sum_ns = self.sum_ns.saturating_add(ns.saturating_mul(n));
        self.any = true;
    }
}

/// The cell's histogram.
#[derive(Debug, Default)]
pub struct Latency {
    counts: [AtomicU64; BUCKETS + 1],
    sum_ns: AtomicU64,
}

/// A reading of [`Latency`].
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct LatencySnapshot {
    /// Per bucket (not cumulative); the last is +Inf.
    pub counts: [u64; BUCKETS + 1],
    pub sum_ns: u64,
}

impl LatencySnapshot {
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }
}

impl Latency {
    /// Adds `local` to the cell's histogram and empties it (a batch with nothing measured
    /// touches no atomic).
    pub fn absorb(&self, local: &mut LocalLatency) {
        if !local.any {
            return;
        }
        for (total, n) in self.counts.iter().zip(local.counts) {
            if n != 0 {
                total.fetch_add(n, Relaxed);
            }
        }
        self.sum_ns.fetch_add(local.sum_ns, Relaxed);
        *local = LocalLatency::default();
    }

    pub fn snapshot(&self) -> LatencySnapshot {
        let mut s = LatencySnapshot {
            sum_ns: self.sum_ns.load(Relaxed),
            ..Default::default()
        };
        for (c, total) in s.counts.iter_mut().zip(&self.counts) {
            *c = total.load(Relaxed);
        }
        s
    }

    /// `stats reset`.
    pub fn reset(&self) {
        for c in &self.counts {
            c.store(0, Relaxed);
        }
        self.sum_ns.store(0, Relaxed);
    }

    /// `stats cellcache`'s lines: `request_duration_count`, `request_duration_sum_us`, and
    /// `request_duration_us_le_B` per bound `B`, cumulative as Prometheus's buckets (the
    /// ring's `stats cellcache` sums them over the cells, which keeps them right).
    pub fn write_stats(&self, out: &mut Vec<u8>) {
        use crate::stats::stat;
        let s = self.snapshot();
        stat(out, "request_duration_count", s.count());
        stat(out, "request_duration_sum_us", s.sum_ns / 1000);
        let mut cumulative = 0;
        for (i, n) in s.counts[..BUCKETS].iter().enumerate() {
            cumulative += n;
            stat(
                out,
                &format!("request_duration_us_le_{}", bound_us(i)),
                cumulative,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_duration_goes_to_the_first_bucket_at_least_as_long() {
        let us = Duration::from_micros;
        assert_eq!(bucket(Duration::ZERO), 0);
        assert_eq!(bucket(Duration::from_nanos(999)), 0);
        assert_eq!(bucket(us(1)), 0);
        assert_eq!(bucket(Duration::from_nanos(1001)), 1);
        assert_eq!(bucket(us(2)), 1);
        assert_eq!(bucket(us(3)), 2);
        assert_eq!(bucket(us(1024)), 10);
        assert_eq!(bucket(us(1025)), 11);
        assert_eq!(bucket(us(bound_us(BUCKETS - 1))), BUCKETS - 1);
        assert_eq!(bucket(us(bound_us(BUCKETS - 1) + 1)), BUCKETS);
        assert_eq!(bucket(Duration::from_secs(3600)), BUCKETS);
    }

    #[test]
    fn folds_add_up_and_stats_are_cumulative() {
        let cell = Latency::default();
        let mut local = LocalLatency::default();
        local.record(Duration::from_micros(3), 5);
        local.record(Duration::from_micros(100), 1);
        local.record(Duration::from_micros(7), 0);
        cell.absorb(&mut local);
        local.record(Duration::from_secs(10), 2);
        cell.absorb(&mut local);
        cell.absorb(&mut local);
        let s = cell.snapshot();
        assert_eq!(s.count(), 8);
        assert_eq!((s.counts[2], s.counts[7], s.counts[BUCKETS]), (5, 1, 2));
        assert_eq!(s.sum_ns, 5 * 3_000 + 100_000 + 2 * 10_000_000_000);
        let mut out = Vec::new();
        cell.write_stats(&mut out);
        let text = String::from_utf8(out).unwrap();
        for line in [
            "STAT request_duration_count 8\r\n",
            "STAT request_duration_us_le_2 0\r\n",
            "STAT request_duration_us_le_4 5\r\n",
            "STAT request_duration_us_le_64 5\r\n",
            "STAT request_duration_us_le_128 6\r\n",
            "STAT request_duration_us_le_4194304 6\r\n",
        ] {
            assert!(text.contains(line), "no {line:?} in {text}");
        }
        cell.reset();
        assert_eq!(cell.snapshot().count(), 0);
    }
}
