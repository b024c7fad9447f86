//! Client side of the memcached text protocol, as narrow as the load generator needs.
//!
//! Encoding appends requests (`get`, `gets`, multi-key `get`, `set`, `version`, `stats`) to a
//! caller-owned buffer, so a pipelined connection writes many requests with one syscall.
//! Parsing is incremental and zero-copy: [`parse_reply`] looks at the bytes read so far and
//! either returns one complete reply that borrows from the buffer together with how many bytes
//! it used, or says the reply is still incomplete. An incomplete reply is a normal outcome, not
//! an error; only bytes that can never become a valid reply are a [`WireError`], after which the
//! connection is out of sync and must be closed.
//!
//! Guarantees: no input makes the parser panic; every line and value is bounded by
//! [`ParseLimits`], so a misbehaving server cannot make the client buffer without bound.
//! The module is self-contained so it can be swapped for the shared `cellcache-proto` codec
//! later: the engine only uses the functions and types exported here.

use thiserror::Error;

/// Bounds the parser enforces on what a server may send.
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

/// What kind of reply the request at the head of the pipeline expects. The text protocol does
/// not tag replies, so the client must know what it asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// `get`/`gets`: zero or more `VALUE` blocks, then `END`.
    Retrieval,
    /// `set` and friends: one status line.
    Storage,
    /// `version`: `VERSION <string>`.
    Version,
    /// `stats`: `STAT <name> <value>` lines, then `END`.
    Stats,
}

/// One complete reply, borrowing from the read buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply<'a> {
    /// The answer to a retrieval: `count` values; iterate them with [`Values::iter`].
    Values(Values<'a>),
    /// `STORED`
    Stored,
    /// `NOT_STORED`
    NotStored,
    /// `EXISTS`
    Exists,
    /// `NOT_FOUND`
    NotFound,
    /// `VERSION <text>`
    Version(&'a [u8]),
    /// The `STAT` lines of a `stats` reply; iterate them with [`Stats::iter`].
    Stats(Stats<'a>),
    /// `ERROR`: the server did not understand the command.
    Error,
    /// `CLIENT_ERROR <message>`
    ClientError(&'a [u8]),
    /// `SERVER_ERROR <message>`
    ServerError(&'a [u8]),
}

impl Reply<'_> {
    /// Whether this reply is one of the three protocol error classes.
    pub fn is_error(&self) -> bool {
        matches!(
            self,
            Reply::Error | Reply::ClientError(_) | Reply::ServerError(_)
        )
    }
}

/// The `VALUE` blocks of a retrieval reply (validated; `END` excluded).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Values<'a> {
    block: &'a [u8],
    count: usize,
}

/// One value of a retrieval reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Value<'a> {
    pub key: &'a [u8],
    pub flags: u32,
    pub cas: Option<u64>,
    pub data: &'a [u8],
}

impl<'a> Values<'a> {
    /// How many values (hits) the reply holds.
    pub fn count(&self) -> usize {
        self.count
    }

    /// Total bytes of value data in the reply.
    pub fn data_bytes(&self) -> usize {
        self.iter().map(|v| v.data.len()).sum()
    }

    /// The values in the order the server sent them.
    pub fn iter(&self) -> impl Iterator<Item = Value<'a>> + 'a {
        let mut rest = self.block;
        std::iter::from_fn(move || {
            if rest.is_empty() {
                return None;
            }
            // The block was validated by `parse_reply`, so these cannot fail; stop quietly
            // rather than panic if they somehow did.
            let line_end = memchr::memmem::find(rest, b"\r\n")?;
            let header = parse_value_header(&rest[..line_end]).ok()?;
            let data_start = line_end + 2;
            let data_end = data_start.checked_add(header.len)?;
            let data = rest.get(data_start..data_end)?;
            rest = rest.get(data_end + 2..)?;
            Some(Value {
                key: header.key,
                flags: header.flags,
                cas: header.cas,
                data,
            })
        })
    }
}

/// The `STAT` lines of a `stats` reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stats<'a> {
    block: &'a [u8],
}

