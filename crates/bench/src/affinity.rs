//! CPU placement: pin the calling thread to a set of cores, and read which cores are allowed.
//!
//! The side-by-side benchmark keeps the server and the load generator on disjoint cores so they
//! do not steal each other's cycles; the report states the placement that was really applied.
//! Linux-only (sched_setaffinity); elsewhere pinning reports "unsupported" and nothing is pinned.

use std::io;

/// Pins the calling thread to `cpus`. An empty list is a no-op.
#[cfg(target_os = "linux")]
pub fn pin_current_thread(cpus: &[usize]) -> io::Result<()> {
    if cpus.is_empty() {
        return Ok(());
    }
    // SAFETY: cpu_set_t is a plain bit array for which all-zero is the valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let capacity = 8 * std::mem::size_of::<libc::cpu_set_t>();
    for &cpu in cpus {
        if cpu >= capacity {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("cpu {cpu} out of range"),
            ));
        }
        // SAFETY: `cpu` was checked to be below the set's capacity in bits, so the bit written
        // lies inside `set`.
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    // SAFETY: pid 0 means the calling thread; `set` is a valid, initialised cpu_set_t and the
    // size passed is its exact size, so the kernel reads only memory we own.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The cores the calling thread may run on.
#[cfg(target_os = "linux")]
pub fn allowed_cpus() -> io::Result<Vec<usize>> {
    // SAFETY: as above, all-zero is a valid cpu_set_t.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: the kernel writes at most `size_of::<cpu_set_t>()` bytes into `set`, which we own.
    let rc =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let capacity = 8 * std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: every `cpu` is below the set's capacity in bits, so only bits of `set` are read.
    Ok((0..capacity)
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
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

/// CPU time (user + system) consumed so far by the calling thread, in nanoseconds.
#[cfg(target_os = "linux")]
pub fn thread_cpu_ns() -> u64 {
    // SAFETY: all-zero is a valid rusage (plain integers and timevals).
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_THREAD fills the rusage we own; no other memory is touched.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) };
    if rc != 0 {
        return 0;
    }
    let ns = |tv: libc::timeval| tv.tv_sec as u64 * 1_000_000_000 + tv.tv_usec as u64 * 1_000;
    ns(usage.ru_utime) + ns(usage.ru_stime)
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
            (allowed_cpus().unwrap(), thread_cpu_ns() >= before)
        })
        .join()
        .unwrap();
        assert_eq!(seen, (vec![target], true));
        assert!(pin_current_thread(&[100_000]).is_err());
    }
}
