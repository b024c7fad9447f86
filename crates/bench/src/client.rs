//! A small blocking client for the control side of a run: readiness checks, `stats`, and
//! pipelined bulk `set`s for preloading the key space and for the capacity experiment.
//!
//! It is deliberately separate from the measurement engine: it runs before or between measured
//! phases, so simplicity beats throughput (still pipelined, so preloading a million keys takes
//! seconds, not minutes). Every wait is bounded by a deadline. Under `--tls` it speaks TLS
//! too (a blocking rustls stream, handshake done in [`BlockingClient::connect_tls`]).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cellcache_proto::{
    Decoded, Expect, Limits, Reply, ReplyError, Request, Response, StatsGroup, StoreHead,
    StoreMode, decode_reply, write_store_with,
};
use thiserror::Error;

use crate::tls::TlsTarget;
use crate::wire::ParseLimits;

/// What can go wrong talking to a server outside of a measured run.
#[derive(Debug, Error)]
pub enum ClientError {
    #[error("{addr}: {source}")]
    Io {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("{addr}: {source}")]
    Wire {
        addr: SocketAddr,
        source: ReplyError,
    },
    #[error("{addr}: server closed the connection")]
    Closed { addr: SocketAddr },
    #[error("{addr}: unexpected reply {reply}")]
    UnexpectedReply { addr: SocketAddr, reply: String },
    #[error("{addr}: not ready after {waited:?} (last error: {last})")]
    NotReady {
        addr: SocketAddr,
        waited: Duration,
        last: String,
    },
}

/// Read-buffer growth step.
const READ_CHUNK_BYTES: usize = 64 * 1024;

/// The control connection's byte stream: plain TCP, or TLS over it.
enum Stream {
    Plain(TcpStream),
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            Stream::Tls(s) => s.flush(),
        }
    }
}

/// A blocking connection with its own read buffer.
pub struct BlockingClient {
    addr: SocketAddr,
    stream: Stream,
    buf: Vec<u8>,
    filled: usize,
    limits: Limits,
}

impl BlockingClient {
    /// Connects with a timeout; `io_timeout` bounds every later read and write.
    pub fn connect(
        addr: SocketAddr,
        timeout: Duration,
        io_timeout: Duration,
    ) -> Result<Self, ClientError> {
        Self::connect_tls(addr, timeout, io_timeout, None)
    }

    /// [`connect`](Self::connect), then, with `tls`, a TLS handshake (bounded by
    /// `io_timeout` like every read and write).
    pub fn connect_tls(
        addr: SocketAddr,
        timeout: Duration,
        io_timeout: Duration,
        tls: Option<&Arc<TlsTarget>>,
    ) -> Result<Self, ClientError> {
        let io = |source| ClientError::Io { addr, source };
        let mut socket = TcpStream::connect_timeout(&addr, timeout).map_err(io)?;
        socket.set_nodelay(true).map_err(io)?;
        socket.set_read_timeout(Some(io_timeout)).map_err(io)?;
        socket.set_write_timeout(Some(io_timeout)).map_err(io)?;
        let stream = match tls {
            None => Stream::Plain(socket),
            Some(tls) => {
                let mut session = tls
                    .session(addr)
                    .map_err(|e| io(std::io::Error::other(e)))?;
                while session.is_handshaking() {
                    session.complete_io(&mut socket).map_err(io)?;
                }
                Stream::Tls(Box::new(rustls::StreamOwned::new(session, socket)))
            }
        };
        Ok(Self {
            addr,
            stream,
            buf: vec![0; READ_CHUNK_BYTES],
            filled: 0,
            limits: ParseLimits::default().codec(),
        })
    }

    /// The TLS session, when the connection speaks TLS.
    pub fn tls_session(&self) -> Option<&rustls::ClientConnection> {
        match &self.stream {
            Stream::Plain(_) => None,
            Stream::Tls(s) => Some(&s.conn),
        }
    }

    /// Sends `version` and returns the server's version string.
    pub fn version(&mut self) -> Result<String, ClientError> {
        let mut out = Vec::new();
        Request::Version.encode(&mut out);
        self.send(&out)?;
        self.read_reply(Expect::Line, |reply| match reply {
            Reply::Line(Response::Version(v)) => Ok(String::from_utf8_lossy(v).into_owned()),
            other => Err(format!("{other:?}")),
        })
    }

    /// Sends `stats` and returns every statistic as text.
    pub fn stats(&mut self) -> Result<BTreeMap<String, String>, ClientError> {
        let mut out = Vec::new();
        Request::Stats(StatsGroup::General).encode(&mut out);
        self.send(&out)?;
        self.read_reply(Expect::Stats, |reply| match reply {
            Reply::Stats(stats) => Ok(stats
                .iter()
                .map(|(k, v)| {
                    (
                        String::from_utf8_lossy(k).into_owned(),
                        String::from_utf8_lossy(v).into_owned(),
                    )
                })
                .collect()),
            other => Err(format!("{other:?}")),
        })
    }

