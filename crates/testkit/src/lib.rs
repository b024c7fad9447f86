//! cellcache-testkit: test-only tools for checking a cache under faults.
//!
//! - [`history`]: Jepsen-style histories of client operations and the checker
//!   (linearizable registers, append logs);
//! - [`workload`]: threaded memcached text-protocol clients that record such a history
//!   against a list of server addresses;
//! - [`proxy`]: a fault-injecting TCP proxy (latency, bandwidth, blackhole, drop, reset);
//! - [`process`]: `cellcache serve` children to kill, pause, resume and restart, with
//!   their logs kept for post-mortems;
//! - [`netns`]: network namespaces on a bridge, partitioned with nftables drop rules;
//! - [`postgres`]: a throwaway PostgreSQL server (Debian's binaries) on a loopback port,
//!   stopped and started at will, for the cache tier's tests.
#![forbid(unsafe_code)]

pub mod history;
pub mod netns;
pub mod postgres;
pub mod process;
pub mod proxy;
pub mod workload;
