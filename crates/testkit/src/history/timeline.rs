//! What clients saw over time, for the measurements of the fault tests (throughput before,
//! during and after a fault; how long no request succeeded; errors in the window): the
//! history's operations counted per time bucket by completion time, and the gaps between
//! successful completions.

use std::time::Duration;

use super::{History, HistoryError, Outcome};

/// Operations completed within `[start, start + width)`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bucket {
    pub start: Duration,
    pub ok: u64,
    pub failed: u64,
    pub unknown: u64,
}

/// Counts completed operations per `width` of time, from the first event to the last
/// completion; buckets without completions are kept (zero throughput is the point).
pub fn buckets(history: &History, width: Duration) -> Result<Vec<Bucket>, HistoryError> {
    let width_ns = width.as_nanos().max(1);
    let mut buckets: Vec<Bucket> = Vec::new();
    for operation in history.operations()? {
        let Some(at) = operation.completed_at else {
            continue;
        };
        let slot = (at.as_nanos() / width_ns) as usize;
        if buckets.len() <= slot {
            let from = buckets.len();
            buckets.extend((from..=slot).map(|i| Bucket {
                start: width * i as u32,
                ..Bucket::default()
            }));
        }
        let bucket = &mut buckets[slot];
        match operation.outcome {
            Outcome::Ok(_) => bucket.ok += 1,
            Outcome::Fail(_) => bucket.failed += 1,
            Outcome::Unknown(_) => bucket.unknown += 1,
        }
    }
    Ok(buckets)
}

/// The longest interval, starting at or after `from`, in which no operation completed
/// successfully: `(start, end)` between two successive successful completions (or `from`
/// and the first one). `None` without successes after `from`.
pub fn longest_gap_without_success(
    history: &History,
    from: Duration,
) -> Result<Option<(Duration, Duration)>, HistoryError> {
    let mut successes: Vec<Duration> = history
        .operations()?
        .into_iter()
        .filter(|o| matches!(o.outcome, Outcome::Ok(_)))
        .filter_map(|o| o.completed_at)
        .filter(|&at| at >= from)
        .collect();
    successes.sort_unstable();
    let mut previous = from;
    let mut longest: Option<(Duration, Duration)> = None;
    for at in successes {
        if longest.is_none_or(|(start, end)| at - previous > end - start) {
            longest = Some((previous, at));
        }
        previous = at;
    }
    Ok(longest)
}
