//! cellcache-proto: the memcached text protocol (classic and meta commands),
//! sans-IO, in both directions.
//!
//! Server direction: [`parse`] turns the front of a read buffer into a
//! [`Request`] that borrows keys and values from the buffer, or reports
//! [`Parsed::Incomplete`], or a [`ProtocolError`] that says which error line
//! to send and how many bytes to drop and swallow. Replies are composed into
//! a `Vec<u8>` with [`Response::encode`], or piecewise with
//! [`write_value_header`] / [`write_meta_header`] so values are copied once,
//! straight from the store into the output buffer.
//!
//! The binary protocol (magic `0x80`) has its own codec in [`binary`]; client
//! authentication (memcached's text login, SASL PLAIN's response) is in [`auth`].
//!
//! Every reply line the server sends verbatim is a constant in [`lines`].
//!
//! Client direction (load generator, inter-cell forwarder, binary
//! translation): [`Request::encode`] (and [`write_retrieve_with`] /
//! [`write_store_with`], which write keys in place), [`parse_reply`] for one
//! reply line, and [`decode_reply`] for the whole reply to one request (a
//! retrieval's values or a `stats` reply up to `END`).
//!
//! Guarantees: no I/O, no clock, no panics on any input, no allocation while
//! parsing, `consumed` never exceeds the input, and every length read from
//! the wire is bounded by [`Limits`] before it is used. The syntax, error
//! lines and their wording follow memcached's protocol.txt and were checked
//! against memcached 1.6.18; deliberate differences are listed in
//! docs/protocol.md.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod auth;
pub mod binary;
mod decode;
mod error;
pub mod limits;
pub mod lines;
pub mod meta;
mod parse;
mod reply;
mod request;
mod response;
pub mod token;

pub use decode::{Decoded, Expect, Reply, Stats, Value, Values, decode_reply};
pub use error::{ClientError, ErrorReply, ProtocolError, ServerError};
pub use limits::{Limits, LimitsError};
pub use meta::{
    ArithmeticMode, MetaArithmeticFlags, MetaDeleteFlags, MetaGetFlags, MetaKey, MetaSetFlags,
    ReturnFlag, ReturnFlags, SetMode,
};
pub use parse::{Parsed, RetrieveRest, parse, parse_retrieve_rest};
pub use reply::{ParsedReply, ReplyError, parse_reply};
pub use request::{
    Admin, ArithmeticOp, Keys, KeysError, Request, Retrieve, StatsGroup, Store, StoreHead,
    StoreMode, write_retrieve, write_retrieve_with, write_store_with,
};
pub use response::{
    MetaReply, MetaReplyFlags, MetaStatus, PrefixCounts, Response, write_cachedump_item,
    write_detail_prefix, write_meta_header, write_stat, write_value_end, write_value_header,
};

/// Bytes still to be discarded from a connection's input after a rejected
/// storage command (its announced data block). The connection keeps one
/// across reads: before parsing new input, it drops
/// [`Discard::take`]`(available)` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Discard {
    remaining: usize,
}

impl Discard {
    /// Discard `bytes` more bytes.
    pub const fn new(bytes: usize) -> Self {
        Self { remaining: bytes }
    }

    /// With `available` bytes buffered, how many to drop now; the rest of
    /// the debt is kept for the next read.
    pub fn take(&mut self, available: usize) -> usize {
        let now = self.remaining.min(available);
        self.remaining -= now;
        now
    }

    /// Bytes still owed.
    pub const fn remaining(&self) -> usize {
        self.remaining
    }

    /// Whether nothing is left to discard.
    pub const fn is_done(&self) -> bool {
        self.remaining == 0
    }
}

#[cfg(test)]
mod tests;
