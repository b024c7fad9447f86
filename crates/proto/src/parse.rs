//! Server direction: bytes in, one [`Request`] (or a protocol error) out.
//!
//! [`parse`] looks at the front of the connection's read buffer and reports
//! one of three outcomes: a complete request and how many bytes it used, not
//! enough bytes yet ([`Parsed::Incomplete`], a normal outcome), or a
//! [`ProtocolError`] saying what to reply and how many bytes to drop or
//! swallow. It never panics, never reads past `buf`, never reports more
//! `consumed` bytes than `buf` holds, and bounds every length by [`Limits`]
//! before trusting it. It allocates nothing: the request borrows from `buf`.
//!
//! Argument counts, error lines and the `noreply` rules follow memcached
//! 1.6 (checked against memcached 1.6.18; see the tests).

use memchr::memchr;

use crate::error::{ClientError, ErrorReply, ProtocolError, ServerError};
use crate::limits::Limits;
use crate::meta;
use crate::request::{
    Admin, ArithmeticOp, Keys, KeysError, Request, Retrieve, StatsGroup, Store, StoreMode,
};
use crate::token::{Tokens, key_is_valid, parse_i64, parse_u32, parse_u64, parse_usize};

/// Outcome of [`parse`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parsed<'a> {
    /// A whole request is at the front of the buffer.
    Complete {
        /// The request, borrowing from the buffer.
        request: Request<'a>,
        /// Bytes it occupies (line and data block); drop them once the
        /// request has been handled.
        consumed: usize,
    },
    /// The frame is not complete yet: read more and call again with the
    /// grown buffer (nothing was consumed).
    Incomplete,
    /// The request is malformed; see [`ProtocolError`].
    Error(ProtocolError<'a>),
    /// A first batch of a retrieval line too long (or with too many keys) to
    /// be taken whole: `request` is a [`Request::Retrieve`] of the batch's
    /// keys, whose reply must go without its final `END`. The line goes on
    /// after `consumed`: parse it with [`parse_retrieve_rest`] and `rest`
    /// until that answers [`Parsed::Complete`] (whose reply ends with `END`).
    /// So a `get` of any number of keys is answered in bounded memory.
    Partial {
        /// A retrieval of this batch's keys (possibly none).
        request: Request<'a>,
        /// Bytes of the line the batch covers.
        consumed: usize,
        /// What the rest of the line needs to be parsed on its own.
        rest: RetrieveRest,
    },
}

/// The options of a retrieval line whose keys come in batches ([`Parsed::Partial`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetrieveRest {
    /// `gets`/`gats`.
    pub return_cas: bool,
    /// `gat`/`gats` exptime.
    pub touch_exptime: Option<i64>,
}

/// Most tokens any classic command takes (`cas` with all its arguments and
/// `noreply`); a line with more is an `ERROR`, as in memcached.
const CLASSIC_TOKENS_MAX: usize = 7;

/// The first tokens of a line, inline.
struct LineTokens<'a> {
    items: [&'a [u8]; CLASSIC_TOKENS_MAX],
    /// Tokens in the line, counted up to `CLASSIC_TOKENS_MAX + 1`.
    count: usize,
}

impl<'a> LineTokens<'a> {
    fn new(tokens: Tokens<'a>) -> Self {
        let mut items: [&'a [u8]; CLASSIC_TOKENS_MAX] = [&[]; CLASSIC_TOKENS_MAX];
        let mut count = 0;
        for token in tokens {
            if count < CLASSIC_TOKENS_MAX {
                items[count] = token;
            }
            count += 1;
            if count > CLASSIC_TOKENS_MAX {
                break;
            }
        }
        Self { items, count }
    }

    /// Token `i` (the first argument is 0); callers check `count` first.
    fn get(&self, i: usize) -> &'a [u8] {
        self.items.get(i).copied().unwrap_or_default()
    }