impl<'a> Stats<'a> {
    /// `(name, value)` pairs in the order the server sent them.
    pub fn iter(&self) -> impl Iterator<Item = (&'a [u8], &'a [u8])> + 'a {
        self.block.split(|&b| b == b'\n').filter_map(|line| {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            let rest = line.strip_prefix(b"STAT ")?;
            let space = memchr::memchr(b' ', rest)?;
            Some((&rest[..space], &rest[space + 1..]))
        })
    }

    /// The value of one statistic parsed as an unsigned integer.
    pub fn get_u64(&self, name: &str) -> Option<u64> {
        self.iter()
            .find(|(n, _)| *n == name.as_bytes())
            .and_then(|(_, v)| std::str::from_utf8(v).ok()?.parse().ok())
    }
}

/// The outcome of looking at the bytes read so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parsed<'a> {
    /// One whole reply, which used the first `consumed` bytes of the buffer.
    Complete { reply: Reply<'a>, consumed: usize },
    /// More bytes are needed; nothing was consumed.
    Incomplete,
}

/// Bytes that can never become the expected reply. The connection is out of sync.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum WireError {
    #[error("reply line longer than {limit} bytes")]
    LineTooLong { limit: usize },
    #[error("value of {len} bytes exceeds the {limit}-byte limit")]
    ValueTooLarge { len: usize, limit: usize },
    #[error("malformed VALUE header: {0:?}")]
    BadValueHeader(String),
    #[error("value data not followed by CRLF")]
    BadValueTerminator,
    #[error("unexpected reply line: {0:?}")]
    Unexpected(String),
}

fn lossy(bytes: &[u8]) -> String {
    const SHOWN_BYTES_MAX: usize = 80;
    String::from_utf8_lossy(&bytes[..bytes.len().min(SHOWN_BYTES_MAX)]).into_owned()
}

/// Finds the next line starting at `from`; `Ok(None)` if it is not complete yet.
/// Returns `(line without CRLF, index after CRLF)`.
fn next_line<'a>(
    buf: &'a [u8],
    from: usize,
    limits: &ParseLimits,
) -> Result<Option<(&'a [u8], usize)>, WireError> {
    let rest = &buf[from..];
    let window = &rest[..rest.len().min(limits.line_bytes_max)];
    match memchr::memchr(b'\n', window) {
        Some(nl) if nl > 0 && window[nl - 1] == b'\r' => Ok(Some((&rest[..nl - 1], from + nl + 1))),
        Some(_) => Err(WireError::Unexpected(lossy(window))),
        None if rest.len() >= limits.line_bytes_max => Err(WireError::LineTooLong {
            limit: limits.line_bytes_max,
        }),
        None => Ok(None),
    }
}

struct ValueHeader<'a> {
    key: &'a [u8],
    flags: u32,
    len: usize,
    cas: Option<u64>,
}

fn parse_num<T: std::str::FromStr>(field: Option<&[u8]>) -> Option<T> {
    std::str::from_utf8(field?).ok()?.parse().ok()
}

/// Parses `VALUE <key> <flags> <bytes> [<cas>]` (the `VALUE ` prefix included).
fn parse_value_header(line: &[u8]) -> Result<ValueHeader<'_>, WireError> {
    let bad = || WireError::BadValueHeader(lossy(line));
    let rest = line.strip_prefix(b"VALUE ").ok_or_else(bad)?;
    let mut fields = rest.split(|&b| b == b' ');
    let key = fields.next().filter(|k| !k.is_empty()).ok_or_else(bad)?;
    let flags = parse_num(fields.next()).ok_or_else(bad)?;
    let len = parse_num(fields.next()).ok_or_else(bad)?;
    let cas = match fields.next() {
        Some(f) => Some(parse_num(Some(f)).ok_or_else(bad)?),
        None => None,
    };
    if fields.next().is_some() {
        return Err(bad());
    }
    Ok(ValueHeader {
        key,
        flags,
        len,
        cas,
    })
}

/// The text of an error line after its keyword and one space.
fn message(msg: &[u8]) -> &[u8] {
    msg.strip_prefix(b" ").unwrap_or(msg)
}

/// Recognises the error lines any command may get instead of its normal reply.
fn error_line(line: &[u8]) -> Option<Reply<'_>> {
    if line == b"ERROR" {
        return Some(Reply::Error);
    }
    if let Some(msg) = line.strip_prefix(b"CLIENT_ERROR") {
        return Some(Reply::ClientError(message(msg)));
    }
    line.strip_prefix(b"SERVER_ERROR")
        .map(|msg| Reply::ServerError(message(msg)))
}

