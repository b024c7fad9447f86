//! TLS for the harness: a CA with certificates made for the test (rcgen), and what a
//! [`super::Client`] needs to speak TLS to a cell (or memcached) started with `-Z`.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore};

/// A CA and certificates it signed, as PEM files in a directory of their own: `server`
/// (for `localhost` and 127.0.0.1) and `client`; plus `other-ca` and `stranger`, a CA the
/// server does not know and a client certificate it signed.
pub struct Pki {
    pub dir: PathBuf,
}

impl Pki {
    pub fn new() -> Pki {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "cellcache-test-pki-{}-{}",
            std::process::id(),
            N.fetch_add(1, Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let pki = Pki { dir };
        let (ca, ca_key) = pki.ca("ca");
        pki.leaf("server", &["localhost", "127.0.0.1"], &ca, &ca_key);
        pki.leaf("client", &["client"], &ca, &ca_key);
        let (other, other_key) = pki.ca("other-ca");
        pki.leaf("stranger", &["client"], &other, &other_key);
        pki
    }

    fn ca(&self, name: &str) -> (rcgen::Certificate, rcgen::KeyPair) {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, format!("cellcache test {name}"));
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        std::fs::write(self.dir.join(format!("{name}.crt")), cert.pem()).unwrap();
        (cert, key)
    }

    fn leaf(&self, name: &str, sans: &[&str], ca: &rcgen::Certificate, ca_key: &rcgen::KeyPair) {
        let key = rcgen::KeyPair::generate().unwrap();
        let sans: Vec<String> = sans.iter().map(|s| s.to_string()).collect();
        let cert = rcgen::CertificateParams::new(sans)
            .unwrap()
            .signed_by(&key, ca, ca_key)
            .unwrap();
        std::fs::write(self.dir.join(format!("{name}.crt")), cert.pem()).unwrap();
        std::fs::write(self.dir.join(format!("{name}.key")), key.serialize_pem()).unwrap();
    }

    pub fn path(&self, file: &str) -> String {
        self.dir.join(file).display().to_string()
    }

    /// memcached's `-o` for a server with this PKI's server certificate.
    pub fn server_option(&self) -> String {
        format!(
            "ssl_chain_cert={},ssl_key={}",
            self.path("server.crt"),
            self.path("server.key")
        )
    }

    /// A client trusting this PKI's CA; presenting the certificate `cert` (`client`,
    /// `stranger`) when given.
    pub fn client(&self, cert: Option<&str>) -> Arc<ClientConfig> {
        let mut roots = RootCertStore::empty();
        for c in CertificateDer::pem_file_iter(self.path("ca.crt")).unwrap() {
            roots.add(c.unwrap()).unwrap();
        }
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
        Arc::new(match cert {
            None => builder.with_no_client_auth(),
            Some(name) => {
                let chain = CertificateDer::pem_file_iter(self.path(&format!("{name}.crt")))
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