    /// memcached's `set_noreply_maybe`: the last token is `noreply`.
    fn noreply(&self) -> bool {
        self.count > 0 && self.count <= CLASSIC_TOKENS_MAX && self.get(self.count - 1) == b"noreply"
    }
}

/// Parses the request at the front of `buf`.
pub fn parse<'a>(buf: &'a [u8], limits: &Limits) -> Parsed<'a> {
    let window = &buf[..buf.len().min(limits.line_bytes_max)];
    let Some(newline) = memchr(b'\n', window) else {
        if !buf.is_empty() && buf.len() >= limits.line_bytes_max {
            return long_line(window, limits);
        }
        return Parsed::Incomplete;
    };
    let line_len = newline + 1;
    let line = match &buf[..newline] {
        [head @ .., b'\r'] => head,
        whole => whole,
    };
    let mut tokens = Tokens::new(line);
    let Some(command) = tokens.next() else {
        return error(ErrorReply::Error, line_len);
    };
    let cx = Context {
        buf,
        line_len,
        limits,
        line_complete: true,
    };
    match command {
        b"get" => cx.retrieve(tokens, false, false),
        b"gets" => cx.retrieve(tokens, true, false),
        b"gat" => cx.retrieve(tokens, false, true),
        b"gats" => cx.retrieve(tokens, true, true),
        b"set" => cx.store(tokens, Mode::Set),
        b"add" => cx.store(tokens, Mode::Add),
        b"replace" => cx.store(tokens, Mode::Replace),
        b"append" => cx.store(tokens, Mode::Append),
        b"prepend" => cx.store(tokens, Mode::Prepend),
        b"cas" => cx.store(tokens, Mode::Cas),
        b"delete" => cx.delete(tokens),
        b"incr" => cx.arithmetic(tokens, ArithmeticOp::Incr),
        b"decr" => cx.arithmetic(tokens, ArithmeticOp::Decr),
        b"touch" => cx.touch(tokens),
        b"flush_all" => cx.flush_all(tokens),
        b"version" => cx.complete(Request::Version),
        b"verbosity" => cx.verbosity(tokens),
        // ElastiCache's auto discovery; any other `config` request is unknown, as in memcached.
        b"config" if trim_end(tokens.remainder()) == b"get cluster" => {
            cx.complete(Request::ConfigGetCluster)
        }
        b"refresh_certs" => {
            // As memcached: any further words are ignored but a trailing `noreply`.
            let noreply = LineTokens::new(tokens).noreply();
            cx.complete(Request::RefreshCerts { noreply })
        }
        b"cache_memlimit" => cx.cache_memlimit(tokens),
        b"stats" => {
            let args = trim_end(tokens.remainder());
            cx.complete(Request::Stats(StatsGroup::from_args(args)))
        }
        b"quit" => cx.complete(Request::Quit),
        b"shutdown" => cx.shutdown(tokens),
        b"slabs" => cx.slabs(tokens),
        b"lru_crawler" => cx.lru_crawler(tokens),
        b"mg" | b"md" | b"ma" | b"me" => cx.meta_keyed(command, tokens),
        b"ms" => cx.meta_set(tokens),
        b"mn" => cx.complete(Request::MetaNoop),
        _ if line
            .rsplit(|&b| b == b' ')
            .next()
            .is_some_and(|last| last.starts_with(b"HTTP/")) =>
        {
            // An unknown command ending in `HTTP/…`: an HTTP client on the memcached port.
            // memcached closes the connection without a reply.
            Parsed::Error(ProtocolError {
                noreply: true,
                close: true,
                ..ProtocolError::line(ErrorReply::Error, line_len)
            })
        }
        _ => error(ErrorReply::Error, line_len),
    }
}

/// Room kept free in a retrieval batch's window so that the batch, re-encoded as a line of
/// its own (`gats <exptime> <keys>\r\n`, for forwarding), still fits `line_bytes_max`.
const BATCH_LINE_SLACK_BYTES: usize = 32;