/// Looks for one complete reply of kind `expect` at the start of `buf`.
///
/// Cost is linear in the number of reply lines, not in value bytes: value data is skipped by
/// its announced length. Calling again after more bytes arrive re-scans only headers.
pub fn parse_reply<'a>(
    buf: &'a [u8],
    expect: Expect,
    limits: &ParseLimits,
) -> Result<Parsed<'a>, WireError> {
    let Some((line, after)) = next_line(buf, 0, limits)? else {
        return Ok(Parsed::Incomplete);
    };
    if let Some(reply) = error_line(line) {
        return Ok(Parsed::Complete {
            reply,
            consumed: after,
        });
    }
    let unexpected = || WireError::Unexpected(lossy(line));
    let reply = match expect {
        Expect::Storage => match line {
            b"STORED" => Reply::Stored,
            b"NOT_STORED" => Reply::NotStored,
            b"EXISTS" => Reply::Exists,
            b"NOT_FOUND" => Reply::NotFound,
            _ => return Err(unexpected()),
        },
        Expect::Version => Reply::Version(line.strip_prefix(b"VERSION ").ok_or_else(unexpected)?),
        Expect::Retrieval => return parse_values(buf, line, after, limits),
        Expect::Stats => return parse_stats(buf, line, after, limits),
    };
    Ok(Parsed::Complete {
        reply,
        consumed: after,
    })
}

fn parse_values<'a>(
    buf: &'a [u8],
    first: &'a [u8],
    first_end: usize,
    limits: &ParseLimits,
) -> Result<Parsed<'a>, WireError> {
    let mut line = first;
    let mut pos = first_end;
    let mut count = 0;
    loop {
        if line == b"END" {
            // The block runs from the start to the beginning of the END line.
            let block = &buf[..pos - b"END\r\n".len()];
            return Ok(Parsed::Complete {
                reply: Reply::Values(Values { block, count }),
                consumed: pos,
            });
        }
        let header = parse_value_header(line)?;
        if header.len > limits.value_bytes_max {
            return Err(WireError::ValueTooLarge {
                len: header.len,
                limit: limits.value_bytes_max,
            });
        }
        let data_end = pos + header.len;
        if buf.len() < data_end + 2 {
            return Ok(Parsed::Incomplete);
        }
        if &buf[data_end..data_end + 2] != b"\r\n" {
            return Err(WireError::BadValueTerminator);
        }
        count += 1;
        pos = data_end + 2;
        match next_line(buf, pos, limits)? {
            Some((next, after)) => {
                line = next;
                pos = after;
            }
            None => return Ok(Parsed::Incomplete),
        }
    }
}

fn parse_stats<'a>(
    buf: &'a [u8],
    first: &'a [u8],
    first_end: usize,
    limits: &ParseLimits,
) -> Result<Parsed<'a>, WireError> {
    let mut line = first;
    let mut pos = first_end;
    loop {
        if line == b"END" {
            let block = &buf[..pos - b"END\r\n".len()];
            return Ok(Parsed::Complete {
                reply: Reply::Stats(Stats { block }),
                consumed: pos,
            });
        }
        if !line.starts_with(b"STAT ") {
            return Err(WireError::Unexpected(lossy(line)));
        }
        match next_line(buf, pos, limits)? {
            Some((next, after)) => {
                line = next;
                pos = after;
            }
            None => return Ok(Parsed::Incomplete),
        }
    }
}

/// Appends `get <key>...\r\n` (a multi-get when more than one key is given).
pub fn encode_get<K: AsRef<[u8]>>(out: &mut Vec<u8>, keys: &[K]) {
    encode_retrieval(out, b"get", keys);
}

/// Appends `get` with `n_keys` keys, each written in place by `write_key(i, out)`, so the
/// caller can generate keys straight into the output buffer without allocating.
pub fn encode_get_with(
    out: &mut Vec<u8>,
    n_keys: usize,
    mut write_key: impl FnMut(usize, &mut Vec<u8>),
) {
    out.extend_from_slice(b"get");
    for i in 0..n_keys {
        out.push(b' ');
        write_key(i, out);
    }
    out.extend_from_slice(b"\r\n");
}

/// Appends `gets <key>...\r\n`.
pub fn encode_gets<K: AsRef<[u8]>>(out: &mut Vec<u8>, keys: &[K]) {
    encode_retrieval(out, b"gets", keys);
}

