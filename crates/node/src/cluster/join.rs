//! Becoming a ring member, before the cell serves: binding the peer port, drawing a new
//! ring's identity, and asking a live cell to admit this one (`cluster join`, retried until
//! the join timeout, abandoned promptly on a signal). With a cluster secret the request goes
//! to the cell's peer port after proving the secret (the client port refuses it); without
//! one, to its client port.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use anyhow::Context;
use cellcache_cluster::auth::Secret;
use cellcache_cluster::wire::WireConfig;
use cellcache_cluster::{CellAddress, CellId, ClusterMap};

use cellcache_proto::{Response, lines};

use super::Slot;
use super::handshake::{self, HandshakeError};
use crate::cell::Cell;
use std::sync::Arc;

/// Binds the peer listener: `port`, or client port + 10000, or any free port.
pub(super) fn bind_peer(client: SocketAddr, port: u16) -> anyhow::Result<std::net::TcpListener> {
    let bind = |p: u16| {
        let l = std::net::TcpListener::bind(SocketAddr::new(client.ip(), p))?;
        l.set_nonblocking(true)?;
        std::io::Result::Ok(l)
    };
    if port != 0 {
        return bind(port).with_context(|| format!("binding the peer port {port}"));
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
    bind(0).context("binding a peer port")
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

/// Asks the cell at `join` (client port) to admit this cell, retrying until the join
/// timeout; returns the map that has it.
pub(super) fn join_ring(
    join: &str,
    me: &CellAddress,
    parent: Option<&CellId>,
    timeout_ms: u64,
    shutdown: &cellcache_io::Shutdown,
    secret: Option<&Secret>,
    wire: &WireConfig,
) -> anyhow::Result<ClusterMap> {
    let deadline = Instant::now() + Duration::from_millis(timeout_ms * 10);
    let abandoned = || {
        anyhow::anyhow!(
            "stopped by a signal while joining the ring through {join}: abandoned the join \
             (if the ring had already admitted this cell, it declares it dead as for a crash)"
        )
    };
    loop {
        match try_join(join, me, parent, timeout_ms, shutdown, secret, wire) {
            Ok(m) => return Ok(m),
            Err(_) if shutdown.is_triggered() => return Err(abandoned()),
            // A wrong or missing secret does not fix itself: say so at once.
            Err(e) if is_final(&e) => {
                return Err(e.context(format!("joining the ring through {join}")));
            }
            Err(e) if Instant::now() < deadline => {
                tracing::info!(error = %e, "join not accepted yet; retrying");
                let retry_at = Instant::now() + Duration::from_millis(300);
                while Instant::now() < retry_at {
                    if shutdown.is_triggered() {
                        return Err(abandoned());
                    }
                    std::thread::sleep(JOIN_SHUTDOWN_POLL);
                }
            }
            Err(e) => return Err(e.context(format!("joining the ring through {join}"))),
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
) -> anyhow::Result<()> {
    s.set_read_timeout(Some(JOIN_SHUTDOWN_POLL))?;
    let deadline = Instant::now() + timeout;
    let mut chunk = [0u8; 4096];
    while !done(buf) {
        anyhow::ensure!(!shutdown.is_triggered(), "interrupted");
        anyhow::ensure!(Instant::now() < deadline, "no answer to the join request");
        match s.read(&mut chunk) {
            Ok(0) => anyhow::bail!("the cell closed the connection"),
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

/// The ring refused this cell for a reason a retry cannot change: its secret (a proof that
/// failed, a peer that wants none or another) or a client error (a ring with a secret
/// asked without one).
fn is_final(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<HandshakeError>().is_some_and(|h| {
            matches!(
                h,
                HandshakeError::Auth(_)
                    | HandshakeError::Refused(_)
                    | HandshakeError::Unexpected(..)
            )
        }) || c.downcast_ref::<Refusal>().is_some()
    })
}

/// A `CLIENT_ERROR` answer to `cluster join`: final.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Refusal(String);

fn try_join(
    join: &str,
    me: &CellAddress,
    parent: Option<&CellId>,
    timeout_ms: u64,
    shutdown: &cellcache_io::Shutdown,
    secret: Option<&Secret>,
    wire: &WireConfig,
) -> anyhow::Result<ClusterMap> {
    let timeout = Duration::from_millis(timeout_ms * 5);
    let parent = parent.map(|p| format!(" {p}")).unwrap_or_default();
    let line = format!("cluster join {} {}{parent}", me.client, me.peer);
    let buf = match secret {
        Some(secret) => {
            let peer = peer_address_of(join, timeout)?;
            handshake::operator_call(&peer, secret, wire, &line, timeout)?.into_bytes()
        }
        None => client_port_join(join, &line, timeout, shutdown)?,
    };
    parse_joined(&buf)
}

/// The peer address of the cell whose client address is `client`, from its `cluster status`
/// (its `SELF` id's `CELL` line).
pub fn peer_address_of(client: &str, timeout: Duration) -> anyhow::Result<String> {
    let mut s = TcpStream::connect(client).with_context(|| format!("connecting to {client}"))?;
    s.set_read_timeout(Some(timeout))?;
    s.write_all(b"cluster status\r\n")?;
    let mut text = String::new();
    let mut chunk = [0u8; 4096];
    while !text.contains("END\r\n") && !text.starts_with("SERVER_ERROR") {
        let n = s.read(&mut chunk)?;
        anyhow::ensure!(n > 0, "{client} closed the connection");
        text.push_str(&String::from_utf8_lossy(&chunk[..n]));
        anyhow::ensure!(text.len() < 1 << 20, "cluster status of {client} too long");
    }
    let me = text
        .lines()
        .next()
        .and_then(|l| l.split(' ').skip_while(|w| *w != "SELF").nth(1))
        .with_context(|| format!("no SELF in the cluster status of {client}: {text}"))?
        .to_string();
    text.lines()
        .find(|l| l.split(' ').nth(1) == Some(me.as_str()) && l.starts_with("CELL "))
        .and_then(|l| l.split(' ').find_map(|w| w.strip_prefix("peer=")))
        .map(str::to_string)
        .with_context(|| format!("no peer address of cell {me} in the status of {client}"))
}

/// `cluster join` on the client port of `join`: its whole reply.
fn client_port_join(
    join: &str,
    line: &str,
    timeout: Duration,
    shutdown: &cellcache_io::Shutdown,
) -> anyhow::Result<Vec<u8>> {
    let mut s = TcpStream::connect(join)?;
    write!(s, "{line}\r\n")?;
    let mut buf = Vec::new();
    read_until(&mut s, &mut buf, timeout, shutdown, |b| b.contains(&b'\n'))?;
    let eol = buf
        .iter()
        .position(|&b| b == b'\n')
        .expect("read up to a line end");
    let line = String::from_utf8_lossy(&buf[..=eol]).into_owned();
    if let Some(len) = line.strip_prefix("JOINED ") {
        let len: usize = len.trim_end().parse().context("bad JOINED line")?;
        anyhow::ensure!(
            len <= cellcache_cluster::map::MAP_BYTES_MAX_DEFAULT,
            "map too large"
        );
        let start = eol + 1;
        read_until(&mut s, &mut buf, timeout, shutdown, |b| {
            b.len() >= start + len + 2
        })?;
    }
    Ok(buf)
}

/// The map in a `JOINED <len>\r\n<map>\r\n` reply; any other reply is the error.
fn parse_joined(buf: &[u8]) -> anyhow::Result<ClusterMap> {
    let eol = buf
        .iter()
        .position(|&b| b == b'\n')
        .context("a join reply without a line end")?;
    let line = String::from_utf8_lossy(&buf[..=eol]).into_owned();
    let Some(len) = line.strip_prefix("JOINED ") else {
        if line.starts_with("CLIENT_ERROR") {
            return Err(Refusal(line.trim_end().to_string()).into());
        }
        anyhow::bail!("{}", line.trim_end());
    };
    let len: usize = len.trim_end().parse().context("bad JOINED line")?;
    let start = eol + 1;
    let map = buf
        .get(start..start + len)
        .context("a join reply shorter than its map")?;
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
            tracing::error!(error = %e, "invitation failed");
            let mut reply = Vec::new();
            Response::ServerError(format!("join failed: {e:#}").as_bytes()).encode(&mut reply);
            reply
        }
    }
}
