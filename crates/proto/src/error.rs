//! Protocol errors: what the parser tells the connection when a request is
//! malformed, and the exact error line memcached would send for it.
//!
//! Bad client input is never a Rust error that unwinds anything: it becomes a
//! [`ProtocolError`] value carrying the reply line, how many bytes to consume
//! now, how many more to swallow (a storage command's announced data block,
//! which may not have arrived yet), and whether the connection must close.

use crate::Discard;

/// The error line to send, with memcached's wording (protocol.txt, "Error strings").
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ErrorReply {
    /// `ERROR`: unknown command name or wrong number of arguments.
    #[error("ERROR")]
    Error,
    /// `CLIENT_ERROR <msg>`: the input does not conform to the protocol.
    #[error("CLIENT_ERROR {}", .0.message())]
    Client(ClientError),
    /// `SERVER_ERROR <msg>`: the server cannot carry the command out.
    #[error("SERVER_ERROR {}", .0.message())]
    Server(ServerError),
}

impl ErrorReply {
    /// The full error line, `\r\n` included.
    pub const fn line(&self) -> &'static [u8] {
        match self {
            ErrorReply::Error => crate::lines::ERROR,
            ErrorReply::Client(e) => e.line(),
            ErrorReply::Server(e) => e.line(),
        }
    }

    /// Appends the full error line, `\r\n` included.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.line());
    }
}

/// Writes `message()` (the text after the keyword) and `line()` (the whole line,
/// `\r\n` included) of an error enum from one literal per variant, so each
/// error's wording is written once.
macro_rules! error_texts {
    ($type:ident, $keyword:literal, { $($variant:ident => $text:literal,)* }) => {
        impl $type {
            #[doc = concat!("The text after `", $keyword, "`.")]
            pub const fn message(&self) -> &'static str {
                match self {
                    $($type::$variant => $text,)*
                }
            }

            /// The whole error line, `\r\n` included.
            pub const fn line(&self) -> &'static [u8] {
                match self {
                    $($type::$variant => concat!($keyword, $text, "\r\n").as_bytes(),)*
                }
            }
        }
    };
}

/// Every `CLIENT_ERROR` the parser produces. Messages are memcached 1.6's
/// where memcached has the case; the rest are cellcache's and documented in
/// docs/protocol.md.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientError {
    /// Bad key (too long, control bytes), bad number or bad argument count.
    BadCommandLineFormat,
    /// `delete <key> <x>` where x is neither `0` nor `noreply`.
    BadDeleteFormat,
    /// The data block of a storage command is not followed by `\r\n`.
    BadDataChunk,
    /// `incr`/`decr` delta is not an unsigned 64-bit decimal.
    InvalidDelta,
    /// `touch`/`gat`/`flush_all` exptime is not a number.
    InvalidExptime,
    /// A command line longer than [`crate::Limits::line_bytes_max`].
    LineTooLong,
    /// Meta command: unknown flag, or a flag the command does not take.
    InvalidFlag,
    /// Meta command: the same flag given twice.
    DuplicateFlag,
    /// Meta command: a numeric flag token (`T`, `N`, `R`, `C`, `E`, `F`) is not a number.
    BadToken,
    /// Meta command: `M` token is not exactly one character.
    ModeTokenLength,
    /// Meta command: `M` mode character unknown for `ms`.
    InvalidSetMode,
    /// Meta command: `M` mode character unknown for `ma`.
    InvalidArithmeticMode,
    /// `ma` `D` token is not an unsigned 64-bit decimal.
    InvalidDeltaToken,
    /// `ma` `J` token is not an unsigned 64-bit decimal.
    InvalidInitialToken,
    /// Meta command: more flag tokens than [`crate::limits::META_FLAGS_MAX`].
    TooManyFlags,
    /// Meta command: opaque token longer than 32 bytes.
    OpaqueTooLong,
    /// Meta command with `b`: the key is not valid base64.
    KeyDecode,
}

error_texts!(ClientError, "CLIENT_ERROR ", {
    BadCommandLineFormat => "bad command line format",
    BadDeleteFormat => "bad command line format.  Usage: delete <key> [noreply]",
    BadDataChunk => "bad data chunk",
    InvalidDelta => "invalid numeric delta argument",
    InvalidExptime => "invalid exptime argument",
    LineTooLong => "line too long",
    InvalidFlag => "invalid flag",
    DuplicateFlag => "duplicate flag",
    BadToken => "bad token in command line format",
    ModeTokenLength => "incorrect length for M token",
    InvalidSetMode => "invalid mode for ms M token",
    InvalidArithmeticMode => "invalid mode for ma M token",
    InvalidDeltaToken => "invalid numeric delta value",
    InvalidInitialToken => "invalid numeric initial value",
    TooManyFlags => "options flags are too long",
    OpaqueTooLong => "opaque token too long",
    KeyDecode => "error decoding key",
});

/// `SERVER_ERROR`s the parser itself can decide on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerError {
    /// The announced item does not fit `item_size_max` ([`crate::Limits::item_fits`]).
    ObjectTooLarge,
}

error_texts!(ServerError, "SERVER_ERROR ", {
    ObjectTooLarge => "object too large for cache",
});

/// A malformed request: what to reply and how to resynchronise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProtocolError<'a> {
    /// The error line for the client.
    pub reply: ErrorReply,
    /// Bytes of the input to drop now (never more than the input length).
    pub consumed: usize,
    /// Bytes to discard after `consumed`, possibly not received yet: the data
    /// block a rejected storage command announced, with its `\r\n`. Feed it to
    /// a [`Discard`] that the connection keeps across reads.
    pub swallow: usize,
    /// The request said `noreply`; memcached then suppresses even the error
    /// line, and so should the server, or the client's stream desynchronises.
    pub noreply: bool,
    /// Close the connection after the reply (if any), as memcached does: a
    /// command line longer than the limit (its end cannot be found), or an
    /// HTTP request line sent to the memcached port.
    pub close: bool,
    /// The error was found before the end of a long retrieval line: the rest
    /// of that line, up to and including its `\n`, must be discarded too
    /// (possibly not received yet).
    pub skip_line: bool,
    /// A `set` or `ms` (any mode) rejected as too large: memcached also
    /// unlinks the key's existing item so a stale value does not outlive the
    /// failed write; the node should do the same.
    pub failed_set_key: Option<crate::MetaKey<'a>>,
}

impl<'a> ProtocolError<'a> {
    pub(crate) fn line(reply: ErrorReply, consumed: usize) -> Self {
        Self {
            reply,
            consumed,
            swallow: 0,
            noreply: false,
            close: false,
            skip_line: false,
            failed_set_key: None,
        }
    }

    /// A [`Discard`] for the bytes to swallow after `consumed`.
    pub fn discard(&self) -> Discard {
        Discard::new(self.swallow)
    }
}
