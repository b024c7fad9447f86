//! Requests: one frame at the front of a buffer to a typed [`Frame`], and back.
//!
//! The parser bounds every length before waiting for bytes: a frame the limits allow is
//! at most `24 + 20 + key_bytes_max + value_bytes_max` bytes; a storage command announcing
//! a larger value is rejected as soon as its key has arrived (its value is swallowed as it
//! streams in), and every other opcode's body must be exactly its extras and key, so the
//! connection never buffers more than one bounded frame. The outcomes and the connection's
//! reaction follow memcached 1.6's `proto_bin.c`:
//!
//! | input | reply | then |
//! |---|---|---|
//! | first byte not `0x80` | none | close |
//! | key + extras longer than the body | `0x81` | close |
//! | key longer than `key_bytes_max` | `0x04` | close |
//! | unknown opcode | `0x81` | skip the body, carry on |
//! | extras/key/body lengths the opcode does not take | `0x04` | close |
//! | storage value over `value_bytes_max` | `0x03` | swallow the value, carry on |
//! | SASL mechanism over [`SASL_MECHANISM_BYTES_MAX`] | `0x04` | swallow the data, carry on |
//! | SASL data over [`SASL_DATA_BYTES_MAX`] (cellcache's bound) | `0x20` | swallow it, carry on |

use super::header::{HEADER_BYTES, Header, MAGIC_REQUEST, Opcode, Status};
use crate::Discard;
use crate::limits::Limits;

/// Expiration meaning "do not create" in an increment/decrement request.
pub const NO_CREATE_EXPTIME: u32 = 0xffff_ffff;

/// Longest SASL mechanism name (memcached's `MAX_SASL_MECH_LEN`); a longer one is
/// "invalid arguments".
pub const SASL_MECHANISM_BYTES_MAX: usize = 32;

/// Most bytes of a SASL request's data (the client's response). PLAIN's is an identity, a
/// user and a password; memcached bounds a password database line at 256 bytes. Longer
/// data is refused as an authentication failure without being buffered.
pub const SASL_DATA_BYTES_MAX: usize = 1024;

/// One request: its opcode (which carries the quiet and with-key variants), the opaque
/// to echo, the CAS to compare (0 = none) and the command's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame<'a> {
    /// The opcode as sent.
    pub opcode: Opcode,
    /// Echoed in every response to this request.
    pub opaque: u32,
    /// Compare-and-swap value; 0 means "no check".
    pub cas: u64,
    /// The command's fields.
    pub command: Command<'a>,
}

/// The fields of a request, by opcode family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command<'a> {
    /// `GET`, `GETQ`, `GETK`, `GETKQ`.
    Get {
        /// The key.
        key: &'a [u8],
    },
    /// `GAT`, `GATQ`, `GATK`, `GATKQ`: get and set a new expiration.
    GetAndTouch {
        /// The key.
        key: &'a [u8],
        /// New expiration (relative seconds, or unix time past 30 days; 0 = never).
        exptime: u32,
    },
    /// `TOUCH`.
    Touch {
        /// The key.
        key: &'a [u8],
        /// New expiration.
        exptime: u32,
    },
    /// `SET`, `ADD`, `REPLACE` and their quiet forms.
    Store {
        /// The key.
        key: &'a [u8],
        /// The value.
        value: &'a [u8],
        /// Client flags.
        flags: u32,
        /// Expiration.
        exptime: u32,
    },
    /// `APPEND`, `PREPEND` and their quiet forms (no extras).
    Concat {
        /// The key.
        key: &'a [u8],
        /// The bytes to add.
        value: &'a [u8],
    },
    /// `DELETE`, `DELETEQ`.
    Delete {
        /// The key.
        key: &'a [u8],
    },
    /// `INCREMENT`, `DECREMENT` and their quiet forms.
    Arithmetic {
        /// The key.
        key: &'a [u8],
        /// Amount to add or subtract.
        delta: u64,
        /// Value of a counter created by this request.
        initial: u64,
        /// Expiration of a created counter; [`NO_CREATE_EXPTIME`] = never create.
        exptime: u32,
    },
    /// `FLUSH`, `FLUSHQ`.
    Flush {
        /// Seconds (or unix time) before the flush takes effect, if the extras were sent.
        delay: Option<u32>,
    },
    /// `STAT`: the group is the key (empty = general stats).
    Stat {
        /// The group name as sent.
        group: &'a [u8],
    },
    /// `VERBOSITY`.
    Verbosity {
        /// The requested level.
        level: u32,
    },
    /// `NOOP`.
    Noop,
    /// `VERSION`.
    Version,
    /// `QUIT`, `QUITQ`.
    Quit,
    /// `SASL_LIST_MECHS`.
    SaslListMechs,
    /// `SASL_AUTH` (start) and `SASL_STEP` (continue).
    Sasl {
        /// The mechanism's name (the key), e.g. `PLAIN`.
        mechanism: &'a [u8],
        /// The client's response (the value); for PLAIN `[authzid] NUL user NUL password`.
        data: &'a [u8],
    },
}

