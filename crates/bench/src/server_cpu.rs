//! The CPU time a server process spends during the measured phase of a run, so a
//! comparison reports work per CPU-second beside work per second: on a small machine the
//! generator and the server compete, and ops/s alone says more about the machine than
//! about the server.
//!
//! A background thread samples the process's user + system time (every thread of it, from
//! `/proc/PID/stat`, in clock ticks) every [`SAMPLE_INTERVAL`] with the wall clock; the CPU
//! time at the phase's start and end is interpolated between the samples around them.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How often the server's CPU time is read. Clock ticks are 10 ms on Linux, so finer
/// sampling gains nothing; a 10 s phase is measured to about 1 %.
pub const SAMPLE_INTERVAL: Duration = Duration::from_millis(50);

/// One reading: wall clock (seconds since the Unix epoch) and the process's CPU seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    pub unix_secs: f64,
    pub cpu_secs: f64,
}

/// User + system CPU seconds of process `pid` so far, or `None` when it cannot be read
/// (no such process, not Linux).
pub fn process_cpu_secs(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: count from the
    // last ')'. utime and stime are fields 14 and 15, so the 12th and 13th after it.
    let after = &stat[stat.rfind(')')? + 1..];
    let mut fields = after.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    let ticks = rustix::param::clock_ticks_per_second();
    Some((utime + stime) as f64 / ticks as f64)
}

fn now_unix_secs() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Samples the CPU time of a set of processes, summed, until [`CpuSampler::finish`].
pub struct CpuSampler {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Vec<Sample>>,
}

impl CpuSampler {
    /// Starts sampling `pids`; a reading counts only when every one of them could be read.
    pub fn start(pids: Vec<u32>) -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("server-cpu".into())
            .spawn(move || {
                let mut samples = Vec::new();
                loop {
                    let done = flag.load(Ordering::Acquire);
                    let each: Option<Vec<f64>> =
                        pids.iter().map(|&p| process_cpu_secs(p)).collect();
                    if let Some(cpu_secs) = each.map(|e| e.iter().sum()) {
                        samples.push(Sample {
                            unix_secs: now_unix_secs(),
                            cpu_secs,
                        });
                    }
                    if done {
                        return samples;
                    }
                    std::thread::sleep(SAMPLE_INTERVAL);
                }
            })?;
        Ok(Self { stop, thread })
    }

    /// Stops sampling (after one last reading) and returns every sample, oldest first.
    pub fn finish(self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Release);
        self.thread.join().unwrap_or_default()
    }
}

/// CPU seconds spent between the wall-clock instants `from` and `to`, interpolated between
/// the samples around each; `None` unless samples cover both.
pub fn cpu_between(samples: &[Sample], from: f64, to: f64) -> Option<f64> {
    Some(cpu_at(samples, to)? - cpu_at(samples, from)?)
}

fn cpu_at(samples: &[Sample], at: f64) -> Option<f64> {
    let after = samples.iter().position(|s| s.unix_secs >= at)?;
    let b = samples[after];
    if after == 0 {
        // Exactly at the first sample is covered; before it is not.
        return (b.unix_secs == at).then_some(b.cpu_secs);
    }
    let a = samples[after - 1];
    let span = b.unix_secs - a.unix_secs;
    let share = if span > 0.0 {
        (at - a.unix_secs) / span
    } else {
        1.0
    };
    Some(a.cpu_secs + share * (b.cpu_secs - a.cpu_secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(unix_secs: f64, cpu_secs: f64) -> Sample {
        Sample {
            unix_secs,
            cpu_secs,
        }
    }

    #[test]
    fn cpu_between_interpolates_and_refuses_what_samples_do_not_cover() {
        let samples = [s(10.0, 1.0), s(11.0, 1.5), s(12.0, 2.5)];
        assert_eq!(cpu_between(&samples, 10.0, 12.0), Some(1.5));
        assert_eq!(cpu_between(&samples, 10.5, 11.5), Some(2.0 - 1.25));
        assert_eq!(cpu_between(&samples, 9.0, 11.0), None);
        assert_eq!(cpu_between(&samples, 11.0, 12.5), None);
        assert_eq!(cpu_between(&[], 1.0, 2.0), None);
    }

    #[test]
    fn a_busy_process_is_seen_spending_cpu() {
        let pid = std::process::id();
        let sampler = CpuSampler::start(vec![pid]).unwrap();
        std::thread::sleep(SAMPLE_INTERVAL * 2);
        let from = now_unix_secs();
        // Spin (bounded by iterations, not time) until this process's CPU clock moved by
        // at least a few ticks.
        let start = process_cpu_secs(pid).unwrap();
        let mut x = 0u64;
        for i in 0..20_000_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
            if i % 1_000_000 == 0 && process_cpu_secs(pid).unwrap() - start > 0.1 {
                break;
            }
        }
        std::hint::black_box(x);
        let to = now_unix_secs();
        std::thread::sleep(SAMPLE_INTERVAL * 2);
        let samples = sampler.finish();
        let spent = cpu_between(&samples, from, to).expect("the samples cover the spin");
        assert!(spent > 0.05, "spent {spent} CPU seconds");
    }
}
