//! Client direction: bytes from a server in, one [`Response`] out.
//!
//! Used by the load generator and the inter-cell forwarder. Like
//! [`crate::parse`], it is sans-IO and zero-copy, reports
//! [`ParsedReply::Incomplete`] for a partial frame, never panics and never
//! reports more `consumed` than the input. A malformed reply is a
//! [`ReplyError`]: the server is not speaking the protocol, so the client
//! should drop the connection.

use memchr::memchr;

use crate::limits::Limits;
use crate::response::{MetaReply, MetaReplyFlags, MetaStatus, Response};
use crate::token::{Tokens, parse_i64, parse_u32, parse_u64, parse_usize};

/// Outcome of [`parse_reply`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParsedReply<'a> {
    /// A whole reply is at the front of the buffer.
    Complete {
        /// The reply, borrowing from the buffer.
        reply: Response<'a>,
        /// Bytes it occupies.
        consumed: usize,
    },
    /// Not enough bytes yet.
    Incomplete,
    /// The bytes are not a reply.
    Error(ReplyError),
}

/// Why a reply could not be parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ReplyError {
    /// No line end within [`Limits::line_bytes_max`].
    #[error("reply line longer than the limit")]
    LineTooLong,
    /// The line is no known reply.
    #[error("unknown reply line")]
    Unknown,
    /// A known reply with bad fields.
    #[error("malformed reply line")]
    Malformed,
    /// A value longer than [`Limits::value_bytes_max`].
    #[error("value larger than the limit")]
    ValueTooLarge,
    /// A data block not followed by `\r\n`.
    #[error("data block not terminated by CRLF")]
    BadDataChunk,
    /// A reply line the request cannot get where it came (say `STORED` among a
    /// retrieval's values; see [`crate::decode_reply`]).
    #[error("reply line not expected here")]
    Unexpected,
}

/// Parses the reply at the front of `buf`.
pub fn parse_reply<'a>(buf: &'a [u8], limits: &Limits) -> ParsedReply<'a> {
    let window = &buf[..buf.len().min(limits.line_bytes_max)];
    let Some(newline) = memchr(b'\n', window) else {
        if !buf.is_empty() && buf.len() >= limits.line_bytes_max {
            return ParsedReply::Error(ReplyError::LineTooLong);
        }
        return ParsedReply::Incomplete;
    };
    let line_len = newline + 1;
    let line = match &buf[..newline] {
        [head @ .., b'\r'] => head,
        whole => whole,
    };
    match parse_line(buf, line, line_len, limits) {
        Ok(Some((reply, consumed))) => ParsedReply::Complete { reply, consumed },
        Ok(None) => ParsedReply::Incomplete,
        Err(e) => ParsedReply::Error(e),
    }
}

type LineResult<'a> = Result<Option<(Response<'a>, usize)>, ReplyError>;

fn parse_line<'a>(
    buf: &'a [u8],
    line: &'a [u8],
    line_len: usize,
    limits: &Limits,
) -> LineResult<'a> {
    let simple = |reply| Ok(Some((reply, line_len)));
    let rest_after = |prefix: &[u8]| line.get(prefix.len()..).unwrap_or_default();
    match line {
        b"END" => return simple(Response::End),
        b"STORED" => return simple(Response::Stored),
        b"NOT_STORED" => return simple(Response::NotStored),
        b"EXISTS" => return simple(Response::Exists),
        b"NOT_FOUND" => return simple(Response::NotFound),
        b"DELETED" => return simple(Response::Deleted),
        b"TOUCHED" => return simple(Response::Touched),
        b"OK" => return simple(Response::Ok),
        b"RESET" => return simple(Response::Reset),
        b"MN" => return simple(Response::MetaNoop),
        _ => {}
    }
    if line.starts_with(b"ERROR") {
        return simple(Response::Error);
    }
    if line.starts_with(b"CLIENT_ERROR ") {
        return simple(Response::ClientError(rest_after(b"CLIENT_ERROR ")));
    }
    if line.starts_with(b"SERVER_ERROR ") {
        return simple(Response::ServerError(rest_after(b"SERVER_ERROR ")));
    }
    if line.starts_with(b"VERSION ") {
        return simple(Response::Version(rest_after(b"VERSION ")));
    }
    if line.starts_with(b"STAT ") {
        let rest = rest_after(b"STAT ");
        let split = memchr(b' ', rest).ok_or(ReplyError::Malformed)?;
        return simple(Response::Stat {
            name: &rest[..split],
            value: &rest[split + 1..],
        });
    }
    if line.starts_with(b"VALUE ") {
        return parse_value(buf, rest_after(b"VALUE "), line_len, limits);
    }
    if line.starts_with(b"ME ") {
        let rest = rest_after(b"ME ");
        let (key, info) = match memchr(b' ', rest) {
            Some(split) => (&rest[..split], &rest[split + 1..]),
            None => (rest, &b""[..]),
        };
        if key.is_empty() {
            return Err(ReplyError::Malformed);
        }
        return simple(Response::MetaDebug { key, info });
    }
    if line.first().is_some_and(u8::is_ascii_digit) {
        // memcached may pad a shrunken incr/decr result with spaces.
        let digits = &line[..line.iter().rposition(|&b| b != b' ').map_or(0, |i| i + 1)];
        return parse_u64(digits)
            .map(|n| Some((Response::Number(n), line_len)))
            .ok_or(ReplyError::Malformed);
    }
    let status = match line.get(..2) {
        Some(b"HD") => MetaStatus::Hd,
        Some(b"VA") => MetaStatus::Va,
        Some(b"EN") => MetaStatus::En,
        Some(b"NF") => MetaStatus::Nf,
        Some(b"NS") => MetaStatus::Ns,
        Some(b"EX") => MetaStatus::Ex,
        _ => return Err(ReplyError::Unknown),
    };
    if line.len() > 2 && line[2] != b' ' {
        return Err(ReplyError::Unknown);
    }
    parse_meta(buf, status, &line[2..], line_len, limits)
}

