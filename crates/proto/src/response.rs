//! Replies: the server composes them into its output buffer, the client
//! parses them back (see [`crate::parse_reply`]). One type, [`Response`],
//! serves both directions so the forwarder can relay what it parsed.
//!
//! Values are written without an intermediate copy: the server writes a
//! header with [`write_value_header`] (or [`write_meta_header`] for `VA`),
//! copies the value bytes straight from the store into the same buffer, and
//! finishes with [`write_value_end`].

use crate::lines;
use crate::meta::{ReturnFlag, ReturnFlags};
use crate::token::{write_i64, write_u64};

/// One reply line (and data block, for values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Response<'a> {
    /// `VALUE <key> <flags> <bytes> [<cas>]` and the data block (one item of
    /// a retrieval; the retrieval ends with [`Response::End`]).
    Value {
        /// The key.
        key: &'a [u8],
        /// Client flags.
        flags: u32,
        /// CAS value (`gets`, `gats`).
        cas: Option<u64>,
        /// The data.
        data: &'a [u8],
    },
    /// `END`.
    End,
    /// `STORED`.
    Stored,
    /// `NOT_STORED`.
    NotStored,
    /// `EXISTS`.
    Exists,
    /// `NOT_FOUND`.
    NotFound,
    /// `DELETED`.
    Deleted,
    /// `TOUCHED`.
    Touched,
    /// `OK`.
    Ok,
    /// `RESET` (reply to `stats reset`).
    Reset,
    /// The new value after `incr`/`decr`.
    Number(u64),
    /// `VERSION <version>`.
    Version(&'a [u8]),
    /// `STAT <name> <value>` (a `stats` reply ends with [`Response::End`]).
    Stat {
        /// Statistic name (no spaces).
        name: &'a [u8],
        /// Value (the rest of the line).
        value: &'a [u8],
    },
    /// `ERROR` (a client reading memcached may also see `ERROR <text>`).
    Error,
    /// `CLIENT_ERROR <message>`.
    ClientError(&'a [u8]),
    /// `SERVER_ERROR <message>`.
    ServerError(&'a [u8]),
    /// A meta reply: `HD`, `VA`, `EN`, `NF`, `NS`, `EX`.
    Meta(MetaReply<'a>),
    /// `MN` (reply to `mn`).
    MetaNoop,
    /// `ME <key> <k>=<v>*` (reply to `me`).
    MetaDebug {
        /// The key as requested.
        key: &'a [u8],
        /// The space-separated `name=value` pairs.
        info: &'a [u8],
    },
}

/// Meta reply status code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MetaStatus {
    /// `HD`: success, no value.
    Hd,
    /// `VA <size>`: success, a data block follows.
    Va,
    /// `EN`: miss (`mg`, `me`).
    En,
    /// `NF`: not found.
    Nf,
    /// `NS`: not stored.
    Ns,
    /// `EX`: CAS mismatch.
    Ex,
}

impl MetaStatus {
    /// The two-letter code.
    pub const fn code(self) -> &'static [u8; 2] {
        match self {
            MetaStatus::Hd => b"HD",
            MetaStatus::Va => b"VA",
            MetaStatus::En => b"EN",
            MetaStatus::Nf => b"NF",
            MetaStatus::Ns => b"NS",
            MetaStatus::Ex => b"EX",
        }
    }

    /// Whether the `q` flag hides this status for `command` (`b"mg"`, `b"ms"`,
    /// `b"md"`, `b"ma"`). memcached 1.6.18 hides `EN` for `mg` and `HD` for
    /// `ms`, `md` and `ma`; every other status, and every error, is sent.
    pub fn hidden_by_quiet(self, command: &[u8]) -> bool {
        match command {
            b"mg" => self == MetaStatus::En,
            b"ms" | b"md" | b"ma" => self == MetaStatus::Hd,
            _ => false,
        }
    }
}

/// The flags of a meta reply. Server side it describes the item (the server
/// fills what it knows; [`write_meta_header`] emits what the request asked
/// for); client side it is what the reply said.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct MetaReplyFlags<'a> {
    /// `c`: CAS value.
    pub cas: Option<u64>,
    /// `f`: client flags.
    pub client_flags: Option<u32>,
    /// `h`: hit before.
    pub hit_before: Option<bool>,
    /// `k`: key, as on the wire (base64 text when `base64_key`).
    pub key: Option<&'a [u8]>,
    /// `l`: seconds since last access.
    pub last_access_secs: Option<u64>,
    /// `O`: opaque token.
    pub opaque: Option<&'a [u8]>,
    /// `s`: item size.
    pub size: Option<u64>,
    /// `t`: remaining TTL in seconds, -1 when the item never expires.
    pub ttl_secs: Option<i64>,
    /// `b`: the returned key is base64.
    pub base64_key: bool,
    /// `W`: the client won the right to recache.
    pub won: bool,
    /// `X`: the item is stale.
    pub stale: bool,
    /// `Z`: another client already won the recache.
    pub win_sent: bool,
}