/// A buffer holding no line end within `line_bytes_max`. A retrieval line is taken in
/// batches of the keys in the window; any other command cannot be framed, and memcached
/// closes the connection without a reply (it lets only `get`/`gets` lines grow).
fn long_line<'a>(window: &'a [u8], limits: &Limits) -> Parsed<'a> {
    let close = Parsed::Error(ProtocolError {
        noreply: true,
        close: true,
        ..ProtocolError::line(ErrorReply::Client(ClientError::LineTooLong), window.len())
    });
    let window = &window[..window.len() - BATCH_LINE_SLACK_BYTES.min(window.len() / 2)];
    let mut tokens = Tokens::new(window);
    let (return_cas, touch) = match tokens.next() {
        Some(b"get") => (false, false),
        Some(b"gets") => (true, false),
        Some(b"gat") => (false, true),
        Some(b"gats") => (true, true),
        _ => return close,
    };
    let cx = Context {
        buf: window,
        line_len: window.len(),
        limits,
        line_complete: false,
    };
    cx.retrieve(tokens, return_cas, touch)
}

/// Parses the rest of a retrieval line after a [`Parsed::Partial`] batch: the next batch
/// ([`Parsed::Partial`] again), the last one with the line end ([`Parsed::Complete`], whose
/// [`Request::Retrieve`] may hold no key: the reply is then just `END`), not enough bytes
/// yet, or a bad key ([`Parsed::Error`] with `skip_line` when the line end is still ahead).
pub fn parse_retrieve_rest<'a>(buf: &'a [u8], rest: &RetrieveRest, limits: &Limits) -> Parsed<'a> {
    let window_max = limits.line_bytes_max - BATCH_LINE_SLACK_BYTES.min(limits.line_bytes_max / 2);
    let window = &buf[..buf.len().min(window_max)];
    let (text, complete, line_len) = match memchr(b'\n', window) {
        Some(newline) => {
            let text = &buf[..newline];
            (text.strip_suffix(b"\r").unwrap_or(text), true, newline + 1)
        }
        None if buf.len() >= window_max => (window, false, window.len()),
        None => return Parsed::Incomplete,
    };
    let cx = Context {
        buf,
        line_len,
        limits,
        line_complete: complete,
    };
    cx.retrieve_keys(text, *rest)
}

/// Largest data block length memcached parses at all (`INT_MAX - 2`); a
/// larger one is a bad command line, not a too-large value, so nothing is
/// swallowed: swallowing gigabytes on a typo would stall the connection.
const DATA_LENGTH_MAX: usize = i32::MAX as usize - 2;

/// A data block length: a decimal no larger than [`DATA_LENGTH_MAX`].
fn parse_length(token: &[u8]) -> Option<usize> {
    parse_usize(token).filter(|&len| len <= DATA_LENGTH_MAX)
}

fn trim_end(bytes: &[u8]) -> &[u8] {
    let end = bytes.iter().rposition(|&b| b != b' ').map_or(0, |i| i + 1);
    &bytes[..end]
}

fn error(reply: ErrorReply, consumed: usize) -> Parsed<'static> {
    Parsed::Error(ProtocolError::line(reply, consumed))
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Set,
    Add,
    Replace,
    Append,
    Prepend,
    Cas,
}

/// What every command parser needs: the buffer, where the line ends, limits.
struct Context<'a, 'l> {
    buf: &'a [u8],
    line_len: usize,
    limits: &'l Limits,
    /// `line_len` bytes end with the line end; false for a window of a long retrieval line.
    line_complete: bool,
}

