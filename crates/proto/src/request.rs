//! Requests: the typed form of every command line (and data block) a client
//! can send, borrowing keys and values from the read buffer, and their
//! encoding back to bytes for the client direction (load generator, forwarder).
//!
//! A [`Request`] produced by [`crate::parse`] is always valid: keys are within
//! the limits and contain no control bytes, counts are bounded. A hand-built
//! request is encoded as given; [`Request::encode`] does not validate.

use crate::meta::{MetaArithmeticFlags, MetaDeleteFlags, MetaGetFlags, MetaKey, MetaSetFlags};
use crate::token::{Tokens, write_i64, write_u64};

/// One client request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request<'a> {
    /// `get`, `gets`, `gat`, `gats`.
    Retrieve(Retrieve<'a>),
    /// `set`, `add`, `replace`, `append`, `prepend`, `cas`.
    Store(Store<'a>),
    /// `delete <key> [0] [noreply]` (the legacy `0` hold time is accepted).
    Delete {
        /// The key.
        key: &'a [u8],
        /// Suppress the reply.
        noreply: bool,
    },
    /// `incr`/`decr <key> <delta> [noreply]`.
    Arithmetic {
        /// Increment or decrement.
        op: ArithmeticOp,
        /// The key.
        key: &'a [u8],
        /// Unsigned 64-bit delta.
        delta: u64,
        /// Suppress the reply.
        noreply: bool,
    },
    /// `touch <key> <exptime> [noreply]`.
    Touch {
        /// The key.
        key: &'a [u8],
        /// New expiry, as memcached reads exptime (0 never, up to 30 days relative, else
        /// absolute unix time, negative already expired).
        exptime: i64,
        /// Suppress the reply.
        noreply: bool,
    },
    /// `flush_all [delay] [noreply]`.
    FlushAll {
        /// Seconds (or absolute unix time) before the flush takes effect.
        delay: Option<i64>,
        /// Suppress the reply.
        noreply: bool,
    },
    /// `version`.
    Version,
    /// `verbosity <level> [noreply]`: accepted and ignored by cellcache.
    Verbosity {
        /// Requested level.
        level: u32,
        /// Suppress the reply.
        noreply: bool,
    },
    /// `config get cluster`: the cells of the ring, as ElastiCache's auto-discovery
    /// endpoint answers it (`CONFIG cluster 0 <len>`, a version, `host|ip|port …`, `END`).
    ConfigGetCluster,
    /// `refresh_certs [noreply]`: read the TLS certificate and key again (memcached `-Z`).
    RefreshCerts {
        /// Suppress the reply.
        noreply: bool,
    },
    /// `stats [group]`.
    Stats(StatsGroup<'a>),
    /// `cache_memlimit <megabytes> [noreply]`: change the memory limit at run time.
    CacheMemlimit {
        /// New limit in megabytes (MiB).
        megabytes: u64,
        /// Suppress the reply.
        noreply: bool,
    },
    /// `quit`: close the connection without a reply.
    Quit,
    /// `shutdown [graceful]`: the node decides whether it is allowed.
    Shutdown {
        /// `shutdown graceful`.
        graceful: bool,
    },
    /// memcached's slab mover and LRU crawler commands, and `shutdown` with a bad mode.
    Admin(Admin),
    /// `mg <key> <flags>*`.
    MetaGet {
        /// The key.
        key: MetaKey<'a>,
        /// The flags.
        flags: MetaGetFlags<'a>,
    },
    /// `ms <key> <datalen> <flags>*` and its data block.
    MetaSet {
        /// The key.
        key: MetaKey<'a>,
        /// The data block, without its `\r\n`.
        value: &'a [u8],
        /// The flags.
        flags: MetaSetFlags<'a>,
    },
    /// `md <key> <flags>*`.
    MetaDelete {
        /// The key.
        key: MetaKey<'a>,
        /// The flags.
        flags: MetaDeleteFlags<'a>,
    },
    /// `ma <key> <flags>*`.
    MetaArithmetic {
        /// The key.
        key: MetaKey<'a>,
        /// The flags.
        flags: MetaArithmeticFlags<'a>,
    },
    /// `mn`: reply `MN` (marks the end of a pipeline of quiet commands).
    MetaNoop,
    /// `me <key> [b]`: human-readable item metadata.
    MetaDebug {
        /// The key.
        key: MetaKey<'a>,
    },
}

/// Administration commands of memcached whose mechanism cellcache's single arena does not
/// have (slab classes to rebalance, an LRU crawler); the node answers each as memcached 1.6
/// does when there is nothing for the mechanism to do (docs/protocol.md, "Administration").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admin {
    /// `slabs automove <0|1|2>`.
    SlabsAutomove(u8),
    /// `slabs reassign <source class> <destination class>`.
    SlabsReassign {
        /// Source slab class.
        source: i32,
        /// Destination slab class.
        destination: i32,
    },
    /// `lru_crawler crawl|metadump|mgdump <classes>`: work for a crawler.
    LruCrawlerRun,
    /// `lru_crawler enable`.
    LruCrawlerEnable,
    /// `lru_crawler disable`.
    LruCrawlerDisable,
    /// `lru_crawler sleep <usecs>` or `lru_crawler tocrawl <items>`: a crawler setting.
    LruCrawlerSetting,
    /// `shutdown` with an argument other than `graceful`.
    ShutdownInvalidMode,
}

/// A retrieval: `get` = no cas, no touch; `gets` = cas; `gat` = touch;
/// `gats` = cas + touch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retrieve<'a> {
    /// Return CAS values (`gets`, `gats`).
    pub return_cas: bool,
    /// Touch each hit with this exptime (`gat`, `gats`).
    pub touch_exptime: Option<i64>,
    /// One or more keys.
    pub keys: Keys<'a>,
}