impl MetaReplyFlags<'_> {
    fn write_flag(&self, flag: ReturnFlag, opaque: Option<&[u8]>, out: &mut Vec<u8>) -> bool {
        let start = out.len();
        out.push(b' ');
        out.push(flag.letter());
        let present = match flag {
            ReturnFlag::Cas => self.cas.map(|v| write_u64(out, v)).is_some(),
            ReturnFlag::ClientFlags => self
                .client_flags
                .map(|v| write_u64(out, u64::from(v)))
                .is_some(),
            ReturnFlag::HitBefore => self
                .hit_before
                .map(|v| out.push(if v { b'1' } else { b'0' }))
                .is_some(),
            ReturnFlag::Key => self.key.map(|k| out.extend_from_slice(k)).is_some(),
            ReturnFlag::LastAccess => self.last_access_secs.map(|v| write_u64(out, v)).is_some(),
            ReturnFlag::Opaque => opaque.map(|o| out.extend_from_slice(o)).is_some(),
            ReturnFlag::Size => self.size.map(|v| write_u64(out, v)).is_some(),
            ReturnFlag::Ttl => self.ttl_secs.map(|v| write_i64(out, v)).is_some(),
        };
        if !present {
            out.truncate(start);
        }
        present
    }

    /// Appends `b` (when `base64`), `Z`, `X`, `W` in memcached's order
    /// (after the return flags).
    fn write_trailer(&self, base64: bool, out: &mut Vec<u8>) {
        if base64 {
            out.extend_from_slice(b" b");
        }
        if self.win_sent {
            out.extend_from_slice(b" Z");
        }
        if self.stale {
            out.extend_from_slice(b" X");
        }
        if self.won {
            out.extend_from_slice(b" W");
        }
    }
}

/// Order in which [`MetaReply::encode`] writes flags when no request order
/// is known.
const CANONICAL_ORDER: [ReturnFlag; 8] = [
    ReturnFlag::Cas,
    ReturnFlag::ClientFlags,
    ReturnFlag::HitBefore,
    ReturnFlag::Key,
    ReturnFlag::LastAccess,
    ReturnFlag::Opaque,
    ReturnFlag::Size,
    ReturnFlag::Ttl,
];

/// A meta reply with its flags and, for `VA`, its data block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MetaReply<'a> {
    /// Status code.
    pub status: MetaStatus,
    /// Returned flags.
    pub flags: MetaReplyFlags<'a>,
    /// The data block (`Some` exactly when `status` is `Va`).
    pub value: Option<&'a [u8]>,
}

impl MetaReply<'_> {
    /// Appends the reply with flags in a fixed order (`c f h k l O s t b Z X W`).
    /// Servers answering a request should use [`write_meta_header`], which
    /// follows the request's order as memcached does.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.status.code());
        if self.status == MetaStatus::Va {
            out.push(b' ');
            write_u64(out, self.value.unwrap_or_default().len() as u64);
        }
        for flag in CANONICAL_ORDER {
            self.flags.write_flag(flag, self.flags.opaque, out);
        }
        self.flags.write_trailer(self.flags.base64_key, out);
        out.extend_from_slice(b"\r\n");
        if let Some(value) = self.value {
            out.extend_from_slice(value);
            out.extend_from_slice(b"\r\n");
        }
    }
}

/// Writes a meta reply line: `status` (with `value_len` for `VA`), then each
/// flag of `requested` in request order for which `item` has a value (the
/// opaque token comes from `requested`), then `b` (when `item.base64_key`
/// and a key was written), `Z`, `X`, `W`. For `VA`, copy the value after
/// this and finish with [`write_value_end`].
pub fn write_meta_header(
    out: &mut Vec<u8>,
    status: MetaStatus,
    value_len: usize,
    requested: &ReturnFlags<'_>,
    item: &MetaReplyFlags<'_>,
) {
    out.extend_from_slice(status.code());
    if status == MetaStatus::Va {
        out.push(b' ');
        write_u64(out, value_len as u64);
    }
    let mut key_written = false;
    for flag in requested.iter() {
        let written = item.write_flag(flag, requested.opaque(), out);
        key_written |= written && flag == ReturnFlag::Key;
    }
    item.write_trailer(item.base64_key && key_written, out);
    out.extend_from_slice(b"\r\n");
}

/// Writes `STAT <name> <value>\r\n`, the value as it displays.
pub fn write_stat(out: &mut Vec<u8>, name: &str, value: impl std::fmt::Display) {
    Response::Stat {
        name: name.as_bytes(),
        value: value.to_string().as_bytes(),
    }
    .encode(out);
}

