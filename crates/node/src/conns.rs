//! The cell's registry of client connections, for memcached's `stats conns`.
//!
//! Each connection registers when its session opens and leaves when the session is dropped
//! (after the engine closed it). What is reported is what the I/O layer tells a session
//! ([`cellcache_io::Accepted`]: peer, listener, descriptor) plus two fields the session
//! keeps up to date itself: its state and when it last consumed a request. memcached names
//! each line by the socket's descriptor; so does cellcache.
//!
//! Concurrency: the map is behind one mutex, taken when a connection opens or closes and
//! by `stats conns`; a session updates its own [`ConnState`] with relaxed atomics on the
//! request path (no lock). The map is bounded by the engine's connection limit.

use cellcache_io::{Accepted, Listening};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering::Relaxed};

/// What a connection is doing, in memcached's state names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    /// Waiting for input, nothing buffered (`conn_read`, as memcached reports an idle one).
    Read = 0,
    /// Handling input (`conn_parse_cmd`): the connection asking `stats conns` is in it.
    ParseCmd = 1,
    /// Holding part of a request, waiting for the rest (`conn_nread`).
    Nread = 2,
    /// Stopped at the `-R` limit with input left, waiting for its next turn
    /// (`conn_new_cmd`, where memcached's connection waits then).
    NewCmd = 3,
}

impl Phase {
    fn name(v: u8) -> &'static str {
        match v {
            1 => "conn_parse_cmd",
            2 => "conn_nread",
            3 => "conn_new_cmd",
            _ => "conn_read",
        }
    }
}

/// The fields a session updates for `stats conns`.
#[derive(Debug, Default)]
pub struct ConnState {
    phase: AtomicU8,
    /// Unix seconds when the connection last consumed a request (or opened).
    last_cmd_secs: AtomicU32,
}

impl ConnState {
    pub fn set_phase(&self, phase: Phase) {
        self.phase.store(phase as u8, Relaxed);
    }

    pub fn command_at(&self, now: u32) {
        self.last_cmd_secs.store(now, Relaxed);
    }
}

struct Entry {
    accepted: Accepted,
    state: Arc<ConnState>,
}

/// Every open client connection and the listeners, of one cell.
#[derive(Default)]
pub struct ConnRegistry {
    next_id: AtomicU64,
    /// Lock order: a leaf lock, see `cluster::Cluster`.
    conns: Mutex<HashMap<u64, Entry>>,
    /// Lock order: a leaf lock, see `cluster::Cluster`.
    listeners: Mutex<Vec<Listening>>,
}

/// A connection's membership in the registry; leaving it (drop) unregisters.
pub struct Registration {
    id: u64,
    pub state: Arc<ConnState>,
}

impl ConnRegistry {
    /// Records the engine's listeners (once it runs).
    pub fn set_listeners(&self, listeners: &[Listening]) {
        *self.listeners.lock() = listeners.to_vec();
    }

    pub fn open(&self, accepted: Accepted, now: u32) -> Registration {
        let id = self.next_id.fetch_add(1, Relaxed);
        let state = Arc::new(ConnState::default());
        state.command_at(now);
        self.conns.lock().insert(
            id,
            Entry {
                accepted,
                state: state.clone(),
            },
        );
        Registration { id, state }
    }

    pub fn close(&self, registration: &Registration) {
        self.conns.lock().remove(&registration.id);
    }

    /// memcached's `stats conns` lines (without `END`), by descriptor: each listener's
    /// `addr`, `state conn_listening` and `secs_since_last_cmd` (the cell's uptime), each
    /// connection's `addr`, `listen_addr`, `state` and `secs_since_last_cmd`.
    pub fn write_stats(&self, now: u32, uptime_secs: u64, out: &mut Vec<u8>) {
        use cellcache_proto::write_stat as stat;
        let mut lines: Vec<(i32, Vec<u8>)> = Vec::new();
        for l in self.listeners.lock().iter() {
            let fd = l.fd;
            let mut text = Vec::new();
            stat(&mut text, &format!("{fd}:addr"), wire_addr(l.addr));
            stat(&mut text, &format!("{fd}:state"), "conn_listening");
            stat(&mut text, &format!("{fd}:secs_since_last_cmd"), uptime_secs);
            lines.push((fd, text));
        }
        for e in self.conns.lock().values() {
            let a = &e.accepted;
            let fd = a.fd;
            let idle = now.saturating_sub(e.state.last_cmd_secs.load(Relaxed));
            let mut text = Vec::new();
            stat(&mut text, &format!("{fd}:addr"), wire_addr(a.peer));
            stat(
                &mut text,
                &format!("{fd}:listen_addr"),
                wire_addr(a.listener),
            );
            let state = Phase::name(e.state.phase.load(Relaxed));
            stat(&mut text, &format!("{fd}:state"), state);
            stat(&mut text, &format!("{fd}:secs_since_last_cmd"), idle);
            lines.push((fd, text));
        }
        lines.sort_by_key(|(fd, _)| *fd);
        for (_, text) in lines {
            out.extend_from_slice(&text);
        }
    }
}

/// memcached's address form: `tcp:1.2.3.4:11211`, `tcp6:[::1]:11211`.
fn wire_addr(addr: SocketAddr) -> String {
    match addr {
        SocketAddr::V4(a) => format!("tcp:{a}"),
        SocketAddr::V6(a) => format!("tcp6:[{}]:{}", a.ip(), a.port()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_listeners_and_connections_by_descriptor() {
        let r = ConnRegistry::default();
        r.set_listeners(&[Listening {
            addr: "127.0.0.1:11211".parse().unwrap(),
            fd: 7,
        }]);
        let accepted = |fd, port| Accepted {
            peer: SocketAddr::from(([127, 0, 0, 1], port)),
            listener: "127.0.0.1:11211".parse().unwrap(),
            fd,
        };
        let b = r.open(accepted(12, 5000), 100);
        let a = r.open(accepted(9, 4000), 100);
        a.state.set_phase(Phase::ParseCmd);
        b.state.set_phase(Phase::Nread);
        let mut out = Vec::new();
        r.write_stats(103, 50, &mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "STAT 7:addr tcp:127.0.0.1:11211\r\nSTAT 7:state conn_listening\r\n\
             STAT 7:secs_since_last_cmd 50\r\n\
             STAT 9:addr tcp:127.0.0.1:4000\r\nSTAT 9:listen_addr tcp:127.0.0.1:11211\r\n\
             STAT 9:state conn_parse_cmd\r\nSTAT 9:secs_since_last_cmd 3\r\n\
             STAT 12:addr tcp:127.0.0.1:5000\r\nSTAT 12:listen_addr tcp:127.0.0.1:11211\r\n\
             STAT 12:state conn_nread\r\nSTAT 12:secs_since_last_cmd 3\r\n"
        );
        r.close(&a);
        r.close(&b);
        let mut out = Vec::new();
        r.write_stats(103, 50, &mut out);
        assert!(!String::from_utf8(out).unwrap().contains("9:addr"));
        assert_eq!(wire_addr("[::1]:80".parse().unwrap()), "tcp6:[::1]:80");
    }
}