/// Outcome of [`parse_request`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinaryParsed<'a> {
    /// A whole request is at the front of the buffer.
    Complete {
        /// The request, borrowing from the buffer.
        frame: Frame<'a>,
        /// Bytes it occupies.
        consumed: usize,
    },
    /// Not enough bytes yet (the frame the header announces is within the limits).
    Incomplete,
    /// A request that cannot be served; see [`BinaryError`].
    Error(BinaryError<'a>),
}

/// What is wrong with a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The first byte is not [`MAGIC_REQUEST`].
    #[error("bad magic byte {0:#04x}")]
    BadMagic(u8),
    /// The key and extras lengths add up to more than the body length.
    #[error("key and extras are longer than the body")]
    LengthsExceedBody,
    /// The key is longer than the limit.
    #[error("key of {0} bytes is longer than the limit")]
    KeyTooLong(u16),
    /// An opcode cellcache does not serve.
    #[error("unknown opcode {0:#04x}")]
    UnknownOpcode(u8),
    /// Extras, key or body lengths that the opcode does not take.
    #[error("lengths do not fit opcode {0:?}")]
    BadLengths(Opcode),
    /// A storage command's value is larger than the limit.
    #[error("value of {0} bytes is larger than the limit")]
    ValueTooLarge(usize),
    /// A SASL mechanism name longer than [`SASL_MECHANISM_BYTES_MAX`].
    #[error("SASL mechanism of {0} bytes is longer than the limit")]
    MechanismTooLong(u16),
    /// SASL data longer than [`SASL_DATA_BYTES_MAX`].
    #[error("SASL data of {0} bytes is longer than the limit")]
    SaslDataTooLong(usize),
}

/// A rejected request: what to answer and how to resynchronise (like the text protocol's
/// [`crate::ProtocolError`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BinaryError<'a> {
    /// Why.
    pub kind: FrameError,
    /// The status of the error response; `None`: close without answering.
    pub status: Option<Status>,
    /// The request's opcode byte (echoed in the response).
    pub opcode: u8,
    /// The request's opaque (echoed in the response).
    pub opaque: u32,
    /// Bytes of the input to drop now (never more than the input length).
    pub consumed: usize,
    /// Bytes to discard after `consumed`, possibly not received yet.
    pub swallow: usize,
    /// Close the connection once the response is written.
    pub close: bool,
    /// A `SET` refused as too large: memcached unlinks the key's existing item so a stale
    /// value does not outlive the failed write; the node does the same.
    pub failed_set_key: Option<&'a [u8]>,
}

impl BinaryError<'_> {
    /// A [`Discard`] for the bytes to swallow after `consumed`.
    pub fn discard(&self) -> Discard {
        Discard::new(self.swallow)
    }

    /// Appends the error response (nothing when [`Self::status`] is `None`).
    pub fn encode_reply(&self, out: &mut Vec<u8>) {
        if let Some(status) = self.status {
            super::response::write_error(out, self.opcode, status, self.opaque);
        }
    }
}

