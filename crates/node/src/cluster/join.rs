//! Becoming a ring member, before the cell serves: binding the peer port, drawing a new
//! ring's identity, and asking a live cell to admit this one (`cluster join`, retried until
//! the join timeout, abandoned promptly on a signal). With a cluster secret the request goes
//! to the cell's peer port after proving the secret (the client port refuses it); without
//! one, to its client port.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use cellcache_cluster::auth::Secret;
use cellcache_cluster::wire::WireConfig;
use cellcache_cluster::{CellAddress, CellId, ClusterMap, MapError};

use cellcache_proto::{Response, lines};

use super::Slot;
use super::handshake::{self, OperatorCallError};
use crate::cell::Cell;
use std::sync::Arc;

/// Binds the peer listener: `port`, or client port + 10000, or any free port.
pub(super) fn bind_peer(client: SocketAddr, port: u16) -> Result<std::net::TcpListener, JoinError> {
    let bind = |p: u16| {
        let l = std::net::TcpListener::bind(SocketAddr::new(client.ip(), p))?;
        l.set_nonblocking(true)?;
        std::io::Result::Ok(l)
    };
    if port != 0 {
        return bind(port).map_err(|source| JoinError::BindPeer { port, source });
    }
    if let Some(p) = client
        .port()
        .checked_add(10_000)
        .filter(|_| client.port() != 0)
    {
        if let Ok(l) = bind(p) {
            return Ok(l);
        }
    }
    bind(0).map_err(|source| JoinError::BindPeer { port: 0, source })
}

/// A random ring identity: the clock's nanoseconds mixed with this process's id and a
/// per-process random state, never 0 (0 is a map from before ring identities).
pub(super) fn new_ring_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.write_u32(std::process::id());
    h.finish().max(1)
}

/// How often a blocked join looks at the shutdown flag: a signal stops a joining cell
/// within about this long (plus one connect attempt), not after the whole join timeout.
const JOIN_SHUTDOWN_POLL: Duration = Duration::from_millis(100);

/// Why this cell could not become a member of a ring.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    /// Port 0: any free port was asked for.
    #[error("binding the peer port {port}")]
    BindPeer {
        port: u16,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "stopped by a signal while joining the ring through {via}: abandoned the join (if the \
         ring had already admitted this cell, it declares it dead as for a crash)"
    )]
    Abandoned { via: String },
    #[error("joining the ring through {via}")]
    Failed {
        via: String,
        #[source]
        source: AttemptError,
    },
}

