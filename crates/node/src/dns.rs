//! The DNS entry point (`[dns]`, `--dns-port`, `--cluster-name`): a cell answers DNS for its
//! ring's name, so a client can find the ring the way it finds any service, and follow cells
//! as they come and go (short TTLs). Built on hickory-server (UDP and TCP); the answers come
//! from the map this cell has installed:
//!
//! - `NAME` A / AAAA: the client addresses of the ring's Active cells, in random order;
//! - `_memcache._tcp.NAME` SRV: one record per Active cell — priority 0, weight 1, its client
//!   port, target `cell-ID.NAME` — with the targets' addresses in the additional section;
//! - `cell-ID.NAME` A / AAAA: one cell's address (a cell id's `.` is written `-`);
//! - any other name: NXDOMAIN; another type of a name above: an empty answer (NODATA).
//!
//! A cell advertised by a host name instead of an IP address has no A/AAAA record (its SRV
//! target still names it). A cell outside a ring answers for itself.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use hickory_server::ServerFuture;
use hickory_server::authority::MessageResponseBuilder;
use hickory_server::proto::op::{Header, MessageType, OpCode, ResponseCode};
use hickory_server::proto::rr::rdata::{A, AAAA, SRV};
use hickory_server::proto::rr::{Name, RData, Record, RecordType};
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use rand::seq::SliceRandom as _;

use crate::cell::Cell;
use crate::cluster::Slot;
use crate::config::DnsConfig;

/// Why the DNS listener could not start.
#[derive(Debug, thiserror::Error)]
pub enum DnsError {
    #[error("binding the DNS port {addr} (dns.port, --dns-port)")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("dns.name {0:?} (--cluster-name) is not a domain name")]
    Name(String),
    #[error("starting the DNS thread")]
    Thread(#[source] std::io::Error),
}

/// One cell as DNS shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsCell {
    /// The cell's id, as a DNS label (`1.5` → `1-5`).
    pub label: String,
    /// Its client address's IP, if it is advertised by one.
    pub ip: Option<IpAddr>,
    pub port: u16,
}

/// What to answer one question.
#[derive(Debug, Default)]
pub struct Answer {
    pub code: ResponseCode,
    pub answers: Vec<Record>,
    pub additionals: Vec<Record>,
}

fn address_record(name: &Name, ip: IpAddr, ttl: u32) -> Record {
    let rdata = match ip {
        IpAddr::V4(v4) => RData::A(A(v4)),
        IpAddr::V6(v6) => RData::AAAA(AAAA(v6)),
    };
    Record::from_rdata(name.clone(), ttl, rdata)
}

fn wants(qtype: RecordType, ip: IpAddr) -> bool {
    match qtype {
        RecordType::A => ip.is_ipv4(),
        RecordType::AAAA => ip.is_ipv6(),
        RecordType::ANY => true,
        _ => false,
    }
}

/// The answer to `qname` (lower case, fully qualified: ending in `.`) of type `qtype` for the
/// ring named `origin` (lower case, ending in `.`) whose Active cells are `cells`, in the
/// order given (the caller shuffles them).
pub fn answer(qname: &str, qtype: RecordType, origin: &str, cells: &[DnsCell], ttl: u32) -> Answer {
    let mut out = Answer::default();
    let Ok(name) = Name::from_ascii(qname) else {
        out.code = ResponseCode::FormErr;
        return out;
    };
    let cell_name = |c: &DnsCell| Name::from_ascii(format!("cell-{}.{origin}", c.label)).ok();
    if qname == origin {
        // One record per address: cells sharing a host (and so an IP) are one record.
        let mut ips: Vec<IpAddr> = Vec::new();
        for ip in cells.iter().filter_map(|c| c.ip) {
            if wants(qtype, ip) && !ips.contains(&ip) {
                ips.push(ip);
            }
        }
        out.answers = ips
            .into_iter()
            .map(|ip| address_record(&name, ip, ttl))
            .collect();
    } else if qname == format!("_memcache._tcp.{origin}") {
        if matches!(qtype, RecordType::SRV | RecordType::ANY) {
            for c in cells {
                let Some(target) = cell_name(c) else { continue };
                let srv = SRV::new(0, 1, c.port, target.clone());
                out.answers
                    .push(Record::from_rdata(name.clone(), ttl, RData::SRV(srv)));
                if let Some(ip) = c.ip {
                    out.additionals.push(address_record(&target, ip, ttl));
                }
            }
        }
    } else if let Some(label) = qname
        .strip_suffix(origin)
        .and_then(|l| l.strip_prefix("cell-"))
        .and_then(|l| l.strip_suffix('.'))
    {
        match cells.iter().find(|c| c.label == label) {
            Some(c) => {
                out.answers =
                    c.ip.filter(|ip| wants(qtype, *ip))
                        .map(|ip| address_record(&name, ip, ttl))
                        .into_iter()
                        .collect();
            }
            None => out.code = ResponseCode::NXDomain,
        }
    } else {
        out.code = ResponseCode::NXDomain;
    }
    out
}

