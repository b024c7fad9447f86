//! Client authentication in the session (memcached `-Y`, `server.auth_file`), as memcached
//! 1.6 answers: the connection's [`Gate`] is shut until the client logs in, and only the
//! login gets through it.
//!
//! - **Text**: each request before the login is read by `cellcache_proto::auth::parse_login`
//!   and answered `CLIENT_ERROR unauthenticated` (quit, stats, `cluster …` included); a
//!   login is answered `STORED` and opens the gate, or `CLIENT_ERROR authentication
//!   failure`. The connection stays open either way; what follows the login in the same
//!   read is served normally.
//! - **Binary**: before authentication a frame other than the SASL ones and `version` is
//!   answered `0x20` "Auth failure." and the connection closed, on its header alone.
//!   `SASL_LIST_MECHS` answers `PLAIN`; `SASL_AUTH` with `PLAIN` checks the response and
//!   answers "Authenticated" or `0x20` (a PLAIN without a response is "continue", `0x21`,
//!   and the response comes in a `SASL_STEP`). As with memcached's Cyrus SASL, any SASL
//!   command starts over: the connection is unauthenticated until one succeeds.
//!
//! `auth_cmds` counts every checked login or SASL attempt, `auth_errors` the failed ones.
//!
//! Only the entry cell checks: a request it forwards to its key's master travels on the
//! ring's peer connections (proven by the ring's secret), never through a session.

use cellcache_io::Progress;
use cellcache_proto::auth::{Login, parse_login, plain};
use cellcache_proto::binary::{
    BinaryError, BinaryResponse, Command, Frame, FrameError, Header, MAGIC_REQUEST, Opcode, Status,
    write_error,
};
use cellcache_proto::{Discard, lines};

use super::Conn;

/// The one SASL mechanism offered: the client's response carries the password (so use TLS
/// where the network is not trusted).
const MECHANISMS: &[u8] = b"PLAIN";

/// memcached's value of a successful SASL authentication.
const AUTHENTICATED: &[u8] = b"Authenticated";

/// A connection's authentication state; owned by its session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Gate {
    /// Requests are served (no login needed, or the client logged in).
    open: bool,
    /// A SASL PLAIN started without the client's response was answered "continue": the next
    /// `SASL_STEP` carries it.
    continued: bool,
}

impl Gate {
    /// Open when the cell needs no login.
    pub(crate) fn new(login_required: bool) -> Gate {
        Gate {
            open: !login_required,
            continued: false,
        }
    }

    pub(crate) fn is_open(&self) -> bool {
        self.open
    }
}

/// What a text session does after [`Conn::text_login`].
pub(crate) enum Next {
    /// Read the next request.
    Continue,
    /// Wait for more input.
    Wait,
}

impl Conn {
    /// Checks a login against `credentials`, unless this client's address is locked out
    /// for failing too often (`crate::throttle`): then it fails unchecked.
    fn check_login(&mut self, user: &[u8], password: &[u8]) -> bool {
        let cell = self.cell.clone();
        let Some(credentials) = cell.credentials.as_ref() else {
            return false;
        };
        let now = std::time::Instant::now();
        let throttle = &cell.login_throttle;
        if !throttle.allows(self.peer_ip, now) {
            self.counters.auth_throttled += 1;
            return false;
        }
        let ok = credentials.check(user, password);
        if !ok {
            throttle.failed(self.peer_ip, now);
        }
        ok
    }

    /// Counts one checked attempt and opens (or keeps shut) the gate.
    fn authenticated(&mut self, ok: bool) {
        self.counters.auth_cmds += 1;
        self.counters.auth_errors += u64::from(!ok);
        self.auth.open = ok;
    }

    /// One request at the front of an unauthenticated text connection's `input` (the rest
    /// after `p.consumed`): a login or a refusal.
    pub(crate) fn text_login(
        &mut self,
        input: &[u8],
        output: &mut Vec<u8>,
        p: &mut Progress,
    ) -> Next {
        if self.cell.credentials.is_none() {
            return Next::Continue;
        }
        match parse_login(&input[p.consumed..]) {
            Login::Incomplete => Next::Wait,
            Login::Close => {
                // As memcached: no line end within 2048 bytes closes without a word.
                p.close = true;
                Next::Wait
            }
            Login::Refused {
                reply,
                consumed,
                swallow,
            } => {
                p.consumed += consumed;
                self.discard = Discard::new(swallow);
                self.emit(reply.to_vec(), output);
                Next::Continue
            }
            Login::Credentials {
                user,
                password,
                consumed,
            } => {
                p.consumed += consumed;
                let ok = self.check_login(user, password);
                self.authenticated(ok);
                let reply = if ok {
                    lines::STORED
                } else {
                    lines::CLIENT_ERROR_AUTHENTICATION_FAILURE
                };
                self.emit(reply.to_vec(), output);
                Next::Continue
            }
        }
    }

