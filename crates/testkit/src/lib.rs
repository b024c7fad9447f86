//! cellcache-testkit: test-only tools for checking a cache under faults.
//!
//! - [`history`]: Jepsen-style histories of client operations and the checker
//!   (linearizable registers, append logs);
//! - [`workload`]: threaded memcached text-protocol clients that record such a history
//!   against a list of server addresses.
#![forbid(unsafe_code)]

pub mod history;
pub mod workload;
