//! Binary frames to meta commands, and meta replies back to binary responses.
//!
//! Each binary command has a meta equivalent that asks for exactly what the binary reply
//! carries: `GET` is `mg <key> v f c` (value, flags, CAS), `SET` is `ms <key> <len> c F T M`,
//! `INCREMENT` is `ma <key> v c D [N J]`, and so on. Keys the text protocol cannot carry
//! (spaces, control bytes) travel base64-encoded with the meta `b` flag, so routing,
//! replication and forwarding see the same key bytes a text client would. A [`Shape`]
//! remembers what the binary reply needs (opcode, opaque, key) and [`Shape::reply`] turns
//! the meta reply into it, applying the quiet rules of the binary protocol.

use cellcache_proto::binary::{
    BinaryResponse, Command, Frame, NO_CREATE_EXPTIME, Opcode, ResponseHead, Status, write_error,
    write_error_message, write_header,
};
use cellcache_proto::token::{BINARY_KEY_BYTES_MAX, base64_encode, key_is_valid, write_u64};
use cellcache_proto::{Limits, MetaStatus, ParsedReply, Response, parse_reply};

/// What the binary reply to one request needs, kept while its meta command runs (possibly
/// on another cell).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shape {
    opcode: Opcode,
    opaque: u32,
    /// The key, kept only for the replies that carry it (get-with-key).
    key: Vec<u8>,
}

/// The meta command for `frame` and the shape of its reply; or, when the frame cannot be
/// expressed (a key of bytes the text protocol forbids that is too long for base64 within
/// `key_bytes_max`, a stat group with control bytes), the binary reply to send instead.
pub fn to_text(frame: &Frame<'_>, limits: &Limits) -> Result<(Vec<u8>, Shape), Vec<u8>> {
    let shape = Shape {
        opcode: frame.opcode,
        opaque: frame.opaque,
        key: if frame.opcode.returns_key() {
            frame.key().unwrap_or_default().to_vec()
        } else {
            Vec::new()
        },
    };
    let mut t = Vec::with_capacity(64);
    let refuse = |status| {
        let mut out = Vec::new();
        write_error(&mut out, frame.opcode.code(), status, frame.opaque);
        out
    };
    let cas = frame.cas;
    match frame.command {
        Command::Get { key } => {
            t.extend_from_slice(b"mg ");
            let b64 =
                push_key(&mut t, key, limits).ok_or_else(|| refuse(Status::InvalidArguments))?;
            t.extend_from_slice(b" v f c");
            flag(&mut t, b64, b" b");
        }
        Command::GetAndTouch { key, exptime } | Command::Touch { key, exptime } => {
            t.extend_from_slice(b"mg ");
            let b64 =
                push_key(&mut t, key, limits).ok_or_else(|| refuse(Status::InvalidArguments))?;
            if matches!(frame.command, Command::GetAndTouch { .. }) {
                t.extend_from_slice(b" v");
            }
            t.extend_from_slice(b" f c T");
            write_u64(&mut t, u64::from(exptime));
            flag(&mut t, b64, b" b");
        }
        Command::Store {
            key,
            value,
            flags,
            exptime,
        } => {
            // memcached turns any storage command with a CAS into a compare-and-swap.
            let mode: &[u8] = match frame.opcode {
                _ if cas != 0 => b"S",
                Opcode::Add | Opcode::AddQ => b"E",
                Opcode::Replace | Opcode::ReplaceQ => b"R",
                _ => b"S",
            };
            t.extend_from_slice(b"ms ");
            let b64 =
                push_key(&mut t, key, limits).ok_or_else(|| refuse(Status::InvalidArguments))?;
            t.push(b' ');
            write_u64(&mut t, value.len() as u64);
            t.extend_from_slice(b" c F");
            write_u64(&mut t, u64::from(flags));
            t.extend_from_slice(b" T");
            write_u64(&mut t, u64::from(exptime));
            t.extend_from_slice(b" M");
            t.extend_from_slice(mode);
            cas_flag(&mut t, cas);
            flag(&mut t, b64, b" b");
            t.extend_from_slice(b"\r\n");
            t.extend_from_slice(value);
        }
        Command::Concat { key, value } => {
            let mode: &[u8] = match frame.opcode {
                Opcode::Prepend | Opcode::PrependQ => b"P",
                _ => b"A",
            };
            t.extend_from_slice(b"ms ");
            let b64 =
                push_key(&mut t, key, limits).ok_or_else(|| refuse(Status::InvalidArguments))?;
            t.push(b' ');
            write_u64(&mut t, value.len() as u64);
            t.extend_from_slice(b" c M");
            t.extend_from_slice(mode);
            cas_flag(&mut t, cas);
            flag(&mut t, b64, b" b");
            t.extend_from_slice(b"\r\n");
            t.extend_from_slice(value);
        }
        Command::Delete { key } => {
            t.extend_from_slice(b"md ");
            let b64 =
                push_key(&mut t, key, limits).ok_or_else(|| refuse(Status::InvalidArguments))?;
            cas_flag(&mut t, cas);
            flag(&mut t, b64, b" b");
        }
        Command::Arithmetic {
            key,
            delta,
            initial,
            exptime,
        } => {
            t.extend_from_slice(b"ma ");
            let b64 =
                push_key(&mut t, key, limits).ok_or_else(|| refuse(Status::InvalidArguments))?;
            t.extend_from_slice(b" v c D");
            write_u64(&mut t, delta);
            if matches!(frame.opcode, Opcode::Decrement | Opcode::DecrementQ) {
                t.extend_from_slice(b" MD");
            }
            if exptime != NO_CREATE_EXPTIME {
                t.extend_from_slice(b" N");
                write_u64(&mut t, u64::from(exptime));
                t.extend_from_slice(b" J");
                write_u64(&mut t, initial);
            }
            cas_flag(&mut t, cas);
            flag(&mut t, b64, b" b");
        }
        Command::Flush { delay } => {
            t.extend_from_slice(b"flush_all");
            if let Some(d) = delay {
                t.push(b' ');
                write_u64(&mut t, u64::from(d));
            }
        }
        Command::Stat { group } => {
            t.extend_from_slice(b"stats");
            if !group.is_empty() {
                // memcached answers an unknown group with "Not found"; a group the text
                // protocol cannot carry is unknown.
                if group.iter().any(|&b| b < b' ' || b == 0x7f) {
                    return Err(refuse(Status::KeyNotFound));
                }
                t.push(b' ');
                t.extend_from_slice(group);
            }
        }
        Command::Verbosity { level } => {
            t.extend_from_slice(b"verbosity ");
            write_u64(&mut t, u64::from(level));
        }
        Command::Noop => t.extend_from_slice(b"mn"),
        Command::Version => t.extend_from_slice(b"version"),
        Command::Quit => t.extend_from_slice(b"quit"),
        // Answered by the session when the cell takes logins (`conn::auth`); without an
        // auth file, as memcached without SASL: unknown.
        Command::SaslListMechs | Command::Sasl { .. } => {
            return Err(refuse(Status::UnknownCommand));
        }
    }
    // The end of the command line, or of a storage command's data block.
    t.extend_from_slice(b"\r\n");
    Ok((t, shape))
}

