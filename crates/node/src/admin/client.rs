//! A client of the admin plane, for `cellcache ctl`, `cluster up` and the tests: one
//! HTTP/1.1 request per connection (`Connection: close`), the reply read to its end. The
//! admin plane's replies are short text, so nothing more is needed than a request line, a
//! few headers and the body.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// The longest reply read (a ring's status is a line per cell).
const REPLY_BYTES_MAX: u64 = 16 << 20;

/// Why an admin request got no answer.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("connecting to the admin port {addr}")]
    Connect {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("talking to the admin port {addr}")]
    Io {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the admin port {addr} answered something that is not HTTP")]
    NotHttp { addr: String },
}

/// An admin reply: the HTTP status and the text body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub status: u16,
    pub body: String,
}

impl Reply {
    /// A 2xx status.
    pub fn ok(&self) -> bool {
        (200..300).contains(&self.status)
    }
}

/// Sends `method path` to the admin port at `addr` (with `Authorization: Bearer token` when
/// a token is given) and returns the reply.
pub fn call(
    addr: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    timeout: Duration,
) -> Result<Reply, CallError> {
    let connect = |source| CallError::Connect {
        addr: addr.to_string(),
        source,
    };
    let io = |source| CallError::Io {
        addr: addr.to_string(),
        source,
    };
    let target = addr
        .to_socket_addrs()
        .map_err(connect)?
        .next()
        .ok_or_else(|| connect(std::io::ErrorKind::AddrNotAvailable.into()))?;
    let mut s = TcpStream::connect_timeout(&target, timeout).map_err(connect)?;
    s.set_read_timeout(Some(timeout)).map_err(io)?;
    s.set_write_timeout(Some(timeout)).map_err(io)?;
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Content-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .map_err(io)?;
    let mut raw = Vec::new();
    s.take(REPLY_BYTES_MAX).read_to_end(&mut raw).map_err(io)?;
    parse(&raw).ok_or_else(|| CallError::NotHttp {
        addr: addr.to_string(),
    })
}

/// The status and body of a whole HTTP/1.1 reply (a body delimited by the connection's end
/// or its `Content-Length`; the admin plane never sends a chunked one).
fn parse(raw: &[u8]) -> Option<Reply> {
    let head_end = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&raw[..head_end]).ok()?;
    let mut lines = head.split("\r\n");
    let status = lines
        .next()?
        .strip_prefix("HTTP/1.")?
        .split(' ')
        .nth(1)?
        .parse()
        .ok()?;
    let mut body = &raw[head_end + 4..];
    let length = lines.find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.eq_ignore_ascii_case("content-length")
            .then(|| value.trim().parse::<usize>().ok())
            .flatten()
    });
    if let Some(n) = length {
        body = body.get(..n)?;
    }
    Some(Reply {
        status,
        body: String::from_utf8_lossy(body).into_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_is_its_status_and_body() {
        let r =
            parse(b"HTTP/1.1 409 Conflict\r\ncontent-length: 6\r\n\r\nnope\r\n").expect("parses");
        assert_eq!(r.status, 409);
        assert_eq!(r.body, "nope\r\n");
        assert!(!r.ok());
    }

    #[test]
    fn what_is_not_http_is_refused() {
        assert_eq!(parse(b"ERROR\r\n"), None);
        assert_eq!(parse(b"HTTP/1.1 abc\r\n\r\n"), None);
        assert_eq!(
            parse(b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\nshort"),
            None
        );
    }
}