impl Retrieve<'_> {
    /// The command word.
    pub fn command(&self) -> &'static str {
        match (self.return_cas, self.touch_exptime.is_some()) {
            (false, false) => "get",
            (true, false) => "gets",
            (false, true) => "gat",
            (true, true) => "gats",
        }
    }
}

/// The keys of a multi-key retrieval: a borrowed slice of the request line,
/// split on demand, so a `get` with many keys allocates nothing. Two `Keys`
/// are equal when they hold the same keys in the same order, however they
/// were spaced on the wire.
#[derive(Debug, Clone, Copy)]
pub struct Keys<'a> {
    text: &'a [u8],
    count: usize,
}

/// Why [`Keys::new`] refused a key list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum KeysError {
    /// No key at all.
    #[error("no keys")]
    Empty,
    /// A key is empty, too long or contains a CR, LF or NUL.
    #[error("invalid key")]
    InvalidKey,
    /// More keys than allowed.
    #[error("too many keys")]
    TooMany,
}

impl<'a> Keys<'a> {
    /// Keys from space-separated `text` (the part of a retrieval line after
    /// the command and exptime), validated against the limits.
    pub fn new(text: &'a [u8], key_bytes_max: usize, count_max: usize) -> Result<Self, KeysError> {
        // Two vectorisable passes instead of a branchy byte loop (this is
        // the hot path of every get): one folds a "CR, LF or NUL seen" flag
        // over the text without short-circuiting, so it compiles to SIMD;
        // the other finds the spaces with memchr and bounds each key. Other
        // control bytes belong to the keys, as in memcached.
        let forbidden = text.iter().fold(false, |seen, &b| {
            seen | (b == b'\r') | (b == b'\n') | (b == 0)
        });
        if forbidden {
            return Err(KeysError::InvalidKey);
        }
        let mut count = 0;
        let mut start = 0;
        for end in memchr::memchr_iter(b' ', text).chain(std::iter::once(text.len())) {
            let len = end - start;
            start = end + 1;
            if len == 0 {
                continue;
            }
            if len > key_bytes_max {
                return Err(KeysError::InvalidKey);
            }
            count += 1;
            if count > count_max {
                return Err(KeysError::TooMany);
            }
        }
        if count == 0 {
            return Err(KeysError::Empty);
        }
        Ok(Self { text, count })
    }