fn flag(t: &mut Vec<u8>, on: bool, text: &[u8]) {
    if on {
        t.extend_from_slice(text);
    }
}

fn cas_flag(t: &mut Vec<u8>, cas: u64) {
    if cas != 0 {
        t.extend_from_slice(b" C");
        write_u64(t, cas);
    }
}

/// Appends `key` as a meta key token: as is when the text protocol allows it, else base64
/// (returns whether it did). `None` when even base64 does not fit `key_bytes_max`.
fn push_key(t: &mut Vec<u8>, key: &[u8], limits: &Limits) -> Option<bool> {
    if key_is_valid(key, limits.key_bytes_max) {
        t.extend_from_slice(key);
        return Some(false);
    }
    let encoded_len = key.len().div_ceil(3) * 4;
    if key.is_empty() || key.len() > BINARY_KEY_BYTES_MAX || encoded_len > limits.key_bytes_max {
        return None;
    }
    base64_encode(key, t);
    Some(true)
}

/// Bounds for reading back this cell's own meta replies: values up to any size the store
/// holds (the text is ours, and already complete).
const REPLY_LIMITS: Limits = Limits {
    key_bytes_max: 250,
    line_bytes_max: 1 << 20,
    item_size_max: usize::MAX / 4,
    cas_enabled: true,
    keys_per_get_max: 1,
};

fn parse_one(text: &[u8]) -> Option<(Response<'_>, usize)> {
    match parse_reply(text, &REPLY_LIMITS) {
        ParsedReply::Complete { reply, consumed } => Some((reply, consumed)),
        _ => None,
    }
}

impl Shape {
    /// The binary reply for `text`, the meta (or classic) reply its command produced. Empty
    /// when the binary protocol sends nothing (a quiet command's success, a `GETQ` miss).
    pub fn reply(&self, text: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        self.write_reply(text, &mut out);
        out
    }

