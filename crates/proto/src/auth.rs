//! Client authentication on the wire, sans-IO, both directions: memcached's text login
//! (`-Y`, "ASCII auth") and the client's response of SASL PLAIN (binary protocol).
//!
//! **Text login.** Until a connection has authenticated, memcached 1.6 reads every line as
//! a possible login (`proto_text.c`, `try_read_command_asciiauth`): a `set` line of at
//! least five words whose fifth is a byte count, then that many bytes and `\r\n`, whose
//! first two space-separated words are the user and the password. The key, flags and
//! expiration are ignored, and nothing is stored. [`parse_login`] takes the front of a
//! buffer the same way and says what to answer; [`write_login`] composes a login for a
//! client (a cell that asks another cell's client port for its `cluster status`).
//!
//! | input | memcached's answer |
//! |---|---|
//! | any other line (`get k`, `set k 0 0`, `version`, an empty line) | `CLIENT_ERROR unauthenticated` |
//! | a login whose data does not end in `\r\n` | `CLIENT_ERROR bad command line termination` |
//! | a login whose data has fewer than two words | `CLIENT_ERROR bad authentication token format` |
//! | a login with a user and password | `STORED`, or `CLIENT_ERROR authentication failure` |
//! | no line end within 2048 bytes | close |
//!
//! Every word limit memcached has is kept; cellcache adds one bound: a login announcing
//! more than [`LOGIN_DATA_BYTES_MAX`] bytes is answered `bad authentication token format`
//! at once and its data swallowed as it arrives, so the connection buffers no more than
//! one bounded line and block before it is authenticated.
//!
//! **SASL PLAIN** (RFC 4616): the client's response is `[authzid] NUL authcid NUL passwd`.
//! [`plain`] splits it; as Cyrus SASL (memcached's), an authorization identity other than
//! the user itself is refused.

use crate::lines;

/// Bytes a connection that has not authenticated may send without a line end before it is
/// closed (memcached's 2048 in `try_read_command_asciiauth`).
pub const LOGIN_LINE_BYTES_MAX: usize = 2048;

/// Largest data block of a text login (`<user> <password>`); memcached bounds a line of its
/// auth file at 256 bytes.
pub const LOGIN_DATA_BYTES_MAX: usize = 1024;

/// What the front of an unauthenticated connection's input is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Login<'a> {
    /// Not a whole line, or a login whose data has not all arrived.
    Incomplete,
    /// No line end within [`LOGIN_LINE_BYTES_MAX`] bytes: close without a reply.
    Close,
    /// A request that cannot be served yet, or a malformed login: answer `reply`, drop
    /// `consumed` bytes, then swallow `swallow` more (possibly not received yet).
    Refused {
        /// The error line to send.
        reply: &'static [u8],
        /// Bytes of the input to drop now.
        consumed: usize,
        /// Bytes to discard after them.
        swallow: usize,
    },
    /// A login: check the credentials, answer `STORED` or the failure line.
    Credentials {
        /// The user, as sent.
        user: &'a [u8],
        /// The password, as sent.
        password: &'a [u8],
        /// Bytes of the login (line and data block).
        consumed: usize,
    },
}

