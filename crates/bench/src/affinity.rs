//! CPU placement: pin the calling thread to a set of cores, and read which cores are allowed.
//!
//! The side-by-side benchmark keeps the server and the load generator on disjoint cores so they
//! do not steal each other's cycles; the report states the placement that was really applied.
//! Linux-only (sched_setaffinity, through rustix's safe wrappers; the thread's CPU time through
//! nix's `getrusage`, which rustix lacks); elsewhere pinning reports "unsupported" and nothing
//! is pinned.

use std::io;

/// Pins the calling thread to `cpus`. An empty list is a no-op.
#[cfg(target_os = "linux")]
pub fn pin_current_thread(cpus: &[usize]) -> io::Result<()> {
    use rustix::thread::CpuSet;
    if cpus.is_empty() {
        return Ok(());
    }
    let mut set = CpuSet::new();
    for &cpu in cpus {
        // CpuSet::set does not check its argument: past the set it would panic.
        if cpu >= CpuSet::MAX_CPU {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("cpu {cpu} out of range"),
            ));
        }
        set.set(cpu);
    }
    // `None` is the calling thread.
    rustix::thread::sched_setaffinity(None, &set)?;
    Ok(())
}

/// The cores the calling thread may run on.
#[cfg(target_os = "linux")]
pub fn allowed_cpus() -> io::Result<Vec<usize>> {
    use rustix::thread::CpuSet;
    let set = rustix::thread::sched_getaffinity(None)?;
    Ok((0..CpuSet::MAX_CPU)
        .filter(|&cpu| set.is_set(cpu))
        .collect())
}

/// Pinning is unsupported off Linux.
#[cfg(not(target_os = "linux"))]
pub fn pin_current_thread(cpus: &[usize]) -> io::Result<()> {
    if cpus.is_empty() {
        Ok(())
    } else {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "CPU pinning needs Linux",
        ))
    }
}

/// Unknown off Linux: every core the standard library reports.
#[cfg(not(target_os = "linux"))]
pub fn allowed_cpus() -> io::Result<Vec<usize>> {
    Ok((0..std::thread::available_parallelism().map_or(1, |n| n.get())).collect())
}

/// A list of cores as given on the command line (`0`, `0,2`, `0-3,6`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuList(pub Vec<usize>);

impl std::str::FromStr for CpuList {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        parse_cpu_list(text).map(CpuList)
    }
}

/// Parses a core list such as `0`, `0,2` or `0-3,6`.
pub fn parse_cpu_list(text: &str) -> Result<Vec<usize>, String> {
    let mut cpus = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let bad = || format!("bad CPU list {text:?} (use e.g. 0,2 or 0-3)");
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) =
                    (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
                if a > b {
                    return Err(bad());
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(part.parse().map_err(|_| bad())?),
        }
    }
    cpus.sort_unstable();
    cpus.dedup();
    Ok(cpus)
}

/// CPU time (user + system) consumed so far by the calling thread, in nanoseconds (0 if the
/// kernel does not say). Microsecond resolution, from `getrusage(RUSAGE_THREAD)`.
#[cfg(target_os = "linux")]
pub fn thread_cpu_ns() -> u64 {
    use nix::sys::resource::{UsageWho, getrusage};
    use nix::sys::time::TimeValLike;
    let Ok(usage) = getrusage(UsageWho::RUSAGE_THREAD) else {
        return 0;
    };
    let us = usage.user_time().num_microseconds() + usage.system_time().num_microseconds();
    u64::try_from(us).map_or(0, |us| us * 1_000)
}

/// Not measured off Linux.
#[cfg(not(target_os = "linux"))]
pub fn thread_cpu_ns() -> u64 {
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cpu_lists() {
        assert_eq!(parse_cpu_list("0"), Ok(vec![0]));
        assert_eq!(parse_cpu_list("3,0-2,2"), Ok(vec![0, 1, 2, 3]));
        assert!(parse_cpu_list("2-1").is_err());
        assert!(parse_cpu_list("x").is_err());
    }

    #[test]
    fn pins_a_thread_to_an_allowed_core_and_measures_its_cpu() {
        let allowed = allowed_cpus().unwrap();
        assert!(!allowed.is_empty());
        let target = *allowed.last().unwrap();
        let seen = std::thread::spawn(move || {
            pin_current_thread(&[target]).unwrap();
            let before = thread_cpu_ns();
            let mut x = 0u64;
            for i in 0..5_000_000u64 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
            }
            (allowed_cpus().unwrap(), thread_cpu_ns() > before)
        })
        .join()
        .unwrap();
        assert_eq!(seen, (vec![target], true));
        assert!(pin_current_thread(&[100_000]).is_err());
    }
}
