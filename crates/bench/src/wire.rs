//! The load generator's side of the memcached codec: how tolerant it is of what a server
//! sends. The bytes themselves are `cellcache-proto`'s, the same codec the server uses:
//! requests go out through [`cellcache_proto::write_retrieve_with`],
//! [`cellcache_proto::write_store_with`] and [`cellcache_proto::Request::encode`]; replies
//! come back through [`cellcache_proto::decode_reply`], incrementally and zero-copy, so a
//! pipelined connection parses straight from its read buffer.
//!
//! Guarantee: every reply line and value is bounded by [`ParseLimits`], so a misbehaving
//! server cannot make the client buffer without bound; bytes that can never become the
//! expected reply are a [`cellcache_proto::ReplyError`], after which the connection is out
//! of sync and is closed.

use cellcache_proto::Limits;

/// Bounds the generator enforces on what a server may send. Part of the engine's
/// configuration (and so of every JSON report).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct ParseLimits {
    /// Longest reply line (header or status), terminator included. memcached's own lines are
    /// under 300 bytes; stats lines are the longest.
    pub line_bytes_max: usize,
    /// Largest value a `VALUE` block may announce. memcached's `-I` maximum is 1 GiB; the default
    /// follows its default item size (1 MiB) with headroom for larger configured servers.
    pub value_bytes_max: usize,
}

impl Default for ParseLimits {
    fn default() -> Self {
        Self {
            line_bytes_max: 4096,
            value_bytes_max: 128 * 1024 * 1024,
        }
    }
}

impl ParseLimits {
    /// The same bounds in the form the codec takes.
    pub fn codec(&self) -> Limits {
        Limits::for_replies(self.line_bytes_max, self.value_bytes_max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cellcache_proto::{
        Decoded, Expect, ReplyError, Request, StatsGroup, StoreHead, StoreMode, decode_reply,
        write_retrieve_with, write_store_with,
    };

    /// The requests the generator sends, byte for byte as before the codec moved to proto.
    #[test]
    fn requests_are_byte_exact() {
        let mut out = Vec::new();
        write_retrieve_with(&mut out, false, None, 2, |i, out| {
            out.extend_from_slice(if i == 0 { b"p" } else { b"q" })
        });
        let set = StoreHead {
            mode: StoreMode::Set,
            flags: 7,
            exptime: 30,
            noreply: false,
        };
        write_store_with(&mut out, set, |out| out.extend_from_slice(b"key"), b"hello");
        Request::Version.encode(&mut out);
        Request::Stats(StatsGroup::General).encode(&mut out);
        assert_eq!(
            out,
            b"get p q\r\nset key 7 30 5\r\nhello\r\nversion\r\nstats\r\n".as_slice()
        );
    }

    #[test]
    fn limits_bound_lines_and_values() {
        let limits = ParseLimits {
            line_bytes_max: 8,
            value_bytes_max: 4,
        }
        .codec();
        assert_eq!(
            decode_reply(b"NOT_STORED", Expect::Line, &limits),
            Err(ReplyError::LineTooLong)
        );
        let roomy = ParseLimits {
            line_bytes_max: 64,
            value_bytes_max: 4,
        }
        .codec();
        assert_eq!(
            decode_reply(b"VALUE k 0 5\r\n", Expect::Values, &roomy),
            Err(ReplyError::ValueTooLarge)
        );
        assert_eq!(
            decode_reply(b"VALUE k 0 4\r\n", Expect::Values, &roomy),
            Ok(Decoded::Incomplete)
        );
        assert_eq!(ParseLimits::default().codec().value_bytes_max(), 128 << 20);
    }
}