    /// Before authentication, the reply to the binary frame at the front of `rest` when it
    /// is one the client may not send yet (anything but SASL and `version`), judged on its
    /// header as memcached does; the session then closes. `None`: parse it as usual (a
    /// partial header, a bad magic byte or lengths the parser refuses itself).
    pub(crate) fn binary_refusal(&self, rest: &[u8]) -> Option<Vec<u8>> {
        if self.auth.open || self.cell.credentials.is_none() {
            return None;
        }
        let h = Header::decode(rest)?;
        let lengths_fit = usize::from(h.extras_len) + usize::from(h.key_len) <= h.body_len as usize;
        if h.magic != MAGIC_REQUEST || !lengths_fit {
            return None;
        }
        use Opcode as O;
        match Opcode::from_code(h.opcode) {
            Some(O::SaslListMechs | O::SaslAuth | O::SaslStep | O::Version) => None,
            _ => {
                let mut reply = Vec::new();
                write_error(&mut reply, h.opcode, Status::AuthError, h.opaque);
                Some(reply)
            }
        }
    }

    /// Answers a SASL frame when the cell takes logins (`true`); without an auth file the
    /// frame is left to the translation, which answers "unknown command" as memcached
    /// without SASL does.
    pub(crate) fn sasl(&mut self, frame: &Frame<'_>, output: &mut Vec<u8>) -> bool {
        if self.cell.credentials.is_none() {
            return false;
        }
        if !matches!(frame.command, Command::SaslListMechs | Command::Sasl { .. }) {
            return false;
        }
        let reply = |status: Status, value: &[u8]| {
            let mut out = Vec::new();
            BinaryResponse {
                opcode: frame.opcode.code(),
                status: status.code(),
                opaque: frame.opaque,
                cas: 0,
                extras: &[],
                key: &[],
                value,
            }
            .encode(&mut out);
            out
        };
        // Whatever the command, the connection starts over (memcached's init_sasl_conn).
        self.auth.open = false;
        let continued = std::mem::take(&mut self.auth.continued);
        let response = match frame.command {
            Command::SaslListMechs => {
                self.emit(reply(Status::NoError, MECHANISMS), output);
                return true;
            }
            Command::Sasl { mechanism, data } => match frame.opcode {
                Opcode::SaslAuth if !mechanism.eq_ignore_ascii_case(MECHANISMS) => None,
                Opcode::SaslAuth if data.is_empty() => {
                    self.auth.continued = true;
                    self.emit(reply(Status::AuthContinue, &[]), output);
                    return true;
                }
                Opcode::SaslAuth => Some(data),
                // A step continues a PLAIN answered "continue" (its mechanism is not read);
                // a failed step may be tried again, as with memcached.
                _ if continued => {
                    self.auth.continued = true;
                    Some(data)
                }
                _ => None,
            },
            // Taken above: only SASL frames get here.
            _ => None,
        };
        let ok = response
            .and_then(plain)
            .is_some_and(|(user, password)| self.check_login(user, password));
        self.authenticated(ok);
        let answer = if ok {
            self.auth.continued = false;
            reply(Status::NoError, AUTHENTICATED)
        } else {
            reply(Status::AuthError, Status::AuthError.message().as_bytes())
        };
        self.emit(answer, output);
        true
    }

    /// The reply to a SASL frame the parser refused (a long mechanism or long data): with
    /// an auth file, the parser's (long data counts as a failed attempt); without, "unknown
    /// command", as memcached without SASL. `None` for other errors.
    pub(crate) fn sasl_refusal(&mut self, e: &BinaryError<'_>) -> Option<Vec<u8>> {
        if !matches!(
            e.kind,
            FrameError::MechanismTooLong(_) | FrameError::SaslDataTooLong(_)
        ) {
            return None;
        }
        let mut out = Vec::new();
        if self.cell.credentials.is_none() {
            write_error(&mut out, e.opcode, Status::UnknownCommand, e.opaque);
            return Some(out);
        }
        if matches!(e.kind, FrameError::SaslDataTooLong(_)) {
            self.auth.continued = false;
            self.authenticated(false);
        }
        e.encode_reply(&mut out);
        Some(out)
    }
}

#[cfg(test)]
mod tests;
