//! Does the store fit the machine? Checked before the store is allocated, so a memory limit
//! above what the machine (or the cell's cgroup) can give is a one-line error at start —
//! not an abort, and not an out-of-memory kill once the arena fills. The store then writes
//! every page of its arena and index at start (`cellcache_store`'s `prealloc`), so what
//! passed this check is held from then on.

use std::path::Path;

/// Why the store would not fit.
#[derive(Debug, thiserror::Error)]
#[error(
    "memory limit {limit_mib} MiB (serve -m, store.memory_limit_bytes) is more than the \
     {available_mib} MiB available here ({origin}); lower -m"
)]
pub struct DoesNotFit {
    pub limit_mib: usize,
    pub available_mib: u64,
    /// Where the available figure came from.
    pub origin: &'static str,
}

/// Refuses `bytes` above the memory available now: `MemAvailable` in /proc/meminfo and,
/// inside a cgroup v2 with a memory limit, that limit minus what the cgroup already uses.
/// Where neither can be read (not Linux, /proc not mounted) there is nothing to compare
/// with, and the allocation itself is the only check.
pub fn check_fits(bytes: usize) -> Result<(), DoesNotFit> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok();
    let cgroup = cgroup_available(Path::new("/proc/self/cgroup"), Path::new("/sys/fs/cgroup"));
    let candidates = [
        meminfo
            .as_deref()
            .and_then(mem_available)
            .map(|b| (b, "MemAvailable in /proc/meminfo")),
        cgroup.map(|b| (b, "the cgroup's memory.max less memory.current")),
    ];
    let Some((available, origin)) = candidates.into_iter().flatten().min_by_key(|(b, _)| *b) else {
        return Ok(());
    };
    if bytes as u64 > available {
        return Err(DoesNotFit {
            limit_mib: bytes >> 20,
            available_mib: available >> 20,
            origin,
        });
    }
    Ok(())
}

/// `MemAvailable` of a /proc/meminfo text, in bytes.
fn mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let mut words = line.split_whitespace().skip(1);
    let value: u64 = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") => value.checked_mul(1024),
        None => Some(value),
        Some(_) => None,
    }
}

/// Bytes the process's cgroup v2 may still take, if it has a memory limit.
fn cgroup_available(self_cgroup: &Path, root: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(self_cgroup).ok()?;
    let path = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    let dir = root.join(path.trim_start_matches('/'));
    let max = std::fs::read_to_string(dir.join("memory.max")).ok()?;
    let max: u64 = max.trim().parse().ok()?; // "max" = no limit
    let current: u64 = std::fs::read_to_string(dir.join("memory.current"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(max.saturating_sub(current))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_available_reads_kilobytes() {
        let text = "MemTotal:       24683520 kB\nMemFree:        20789696 kB\n\
                    MemAvailable:   23869088 kB\nBuffers:          111936 kB\n";
        assert_eq!(mem_available(text), Some(23_869_088 * 1024));
        assert_eq!(mem_available("MemTotal: 1 kB\n"), None);
    }

    #[test]
    fn a_cgroup_limit_counts_what_the_cgroup_already_uses() {
        let dir = std::env::temp_dir().join(format!("cellcache-cgroup-{}", std::process::id()));
        let group = dir.join("sys/fs/cgroup/cell.slice");
        std::fs::create_dir_all(&group).unwrap();
        std::fs::write(dir.join("cgroup"), "0::/cell.slice\n").unwrap();
        std::fs::write(group.join("memory.max"), "1073741824\n").unwrap();
        std::fs::write(group.join("memory.current"), "73741824\n").unwrap();
        let root = dir.join("sys/fs/cgroup");
        assert_eq!(
            cgroup_available(&dir.join("cgroup"), &root),
            Some(1_000_000_000)
        );
        std::fs::write(group.join("memory.max"), "max\n").unwrap();
        assert_eq!(cgroup_available(&dir.join("cgroup"), &root), None);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn this_machine_refuses_more_than_it_has() {
        // 2^62 bytes is more than any machine has; a small store fits.
        assert!(check_fits(1 << 20).is_ok());
        if std::fs::read_to_string("/proc/meminfo").is_ok() {
            let e = check_fits(1 << 62).unwrap_err();
            assert!(e.to_string().contains("lower -m"), "{e}");
        }
    }
}