/// Writes `VALUE <key> <flags> <len>[ <cas>]\r\n`; copy the value after it
/// and finish with [`write_value_end`].
pub fn write_value_header(out: &mut Vec<u8>, key: &[u8], flags: u32, len: usize, cas: Option<u64>) {
    out.extend_from_slice(b"VALUE ");
    out.extend_from_slice(key);
    out.push(b' ');
    write_u64(out, u64::from(flags));
    out.push(b' ');
    write_u64(out, len as u64);
    if let Some(cas) = cas {
        out.push(b' ');
        write_u64(out, cas);
    }
    out.extend_from_slice(b"\r\n");
}

/// Terminates a data block (`\r\n`).
pub fn write_value_end(out: &mut Vec<u8>) {
    out.extend_from_slice(b"\r\n");
}

/// Writes one line of memcached's `stats cachedump`: `ITEM <key> [<bytes> b; <exptime> s]`
/// (`exptime` an absolute unix time, 0 for never). The dump ends with `END`.
pub fn write_cachedump_item(out: &mut Vec<u8>, key: &[u8], value_bytes: u64, exptime: u64) {
    out.extend_from_slice(b"ITEM ");
    out.extend_from_slice(key);
    out.extend_from_slice(b" [");
    write_u64(out, value_bytes);
    out.extend_from_slice(b" b; ");
    write_u64(out, exptime);
    out.extend_from_slice(b" s]\r\n");
}

/// Per-prefix counts of memcached's `stats detail dump`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PrefixCounts {
    /// Retrievals of keys with the prefix.
    pub get: u64,
    /// Of those, hits.
    pub hit: u64,
    /// Storage commands.
    pub set: u64,
    /// Deletions.
    pub del: u64,
}

/// Writes one line of memcached's `stats detail dump`:
/// `PREFIX <prefix> get <n> hit <n> set <n> del <n>`. The dump ends with `END`.
pub fn write_detail_prefix(out: &mut Vec<u8>, prefix: &[u8], counts: PrefixCounts) {
    out.extend_from_slice(b"PREFIX ");
    out.extend_from_slice(prefix);
    for (word, n) in [
        (&b" get "[..], counts.get),
        (b" hit ", counts.hit),
        (b" set ", counts.set),
        (b" del ", counts.del),
    ] {
        out.extend_from_slice(word);
        write_u64(out, n);
    }
    out.extend_from_slice(b"\r\n");
}

impl Response<'_> {
    /// Appends the reply's wire form.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let line: &[u8] = match self {
            Response::Value {
                key,
                flags,
                cas,
                data,
            } => {
                write_value_header(out, key, *flags, data.len(), *cas);
                out.extend_from_slice(data);
                write_value_end(out);
                return;
            }
            Response::Meta(reply) => {
                reply.encode(out);
                return;
            }
            Response::Number(n) => {
                write_u64(out, *n);
                out.extend_from_slice(b"\r\n");
                return;
            }
            Response::Version(version) => {
                out.extend_from_slice(b"VERSION ");
                out.extend_from_slice(version);
                out.extend_from_slice(b"\r\n");
                return;
            }
            Response::Stat { name, value } => {
                out.extend_from_slice(b"STAT ");
                out.extend_from_slice(name);
                out.push(b' ');
                out.extend_from_slice(value);
                out.extend_from_slice(b"\r\n");
                return;
            }
            Response::ClientError(message) => {
                out.extend_from_slice(b"CLIENT_ERROR ");
                out.extend_from_slice(message);
                out.extend_from_slice(b"\r\n");
                return;
            }
            Response::ServerError(message) => {
                out.extend_from_slice(b"SERVER_ERROR ");
                out.extend_from_slice(message);
                out.extend_from_slice(b"\r\n");
                return;
            }
            Response::MetaDebug { key, info } => {
                out.extend_from_slice(b"ME ");
                out.extend_from_slice(key);
                if !info.is_empty() {
                    out.push(b' ');
                    out.extend_from_slice(info);
                }
                out.extend_from_slice(b"\r\n");
                return;
            }
            Response::End => lines::END,
            Response::Stored => lines::STORED,
            Response::NotStored => lines::NOT_STORED,
            Response::Exists => lines::EXISTS,
            Response::NotFound => lines::NOT_FOUND,
            Response::Deleted => lines::DELETED,
            Response::Touched => lines::TOUCHED,
            Response::Ok => lines::OK,
            Response::Reset => lines::RESET,
            Response::Error => lines::ERROR,
            Response::MetaNoop => lines::MN,
        };
        out.extend_from_slice(line);
    }
}