/// Largest request frame the parser waits for under `limits` (a storage command with a
/// maximal key and value). The connection's input buffer must hold it.
pub fn frame_bytes_max(limits: &Limits) -> usize {
    HEADER_BYTES + 20 + limits.key_bytes_max + limits.value_bytes_max()
}

/// The extras length an opcode requires, if it requires exactly one.
fn extras_len(opcode: Opcode) -> Option<u8> {
    use Opcode as O;
    Some(match opcode {
        O::Set | O::SetQ | O::Add | O::AddQ | O::Replace | O::ReplaceQ => 8,
        O::Increment | O::IncrementQ | O::Decrement | O::DecrementQ => 20,
        O::Touch | O::Gat | O::GatQ | O::GatK | O::GatKQ | O::Verbosity => 4,
        O::Flush | O::FlushQ => return None, // 0 or 4
        _ => 0,
    })
}

/// Whether the opcode's lengths are ones memcached accepts.
fn lengths_fit(opcode: Opcode, h: &Header) -> bool {
    use Opcode as O;
    let (ext, key, body) = (
        usize::from(h.extras_len),
        usize::from(h.key_len),
        h.body_len as usize,
    );
    let extras_ok = match extras_len(opcode) {
        Some(n) => h.extras_len == n,
        None => ext == 0 || ext == 4,
    };
    if !extras_ok {
        return false;
    }
    match opcode {
        // A value follows the key.
        O::Set | O::SetQ | O::Add | O::AddQ | O::Replace | O::ReplaceQ => key > 0,
        O::Append | O::AppendQ | O::Prepend | O::PrependQ => key > 0,
        // Exactly extras and a key.
        O::Get | O::GetQ | O::GetK | O::GetKQ | O::Delete | O::DeleteQ => {
            key > 0 && body == ext + key
        }
        O::Increment | O::IncrementQ | O::Decrement | O::DecrementQ => key > 0 && body == ext + key,
        O::Touch | O::Gat | O::GatQ | O::GatK | O::GatKQ => key > 0 && body == ext + key,
        O::Stat => body == key,
        // Extras only.
        O::Flush | O::FlushQ | O::Verbosity => key == 0 && body == ext,
        O::Noop | O::Version | O::Quit | O::QuitQ | O::SaslListMechs => body == 0,
        // The mechanism, then any data.
        O::SaslAuth | O::SaslStep => key > 0,
    }
}

fn be_u32(b: &[u8]) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[..4]);
    u32::from_be_bytes(a)
}

fn be_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_be_bytes(a)
}