/// Reads the front of `buf` as memcached reads an unauthenticated connection's input.
/// Never panics; `consumed` never exceeds `buf.len()`.
pub fn parse_login(buf: &[u8]) -> Login<'_> {
    let Some(eol) = memchr::memchr(b'\n', buf) else {
        return if buf.len() > LOGIN_LINE_BYTES_MAX {
            Login::Close
        } else {
            Login::Incomplete
        };
    };
    let line = &buf[..eol];
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let line_len = eol + 1;
    let refused = |reply, consumed, swallow| Login::Refused {
        reply,
        consumed,
        swallow,
    };
    let mut words = line.split(|&b| b == b' ').filter(|w| !w.is_empty());
    let (Some(b"set"), Some(_key), Some(_flags), Some(_exptime), Some(bytes)) = (
        words.next(),
        words.next(),
        words.next(),
        words.next(),
        words.next(),
    ) else {
        return refused(lines::CLIENT_ERROR_UNAUTHENTICATED, line_len, 0);
    };
    let Some(len) = decimal_u32(bytes) else {
        return refused(lines::CLIENT_ERROR_UNAUTHENTICATED, line_len, 0);
    };
    // The block and its "\r\n" (a u32 plus 2 always fits: usize is at least 64 bits here).
    let block = len as usize + 2;
    if len as usize > LOGIN_DATA_BYTES_MAX {
        return refused(
            lines::CLIENT_ERROR_BAD_AUTHENTICATION_TOKEN,
            line_len,
            block,
        );
    }
    let Some(data) = buf.get(line_len..line_len + block) else {
        return Login::Incomplete;
    };
    let consumed = line_len + block;
    let Some(token) = data.strip_suffix(b"\r\n") else {
        return refused(
            lines::CLIENT_ERROR_BAD_COMMAND_LINE_TERMINATION,
            consumed,
            0,
        );
    };
    let mut words = token.split(|&b| b == b' ').filter(|w| !w.is_empty());
    match (words.next(), words.next()) {
        (Some(user), Some(password)) => Login::Credentials {
            user,
            password,
            consumed,
        },
        _ => refused(lines::CLIENT_ERROR_BAD_AUTHENTICATION_TOKEN, consumed, 0),
    }
}

/// A byte count as memcached's `safe_strtoul` takes it: decimal digits, within `u32`.
fn decimal_u32(word: &[u8]) -> Option<u32> {
    if word.is_empty() || !word.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(word).ok()?.parse().ok()
}

/// Whether `user` and `password` can travel in a text login: non-empty, without spaces or
/// line ends (the server splits the block on spaces), within [`LOGIN_DATA_BYTES_MAX`].
pub fn login_is_expressible(user: &[u8], password: &[u8]) -> bool {
    let word = |w: &[u8]| !w.is_empty() && !w.iter().any(|&b| matches!(b, b' ' | b'\r' | b'\n'));
    word(user) && word(password) && user.len() + 1 + password.len() <= LOGIN_DATA_BYTES_MAX
}

/// Appends a text login for `user` and `password` (`set auth 0 0 <n>\r\n<user>
/// <password>\r\n`); the server answers `STORED` when they are right. The caller checks
/// [`login_is_expressible`] first.
pub fn write_login(out: &mut Vec<u8>, user: &[u8], password: &[u8]) {
    let len = user.len() + 1 + password.len();
    out.extend_from_slice(b"set auth 0 0 ");
    crate::token::write_u64(out, len as u64);
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(user);
    out.push(b' ');
    out.extend_from_slice(password);
    out.extend_from_slice(b"\r\n");
}