    fn write_reply(&self, text: &[u8], out: &mut Vec<u8>) {
        use Opcode as O;
        let quiet = self.opcode.is_quiet();
        if self.opcode == O::Stat {
            return self.stats(text, out);
        }
        if matches!(self.opcode, O::Quit | O::QuitQ) && text.is_empty() {
            if !quiet {
                self.success(0, &[], &[], out);
            }
            return;
        }
        let Some((reply, _)) = parse_one(text) else {
            return self.error(Status::InternalError, trim(text), out);
        };
        match reply {
            Response::ServerError(message) => return self.server_error(message, out),
            Response::ClientError(message) => {
                let status = if message.starts_with(b"cannot increment or decrement") {
                    Status::NonNumeric
                } else {
                    Status::InvalidArguments
                };
                return self.error(status, status.message().as_bytes(), out);
            }
            Response::Error => {
                return self.error(Status::UnknownCommand, b"Unknown command", out);
            }
            _ => {}
        }
        let meta = match reply {
            Response::Meta(m) => Some(m),
            _ => None,
        };
        let status_of = |s| meta.is_some_and(|m| m.status == s);
        match self.opcode {
            O::Get | O::GetQ | O::GetK | O::GetKQ | O::Gat | O::GatQ | O::GatK | O::GatKQ => {
                match meta {
                    Some(m) if m.status == MetaStatus::Va => {
                        let flags = m.flags.client_flags.unwrap_or(0).to_be_bytes();
                        let key: &[u8] = if self.opcode.returns_key() {
                            &self.key
                        } else {
                            &[]
                        };
                        let value = m.value.unwrap_or_default();
                        write_header(
                            out,
                            ResponseHead {
                                opcode: self.opcode.code(),
                                status: Status::NoError.code(),
                                opaque: self.opaque,
                                cas: m.flags.cas.unwrap_or(0),
                                extras_len: 4,
                                key_len: key.len() as u16,
                                value_len: value.len(),
                            },
                        );
                        out.extend_from_slice(&flags);
                        out.extend_from_slice(key);
                        out.extend_from_slice(value);
                    }
                    Some(m) if m.status == MetaStatus::En && quiet => {}
                    Some(m) if m.status == MetaStatus::En => {
                        if self.opcode.returns_key() {
                            // memcached: the key, and no message.
                            BinaryResponse {
                                opcode: self.opcode.code(),
                                status: Status::KeyNotFound.code(),
                                opaque: self.opaque,
                                cas: 0,
                                extras: &[],
                                key: &self.key,
                                value: &[],
                            }
                            .encode(out);
                        } else {
                            self.error(Status::KeyNotFound, b"Not found", out);
                        }
                    }
                    _ => self.unexpected(text, out),
                }
            }
            O::Touch => match meta {
                Some(m) if m.status == MetaStatus::Hd => {
                    let flags = m.flags.client_flags.unwrap_or(0).to_be_bytes();
                    self.success(m.flags.cas.unwrap_or(0), &flags, &[], out);
                }
                Some(m) if m.status == MetaStatus::En => {
                    self.error(Status::KeyNotFound, b"Not found", out);
                }
                _ => self.unexpected(text, out),
            },
            op if op.is_storage() => match meta {
                Some(m) if m.status == MetaStatus::Hd => {
                    if !quiet {
                        self.success(m.flags.cas.unwrap_or(0), &[], &[], out);
                    }
                }
                // memcached: a refused add means the key exists, a refused replace that it
                // does not; append/prepend to nothing is "not stored".
                Some(m) if m.status == MetaStatus::Ns => {
                    let status = match self.opcode {
                        O::Add | O::AddQ => Status::KeyExists,
                        O::Replace | O::ReplaceQ => Status::KeyNotFound,
                        _ => Status::ItemNotStored,
                    };
                    self.error(status, status.message().as_bytes(), out);
                }
                _ if status_of(MetaStatus::Ex) => self.error_status(Status::KeyExists, out),
                _ if status_of(MetaStatus::Nf) => self.error_status(Status::KeyNotFound, out),
                _ => self.unexpected(text, out),
            },
            O::Delete | O::DeleteQ => match meta {
                Some(m) if m.status == MetaStatus::Hd => {
                    if !quiet {
                        self.success(0, &[], &[], out);
                    }
                }
                _ if status_of(MetaStatus::Ex) => self.error_status(Status::KeyExists, out),
                _ if status_of(MetaStatus::Nf) => self.error_status(Status::KeyNotFound, out),
                _ => self.unexpected(text, out),
            },
            O::Increment | O::IncrementQ | O::Decrement | O::DecrementQ => match meta {
                Some(m) if m.status == MetaStatus::Va => {
                    let digits = m.value.unwrap_or_default();
                    let Some(n) = std::str::from_utf8(digits)
                        .ok()
                        .and_then(|s| s.trim().parse::<u64>().ok())
                    else {
                        return self.unexpected(text, out);
                    };
                    if !quiet {
                        self.success(m.flags.cas.unwrap_or(0), &[], &n.to_be_bytes(), out);
                    }
                }
                _ if status_of(MetaStatus::Ex) => self.error_status(Status::KeyExists, out),
                _ if status_of(MetaStatus::Nf) => self.error_status(Status::KeyNotFound, out),
                _ if status_of(MetaStatus::Ns) => self.error_status(Status::ItemNotStored, out),
                _ => self.unexpected(text, out),
            },
            O::Flush | O::FlushQ | O::Verbosity => match reply {
                Response::Ok => {
                    if !quiet {
                        self.success(0, &[], &[], out);
                    }
                }
                _ => self.unexpected(text, out),
            },
            O::Noop => match reply {
                Response::MetaNoop => self.success(0, &[], &[], out),
                _ => self.unexpected(text, out),
            },
            O::Version => match reply {
                Response::Version(v) => self.success(0, &[], v, out),
                _ => self.unexpected(text, out),
            },
            // Stat is answered above, quit with a reply other than none is unexpected;
            // storage opcodes are taken by the `is_storage` arm.
            _ => self.unexpected(text, out),
        }
    }