fn data_block(buf: &[u8], start: usize, len: usize) -> Result<Option<(&[u8], usize)>, ReplyError> {
    let end = start + len;
    let Some(frame) = buf.get(..end + 2) else {
        return Ok(None);
    };
    if &frame[end..] != b"\r\n" {
        return Err(ReplyError::BadDataChunk);
    }
    Ok(Some((&frame[start..end], end + 2)))
}

fn parse_value<'a>(
    buf: &'a [u8],
    fields: &'a [u8],
    line_len: usize,
    limits: &Limits,
) -> LineResult<'a> {
    let mut tokens = Tokens::new(fields);
    let (Some(key), Some(flags), Some(len)) = (tokens.next(), tokens.next(), tokens.next()) else {
        return Err(ReplyError::Malformed);
    };
    let flags = parse_u32(flags).ok_or(ReplyError::Malformed)?;
    let len = parse_usize(len).ok_or(ReplyError::Malformed)?;
    let cas = match tokens.next() {
        Some(cas) => Some(parse_u64(cas).ok_or(ReplyError::Malformed)?),
        None => None,
    };
    if tokens.next().is_some() {
        return Err(ReplyError::Malformed);
    }
    if len > limits.value_bytes_max() {
        return Err(ReplyError::ValueTooLarge);
    }
    Ok(data_block(buf, line_len, len)?.map(|(data, consumed)| {
        (
            Response::Value {
                key,
                flags,
                cas,
                data,
            },
            consumed,
        )
    }))
}

fn parse_meta<'a>(
    buf: &'a [u8],
    status: MetaStatus,
    fields: &'a [u8],
    line_len: usize,
    limits: &Limits,
) -> LineResult<'a> {
    let mut tokens = Tokens::new(fields);
    let len = if status == MetaStatus::Va {
        let len = tokens
            .next()
            .and_then(parse_usize)
            .ok_or(ReplyError::Malformed)?;
        if len > limits.value_bytes_max() {
            return Err(ReplyError::ValueTooLarge);
        }
        Some(len)
    } else {
        None
    };
    let mut flags = MetaReplyFlags::default();
    for token in tokens {
        let arg = &token[1..];
        let bad = ReplyError::Malformed;
        match token[0] {
            b'c' => flags.cas = Some(parse_u64(arg).ok_or(bad)?),
            b'f' => flags.client_flags = Some(parse_u32(arg).ok_or(bad)?),
            b'h' => {
                flags.hit_before = Some(match arg {
                    b"0" => false,
                    b"1" => true,
                    _ => return Err(bad),
                });
            }
            b'k' => flags.key = Some(arg),
            b'l' => flags.last_access_secs = Some(parse_u64(arg).ok_or(bad)?),
            b'O' => flags.opaque = Some(arg),
            b's' => flags.size = Some(parse_u64(arg).ok_or(bad)?),
            b't' => flags.ttl_secs = Some(parse_i64(arg).ok_or(bad)?),
            b'b' => flags.base64_key = true,
            b'W' => flags.won = true,
            b'X' => flags.stale = true,
            b'Z' => flags.win_sent = true,
            _ => return Err(bad),
        }
    }
    let Some(len) = len else {
        return Ok(Some((
            Response::Meta(MetaReply {
                status,
                flags,
                value: None,
            }),
            line_len,
        )));
    };
    Ok(data_block(buf, line_len, len)?.map(|(data, consumed)| {
        (
            Response::Meta(MetaReply {
                status,
                flags,
                value: Some(data),
            }),
            consumed,
        )
    }))
}