/// Parses the request at the front of `buf`. Never panics; `consumed` never exceeds
/// `buf.len()`.
pub fn parse_request<'a>(buf: &'a [u8], limits: &Limits) -> BinaryParsed<'a> {
    let Some(&magic) = buf.first() else {
        return BinaryParsed::Incomplete;
    };
    let error = |kind, status, h: &Header, consumed, close| {
        BinaryParsed::Error(BinaryError {
            kind,
            status,
            opcode: h.opcode,
            opaque: h.opaque,
            consumed,
            swallow: 0,
            close,
            failed_set_key: None,
        })
    };
    if magic != MAGIC_REQUEST {
        // Nothing of the stream can be trusted: memcached closes without a word.
        return BinaryParsed::Error(BinaryError {
            kind: FrameError::BadMagic(magic),
            status: None,
            opcode: 0,
            opaque: 0,
            consumed: 1,
            swallow: 0,
            close: true,
            failed_set_key: None,
        });
    }
    let Some(h) = Header::decode(buf) else {
        return BinaryParsed::Incomplete;
    };
    let (ext, key_len, body) = (
        usize::from(h.extras_len),
        usize::from(h.key_len),
        h.body_len as usize,
    );
    if ext + key_len > body {
        let s = Some(Status::UnknownCommand);
        return error(FrameError::LengthsExceedBody, s, &h, HEADER_BYTES, true);
    }
    if key_len > limits.key_bytes_max {
        let s = Some(Status::InvalidArguments);
        return error(FrameError::KeyTooLong(h.key_len), s, &h, HEADER_BYTES, true);
    }
    let Some(opcode) = Opcode::from_code(h.opcode) else {
        return BinaryParsed::Error(BinaryError {
            kind: FrameError::UnknownOpcode(h.opcode),
            status: Some(Status::UnknownCommand),
            opcode: h.opcode,
            opaque: h.opaque,
            consumed: HEADER_BYTES,
            swallow: body,
            close: false,
            failed_set_key: None,
        });
    };
    if !lengths_fit(opcode, &h) {
        let s = Some(Status::InvalidArguments);
        return error(FrameError::BadLengths(opcode), s, &h, HEADER_BYTES, true);
    }
    let value_len = body - ext - key_len;
    let head_len = HEADER_BYTES + ext + key_len;
    if matches!(opcode, Opcode::SaslAuth | Opcode::SaslStep) {
        // As memcached: a long mechanism is refused once read, its data swallowed; long
        // data (cellcache's bound) is refused before it is buffered.
        let refusal = if key_len > SASL_MECHANISM_BYTES_MAX {
            Some((
                FrameError::MechanismTooLong(h.key_len),
                Status::InvalidArguments,
            ))
        } else if value_len > SASL_DATA_BYTES_MAX {
            Some((FrameError::SaslDataTooLong(value_len), Status::AuthError))
        } else {
            None
        };
        if let Some((kind, status)) = refusal {
            if buf.len() < head_len {
                return BinaryParsed::Incomplete;
            }
            return BinaryParsed::Error(BinaryError {
                kind,
                status: Some(status),
                opcode: h.opcode,
                opaque: h.opaque,
                consumed: head_len,
                swallow: value_len,
                close: false,
                failed_set_key: None,
            });
        }
    }
    // The item as memcached counts it (key, value, flags from a set's extras), once the
    // head is here; a value over any item's bound is refused even before.
    let item_too_large = |head: &[u8]| {
        let flags = head
            .get(HEADER_BYTES..HEADER_BYTES + 4)
            .filter(|_| ext >= 4)
            .map_or(0, |f| u32::from_be_bytes([f[0], f[1], f[2], f[3]]));
        !limits.item_fits(key_len, value_len, flags)
    };
    if opcode.is_storage()
        && (value_len > limits.value_bytes_max() || buf.get(..head_len).is_some_and(item_too_large))
    {
        // Answer as soon as the key is here; the value is swallowed as it arrives.
        let Some(head) = buf.get(..head_len) else {
            return BinaryParsed::Incomplete;
        };
        let set = matches!(opcode, Opcode::Set | Opcode::SetQ);
        return BinaryParsed::Error(BinaryError {
            kind: FrameError::ValueTooLarge(value_len),
            status: Some(Status::ValueTooLarge),
            opcode: h.opcode,
            opaque: h.opaque,
            consumed: head_len,
            swallow: value_len,
            close: false,
            failed_set_key: set.then(|| &head[HEADER_BYTES + ext..]),
        });
    }
    let Some(frame) = buf.get(..HEADER_BYTES + body) else {
        return BinaryParsed::Incomplete;
    };
    let extras = &frame[HEADER_BYTES..HEADER_BYTES + ext];
    let key = &frame[HEADER_BYTES + ext..head_len];
    let value = &frame[head_len..];
    use Opcode as O;
    let command = match opcode {
        O::Get | O::GetQ | O::GetK | O::GetKQ => Command::Get { key },
        O::Gat | O::GatQ | O::GatK | O::GatKQ => Command::GetAndTouch {
            key,
            exptime: be_u32(extras),
        },
        O::Touch => Command::Touch {
            key,
            exptime: be_u32(extras),
        },
        O::Set | O::SetQ | O::Add | O::AddQ | O::Replace | O::ReplaceQ => Command::Store {
            key,
            value,
            flags: be_u32(extras),
            exptime: be_u32(&extras[4..]),
        },
        O::Append | O::AppendQ | O::Prepend | O::PrependQ => Command::Concat { key, value },
        O::Delete | O::DeleteQ => Command::Delete { key },
        O::Increment | O::IncrementQ | O::Decrement | O::DecrementQ => Command::Arithmetic {
            key,
            delta: be_u64(extras),
            initial: be_u64(&extras[8..]),
            exptime: be_u32(&extras[16..]),
        },
        O::Flush | O::FlushQ => Command::Flush {
            delay: (ext == 4).then(|| be_u32(extras)),
        },
        O::Stat => Command::Stat { group: key },
        O::Verbosity => Command::Verbosity {
            level: be_u32(extras),
        },
        O::Noop => Command::Noop,
        O::Version => Command::Version,
        O::Quit | O::QuitQ => Command::Quit,
        O::SaslListMechs => Command::SaslListMechs,
        O::SaslAuth | O::SaslStep => Command::Sasl {
            mechanism: key,
            data: value,
        },
    };
    BinaryParsed::Complete {
        frame: Frame {
            opcode,
            opaque: h.opaque,
            cas: h.cas,
            command,
        },
        consumed: frame.len(),
    }
}

