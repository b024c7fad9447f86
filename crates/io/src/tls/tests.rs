//! The TLS layer driven in memory: a rustls client on one side, a [`TlsSession`] around a
//! line-echo session on the other, bytes moved by hand.

use super::*;
use rustls::ClientConnection;
use rustls::pki_types::ServerName;
use std::path::PathBuf;
use std::sync::atomic::AtomicUsize;

/// Answers every complete `\n`-terminated line with the line in upper case; stops once the
/// output reached its budget.
struct Upper;

impl Session for Upper {
    fn on_input(&mut self, input: &[u8], output: &mut Vec<u8>, budget: usize) -> Progress {
        let mut consumed = 0;
        while let Some(end) = input[consumed..].iter().position(|&b| b == b'\n') {
            if output.len() >= budget {
                return Progress {
                    consumed,
                    output_full: true,
                    ..Progress::default()
                };
            }
            let line = &input[consumed..consumed + end + 1];
            output.extend(line.iter().map(u8::to_ascii_uppercase));
            consumed += end + 1;
        }
        Progress {
            consumed,
            ..Progress::default()
        }
    }
}

struct Pki {
    dir: PathBuf,
    ca_pem: String,
}

impl Pki {
    /// A CA, a server certificate for `localhost` signed by it, and a client certificate.
    fn new() -> Pki {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "cellcache-io-tls-{}-{}",
            std::process::id(),
            N.fetch_add(1, Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let ca = ca_params.self_signed(&ca_key).unwrap();
        for (name, san) in [
            ("server", "localhost"),
            ("server2", "localhost"),
            ("client", "client"),
        ] {
            let key = rcgen::KeyPair::generate().unwrap();
            let cert = rcgen::CertificateParams::new(vec![san.to_string()])
                .unwrap()
                .signed_by(&key, &ca, &ca_key)
                .unwrap();
            std::fs::write(dir.join(format!("{name}.crt")), cert.pem()).unwrap();
            std::fs::write(dir.join(format!("{name}.key")), key.serialize_pem()).unwrap();
        }
        std::fs::write(dir.join("ca.crt"), ca.pem()).unwrap();
        Pki {
            dir,
            ca_pem: ca.pem(),
        }
    }

    fn path(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }

    fn server(&self, verify_mode: u8) -> TlsConfig {
        TlsConfig {
            enabled: true,
            chain_cert: self.path("server.crt"),
            key: self.path("server.key"),
            ca_cert: self.path("ca.crt"),
            verify_mode,
            ..TlsConfig::default()
        }
    }

    fn client(&self, with_cert: bool) -> ClientConnection {
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(self.ca_pem.as_bytes()) {
            roots.add(cert.unwrap()).unwrap();
        }
        let builder = rustls::ClientConfig::builder_with_provider(crypto())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
        let config = if with_cert {
            builder
                .with_client_auth_cert(
                    load_certs(&self.path("client.crt")).unwrap(),
                    load_key(&self.path("client.key")).unwrap(),
                )
                .unwrap()
        } else {
            builder.with_no_client_auth()
        };
        ClientConnection::new(Arc::new(config), ServerName::try_from("localhost").unwrap()).unwrap()
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

const BUDGET: usize = 1 << 20;

fn session(pki: &Pki, verify_mode: u8) -> (TlsSession<Upper>, Arc<TlsStats>) {
    let certs = TlsCerts::load(&pki.server(verify_mode)).unwrap();
    let service = TlsService::new(Arc::new(UpperService), certs, 64 * 1024, Vec::new());
    let stats = service.stats();
    let accepted = Accepted {
        peer: "127.0.0.1:1".parse().unwrap(),
        listener: "127.0.0.1:2".parse().unwrap(),
        fd: -1,
    };
    match service.open(accepted, Notify::noop()) {
        TlsOrPlain::Tls(s) => (*s, stats),
        TlsOrPlain::Plain(_) => panic!("a TLS listener"),
    }
}

struct UpperService;

impl Service for UpperService {
    type Session = Upper;
    fn open(&self, _: Accepted, _: Notify) -> Upper {
        Upper
    }
}

/// Moves the client's pending records to the server and the server's answer back; the
/// server's progress of the last call.
fn exchange(
    client: &mut ClientConnection,
    server: &mut TlsSession<Upper>,
    budget: usize,
) -> Progress {
    let mut wire = Vec::new();
    while client.wants_write() {
        client.write_tls(&mut wire).unwrap();
    }
    let mut back = Vec::new();
    let progress = server.on_input(&wire, &mut back, budget);
    assert_eq!(
        progress.consumed,
        wire.len(),
        "the TLS layer takes every byte"
    );
    if !back.is_empty() {
        client.read_tls(&mut &back[..]).unwrap();
        client.process_new_packets().unwrap();
    }
    progress
}

fn handshake(client: &mut ClientConnection, server: &mut TlsSession<Upper>) {
    for _ in 0..10 {
        if !client.is_handshaking() && server.handshaken {
            return;
        }
        exchange(client, server, BUDGET);
    }
    panic!("no handshake after 10 exchanges");
}

fn read_plain(client: &mut ClientConnection) -> Vec<u8> {
    let mut out = Vec::new();
    let _ = client.reader().read_to_end(&mut out);
    out
}

#[test]
fn a_client_is_served_through_tls() {
    let pki = Pki::new();
    let (mut server, stats) = session(&pki, 0);
    let mut client = pki.client(false);
    handshake(&mut client, &mut server);
    client.writer().write_all(b"get foo\n").unwrap();
    let p = exchange(&mut client, &mut server, BUDGET);
    assert_eq!(read_plain(&mut client), b"GET FOO\n");
    assert_eq!(
        p.buffered,
        Some(crate::Buffered {
            progressed: true,
            pending: false
        })
    );
    assert_eq!(stats.new_sessions.load(Relaxed), 1);
    assert_eq!(stats.handshake_errors.load(Relaxed), 0);
}

#[test]
fn plain_text_on_the_tls_port_is_closed_with_an_alert() {
    let pki = Pki::new();
    let (mut server, stats) = session(&pki, 0);
    let mut out = Vec::new();
    let p = server.on_input(b"get foo\r\n", &mut out, BUDGET);
    assert!(p.close);
    assert_eq!(p.consumed, 9);
    assert!(!out.windows(3).any(|w| w == b"END"), "nothing served");
    assert_eq!(stats.handshake_errors.load(Relaxed), 1);
    // Nothing more is read from it.
    let p = server.on_input(b"get foo\r\n", &mut out, BUDGET);
    assert!(p.close);
}

#[test]
fn part_of_a_request_is_held_and_keeps_the_request_clock_running() {
    let pki = Pki::new();
    let (mut server, _) = session(&pki, 0);
    let mut client = pki.client(false);
    handshake(&mut client, &mut server);
    client.writer().write_all(b"get fo").unwrap();
    let p = exchange(&mut client, &mut server, BUDGET);
    assert_eq!(
        p.for_clock(p.consumed, 0),
        (0, 1),
        "nothing served, part held"
    );
    client.writer().write_all(b"o\n").unwrap();
    let p = exchange(&mut client, &mut server, BUDGET);
    assert_eq!(p.for_clock(p.consumed, 0), (1, 0));
    assert_eq!(read_plain(&mut client), b"GET FOO\n");
}

#[test]
fn an_unfinished_handshake_counts_as_a_held_request() {
    let pki = Pki::new();
    let (mut server, _) = session(&pki, 0);
    let mut client = pki.client(false);
    let mut hello = Vec::new();
    client.write_tls(&mut hello).unwrap();
    let mut out = Vec::new();
    // Half a ClientHello, then silence: a slowloris under TLS.
    let p = server.on_input(&hello[..hello.len() / 2], &mut out, BUDGET);
    assert!(p.holds_input());
    assert_eq!(p.for_clock(p.consumed, 0), (0, 1));
}

#[test]
fn requests_left_by_a_full_output_are_offered_again_without_new_bytes() {
    let pki = Pki::new();
    let (mut server, _) = session(&pki, 0);
    let mut client = pki.client(false);
    handshake(&mut client, &mut server);
    for i in 0..100 {
        client
            .writer()
            .write_all(format!("key{i}\n").as_bytes())
            .unwrap();
    }
    let p = exchange(&mut client, &mut server, 64);
    assert!(p.output_full && p.holds_input());
    let mut rounds = 0;
    let mut served = read_plain(&mut client);
    loop {
        let mut back = Vec::new();
        let p = server.on_input(&[], &mut back, 64);
        client.read_tls(&mut &back[..]).unwrap();
        client.process_new_packets().unwrap();
        served.extend(read_plain(&mut client));
        rounds += 1;
        if !p.holds_input() {
            break;
        }
        assert!(rounds < 1_000, "the held requests drain");
    }
    let expected: Vec<u8> = (0..100)
        .flat_map(|i| format!("KEY{i}\n").into_bytes())
        .collect();
    assert_eq!(served, expected);
}

#[test]
fn a_required_client_certificate_is_checked() {
    let pki = Pki::new();
    let (mut server, stats) = session(&pki, 2);
    let mut client = pki.client(false);
    let mut refused = false;
    for _ in 0..10 {
        let mut wire = Vec::new();
        while client.wants_write() {
            client.write_tls(&mut wire).unwrap();
        }
        let mut back = Vec::new();
        let p = server.on_input(&wire, &mut back, BUDGET);
        if p.close {
            refused = true;
            break;
        }
        client.read_tls(&mut &back[..]).unwrap();
        if client.process_new_packets().is_err() {
            break;
        }
    }
    assert!(refused, "the server closed a client without a certificate");
    assert_eq!(stats.handshake_errors.load(Relaxed), 1);

    let (mut server, stats) = session(&pki, 2);
    let mut client = pki.client(true);
    handshake(&mut client, &mut server);
    client.writer().write_all(b"ok\n").unwrap();
    exchange(&mut client, &mut server, BUDGET);
    assert_eq!(read_plain(&mut client), b"OK\n");
    assert_eq!(stats.new_sessions.load(Relaxed), 1);
}

#[test]
fn bad_configurations_name_what_is_wrong() {
    let pki = Pki::new();
    let err = |c: TlsConfig| server_config(&c).unwrap_err().to_string();
    let mut c = pki.server(0);
    c.key = String::new();
    assert!(err(c).contains("ssl_key"));
    let mut c = pki.server(2);
    c.ca_cert = String::new();
    assert!(err(c).contains("ssl_ca_cert"));
    let mut c = pki.server(0);
    c.chain_cert = pki.path("missing.crt");
    assert!(err(c).contains("missing.crt"));
    let mut c = pki.server(0);
    c.min_version = "tlsv1.1".into();
    assert!(err(c).contains("tlsv1.1"));
    assert!(err(pki.server(4)).contains("ssl_verify_mode=4"));
    let mut c = pki.server(0);
    c.key = pki.path("client.key");
    assert!(err(c).contains("do not make a TLS server"));
}

/// `refresh_certs`: new sessions get the certificate now in the files, open ones keep
/// theirs; a refresh that fails leaves the certificate in use.
#[test]
fn a_refresh_reaches_new_sessions_only() {
    let pki = Pki::new();
    let config = pki.server(0);
    let certs = TlsCerts::load(&config).unwrap();
    let service = TlsService::new(Arc::new(UpperService), certs.clone(), 64 * 1024, Vec::new());
    let accepted = Accepted {
        peer: "127.0.0.1:1".parse().unwrap(),
        listener: "127.0.0.1:2".parse().unwrap(),
        fd: -1,
    };
    let served_cert = |service: &TlsService<UpperService>| {
        let TlsOrPlain::Tls(mut server) = service.open(accepted, Notify::noop()) else {
            panic!("a TLS listener")
        };
        let mut client = pki.client(false);
        handshake(&mut client, &mut server);
        client.peer_certificates().unwrap()[0].to_vec()
    };
    let first = served_cert(&service);
    // Another certificate of the same CA, for the same name, in the same files.
    let key = std::fs::read(pki.path("server2.key")).unwrap();
    std::fs::copy(pki.path("server2.crt"), pki.path("server.crt")).unwrap();
    assert_eq!(
        served_cert(&service),
        first,
        "nothing changes before the refresh"
    );
    std::fs::write(pki.path("server.key"), "not a key").unwrap();
    assert!(certs.refresh().is_err());
    assert_eq!(
        served_cert(&service),
        first,
        "a failed refresh keeps what is in use"
    );
    std::fs::write(pki.path("server.key"), key).unwrap();
    certs.refresh().unwrap();
    let second = served_cert(&service);
    assert_ne!(second, first);
}

/// A connection accepted on a `notls` listener is served as it is.
#[test]
fn a_plain_listener_is_served_without_tls() {
    let pki = Pki::new();
    let certs = TlsCerts::load(&pki.server(0)).unwrap();
    let plain: std::net::SocketAddr = "127.0.0.1:3".parse().unwrap();
    let service = TlsService::new(Arc::new(UpperService), certs, 64 * 1024, vec![plain]);
    let accepted = Accepted {
        peer: "127.0.0.1:1".parse().unwrap(),
        listener: plain,
        fd: -1,
    };
    let mut session = service.open(accepted, Notify::noop());
    assert!(matches!(session, TlsOrPlain::Plain(_)));
    let mut out = Vec::new();
    let p = session.on_input(b"hello\n", &mut out, BUDGET);
    assert_eq!((p.consumed, p.buffered), (6, None));
    assert_eq!(out, b"HELLO\n");
}