    /// The first batch of keys of `text`: at most `count_max` keys, in order. `complete`
    /// says `text` runs to the line end; otherwise a token touching its end may be cut and
    /// is left for a later batch. Returns the keys and how many bytes of `text` they cover
    /// (up to the end of the batch's last key; the bytes after it are the rest of the line).
    /// The batch may hold no key: `text` holds only spaces, or (not `complete`) only a cut
    /// token no longer than `key_bytes_max`.
    pub fn batch(
        text: &'a [u8],
        complete: bool,
        key_bytes_max: usize,
        count_max: usize,
    ) -> Result<(Self, usize), KeysError> {
        let mut count = 0;
        let mut covered = 0;
        let mut i = 0;
        while i < text.len() && count < count_max {
            if text[i] == b' ' {
                i += 1;
                continue;
            }
            let end = memchr::memchr(b' ', &text[i..]).map_or(text.len(), |n| i + n);
            let key = &text[i..end];
            let cut = end == text.len() && !complete;
            // A cut token may end in the `\r` of its line end.
            let body = if cut {
                key.strip_suffix(b"\r").unwrap_or(key)
            } else {
                key
            };
            if body.len() > key_bytes_max || body.iter().any(|&b| b < b' ' || b == 0x7f) {
                return Err(KeysError::InvalidKey);
            }
            if cut {
                break;
            }
            count += 1;
            covered = end;
            i = end;
        }
        if count == 0 {
            // Only spaces, or spaces and a cut token: the spaces are covered, so that every
            // batch of a long line makes progress.
            covered = i.min(text.len());
        }
        Ok((
            Self {
                text: &text[..covered],
                count,
            },
            covered,
        ))
    }

    /// Number of keys (at least one).
    pub fn len(&self) -> usize {
        self.count
    }

    /// Always false: a retrieval has at least one key.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The keys in request order (duplicates kept, as memcached answers each).
    pub fn iter(&self) -> Tokens<'a> {
        Tokens::new(self.text)
    }

    /// The first key (for routing single-key gets without iterating).
    pub fn first(&self) -> &'a [u8] {
        self.iter().next().unwrap_or_default()
    }
}

impl PartialEq for Keys<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.count == other.count && self.iter().eq(other.iter())
    }
}

impl Eq for Keys<'_> {}

impl<'a> IntoIterator for Keys<'a> {
    type Item = &'a [u8];
    type IntoIter = Tokens<'a>;
    fn into_iter(self) -> Tokens<'a> {
        self.iter()
    }
}

/// A storage command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Store<'a> {
    /// Which command.
    pub mode: StoreMode,
    /// The key.
    pub key: &'a [u8],
    /// Opaque 32-bit client flags.
    pub flags: u32,
    /// Expiry, as memcached reads exptime (0 never, up to 30 days relative, else absolute
    /// unix time, negative already expired).
    pub exptime: i64,
    /// The data block, without its `\r\n`.
    pub value: &'a [u8],
    /// Suppress the reply.
    pub noreply: bool,
}

/// Which storage command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StoreMode {
    /// `set`: store unconditionally.
    Set,
    /// `add`: store only if absent.
    Add,
    /// `replace`: store only if present.
    Replace,
    /// `append`: add after the existing data (flags and exptime ignored).
    Append,
    /// `prepend`: add before the existing data (flags and exptime ignored).
    Prepend,
    /// `cas`: store only if the item's CAS equals `unique`.
    Cas {
        /// The CAS value from `gets`.
        unique: u64,
    },
}

impl StoreMode {
    /// The command word.
    pub const fn command(&self) -> &'static str {
        match self {
            StoreMode::Set => "set",
            StoreMode::Add => "add",
            StoreMode::Replace => "replace",
            StoreMode::Append => "append",
            StoreMode::Prepend => "prepend",
            StoreMode::Cas { .. } => "cas",
        }
    }
}

/// `incr` or `decr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ArithmeticOp {
    /// `incr`: wraps at 2^64.
    Incr,
    /// `decr`: stops at 0.
    Decr,
}

/// The argument of `stats`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatsGroup<'a> {
    /// `stats`.
    General,
    /// `stats settings`.
    Settings,
    /// `stats items`.
    Items,
    /// `stats slabs`.
    Slabs,
    /// `stats sizes`.
    Sizes,
    /// `stats conns`.
    Conns,
    /// `stats reset`.
    Reset,
    /// Anything else, as sent (everything after `stats `); the node
    /// answers it or replies `ERROR` as memcached does for unknown groups.
    Other(&'a [u8]),
}

impl<'a> StatsGroup<'a> {
    pub(crate) fn from_args(args: &'a [u8]) -> Self {
        match args {
            b"" => StatsGroup::General,
            b"settings" => StatsGroup::Settings,
            b"items" => StatsGroup::Items,
            b"slabs" => StatsGroup::Slabs,
            b"sizes" => StatsGroup::Sizes,
            b"conns" => StatsGroup::Conns,
            b"reset" => StatsGroup::Reset,
            other => StatsGroup::Other(other),
        }
    }

    fn args(&self) -> &'a [u8] {
        match self {
            StatsGroup::General => b"",
            StatsGroup::Settings => b"settings",
            StatsGroup::Items => b"items",
            StatsGroup::Slabs => b"slabs",
            StatsGroup::Sizes => b"sizes",
            StatsGroup::Conns => b"conns",
            StatsGroup::Reset => b"reset",
            StatsGroup::Other(args) => args,
        }
    }
}