    /// Sets every `(key, value)` from `items`, `batch` requests per round trip. Returns how many
    /// were answered `STORED`; any other reply is counted in the second number.
    pub fn set_many<'v>(
        &mut self,
        items: impl Iterator<Item = (Vec<u8>, &'v [u8])>,
        ttl_secs: i64,
        batch: usize,
    ) -> Result<(u64, u64), ClientError> {
        let batch = batch.max(1);
        let (mut stored, mut other) = (0, 0);
        let mut out = Vec::new();
        let mut items = items.peekable();
        while items.peek().is_some() {
            out.clear();
            let mut n = 0;
            let set = StoreHead {
                mode: StoreMode::Set,
                flags: 0,
                exptime: ttl_secs,
                noreply: false,
            };
            for (key, value) in items.by_ref().take(batch) {
                write_store_with(&mut out, set, |out| out.extend_from_slice(&key), value);
                n += 1;
            }
            self.send(&out)?;
            for _ in 0..n {
                let ok = self.read_reply(Expect::Line, |reply| {
                    Ok(matches!(reply, Reply::Line(Response::Stored)))
                })?;
                if ok { stored += 1 } else { other += 1 }
            }
        }
        Ok((stored, other))
    }

    /// Gets every key of `keys` in one pipelined round trip; whether each was a hit.
    pub fn get_many<'k>(
        &mut self,
        keys: impl Iterator<Item = &'k [u8]>,
    ) -> Result<Vec<bool>, ClientError> {
        let mut out = Vec::new();
        let mut n = 0;
        for key in keys {
            out.extend_from_slice(b"get ");
            out.extend_from_slice(key);
            out.extend_from_slice(b"\r\n");
            n += 1;
        }
        self.send(&out)?;
        (0..n)
            .map(|_| {
                self.read_reply(Expect::Values, |reply| match reply {
                    Reply::Values(values) => Ok(values.count() > 0),
                    other => Err(format!("{other:?}")),
                })
            })
            .collect()
    }

    fn send(&mut self, bytes: &[u8]) -> Result<(), ClientError> {
        self.stream
            .write_all(bytes)
            .map_err(|source| ClientError::Io {
                addr: self.addr,
                source,
            })
    }

    fn read_reply<T>(
        &mut self,
        expect: Expect,
        f: impl FnOnce(Reply<'_>) -> Result<T, String>,
    ) -> Result<T, ClientError> {
        let addr = self.addr;
        loop {
            match decode_reply(&self.buf[..self.filled], expect, &self.limits) {
                Ok(Decoded::Complete { reply, consumed }) => {
                    let result =
                        f(reply).map_err(|reply| ClientError::UnexpectedReply { addr, reply });
                    self.buf.copy_within(consumed..self.filled, 0);
                    self.filled -= consumed;
                    return result;
                }
                Ok(Decoded::Incomplete) => {}
                Err(source) => return Err(ClientError::Wire { addr, source }),
            }
            if self.filled == self.buf.len() {
                self.buf.resize(self.buf.len() + READ_CHUNK_BYTES, 0);
            }
            match self.stream.read(&mut self.buf[self.filled..]) {
                Ok(0) => return Err(ClientError::Closed { addr }),
                Ok(n) => self.filled += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(source) => return Err(ClientError::Io { addr, source }),
            }
        }
    }
}

/// Waits until `addr` answers `version`, retrying every `retry` until `timeout` has passed.
/// Returns the version string. Never sleeps longer than one retry interval at a time, so a
/// fast server is used as soon as it is up.
pub fn wait_ready(
    addr: SocketAddr,
    timeout: Duration,
    retry: Duration,
) -> Result<String, ClientError> {
    wait_ready_tls(addr, timeout, retry, None)
}

/// [`wait_ready`], over TLS when `tls` is given (a server started with `-Z` answers nothing
/// else).
pub fn wait_ready_tls(
    addr: SocketAddr,
    timeout: Duration,
    retry: Duration,
    tls: Option<&Arc<TlsTarget>>,
) -> Result<String, ClientError> {
    let start = Instant::now();
    loop {
        let remaining = timeout.saturating_sub(start.elapsed());
        let attempt =
            BlockingClient::connect_tls(addr, remaining.max(retry), remaining.max(retry), tls)
                .and_then(|mut c| c.version());
        match attempt {
            Ok(version) => return Ok(version),
            Err(e) if start.elapsed() >= timeout => {
                return Err(ClientError::NotReady {
                    addr,
                    waited: start.elapsed(),
                    last: e.to_string(),
                });
            }
            Err(_) => std::thread::sleep(retry.min(timeout.saturating_sub(start.elapsed()))),
        }
    }
}
