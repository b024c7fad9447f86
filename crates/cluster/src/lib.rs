//! cellcache-cluster: the deterministic core of the cellcache ring.
//!
//! Everything a cell needs to agree with the others about *who owns what*, and nothing that
//! touches a socket, a thread or a clock: cell ids ([`id`]), hash ranges ([`range`]), the
//! versioned cluster map ([`map`]), the one placement function ([`placement`]), validated map
//! transitions ([`change`]), the inter-cell frame codec ([`wire`]), the per-cell ring state
//! machine ([`ring`]) and the consensus seam ([`consensus`]). Time and randomness are always
//! arguments, so the whole ring can be simulated on one thread with virtual time.
//!
//! The one exception is `raft` (default cargo feature `raft`): the openraft-backed consensus
//! group, which runs tasks and timers on the caller's tokio runtime. Build with
//! `default-features = false` for the pure core.

#![forbid(unsafe_code)]

pub mod auth;
pub mod autoscale;
pub mod change;
pub mod consensus;
pub mod id;
pub mod map;
pub mod placement;
#[cfg(feature = "raft")]
pub mod raft;
pub mod ring;
pub mod wire;

pub use cellcache_keyspace::{HashRange, RangeError, range};
pub use change::{Change, ChangeError, Proposal};
pub use consensus::{Consensus, ConsensusError, LocalConsensus, Membership};
pub use id::{CellId, IdError};
pub use map::{AbsorptionReason, Cell, CellAddress, CellState, ClusterMap, MapError, Migration};
pub use placement::key_hash;
pub use ring::{Output, Ring, RingConfig, RingMessage, ServeWait};
pub use wire::{Decoded, Frame, FrameKind, WireConfig, WireError};