/// Appends a retrieval line (`get`, `gets`, `gat`, `gats` by the two
/// options) for `keys`, `\r\n` included. Clients and the forwarder use it
/// to send any list of keys (say, the subset of a multi-get one cell owns)
/// without building a [`Keys`] first.
pub fn write_retrieve<'k>(
    out: &mut Vec<u8>,
    return_cas: bool,
    touch_exptime: Option<i64>,
    keys: impl IntoIterator<Item = &'k [u8]>,
) {
    write_retrieve_head(out, return_cas, touch_exptime);
    for key in keys {
        out.push(b' ');
        out.extend_from_slice(key);
    }
    out.extend_from_slice(b"\r\n");
}

/// Like [`write_retrieve`] for `key_count` keys, each written in place by
/// `write_key(i, out)`: a load generator draws its keys straight into the
/// output buffer, allocating nothing per request.
pub fn write_retrieve_with(
    out: &mut Vec<u8>,
    return_cas: bool,
    touch_exptime: Option<i64>,
    key_count: usize,
    mut write_key: impl FnMut(usize, &mut Vec<u8>),
) {
    write_retrieve_head(out, return_cas, touch_exptime);
    for i in 0..key_count {
        out.push(b' ');
        write_key(i, out);
    }
    out.extend_from_slice(b"\r\n");
}

fn write_retrieve_head(out: &mut Vec<u8>, return_cas: bool, touch_exptime: Option<i64>) {
    let command = Retrieve {
        return_cas,
        touch_exptime,
        keys: Keys {
            text: b"",
            count: 0,
        },
    }
    .command();
    out.extend_from_slice(command.as_bytes());
    if let Some(exptime) = touch_exptime {
        out.push(b' ');
        write_i64(out, exptime);
    }
}

/// Appends a storage command, line and data block, `\r\n` after each, with
/// the key written in place by `write_key` (see [`write_retrieve_with`]);
/// [`Request::encode`] of a [`Request::Store`] writes the same bytes.
pub fn write_store_with(
    out: &mut Vec<u8>,
    store: StoreHead,
    write_key: impl FnOnce(&mut Vec<u8>),
    value: &[u8],
) {
    out.extend_from_slice(store.mode.command().as_bytes());
    out.push(b' ');
    write_key(out);
    out.push(b' ');
    write_u64(out, u64::from(store.flags));
    out.push(b' ');
    write_i64(out, store.exptime);
    out.push(b' ');
    write_u64(out, value.len() as u64);
    if let StoreMode::Cas { unique } = store.mode {
        out.push(b' ');
        write_u64(out, unique);
    }
    noreply(out, store.noreply);
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// The fields of a storage command besides its key and value, for
/// [`write_store_with`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreHead {
    /// Which command.
    pub mode: StoreMode,
    /// Opaque 32-bit client flags.
    pub flags: u32,
    /// Expiry, as memcached reads exptime.
    pub exptime: i64,
    /// Suppress the reply.
    pub noreply: bool,
}

fn noreply(out: &mut Vec<u8>, on: bool) {
    if on {
        out.extend_from_slice(b" noreply");
    }
}