/// The Active cells this cell knows of (itself, outside a ring).
fn live_cells(cell: &Cell, ring: &Slot) -> Vec<DnsCell> {
    match ring.cluster.get() {
        Some(cl) => {
            let (_, cells) = cl.live_cells();
            cells
                .into_iter()
                .map(|c| DnsCell {
                    label: c.id.replace('.', "-"),
                    ip: c.ip,
                    port: c.port,
                })
                .collect()
        }
        None => {
            let here = cell.config.server.addrs()[0];
            vec![DnsCell {
                label: "1".into(),
                ip: Some(here.ip()),
                port: here.port(),
            }]
        }
    }
}

struct Handler {
    cell: Arc<Cell>,
    ring: Arc<Slot>,
    origin: String,
    ttl: u32,
}

#[async_trait::async_trait]
impl RequestHandler for Handler {
    async fn handle_request<R: ResponseHandler>(
        &self,
        request: &Request,
        mut response: R,
    ) -> ResponseInfo {
        let builder = MessageResponseBuilder::from_message_request(request);
        let refuse = |code| {
            let mut header = Header::response_from_request(request.header());
            header.set_response_code(code);
            header
        };
        if request.op_code() != OpCode::Query || request.message_type() != MessageType::Query {
            let header = refuse(ResponseCode::NotImp);
            let sent = response
                .send_response(builder.error_msg(request.header(), ResponseCode::NotImp))
                .await;
            return sent.unwrap_or_else(|_| header.into());
        }
        let Ok(info) = request.request_info() else {
            let header = refuse(ResponseCode::FormErr);
            let sent = response
                .send_response(builder.error_msg(request.header(), ResponseCode::FormErr))
                .await;
            return sent.unwrap_or_else(|_| header.into());
        };
        let qname = info.query.name().to_string().to_ascii_lowercase();
        let mut cells = live_cells(&self.cell, &self.ring);
        cells.shuffle(&mut rand::thread_rng());
        let a = answer(
            &qname,
            info.query.query_type(),
            &self.origin,
            &cells,
            self.ttl,
        );
        let mut header = Header::response_from_request(request.header());
        header.set_authoritative(true);
        header.set_response_code(a.code);
        let message = builder.build(header, a.answers.iter(), [], [], a.additionals.iter());
        response
            .send_response(message)
            .await
            .unwrap_or_else(|_| header.into())
    }
}

