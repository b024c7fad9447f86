//! TLS for the harness: a CA with certificates made for the test (rcgen), and what a
//! [`super::Client`] needs to speak TLS to a cell (or memcached) started with `-Z`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore};

/// A certificate authority: its certificate (written to `DIR/NAME-ca.pem`) and key.
pub struct Ca {
    cert: rcgen::Certificate,
    key: rcgen::KeyPair,
    /// The CA certificate's PEM file.
    pub pem: PathBuf,
}

impl Ca {
    pub fn new(dir: &Path, name: &str) -> Ca {
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        p.distinguished_name
            .push(rcgen::DnType::CommonName, format!("{name} test CA"));
        p.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
        ];
        let key = rcgen::KeyPair::generate().expect("a CA key");
        let cert = p.self_signed(&key).expect("the CA certificate");
        let pem = dir.join(format!("{name}-ca.pem"));
        std::fs::write(&pem, cert.pem()).expect("CA written");
        Ca { cert, key, pem }
    }

    /// A certificate for `names` (DNS names or IP addresses; server and client use) signed
    /// by this CA, written to `DIR/FILE.pem` and `DIR/FILE.key`: `(cert, key)` paths.
    pub fn issue(&self, dir: &Path, file: &str, names: &[&str]) -> (PathBuf, PathBuf) {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut p = rcgen::CertificateParams::new(names.clone()).expect("leaf params");
        p.distinguished_name
            .push(rcgen::DnType::CommonName, names[0].as_str());
        p.extended_key_usages = vec![
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let key = rcgen::KeyPair::generate().expect("a key");
        let cert = p
            .signed_by(&key, &self.cert, &self.key)
            .expect("the certificate");
        let (c, k) = (
            dir.join(format!("{file}.pem")),
            dir.join(format!("{file}.key")),
        );
        std::fs::write(&c, cert.pem()).expect("certificate written");
        std::fs::write(&k, key.serialize_pem()).expect("key written");
        (c, k)
    }
}

/// A CA (`ca-ca.pem`) and certificates it signed, in a directory of their own: `server`
/// (for `localhost` and 127.0.0.1) and `client`; plus a CA the server does not know
/// (`other-ca.pem`) and a client certificate it signed, `stranger`. Files are
/// `NAME.pem` and `NAME.key`.
pub struct Pki {
    pub dir: PathBuf,
}

impl Pki {
    pub fn new() -> Pki {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir =
            cellcache_testkit::process::scratch_dir(&format!("pki-{}", N.fetch_add(1, Relaxed)));
        let ca = Ca::new(&dir, "ca");
        ca.issue(&dir, "server", &["localhost", "127.0.0.1"]);
        ca.issue(&dir, "client", &["client"]);
        Ca::new(&dir, "other").issue(&dir, "stranger", &["client"]);
        Pki { dir }
    }

    pub fn path(&self, file: &str) -> String {
        self.dir.join(file).display().to_string()
    }

    /// memcached's `-o` for a server with this PKI's server certificate.
    pub fn server_option(&self) -> String {
        format!(
            "ssl_chain_cert={},ssl_key={}",
            self.path("server.pem"),
            self.path("server.key")
        )
    }

    /// A client trusting this PKI's CA; presenting the certificate `cert` (`client`,
    /// `stranger`) when given.
    pub fn client(&self, cert: Option<&str>) -> Arc<ClientConfig> {
        let mut roots = RootCertStore::empty();
        for c in CertificateDer::pem_file_iter(self.path("ca-ca.pem")).unwrap() {
            roots.add(c.unwrap()).unwrap();
        }
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
        Arc::new(match cert {
            None => builder.with_no_client_auth(),
            Some(name) => {
                let chain = CertificateDer::pem_file_iter(self.path(&format!("{name}.pem")))
                    .unwrap()
                    .map(Result::unwrap)
                    .collect();
                let key = PrivateKeyDer::from_pem_file(self.path(&format!("{name}.key"))).unwrap();
                builder.with_client_auth_cert(chain, key).unwrap()
            }
        })
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A client session for `localhost` under `config`.
pub fn session(config: &Arc<ClientConfig>) -> ClientConnection {
    ClientConnection::new(config.clone(), ServerName::try_from("localhost").unwrap()).unwrap()
}

/// A ClientHello, for probing that a port speaks TLS (the answer's first byte is a TLS
/// handshake record's, 0x16) without trusting its certificate.
pub fn client_hello() -> Vec<u8> {
    let config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(RootCertStore::empty())
        .with_no_client_auth();
    let mut conn = session(&Arc::new(config));
    let mut hello = Vec::new();
    while conn.wants_write() {
        conn.write_tls(&mut hello).unwrap();
    }
    hello
}