/// The user and password of a SASL PLAIN response (`[authzid] NUL authcid NUL passwd`), or
/// `None` when it is malformed (not exactly two NULs, no user) or asks to act as another
/// identity than the user's own.
pub fn plain(data: &[u8]) -> Option<(&[u8], &[u8])> {
    let mut parts = data.splitn(3, |&b| b == 0);
    let (authzid, user, password) = (parts.next()?, parts.next()?, parts.next()?);
    if user.is_empty() || password.contains(&0) || !(authzid.is_empty() || authzid == user) {
        return None;
    }
    Some((user, password))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn refused(buf: &[u8]) -> (&'static [u8], usize, usize) {
        match parse_login(buf) {
            Login::Refused {
                reply,
                consumed,
                swallow,
            } => (reply, consumed, swallow),
            other => panic!("{:?} parsed to {other:?}", String::from_utf8_lossy(buf)),
        }
    }

    /// Each row's answer is what memcached 1.6.18 -Y answered to the same bytes, but for a
    /// byte count past `u32`, which memcached truncates and then waits for.
    #[test]
    fn lines_that_are_not_logins_are_unauthenticated() {
        for line in [
            &b"get foo\r\n"[..],
            b"version\r\n",
            b"\r\n",
            b"set\r\n",
            b"set x 0 0\r\n",
            b"add x 0 0 12\r\n",
            b"set x 0 0 abc\r\n",
            b"set x 0 0 -1\r\n",
            b"set x 0 0 99999999999\r\n",
            b"mn\r\n",
        ] {
            assert_eq!(
                refused(line),
                (lines::CLIENT_ERROR_UNAUTHENTICATED, line.len(), 0),
                "{:?}",
                String::from_utf8_lossy(line)
            );
        }
    }

    #[test]
    fn a_login_yields_its_user_and_password() {
        let cases: [(&[u8], &[u8], &[u8]); 5] = [
            (b"set x 0 0 12\r\nalice secret\r\n", b"alice", b"secret"),
            (
                b"set x 0 0 12 noreply\r\nalice secret\r\n",
                b"alice",
                b"secret",
            ),
            // Extra words, leading and doubled spaces, a bare \n: as memcached.
            (b"set x 0 0 15\r\nalice secret xx\r\n", b"alice", b"secret"),
            (b" set  x 0 0 13\nalice  secret\r\n", b"alice", b"secret"),
            (b"set x 0 0 5 6 7 8 9\r\na\tb c\r\n", b"a\tb", b"c"),
        ];
        for (buf, user, password) in cases {
            assert_eq!(
                parse_login(buf),
                Login::Credentials {
                    user,
                    password,
                    consumed: buf.len()
                }
            );
            for cut in 0..buf.len() {
                assert_eq!(parse_login(&buf[..cut]), Login::Incomplete, "cut {cut}");
            }
        }
    }

    #[test]
    fn malformed_logins() {
        let b = b"set x 0 0 5\r\nalice\r\n";
        assert_eq!(
            refused(b),
            (lines::CLIENT_ERROR_BAD_AUTHENTICATION_TOKEN, b.len(), 0)
        );
        let b = b"set x 0 0 13\r\nalice secret\r\n\r\n";
        assert_eq!(
            refused(b),
            (
                lines::CLIENT_ERROR_BAD_COMMAND_LINE_TERMINATION,
                b.len() - 1,
                0
            )
        );
        // Over the bound: refused at once, the block swallowed.
        let b = b"set x 0 0 4000\r\n";
        assert_eq!(
            refused(b),
            (lines::CLIENT_ERROR_BAD_AUTHENTICATION_TOKEN, b.len(), 4002)
        );
        assert_eq!(
            parse_login(&[b'x'; LOGIN_LINE_BYTES_MAX]),
            Login::Incomplete
        );
        assert_eq!(parse_login(&[b'x'; LOGIN_LINE_BYTES_MAX + 1]), Login::Close);
    }

    #[test]
    fn write_login_parses_back() {
        let mut out = Vec::new();
        write_login(&mut out, b"alice", b"s3cret!");
        assert_eq!(out, b"set auth 0 0 13\r\nalice s3cret!\r\n");
        assert!(matches!(
            parse_login(&out),
            Login::Credentials { user: b"alice", password: b"s3cret!", consumed } if consumed == out.len()
        ));
        assert!(login_is_expressible(b"alice", b"s3cret!"));
        assert!(!login_is_expressible(b"alice", b"two words"));
        assert!(!login_is_expressible(b"", b"x"));
    }

    /// What memcached's Cyrus SASL accepted as PLAIN (checked against memcached -S).
    #[test]
    fn plain_responses() {
        assert_eq!(
            plain(b"\0alice\0secret"),
            Some((&b"alice"[..], &b"secret"[..]))
        );
        assert_eq!(
            plain(b"alice\0alice\0secret"),
            Some((&b"alice"[..], &b"secret"[..]))
        );
        for bad in [
            &b"bob\0alice\0secret"[..],
            b"\0alice",
            b"\0alice\0secret\0",
            b"",
            b"\0\0secret",
        ] {
            assert_eq!(plain(bad), None, "{bad:?}");
        }
    }

    proptest! {
        #[test]
        fn any_bytes_parse_without_panic(buf in proptest::collection::vec(any::<u8>(), 0..3000)) {
            match parse_login(&buf) {
                Login::Refused { consumed, .. } | Login::Credentials { consumed, .. } => {
                    prop_assert!(consumed > 0 && consumed <= buf.len());
                }
                Login::Incomplete | Login::Close => {}
            }
            let _ = plain(&buf);
        }
    }
}
