//! cellcache-tier: what a cell needs to front something slower and durable (SPEC T1–T3).
//!
//! - [`BackingStore`]: the durable store behind a cell, with two implementations:
//!   [`RedbStore`] (embedded, one file per cell) and [`PostgresStore`] (a table in a
//!   PostgreSQL server, through a connection pool). [`open`] picks one from a
//!   `redb:PATH` or `postgres://…` specification.
//! - [`WriteBack`]: the write-back engine as a pure state machine (no I/O, no clock:
//!   `now_ms` is passed in): per-key ordered, coalescing, batched, throttled flushes with
//!   retry and backoff, a bound on dirty bytes, and waiters released once a key's version
//!   is durable (write-through is the same engine with a window of zero and the reply held).
//! - [`Flights`]: single-flight loads — concurrent misses on one key share one load, and a
//!   load that a client write overtook is not filled into the cache.
//!
//! Architecture invariant: nothing here touches the cell's store or protocol; the node
//! wires these pieces to the store's change feed and to its connections.

#![forbid(unsafe_code)]

mod backing;
mod error;
mod flight;
mod postgres;
mod record;
mod redb_store;
mod writeback;

pub use backing::{BackingStore, Spec, open};
pub use error::TierError;
pub use flight::{Flights, Joined, Landed};
pub use postgres::{PostgresConfig, PostgresStore, check_table_name};
pub use record::{KeyedOp, Op, Record};
pub use redb_store::RedbStore;
pub use writeback::{Batch, Completion, Full, Known, WriteBack, WriteBackConfig, WriteBackStats};
