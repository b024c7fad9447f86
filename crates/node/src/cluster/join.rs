//! Becoming a ring member, before the cell serves: binding the peer port, drawing a new
//! ring's identity, and asking a live cell to admit this one (`cluster join` in a `Control`
//! frame on that cell's peer port, after proving the ring's secret when there is one;
//! retried until the join timeout, abandoned promptly on a signal).

use super::transport::PeerAuth;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

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
    #[error(transparent)]
    Call(#[from] OperatorCallError),
    /// A `CLIENT_ERROR` answer: final.
    #[error("{0}")]
    Refused(String),
    /// Any other answer than a map.
    #[error("{0}")]
    Reply(String),
    #[error("the map in the reply")]
    Map(#[from] MapError),
}

impl AttemptError {
    /// The ring refused this cell for a reason a retry cannot change: its secret (a proof
    /// that failed, a peer that wants none or another) or a client error (a ring with a
    /// secret asked without one).
    fn is_final(&self) -> bool {
        match self {
            AttemptError::Refused(_) => true,
            AttemptError::Call(c) => c.is_final(),
            _ => false,
        }
    }
}

/// Asks the cell whose peer port is `join` to admit this cell, retrying until the join
/// timeout; returns the map that has it.
pub(super) fn join_ring(
    join: &str,
    me: &CellAddress,
    parent: Option<&CellId>,
    timeout_ms: u64,
    shutdown: &cellcache_io::Shutdown,
    auth: &PeerAuth,
    wire: &WireConfig,
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
        match try_join(join, me, parent, timeout_ms, auth, wire, shutdown) {
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

fn try_join(
    join: &str,
    me: &CellAddress,
    parent: Option<&CellId>,
    timeout_ms: u64,
    auth: &PeerAuth,
    wire: &WireConfig,
    shutdown: &cellcache_io::Shutdown,
) -> Result<ClusterMap, AttemptError> {
    let timeout = Duration::from_millis(timeout_ms * 5);
    let parent = parent.map(|p| format!(" {p}")).unwrap_or_default();
    let line = format!("cluster join {} {}{parent}", me.client, me.peer);
    let reply = handshake::operator_call(join, auth, wire, &line, timeout, Some(shutdown))?;
    parse_joined(reply.as_bytes())
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

/// A standby cell joins the ring through the cell whose peer port is `via`, as a division of
/// `parent` (an id as `ctl status` prints it); blocking, so callers run it on a thread of its
/// own. The reply is `OK <this cell's id>` or one error line.
pub fn invite(cell: &Arc<Cell>, slot: &Slot, via: &str, parent: &str) -> Vec<u8> {
    let Ok(parent) = parent.parse::<cellcache_cluster::CellId>() else {
        return lines::CLIENT_ERROR_BAD_CELL_ID.to_vec();
    };
    let Some(repl) = slot.standby_repl.lock().take() else {
        return lines::SERVER_ERROR_ALREADY_JOINING.to_vec();
    };
    match super::Cluster::start(cell.clone(), repl, via, Some(&parent), slot) {
        Ok(cl) => {
            let mut reply = Vec::new();
            lines::write_ok_with(&mut reply, cl.me.to_string().as_bytes());
            reply
        }
        Err(e) => {
            let why = crate::error_chain(&e);
            tracing::error!(error = %why, "invitation failed");
            let mut reply = Vec::new();
            Response::ServerError(format!("join failed: {why}").as_bytes()).encode(&mut reply);
            reply
        }
    }
}

/// Whether `join` (`host:port`, a name resolved here, at start) is this cell's own advertised
/// peer address `peer`: then there is no one to join, and the cell starts the ring. This lets
/// every cell of a StatefulSet be given the first pod's address to join (deploy/kubernetes).
pub fn names_this_cell(join: &str, peer: &str) -> bool {
    use std::net::ToSocketAddrs as _;
    if join.is_empty() {
        return false;
    }
    let Ok(mine) = peer.to_socket_addrs() else {
        return false;
    };
    let mine: Vec<SocketAddr> = mine.collect();
    join.to_socket_addrs()
        .is_ok_and(|mut theirs| theirs.any(|a| mine.contains(&a)))
}

#[cfg(test)]
mod tests {
    use super::names_this_cell;

    #[test]
    fn a_join_address_that_is_this_cells_own_starts_the_ring() {
        assert!(names_this_cell("127.0.0.1:21211", "127.0.0.1:21211"));
        assert!(
            names_this_cell("localhost:21211", "127.0.0.1:21211"),
            "a name resolved"
        );
        assert!(!names_this_cell("127.0.0.1:21212", "127.0.0.1:21211"));
        assert!(!names_this_cell("127.0.0.2:21211", "127.0.0.1:21211"));
        assert!(!names_this_cell("", "127.0.0.1:21211"));
        assert!(!names_this_cell(
            "no-such-host.invalid:21211",
            "127.0.0.1:21211"
        ));
    }
}