/// A running DNS listener; stops when dropped.
pub struct Dns {
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Dns {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The DNS listener's sockets, bound before the cell joins its ring (a taken port fails the
/// start then).
pub struct Prepared {
    udp: std::net::UdpSocket,
    tcp: std::net::TcpListener,
    config: DnsConfig,
    origin: String,
}

/// Binds the DNS port (UDP and TCP) if `config.port` is set.
pub fn prepare(config: &DnsConfig) -> Result<Option<Prepared>, DnsError> {
    if config.port == 0 {
        return Ok(None);
    }
    let origin = format!("{}.", config.name.trim_end_matches('.')).to_ascii_lowercase();
    if Name::from_ascii(&origin).is_err() || origin == "." {
        return Err(DnsError::Name(config.name.clone()));
    }
    let addr = SocketAddr::new(config.listen, config.port);
    let bind_error = |source| DnsError::Bind { addr, source };
    let udp = std::net::UdpSocket::bind(addr).map_err(bind_error)?;
    let tcp = std::net::TcpListener::bind(addr).map_err(bind_error)?;
    udp.set_nonblocking(true).map_err(bind_error)?;
    tcp.set_nonblocking(true).map_err(bind_error)?;
    Ok(Some(Prepared {
        udp,
        tcp,
        config: config.clone(),
        origin,
    }))
}

/// Serves DNS on the prepared sockets from a thread of its own.
pub fn start(
    prepared: Option<Prepared>,
    cell: Arc<Cell>,
    ring: Arc<Slot>,
) -> Result<Option<Dns>, DnsError> {
    let Some(p) = prepared else { return Ok(None) };
    let addr = p.udp.local_addr().map_err(|source| DnsError::Bind {
        addr: SocketAddr::new(p.config.listen, p.config.port),
        source,
    })?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let handler = Handler {
        cell,
        ring,
        origin: p.origin.clone(),
        ttl: p.config.ttl_secs,
    };
    let timeout = Duration::from_millis(p.config.tcp_timeout_ms);
    let thread = std::thread::Builder::new()
        .name("cellcache-dns".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(r) => r,
                Err(e) => {
                    tracing::error!(error = %e, "DNS runtime");
                    return;
                }
            };
            runtime.block_on(async move {
                let mut server = ServerFuture::new(handler);
                match (
                    tokio::net::UdpSocket::from_std(p.udp),
                    tokio::net::TcpListener::from_std(p.tcp),
                ) {
                    (Ok(udp), Ok(tcp)) => {
                        server.register_socket(udp);
                        server.register_listener(tcp, timeout);
                    }
                    (Err(e), _) | (_, Err(e)) => {
                        tracing::error!(error = %e, "DNS sockets");
                        return;
                    }
                }
                let _ = stopped.await;
                let _ = server.shutdown_gracefully().await;
            });
        })
        .map_err(DnsError::Thread)?;
    tracing::info!(%addr, name = %p.origin, "DNS entry point bound");
    Ok(Some(Dns {
        addr,
        stop: Some(stop),
        thread: Some(thread),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ORIGIN: &str = "cache.cellcache.local.";

    fn cells() -> Vec<DnsCell> {
        vec![
            DnsCell {
                label: "1".into(),
                ip: Some("10.0.0.1".parse().unwrap()),
                port: 11211,
            },
            DnsCell {
                label: "1-5".into(),
                ip: Some("fd00::2".parse().unwrap()),
                port: 11212,
            },
            DnsCell {
                label: "2".into(),
                ip: None,
                port: 11213,
            },
        ]
    }

    fn rdata(a: &Answer) -> Vec<String> {
        a.answers.iter().map(|r| r.data().to_string()).collect()
    }

    #[test]
    fn the_name_has_every_cells_address_of_the_asked_family() {
        let a = answer(ORIGIN, RecordType::A, ORIGIN, &cells(), 5);
        assert_eq!(a.code, ResponseCode::NoError);
        assert_eq!(rdata(&a), ["10.0.0.1"]);
        assert_eq!(a.answers[0].ttl(), 5);
        let aaaa = answer(ORIGIN, RecordType::AAAA, ORIGIN, &cells(), 5);
        assert_eq!(rdata(&aaaa), ["fd00::2"]);
        let mx = answer(ORIGIN, RecordType::MX, ORIGIN, &cells(), 5);
        assert_eq!((mx.code, mx.answers.len()), (ResponseCode::NoError, 0));
    }

    #[test]
    fn srv_lists_every_cell_with_its_port_and_target() {
        let q = format!("_memcache._tcp.{ORIGIN}");
        let a = answer(&q, RecordType::SRV, ORIGIN, &cells(), 5);
        assert_eq!(
            rdata(&a),
            [
                "0 1 11211 cell-1.cache.cellcache.local.",
                "0 1 11212 cell-1-5.cache.cellcache.local.",
                "0 1 11213 cell-2.cache.cellcache.local.",
            ]
        );
        // The targets' addresses, for the two cells advertised by an IP.
        assert_eq!(a.additionals.len(), 2);
    }

    #[test]
    fn a_cells_own_name_and_nxdomain_for_the_rest() {
        let a = answer(
            &format!("cell-1-5.{ORIGIN}"),
            RecordType::AAAA,
            ORIGIN,
            &cells(),
            5,
        );
        assert_eq!(rdata(&a), ["fd00::2"]);
        for other in [
            format!("cell-9.{ORIGIN}"),
            "example.com.".to_string(),
            format!("x.{ORIGIN}"),
            "cellcache.local.".to_string(),
        ] {
            let a = answer(&other, RecordType::A, ORIGIN, &cells(), 5);
            assert_eq!(a.code, ResponseCode::NXDomain, "{other}");
        }
    }
}
