//! Client direction, one level above [`crate::parse_reply`]: the whole reply one request
//! gets, which for a retrieval or a `stats` is many lines (`VALUE` blocks or `STAT` lines,
//! then `END`).
//!
//! The text protocol does not tag replies, so the caller says what its request expects
//! ([`Expect`]). [`decode_reply`] is incremental and zero-copy like the rest of the crate:
//! it looks at the bytes read so far and returns either one complete [`Reply`] that borrows
//! from the buffer with how many bytes it used, or [`Decoded::Incomplete`] (a normal
//! outcome: read more and call again). Only bytes that can never become the expected reply
//! are a [`ReplyError`], after which the connection is out of sync and must be closed.
//!
//! Guarantees: never panics, never reports more bytes than the input holds, and every line
//! and value is bounded by [`Limits`] (see [`Limits::for_replies`]), so a misbehaving server
//! cannot make a client buffer without bound. Cost is linear in the number of reply lines,
//! not in value bytes: data blocks are skipped by their announced length.

use crate::limits::Limits;
use crate::reply::{ParsedReply, ReplyError, parse_reply};
use crate::response::Response;

/// What the request at the head of a pipeline expects back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// `get`/`gets`/`gat`/`gats`: zero or more `VALUE` blocks, then `END`.
    Values,
    /// `stats` (and its groups that answer with `STAT` lines): `STAT` lines, then `END`.
    Stats,
    /// Anything else: one reply line (with its data block, for a meta `VA`).
    Line,
}

/// The whole reply to one request, borrowing from the read buffer. An error line
/// (`ERROR`, `CLIENT_ERROR`, `SERVER_ERROR`) answers any request and comes as
/// [`Reply::Line`], whatever was expected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply<'a> {
    /// A retrieval's values (`END` excluded; a miss holds none).
    Values(Values<'a>),
    /// A `stats` reply's `STAT` lines (`END` excluded).
    Stats(Stats<'a>),
    /// A one-line reply.
    Line(Response<'a>),
}

impl Reply<'_> {
    /// Whether this is one of the three error replies.
    pub fn is_error(&self) -> bool {
        matches!(
            self,
            Reply::Line(Response::Error | Response::ClientError(_) | Response::ServerError(_))
        )
    }
}

/// Outcome of [`decode_reply`] on input that can still become the expected reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decoded<'a> {
    /// One whole reply, which used the first `consumed` bytes of the buffer.
    Complete {
        /// The reply, borrowing from the buffer.
        reply: Reply<'a>,
        /// Bytes it occupies.
        consumed: usize,
    },
    /// More bytes are needed; nothing was consumed.
    Incomplete,
}

/// Bounds for walking a block [`decode_reply`] has already checked against the caller's.
const CHECKED: Limits = Limits {
    key_bytes_max: usize::MAX,
    line_bytes_max: usize::MAX,
    item_size_max: usize::MAX,
    cas_enabled: true,
    keys_per_get_max: usize::MAX,
};

/// The `VALUE` blocks of a retrieval reply, checked when decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Values<'a> {
    block: &'a [u8],
    count: usize,
}

/// One value of a retrieval reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Value<'a> {
    /// The key.
    pub key: &'a [u8],
    /// Client flags.
    pub flags: u32,
    /// CAS value (`gets`, `gats`).
    pub cas: Option<u64>,
    /// The data, without its `\r\n`.
    pub data: &'a [u8],
}

impl<'a> Values<'a> {
    /// How many values (hits) the reply holds.
    pub fn count(&self) -> usize {
        self.count
    }

    /// The values in the order the server sent them.
    pub fn iter(&self) -> impl Iterator<Item = Value<'a>> + 'a {
        responses(self.block).filter_map(|response| match response {
            Response::Value {
                key,
                flags,
                cas,
                data,
            } => Some(Value {
                key,
                flags,
                cas,
                data,
            }),
            _ => None,
        })
    }
}

/// The `STAT` lines of a `stats` reply, checked when decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stats<'a> {
    block: &'a [u8],
}

impl<'a> Stats<'a> {
    /// `(name, value)` pairs in the order the server sent them.
    pub fn iter(&self) -> impl Iterator<Item = (&'a [u8], &'a [u8])> + 'a {
        responses(self.block).filter_map(|response| match response {
            Response::Stat { name, value } => Some((name, value)),
            _ => None,
        })
    }
}

/// The responses of a block [`decode_reply`] checked; stops quietly (rather than
/// panicking) should one somehow not parse again.
fn responses(block: &[u8]) -> impl Iterator<Item = Response<'_>> + '_ {
    let mut rest = block;
    std::iter::from_fn(move || match parse_reply(rest, &CHECKED) {
        ParsedReply::Complete { reply, consumed } => {
            rest = rest.get(consumed..).unwrap_or_default();
            Some(reply)
        }
        ParsedReply::Incomplete | ParsedReply::Error(_) => None,
    })
}

/// Looks for one complete reply of kind `expect` at the start of `buf`. Calling again
/// after more bytes arrive re-reads only the lines, never the value bytes.
pub fn decode_reply<'a>(
    buf: &'a [u8],
    expect: Expect,
    limits: &Limits,
) -> Result<Decoded<'a>, ReplyError> {
    let mut pos = 0;
    let mut count = 0;
    loop {
        let rest = buf.get(pos..).unwrap_or_default();
        let (response, consumed) = match parse_reply(rest, limits) {
            ParsedReply::Complete { reply, consumed } => (reply, consumed),
            ParsedReply::Incomplete => return Ok(Decoded::Incomplete),
            ParsedReply::Error(e) => return Err(e),
        };
        let first = pos == 0;
        let end = pos + consumed;
        let reply = match (expect, response) {
            (_, Response::Error | Response::ClientError(_) | Response::ServerError(_)) if first => {
                Reply::Line(response)
            }
            (Expect::Line, _) => Reply::Line(response),
            (Expect::Values, Response::Value { .. }) => {
                count += 1;
                pos = end;
                continue;
            }
            (Expect::Stats, Response::Stat { .. }) => {
                pos = end;
                continue;
            }
            (Expect::Values, Response::End) => Reply::Values(Values {
                block: &buf[..pos],
                count,
            }),
            (Expect::Stats, Response::End) => Reply::Stats(Stats { block: &buf[..pos] }),
            _ => return Err(ReplyError::Unexpected),
        };
        return Ok(Decoded::Complete {
            reply,
            consumed: end,
        });
    }
}

#[cfg(test)]
mod tests;