impl<'a> Context<'a, '_> {
    fn complete(&self, request: Request<'a>) -> Parsed<'a> {
        Parsed::Complete {
            request,
            consumed: self.line_len,
        }
    }

    fn client_error(&self, e: ClientError, noreply: bool) -> Parsed<'a> {
        Parsed::Error(ProtocolError {
            noreply,
            ..ProtocolError::line(ErrorReply::Client(e), self.line_len)
        })
    }

    fn key_ok(&self, key: &[u8]) -> bool {
        key_is_valid(key, self.limits.key_bytes_max)
    }

    fn retrieve(&self, mut tokens: Tokens<'a>, return_cas: bool, touch: bool) -> Parsed<'a> {
        let touch_exptime = if touch {
            let Some(token) = tokens.next() else {
                return error(ErrorReply::Error, self.line_len);
            };
            match parse_i64(token) {
                Some(exptime) => Some(exptime),
                None => return self.retrieval_error(ClientError::InvalidExptime),
            }
        } else {
            None
        };
        let text = tokens.remainder();
        if self.line_complete {
            // The common case: the whole line is here and small; validated in one pass.
            match Keys::new(
                text,
                self.limits.key_bytes_max,
                self.limits.keys_per_get_max,
            ) {
                Ok(keys) => {
                    return self.complete(Request::Retrieve(Retrieve {
                        return_cas,
                        touch_exptime,
                        keys,
                    }));
                }
                Err(KeysError::Empty) => return error(ErrorReply::Error, self.line_len),
                Err(KeysError::InvalidKey) => {
                    return self.client_error(ClientError::BadCommandLineFormat, false);
                }
                Err(KeysError::TooMany) => {}
            }
        }
        self.retrieve_keys(
            text,
            RetrieveRest {
                return_cas,
                touch_exptime,
            },
        )
    }

    /// The next batch of a retrieval line's keys from `text` (a suffix of the line, without
    /// its line end), as [`Parsed::Partial`] or, when it reaches the line end,
    /// [`Parsed::Complete`].
    fn retrieve_keys(&self, text: &'a [u8], rest: RetrieveRest) -> Parsed<'a> {
        let (keys, covered) = match Keys::batch(
            text,
            self.line_complete,
            self.limits.key_bytes_max,
            self.limits.keys_per_get_max,
        ) {
            Ok(batch) => batch,
            Err(_) => return self.retrieval_error(ClientError::BadCommandLineFormat),
        };
        let request = Request::Retrieve(Retrieve {
            return_cas: rest.return_cas,
            touch_exptime: rest.touch_exptime,
            keys,
        });
        // Where `text` starts in the buffer: it is a suffix of the line.
        let start = text.as_ptr() as usize - self.buf.as_ptr() as usize;
        let done = self.line_complete && text[covered..].iter().all(|&b| b == b' ');
        if done {
            self.complete(request)
        } else {
            Parsed::Partial {
                request,
                consumed: start + covered,
                rest,
            }
        }
    }

    /// A client error in a retrieval line: when the line end is not in the buffer yet, the
    /// rest of the line is discarded as it arrives.
    fn retrieval_error(&self, e: ClientError) -> Parsed<'a> {
        Parsed::Error(ProtocolError {
            skip_line: !self.line_complete,
            ..ProtocolError::line(ErrorReply::Client(e), self.line_len)
        })
    }

    fn store(&self, tokens: Tokens<'a>, mode: Mode) -> Parsed<'a> {
        let t = LineTokens::new(tokens);
        let arguments = if mode == Mode::Cas { 5 } else { 4 };
        // memcached takes exactly the arguments plus one optional token,
        // which means noreply when it says so and is ignored otherwise.
        if t.count != arguments && t.count != arguments + 1 {
            return error(ErrorReply::Error, self.line_len);
        }
        let noreply = t.noreply();
        let bad_line = || self.client_error(ClientError::BadCommandLineFormat, noreply);
        let key = t.get(0);
        if !self.key_ok(key) {
            return bad_line();
        }
        let (Some(flags), Some(exptime), Some(len)) = (
            parse_u32(t.get(1)),
            parse_i64(t.get(2)),
            parse_length(t.get(3)),
        ) else {
            return bad_line();
        };
        let store_mode = match mode {
            Mode::Set => StoreMode::Set,
            Mode::Add => StoreMode::Add,
            Mode::Replace => StoreMode::Replace,
            Mode::Append => StoreMode::Append,
            Mode::Prepend => StoreMode::Prepend,
            Mode::Cas => match parse_u64(t.get(4)) {
                Some(unique) => StoreMode::Cas { unique },
                None => return bad_line(),
            },
        };
        if !self.limits.item_fits(key.len(), len, flags) {
            return Parsed::Error(ProtocolError {
                swallow: len.saturating_add(2),
                noreply,
                failed_set_key: (mode == Mode::Set).then_some(meta::MetaKey {
                    wire: key,
                    base64: false,
                }),
                ..ProtocolError::line(
                    ErrorReply::Server(ServerError::ObjectTooLarge),
                    self.line_len,
                )
            });
        }
        self.data_block(len, noreply, |value| {
            Request::Store(Store {
                mode: store_mode,
                key,
                flags,
                exptime,
                value,
                noreply,
            })
        })
    }

    /// The `len`-byte data block after the line and its `\r\n` terminator;
    /// `len` is already bounded by the value limit.
    fn data_block(
        &self,
        len: usize,
        noreply: bool,
        request: impl FnOnce(&'a [u8]) -> Request<'a>,
    ) -> Parsed<'a> {
        let end = self.line_len + len;
        let consumed = end + 2;
        let Some(frame) = self.buf.get(..consumed) else {
            return Parsed::Incomplete;
        };
        if &frame[end..] != b"\r\n" {
            // memcached reads exactly len + 2 bytes, then rejects them.
            return Parsed::Error(ProtocolError {
                noreply,
                ..ProtocolError::line(ErrorReply::Client(ClientError::BadDataChunk), consumed)
            });
        }
        Parsed::Complete {
            request: request(&frame[self.line_len..end]),
            consumed,
        }
    }

    fn delete(&self, tokens: Tokens<'a>) -> Parsed<'a> {
        let t = LineTokens::new(tokens);
        if !(1..=3).contains(&t.count) {
            return error(ErrorReply::Error, self.line_len);
        }
        let noreply = t.noreply();
        let key = t.get(0);
        if !self.key_ok(key) {
            return self.client_error(ClientError::BadCommandLineFormat, noreply);
        }
        if t.count > 1 {
            let hold_is_zero = t.get(1) == b"0";
            let valid = (t.count == 2 && (hold_is_zero || noreply))
                || (t.count == 3 && hold_is_zero && noreply);
            if !valid {
                return self.client_error(ClientError::BadDeleteFormat, noreply);
            }
        }
        self.complete(Request::Delete { key, noreply })
    }

    fn arithmetic(&self, tokens: Tokens<'a>, op: ArithmeticOp) -> Parsed<'a> {
        let t = LineTokens::new(tokens);
        if t.count != 2 && t.count != 3 {
            return error(ErrorReply::Error, self.line_len);
        }
        let noreply = t.noreply();
        let key = t.get(0);
        if !self.key_ok(key) {
            return self.client_error(ClientError::BadCommandLineFormat, noreply);
        }
        let Some(delta) = parse_u64(t.get(1)) else {
            return self.client_error(ClientError::InvalidDelta, noreply);
        };
        self.complete(Request::Arithmetic {
            op,
            key,
            delta,
            noreply,
        })
    }

    fn touch(&self, tokens: Tokens<'a>) -> Parsed<'a> {
        let t = LineTokens::new(tokens);
        if t.count != 2 && t.count != 3 {
            return error(ErrorReply::Error, self.line_len);
        }
        let noreply = t.noreply();
        let key = t.get(0);
        if !self.key_ok(key) {
            return self.client_error(ClientError::BadCommandLineFormat, noreply);
        }
        let Some(exptime) = parse_i64(t.get(1)) else {
            return self.client_error(ClientError::InvalidExptime, noreply);
        };
        self.complete(Request::Touch {
            key,
            exptime,
            noreply,
        })
    }

    fn flush_all(&self, tokens: Tokens<'a>) -> Parsed<'a> {
        let t = LineTokens::new(tokens);
        if t.count > 2 {
            return error(ErrorReply::Error, self.line_len);
        }
        let noreply = t.noreply();
        let delay = if t.count == 0 || (t.count == 1 && noreply) {
            None
        } else {
            match parse_i64(t.get(0)) {
                Some(delay) => Some(delay),
                None => return self.client_error(ClientError::InvalidExptime, noreply),
            }
        };
        self.complete(Request::FlushAll { delay, noreply })
    }

    fn verbosity(&self, tokens: Tokens<'a>) -> Parsed<'a> {
        let t = LineTokens::new(tokens);
        if t.count != 1 && t.count != 2 {
            return error(ErrorReply::Error, self.line_len);
        }
        let noreply = t.noreply();
        // memcached accepts any unsigned number here; the level is ignored.
        let Some(level) = parse_u64(t.get(0)).map(|v| u32::try_from(v).unwrap_or(u32::MAX)) else {
            return self.client_error(ClientError::BadCommandLineFormat, noreply);
        };
        self.complete(Request::Verbosity { level, noreply })
    }

    fn cache_memlimit(&self, tokens: Tokens<'a>) -> Parsed<'a> {
        let t = LineTokens::new(tokens);
        if t.count != 1 && t.count != 2 {
            return error(ErrorReply::Error, self.line_len);
        }
        let noreply = t.noreply();
        // memcached 1.6.18 answers a limit that is not a number with `ERROR`.
        let Some(megabytes) = parse_u64(t.get(0)) else {
            return Parsed::Error(ProtocolError {
                noreply,
                ..ProtocolError::line(ErrorReply::Error, self.line_len)
            });
        };
        self.complete(Request::CacheMemlimit { megabytes, noreply })
    }

    fn shutdown(&self, tokens: Tokens<'a>) -> Parsed<'a> {
        let t = LineTokens::new(tokens);
        match (t.count, t.get(0)) {
            (0, _) => self.complete(Request::Shutdown { graceful: false }),
            (1, b"graceful") => self.complete(Request::Shutdown { graceful: true }),
            // memcached answers this `CLIENT_ERROR invalid shutdown mode` when shutdown is
            // enabled and `ERROR: shutdown not enabled` otherwise: the node decides.
            _ => self.complete(Request::Admin(Admin::ShutdownInvalidMode)),
        }
    }

    /// `slabs automove|reassign …`, with memcached 1.6's argument checks.
    fn slabs(&self, tokens: Tokens<'a>) -> Parsed<'a> {
        let t = LineTokens::new(tokens);
        let bad_line = || self.client_error(ClientError::BadCommandLineFormat, false);
        match (t.count, t.get(0)) {
            // As memcached: a level that is no number is a bad line, one out of range ERROR.
            (2, b"automove") => match parse_u32(t.get(1)) {
                Some(mode @ 0..=2) => {
                    self.complete(Request::Admin(Admin::SlabsAutomove(mode as u8)))
                }
                Some(_) => error(ErrorReply::Error, self.line_len),
                None => bad_line(),
            },
            (3, b"reassign") => {
                let class = |token: &[u8]| parse_i64(token).and_then(|v| i32::try_from(v).ok());
                match (class(t.get(1)), class(t.get(2))) {
                    (Some(source), Some(destination)) => {
                        self.complete(Request::Admin(Admin::SlabsReassign {
                            source,
                            destination,
                        }))
                    }
                    _ => bad_line(),
                }
            }
            _ => error(ErrorReply::Error, self.line_len),
        }
    }

    /// `lru_crawler …`, with memcached 1.6's argument checks.
    fn lru_crawler(&self, tokens: Tokens<'a>) -> Parsed<'a> {
        let t = LineTokens::new(tokens);
        let admin = |a| self.complete(Request::Admin(a));
        match (t.count, t.get(0)) {
            (2, b"crawl" | b"metadump") => admin(Admin::LruCrawlerRun),
            (1, b"enable") => admin(Admin::LruCrawlerEnable),
            (1, b"disable") => admin(Admin::LruCrawlerDisable),
            (2, b"sleep" | b"tocrawl") => match parse_u32(t.get(1)) {
                Some(_) => admin(Admin::LruCrawlerSetting),
                None => self.client_error(ClientError::BadCommandLineFormat, false),
            },
            _ => error(ErrorReply::Error, self.line_len),
        }
    }

    /// `mg`, `md`, `ma`, `me`: a key, then flags, no data block.
    fn meta_keyed(&self, command: &[u8], mut tokens: Tokens<'a>) -> Parsed<'a> {
        let Some(key) = tokens.next() else {
            return if command == b"me" {
                self.client_error(ClientError::BadCommandLineFormat, false)
            } else {
                error(ErrorReply::Error, self.line_len)
            };
        };
        if !self.key_ok(key) {
            return self.client_error(ClientError::BadCommandLineFormat, false);
        }
        let request = match command {
            b"mg" => meta::parse_get_flags(tokens, key)
                .map(|(key, flags)| Request::MetaGet { key, flags }),
            b"md" => meta::parse_delete_flags(tokens, key)
                .map(|(key, flags)| Request::MetaDelete { key, flags }),
            b"ma" => meta::parse_arithmetic_flags(tokens, key)
                .map(|(key, flags)| Request::MetaArithmetic { key, flags }),
            _ => meta::parse_debug_key(tokens, key).map(|key| Request::MetaDebug { key }),
        };
        match request {
            Ok(request) => self.complete(request),
            // Meta errors are always sent, even with `q`.
            Err(e) => self.client_error(e, false),
        }
    }

    fn meta_set(&self, mut tokens: Tokens<'a>) -> Parsed<'a> {
        let Some(key) = tokens.next() else {
            return error(ErrorReply::Error, self.line_len);
        };
        let bad_line = || self.client_error(ClientError::BadCommandLineFormat, false);
        if !self.key_ok(key) {
            return bad_line();
        }
        let Some(len) = tokens.next().and_then(parse_length) else {
            return bad_line();
        };
        // From here on the data block length is known, so every error also
        // swallows the data block, as memcached does.
        let swallow = |reply: ErrorReply| {
            Parsed::Error(ProtocolError {
                swallow: len.saturating_add(2),
                ..ProtocolError::line(reply, self.line_len)
            })
        };
        let (key, flags) = match meta::parse_set_flags(tokens, key) {
            Ok(parsed) => parsed,
            Err(e) => return swallow(ErrorReply::Client(e)),
        };
        // As memcached: the flags are checked first, then the item's size (with the
        // decoded key's length); a refused item also drops the key's existing one, in every
        // mode, so a stale value does not outlive the failed write.
        let key_len = if key.base64 {
            key.binary(&mut [0; crate::token::BINARY_KEY_BYTES_MAX])
                .len()
        } else {
            key.wire.len()
        };
        if !self
            .limits
            .item_fits(key_len, len, flags.client_flags.unwrap_or(0))
        {
            return Parsed::Error(ProtocolError {
                swallow: len.saturating_add(2),
                failed_set_key: Some(key),
                ..ProtocolError::line(
                    ErrorReply::Server(ServerError::ObjectTooLarge),
                    self.line_len,
                )
            });
        }
        self.data_block(len, false, |value| Request::MetaSet { key, value, flags })
    }
}