/// Why one request to be admitted got no map back.
#[derive(Debug, thiserror::Error)]
pub enum AttemptError {
    #[error("connection")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Status(#[from] StatusError),
    #[error(transparent)]
    Call(#[from] OperatorCallError),
    /// A `CLIENT_ERROR` answer: final.
    #[error("{0}")]
    Refused(String),
    /// Any other answer than a map.
    #[error("{0}")]
    Reply(String),
    #[error("interrupted")]
    Interrupted,
    #[error("no answer to the join request")]
    NoAnswer,
    #[error("the cell closed the connection")]
    Closed,
    #[error("the map in the reply")]
    Map(#[from] MapError),
}

impl AttemptError {
    /// The ring refused this cell for a reason a retry cannot change: its secret (a proof
    /// that failed, a peer that wants none or another), its login (another auth file) or a
    /// client error (a ring with a secret asked without one).
    fn is_final(&self) -> bool {
        let denied = |e: &std::io::Error| e.kind() == std::io::ErrorKind::PermissionDenied;
        match self {
            AttemptError::Refused(_) => true,
            AttemptError::Call(c) => c.is_final(),
            AttemptError::Io(e) | AttemptError::Status(StatusError::Io { source: e, .. }) => {
                denied(e)
            }
            _ => false,
        }
    }
}

/// How this cell calls the cell it joins through: the ring's secret and frame limits (for
/// its peer port) and the login its client port may want (`server.auth_file`).
pub(super) struct Calling<'a> {
    pub secret: Option<&'a Secret>,
    pub wire: &'a WireConfig,
    pub login: Option<&'a [u8]>,
}

/// Why a cell's `cluster status` did not give its peer address.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    #[error("asking {client} for its cluster status")]
    Io {
        client: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{client} closed the connection")]
    Closed { client: String },
    #[error("cluster status of {client} too long")]
    TooLong { client: String },
    #[error("no SELF in the cluster status of {client}: {text}")]
    NoSelf { client: String, text: String },
    #[error("no peer address of cell {cell} in the status of {client}")]
    NoPeer { client: String, cell: String },
}

/// Asks the cell at `join` (client port) to admit this cell, retrying until the join
/// timeout; returns the map that has it.
pub(super) fn join_ring(
    join: &str,
    me: &CellAddress,
    parent: Option<&CellId>,
    timeout_ms: u64,
    shutdown: &cellcache_io::Shutdown,
    calling: &Calling<'_>,
) -> Result<ClusterMap, JoinError> {
    let deadline = Instant::now() + Duration::from_millis(timeout_ms * 10);
    let abandoned = || JoinError::Abandoned {
        via: join.to_string(),
    };
    let failed = |source| JoinError::Failed {
        via: join.to_string(),
        source,
    };
    loop {
        match try_join(join, me, parent, timeout_ms, shutdown, calling) {
            Ok(m) => return Ok(m),
            Err(_) if shutdown.is_triggered() => return Err(abandoned()),
            // A wrong or missing secret does not fix itself: say so at once.
            Err(e) if e.is_final() => return Err(failed(e)),
            Err(e) if Instant::now() < deadline => {
                tracing::info!(error = %crate::error_chain(&e), "join not accepted yet; retrying");
                let retry_at = Instant::now() + Duration::from_millis(300);
                while Instant::now() < retry_at {
                    if shutdown.is_triggered() {
                        return Err(abandoned());
                    }
                    std::thread::sleep(JOIN_SHUTDOWN_POLL);
                }
            }
            Err(e) => return Err(failed(e)),
        }
    }
}

/// Reads into `buf` until `done(buf)` holds, in slices of [`JOIN_SHUTDOWN_POLL`], giving up
/// after `timeout` or once `shutdown` is triggered.
fn read_until(
    s: &mut TcpStream,
    buf: &mut Vec<u8>,
    timeout: Duration,
    shutdown: &cellcache_io::Shutdown,
    done: impl Fn(&[u8]) -> bool,
) -> Result<(), AttemptError> {
    s.set_read_timeout(Some(JOIN_SHUTDOWN_POLL))?;
    let deadline = Instant::now() + timeout;
    let mut chunk = [0u8; 4096];
    while !done(buf) {
        if shutdown.is_triggered() {
            return Err(AttemptError::Interrupted);
        }
        if Instant::now() >= deadline {
            return Err(AttemptError::NoAnswer);
        }
        match s.read(&mut chunk) {
            Ok(0) => return Err(AttemptError::Closed),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

fn try_join(
    join: &str,
    me: &CellAddress,
    parent: Option<&CellId>,
    timeout_ms: u64,
    shutdown: &cellcache_io::Shutdown,
    calling: &Calling<'_>,
) -> Result<ClusterMap, AttemptError> {
    let timeout = Duration::from_millis(timeout_ms * 5);
    let parent = parent.map(|p| format!(" {p}")).unwrap_or_default();
    let line = format!("cluster join {} {}{parent}", me.client, me.peer);
    let buf = match calling.secret {
        Some(secret) => {
            let peer = peer_address_of(join, timeout, calling.login)?;
            handshake::operator_call(&peer, secret, calling.wire, &line, timeout)?.into_bytes()
        }
        None => client_port_join(join, &line, timeout, shutdown, calling.login)?,
    };
    parse_joined(&buf)
}

/// The peer address of the cell whose client address is `client`, from its `cluster status`
/// (its `SELF` id's `CELL` line), asked after `login` if the cell wants one.
pub fn peer_address_of(
    client: &str,
    timeout: Duration,
    login: Option<&[u8]>,
) -> Result<String, StatusError> {
    let io = |source| StatusError::Io {
        client: client.to_string(),
        source,
    };
    let mut s = TcpStream::connect(client).map_err(io)?;
    s.set_read_timeout(Some(timeout)).map_err(io)?;
    crate::credentials::log_in(&mut s, login).map_err(io)?;
    s.write_all(b"cluster status\r\n").map_err(io)?;
    let mut text = String::new();
    let mut chunk = [0u8; 4096];
    while !text.contains("END\r\n") && !text.starts_with("SERVER_ERROR") {
        let n = s.read(&mut chunk).map_err(io)?;
        if n == 0 {
            return Err(StatusError::Closed {
                client: client.to_string(),
            });
        }
        text.push_str(&String::from_utf8_lossy(&chunk[..n]));
        if text.len() >= 1 << 20 {
            return Err(StatusError::TooLong {
                client: client.to_string(),
            });
        }
    }
    let Some(me) = text
        .lines()
        .next()
        .and_then(|l| l.split(' ').skip_while(|w| *w != "SELF").nth(1))
        .map(str::to_string)
    else {
        return Err(StatusError::NoSelf {
            client: client.to_string(),
            text,
        });
    };
    text.lines()
        .find(|l| l.split(' ').nth(1) == Some(me.as_str()) && l.starts_with("CELL "))
        .and_then(|l| l.split(' ').find_map(|w| w.strip_prefix("peer=")))
        .map(str::to_string)
        .ok_or(StatusError::NoPeer {
            client: client.to_string(),
            cell: me,
        })
}

/// `cluster join` on the client port of `join` (after `login` if it wants one): its whole
/// reply.
fn client_port_join(
    join: &str,
    line: &str,
    timeout: Duration,
    shutdown: &cellcache_io::Shutdown,
    login: Option<&[u8]>,
) -> Result<Vec<u8>, AttemptError> {
    let mut s = TcpStream::connect(join)?;
    s.set_read_timeout(Some(timeout))?;
    crate::credentials::log_in(&mut s, login)?;
    write!(s, "{line}\r\n")?;
    let mut buf = Vec::new();
    read_until(&mut s, &mut buf, timeout, shutdown, |b| b.contains(&b'\n'))?;
    let eol = buf
        .iter()
        .position(|&b| b == b'\n')
        .expect("read up to a line end");
    let line = String::from_utf8_lossy(&buf[..=eol]).into_owned();
    if let Some(len) = line.strip_prefix("JOINED ") {
        let len = joined_len(len)?;
        let start = eol + 1;
        read_until(&mut s, &mut buf, timeout, shutdown, |b| {
            b.len() >= start + len + 2
        })?;
    }
    Ok(buf)
}

/// The map length of a `JOINED <len>` line, at most the largest map a cell accepts.
fn joined_len(len: &str) -> Result<usize, AttemptError> {
    match len.trim_end().parse::<usize>() {
        Ok(n) if n <= cellcache_cluster::map::MAP_BYTES_MAX_DEFAULT => Ok(n),
        Ok(_) => Err(AttemptError::Reply("map too large".into())),
        Err(_) => Err(AttemptError::Reply(format!("bad JOINED line: {len}"))),
    }
}

/// The map in a `JOINED <len>\r\n<map>\r\n` reply; any other reply is the error.
fn parse_joined(buf: &[u8]) -> Result<ClusterMap, AttemptError> {
    let Some(eol) = buf.iter().position(|&b| b == b'\n') else {
        return Err(AttemptError::Reply(
            "a join reply without a line end".into(),
        ));
    };
    let line = String::from_utf8_lossy(&buf[..=eol]).into_owned();
    let Some(len) = line.strip_prefix("JOINED ") else {
        let line = line.trim_end().to_string();
        return Err(if line.starts_with("CLIENT_ERROR") {
            AttemptError::Refused(line)
        } else {
            AttemptError::Reply(line)
        });
    };
    let len = joined_len(len)?;
    let start = eol + 1;
    let map = buf
        .get(start..start + len)
        .ok_or_else(|| AttemptError::Reply("a join reply shorter than its map".into()))?;
    Ok(ClusterMap::decode(
        map,
        cellcache_cluster::map::MAP_BYTES_MAX_DEFAULT,
    )?)
}

/// `cluster invite <ring-cell client address> <parent id>` on a standby cell: joins the ring
/// as a division of the parent (blocking; runs on its own thread).
pub fn invite(cell: &Arc<Cell>, slot: &Slot, line: &str) -> Vec<u8> {
    let words: Vec<&str> = line.split_ascii_whitespace().collect();
    let ["cluster", "invite", ring, parent] = words.as_slice() else {
        return lines::SERVER_ERROR_STANDBY_INVITE_ONLY.to_vec();
    };
    let Ok(parent) = parent.parse::<cellcache_cluster::CellId>() else {
        return lines::CLIENT_ERROR_BAD_CELL_ID.to_vec();
    };
    let Some(repl) = slot.standby_repl.lock().take() else {
        return lines::SERVER_ERROR_ALREADY_JOINING.to_vec();
    };
    match super::Cluster::start(cell.clone(), repl, ring, Some(&parent), slot) {
        Ok(cl) => {
            let mut reply = Vec::new();
            lines::write_ok_with(&mut reply, cl.me.to_string().as_bytes());
            reply
        }
        Err(e) => {
            tracing::error!(error = %crate::error_chain(&e), "invitation failed");
            let mut reply = Vec::new();
            let why = crate::error_chain(&e);
            Response::ServerError(format!("join failed: {why}").as_bytes()).encode(&mut reply);
            reply
        }
    }
}