impl Request<'_> {
    /// The key a single-key request addresses (`None` for multi-key
    /// retrievals and keyless commands). For meta commands it is the wire
    /// form; see [`MetaKey::binary`].
    pub fn key(&self) -> Option<&[u8]> {
        match self {
            Request::Store(s) => Some(s.key),
            Request::Delete { key, .. }
            | Request::Arithmetic { key, .. }
            | Request::Touch { key, .. } => Some(key),
            Request::MetaGet { key, .. }
            | Request::MetaSet { key, .. }
            | Request::MetaDelete { key, .. }
            | Request::MetaArithmetic { key, .. }
            | Request::MetaDebug { key } => Some(key.wire),
            _ => None,
        }
    }

    /// Appends the request's wire form (line, and data block for storage
    /// commands), as a client sends it.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Request::Retrieve(r) => {
                write_retrieve(out, r.return_cas, r.touch_exptime, r.keys.iter());
                return;
            }
            Request::Store(s) => {
                let head = StoreHead {
                    mode: s.mode,
                    flags: s.flags,
                    exptime: s.exptime,
                    noreply: s.noreply,
                };
                write_store_with(out, head, |out| out.extend_from_slice(s.key), s.value);
                return;
            }
            Request::Delete { key, noreply: nr } => {
                out.extend_from_slice(b"delete ");
                out.extend_from_slice(key);
                noreply(out, *nr);
            }
            Request::Arithmetic {
                op,
                key,
                delta,
                noreply: nr,
            } => {
                out.extend_from_slice(match op {
                    ArithmeticOp::Incr => b"incr ",
                    ArithmeticOp::Decr => b"decr ",
                });
                out.extend_from_slice(key);
                out.push(b' ');
                write_u64(out, *delta);
                noreply(out, *nr);
            }
            Request::Touch {
                key,
                exptime,
                noreply: nr,
            } => {
                out.extend_from_slice(b"touch ");
                out.extend_from_slice(key);
                out.push(b' ');
                write_i64(out, *exptime);
                noreply(out, *nr);
            }
            Request::FlushAll { delay, noreply: nr } => {
                out.extend_from_slice(b"flush_all");
                if let Some(delay) = delay {
                    out.push(b' ');
                    write_i64(out, *delay);
                }
                noreply(out, *nr);
            }
            Request::Version => out.extend_from_slice(b"version"),
            Request::CacheMemlimit {
                megabytes,
                noreply: nr,
            } => {
                out.extend_from_slice(b"cache_memlimit ");
                write_u64(out, *megabytes);
                noreply(out, *nr);
            }
            Request::ConfigGetCluster => out.extend_from_slice(b"config get cluster"),
            Request::RefreshCerts { noreply: nr } => {
                out.extend_from_slice(b"refresh_certs");
                noreply(out, *nr);
            }
            Request::Verbosity { level, noreply: nr } => {
                out.extend_from_slice(b"verbosity ");
                write_u64(out, u64::from(*level));
                noreply(out, *nr);
            }
            Request::Stats(group) => {
                out.extend_from_slice(b"stats");
                let args = group.args();
                if !args.is_empty() {
                    out.push(b' ');
                    out.extend_from_slice(args);
                }
            }
            Request::Quit => out.extend_from_slice(b"quit"),
            Request::Shutdown { graceful } => {
                out.extend_from_slice(b"shutdown");
                if *graceful {
                    out.extend_from_slice(b" graceful");
                }
            }
            Request::Admin(admin) => match admin {
                Admin::SlabsAutomove(mode) => {
                    out.extend_from_slice(b"slabs automove ");
                    write_u64(out, u64::from(*mode));
                }
                Admin::SlabsReassign {
                    source,
                    destination,
                } => {
                    out.extend_from_slice(b"slabs reassign ");
                    write_i64(out, i64::from(*source));
                    out.push(b' ');
                    write_i64(out, i64::from(*destination));
                }
                Admin::LruCrawlerRun => out.extend_from_slice(b"lru_crawler crawl all"),
                Admin::LruCrawlerEnable => out.extend_from_slice(b"lru_crawler enable"),
                Admin::LruCrawlerDisable => out.extend_from_slice(b"lru_crawler disable"),
                Admin::LruCrawlerSetting => out.extend_from_slice(b"lru_crawler sleep 0"),
                Admin::ShutdownInvalidMode => out.extend_from_slice(b"shutdown invalid"),
            },
            Request::MetaGet { key, flags } => {
                out.extend_from_slice(b"mg ");
                out.extend_from_slice(key.wire);
                flags.encode(key.base64, out);
            }
            Request::MetaSet { key, value, flags } => {
                out.extend_from_slice(b"ms ");
                out.extend_from_slice(key.wire);
                out.push(b' ');
                write_u64(out, value.len() as u64);
                flags.encode(key.base64, out);
                out.extend_from_slice(b"\r\n");
                out.extend_from_slice(value);
            }
            Request::MetaDelete { key, flags } => {
                out.extend_from_slice(b"md ");
                out.extend_from_slice(key.wire);
                flags.encode(key.base64, out);
            }
            Request::MetaArithmetic { key, flags } => {
                out.extend_from_slice(b"ma ");
                out.extend_from_slice(key.wire);
                flags.encode(key.base64, out);
            }
            Request::MetaNoop => out.extend_from_slice(b"mn"),
            Request::MetaDebug { key } => {
                out.extend_from_slice(b"me ");
                out.extend_from_slice(key.wire);
                if key.base64 {
                    out.extend_from_slice(b" b");
                }
            }
        }
        out.extend_from_slice(b"\r\n");
    }
}