    /// `STAT name value` lines become one packet each (key = name, value = value), `END`
    /// (or `RESET`) the empty terminating packet; an unknown group is "Not found".
    fn stats(&self, text: &[u8], out: &mut Vec<u8>) {
        let mut rest = text;
        let start = out.len();
        while let Some((reply, consumed)) = parse_one(rest) {
            rest = &rest[consumed..];
            match reply {
                Response::Stat { name, value } => self.success_with_key(name, value, out),
                // `stats detail on|off` answers OK: memcached's empty success.
                Response::End | Response::Reset | Response::Ok => {
                    self.success(0, &[], &[], out);
                    return;
                }
                Response::Error => {
                    out.truncate(start);
                    return self.error_status(Status::KeyNotFound, out);
                }
                Response::ServerError(message) => {
                    out.truncate(start);
                    return self.server_error(message, out);
                }
                _ => break,
            }
        }
        out.truncate(start);
        self.unexpected(text, out);
    }

    fn success(&self, cas: u64, extras: &[u8], value: &[u8], out: &mut Vec<u8>) {
        BinaryResponse {
            opcode: self.opcode.code(),
            status: Status::NoError.code(),
            opaque: self.opaque,
            cas,
            extras,
            key: &[],
            value,
        }
        .encode(out);
    }

    fn success_with_key(&self, key: &[u8], value: &[u8], out: &mut Vec<u8>) {
        BinaryResponse {
            opcode: self.opcode.code(),
            status: Status::NoError.code(),
            opaque: self.opaque,
            cas: 0,
            extras: &[],
            key,
            value,
        }
        .encode(out);
    }

    fn error(&self, status: Status, message: &[u8], out: &mut Vec<u8>) {
        write_error_message(out, self.opcode.code(), status, self.opaque, message);
    }

    fn error_status(&self, status: Status, out: &mut Vec<u8>) {
        write_error(out, self.opcode.code(), status, self.opaque);
    }

    /// `SERVER_ERROR …`: the store's failures keep memcached's statuses; a ring's retryable
    /// errors (no master, not in a ring yet) are "temporary failure" with cellcache's text.
    fn server_error(&self, message: &[u8], out: &mut Vec<u8>) {
        use Opcode as O;
        let concat = matches!(
            self.opcode,
            O::Append | O::AppendQ | O::Prepend | O::PrependQ
        );
        if message.starts_with(b"object too large") {
            // memcached refuses a too-long append as "not stored".
            let status = if concat {
                Status::ItemNotStored
            } else {
                Status::ValueTooLarge
            };
            self.error_status(status, out);
        } else if message.starts_with(b"out of memory") {
            self.error_status(Status::OutOfMemory, out);
        } else if message.starts_with(b"cluster:") || message.starts_with(b"standby:") {
            self.error(Status::TemporaryFailure, message, out);
        } else {
            self.error(Status::InternalError, message, out);
        }
    }

    fn unexpected(&self, text: &[u8], out: &mut Vec<u8>) {
        self.error(Status::InternalError, trim(text), out);
    }
}

/// The first line of a reply, for an error message.
fn trim(text: &[u8]) -> &[u8] {
    let end = text
        .iter()
        .position(|&b| b == b'\r' || b == b'\n')
        .unwrap_or(text.len());
    &text[..end.min(200)]
}