impl Frame<'_> {
    /// Appends the request's wire form, as a client sends it. A hand-built frame is encoded
    /// as given: a command that does not belong to the opcode makes a frame the server
    /// rejects.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut extras = [0u8; 20];
        let (ext, key, value): (usize, &[u8], &[u8]) = match self.command {
            Command::Get { key } | Command::Delete { key } => (0, key, b""),
            Command::GetAndTouch { key, exptime } | Command::Touch { key, exptime } => {
                extras[..4].copy_from_slice(&exptime.to_be_bytes());
                (4, key, b"")
            }
            Command::Store {
                key,
                value,
                flags,
                exptime,
            } => {
                extras[..4].copy_from_slice(&flags.to_be_bytes());
                extras[4..8].copy_from_slice(&exptime.to_be_bytes());
                (8, key, value)
            }
            Command::Concat { key, value } => (0, key, value),
            Command::Arithmetic {
                key,
                delta,
                initial,
                exptime,
            } => {
                extras[..8].copy_from_slice(&delta.to_be_bytes());
                extras[8..16].copy_from_slice(&initial.to_be_bytes());
                extras[16..20].copy_from_slice(&exptime.to_be_bytes());
                (20, key, b"")
            }
            Command::Flush { delay } => match delay {
                Some(d) => {
                    extras[..4].copy_from_slice(&d.to_be_bytes());
                    (4, b"", b"")
                }
                None => (0, b"", b""),
            },
            Command::Stat { group } => (0, group, b""),
            Command::Verbosity { level } => {
                extras[..4].copy_from_slice(&level.to_be_bytes());
                (4, b"", b"")
            }
            Command::Noop | Command::Version | Command::Quit | Command::SaslListMechs => {
                (0, b"", b"")
            }
            Command::Sasl { mechanism, data } => (0, mechanism, data),
        };
        Header {
            magic: MAGIC_REQUEST,
            opcode: self.opcode.code(),
            key_len: key.len() as u16,
            extras_len: ext as u8,
            data_type: 0,
            vbucket_or_status: 0,
            body_len: (ext + key.len() + value.len()) as u32,
            opaque: self.opaque,
            cas: self.cas,
        }
        .encode(out);
        out.extend_from_slice(&extras[..ext]);
        out.extend_from_slice(key);
        out.extend_from_slice(value);
    }

    /// The key the request addresses (`None` for keyless commands; the group for `STAT`).
    pub fn key(&self) -> Option<&[u8]> {
        match self.command {
            Command::Get { key }
            | Command::GetAndTouch { key, .. }
            | Command::Touch { key, .. }
            | Command::Store { key, .. }
            | Command::Concat { key, .. }
            | Command::Delete { key }
            | Command::Arithmetic { key, .. } => Some(key),
            _ => None,
        }
    }
}