fn encode_retrieval<K: AsRef<[u8]>>(out: &mut Vec<u8>, verb: &[u8], keys: &[K]) {
    out.extend_from_slice(verb);
    for key in keys {
        out.push(b' ');
        out.extend_from_slice(key.as_ref());
    }
    out.extend_from_slice(b"\r\n");
}

/// Appends `set <key> <flags> <ttl> <bytes>\r\n<value>\r\n`.
pub fn encode_set(out: &mut Vec<u8>, key: &[u8], flags: u32, ttl_secs: i64, value: &[u8]) {
    encode_set_with(
        out,
        |out| out.extend_from_slice(key),
        flags,
        ttl_secs,
        value,
    );
}

/// Like [`encode_set`], with the key written in place by `write_key` (no allocation).
pub fn encode_set_with(
    out: &mut Vec<u8>,
    write_key: impl FnOnce(&mut Vec<u8>),
    flags: u32,
    ttl_secs: i64,
    value: &[u8],
) {
    use std::io::Write as _;
    out.extend_from_slice(b"set ");
    write_key(out);
    // Writing integers into a Vec cannot fail.
    let _ = write!(out, " {flags} {ttl_secs} {}\r\n", value.len());
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// Appends `version\r\n`.
pub fn encode_version(out: &mut Vec<u8>) {
    out.extend_from_slice(b"version\r\n");
}

/// Appends `stats\r\n`.
pub fn encode_stats(out: &mut Vec<u8>) {
    out.extend_from_slice(b"stats\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(buf: &[u8], expect: Expect) -> Result<Parsed<'_>, WireError> {
        parse_reply(buf, expect, &ParseLimits::default())
    }

    #[test]
    fn encodes_requests_byte_exact() {
        let mut out = Vec::new();
        encode_get(&mut out, &[b"a".as_slice()]);
        encode_get(&mut out, &["k1", "k2", "k3"]);
        encode_gets(&mut out, &["x"]);
        encode_get_with(&mut out, 2, |i, out| {
            out.extend_from_slice(if i == 0 { b"p" } else { b"q" })
        });
        encode_set(&mut out, b"key", 7, 30, b"hello");
        encode_set_with(&mut out, |out| out.extend_from_slice(b"k2"), 0, 0, b"");
        encode_version(&mut out);
        encode_stats(&mut out);
        assert_eq!(
            out,
            b"get a\r\nget k1 k2 k3\r\ngets x\r\nget p q\r\nset key 7 30 5\r\nhello\r\nset k2 0 0 0\r\n\r\nversion\r\nstats\r\n".as_slice()
        );
    }

    #[test]
    fn parses_storage_replies_and_errors() {
        for (bytes, want) in [
            (&b"STORED\r\n"[..], Reply::Stored),
            (b"NOT_STORED\r\n", Reply::NotStored),
            (b"EXISTS\r\n", Reply::Exists),
            (b"NOT_FOUND\r\n", Reply::NotFound),
            (b"ERROR\r\n", Reply::Error),
            (
                b"SERVER_ERROR out of memory\r\n",
                Reply::ServerError(b"out of memory"),
            ),
            (
                b"CLIENT_ERROR bad data chunk\r\n",
                Reply::ClientError(b"bad data chunk"),
            ),
        ] {
            assert_eq!(
                parse(bytes, Expect::Storage),
                Ok(Parsed::Complete {
                    reply: want,
                    consumed: bytes.len()
                })
            );
        }
    }

    #[test]
    fn parses_multi_value_reply_zero_copy() {
        let buf = b"VALUE a 1 3\r\nabc\r\nVALUE bb 0 0 99\r\n\r\nEND\r\nSTORED\r\n";
        let Ok(Parsed::Complete {
            reply: Reply::Values(values),
            consumed,
        }) = parse(buf, Expect::Retrieval)
        else {
            panic!("expected values");
        };
        assert_eq!(consumed, buf.len() - b"STORED\r\n".len());
        assert_eq!(values.count(), 2);
        let all: Vec<_> = values.iter().collect();
        assert_eq!(
            all[0],
            Value {
                key: b"a",
                flags: 1,
                cas: None,
                data: b"abc"
            }
        );
        assert_eq!(
            all[1],
            Value {
                key: b"bb",
                flags: 0,
                cas: Some(99),
                data: b""
            }
        );
        // Zero-copy: the data slice points into the read buffer.
        assert!(std::ptr::eq(all[0].data.as_ptr(), buf[13..].as_ptr()));
        assert_eq!(values.data_bytes(), 3);
    }

    #[test]
    fn miss_is_an_empty_values_reply() {
        assert_eq!(
            parse(b"END\r\n", Expect::Retrieval),
            Ok(Parsed::Complete {
                reply: Reply::Values(Values {
                    block: b"",
                    count: 0
                }),
                consumed: 5
            })
        );
    }

    #[test]
    fn every_prefix_of_a_reply_is_incomplete() {
        // Value data containing CR LF and "END" must be skipped by length, not scanned.
        let buf = b"VALUE k 0 7\r\nEND\r\nxx\r\nEND\r\n";
        for cut in 0..buf.len() {
            assert_eq!(
                parse(&buf[..cut], Expect::Retrieval),
                Ok(Parsed::Incomplete),
                "cut at {cut}"
            );
        }
        let Ok(Parsed::Complete {
            reply: Reply::Values(v),
            consumed,
        }) = parse(buf, Expect::Retrieval)
        else {
            panic!("expected complete");
        };
        assert_eq!((v.count(), consumed), (1, buf.len()));
        assert_eq!(v.iter().next().map(|v| v.data), Some(&b"END\r\nxx"[..]));
    }

    #[test]
    fn parses_stats_and_version() {
        let buf = b"STAT pid 12\r\nSTAT evictions 5\r\nSTAT version 1.6.18\r\nEND\r\n";
        let Ok(Parsed::Complete {
            reply: Reply::Stats(stats),
            consumed,
        }) = parse(buf, Expect::Stats)
        else {
            panic!("expected stats");
        };
        assert_eq!(consumed, buf.len());
        assert_eq!(stats.get_u64("evictions"), Some(5));
        assert_eq!(stats.get_u64("version"), None);
        assert_eq!(stats.iter().count(), 3);
        assert_eq!(
            parse(b"VERSION 1.6.18\r\n", Expect::Version),
            Ok(Parsed::Complete {
                reply: Reply::Version(b"1.6.18"),
                consumed: 16
            })
        );
    }

    #[test]
    fn rejects_garbage_and_enforces_limits() {
        assert!(matches!(
            parse(b"HELLO\r\n", Expect::Storage),
            Err(WireError::Unexpected(_))
        ));
        assert!(matches!(
            parse(b"VALUE k x 1\r\na\r\nEND\r\n", Expect::Retrieval),
            Err(WireError::BadValueHeader(_))
        ));
        assert!(matches!(
            parse(b"VALUE k 0 1\r\nab\r\nEND\r\n", Expect::Retrieval),
            Err(WireError::BadValueTerminator)
        ));
        assert!(matches!(
            parse(b"STORED\n", Expect::Storage),
            Err(WireError::Unexpected(_))
        ));
        let limits = ParseLimits {
            line_bytes_max: 8,
            value_bytes_max: 4,
        };
        assert_eq!(
            parse_reply(b"NOT_STORED", Expect::Storage, &limits),
            Err(WireError::LineTooLong { limit: 8 })
        );
        assert_eq!(
            parse_reply(
                b"VALUE k 0 5\r\n",
                Expect::Retrieval,
                &ParseLimits {
                    line_bytes_max: 64,
                    value_bytes_max: 4
                }
            ),
            Err(WireError::ValueTooLarge { len: 5, limit: 4 })
        );
    }

    #[test]
    fn never_panics_on_arbitrary_bytes() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
        let alphabet = b"VALUE END STORED\r\n0123 x";
        for _ in 0..20_000 {
            let len = rng.gen_range(0..40);
            let buf: Vec<u8> = (0..len)
                .map(|_| alphabet[rng.gen_range(0..alphabet.len())])
                .collect();
            for expect in [
                Expect::Retrieval,
                Expect::Storage,
                Expect::Version,
                Expect::Stats,
            ] {
                if let Ok(Parsed::Complete {
                    reply: Reply::Values(v),
                    consumed,
                }) = parse(&buf, expect)
                {
                    assert!(consumed <= buf.len());
                    assert_eq!(v.iter().count(), v.count());
                }
            }
        }
    }
}
