//! TLS to the target (`--tls`): the generator speaks TLS to servers started with memcached's
//! `-Z` (memcached itself, or cellcache), with rustls 0.23 and its *ring* provider, the
//! server side's own stack.
//!
//! Where the cost lands: the handshake is done, blocking, while each connection is opened,
//! before the run's clock starts (the same place the TCP connect is), so neither the warm-up
//! nor the measured phase contains a handshake; what they do contain is record encryption
//! and decryption on both sides. The measured loop moves ciphertext between the socket and a
//! non-blocking rustls `ClientConnection` (see `engine::worker`); a plain connection never
//! touches this module.
//!
//! Trust: `--tls-ca PEM` names the trust anchors and the server certificate is verified
//! against them and `--tls-server-name` (default: the host of each `--server`). The only way
//! around verification is the explicit `--tls-insecure`, for benchmarking against throwaway
//! certificates only: it accepts any certificate for any name, but still checks the
//! handshake signatures, so the crypto work is the same as with verification.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, bail};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{
    ClientConfig, ClientConnection, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use serde::{Deserialize, Serialize};

/// The TLS options on the command line (shared by `bench` and `bench compare`).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct TlsArgs {
    /// Speak TLS to the target (a server started with -Z). Needs --tls-ca or --tls-insecure.
    /// The handshake is done while connecting, before warm-up and measurement.
    #[arg(long = "tls")]
    pub enabled: bool,
    /// PEM file of the CA certificate(s) the server's certificate must chain to.
    #[arg(long, value_name = "PEM")]
    pub tls_ca: Option<PathBuf>,
    /// Name the server certificate must be valid for (DNS name or IP address). Default: the
    /// host of each --server.
    #[arg(long, value_name = "NAME")]
    pub tls_server_name: Option<String>,
    /// FOR BENCHMARKING ONLY: accept any server certificate for any name (handshake
    /// signatures are still checked). Never use it where the data or the server matter.
    #[arg(long)]
    pub tls_insecure: bool,
}

/// How the server certificate was checked, for the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verification {
    /// Chain to `--tls-ca` and the server name checked.
    Ca,
    /// `--tls-insecure`: not checked.
    Insecure,
}

/// What the report says about TLS (absent from plain runs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TlsReport {
    pub verification: Verification,
    /// The name checked (or sent in SNI) per server, in `servers` order.
    pub server_names: Vec<String>,
    /// Negotiated on the control connection (`TLSv1_3` …), which uses the same client
    /// configuration as the load connections.
    pub protocol: String,
    pub cipher_suite: String,
}

/// Everything a connection needs to start a TLS session with one of the targets.
#[derive(Debug, Clone)]
pub struct TlsTarget {
    config: Arc<ClientConfig>,
    names: Vec<(SocketAddr, ServerName<'static>)>,
    verification: Verification,
}

impl TlsTarget {
    /// The client configuration for `args` against `servers`, each `(address, host as
    /// written)`; `None` without `--tls`.
    pub fn from_args(
        args: &TlsArgs,
        servers: &[(SocketAddr, String)],
    ) -> anyhow::Result<Option<Arc<Self>>> {
        if !args.enabled {
            if args.tls_ca.is_some() || args.tls_insecure || args.tls_server_name.is_some() {
                bail!("--tls-ca, --tls-insecure and --tls-server-name need --tls");
            }
            return Ok(None);
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .context("TLS protocol versions")?;
        let (config, verification) = match (&args.tls_ca, args.tls_insecure) {
            (Some(_), true) => bail!("give either --tls-ca or --tls-insecure, not both"),
            (None, false) => bail!(
                "--tls needs --tls-ca PEM (the CA the server certificate chains to), \
                 or --tls-insecure to skip verification (benchmarking only)"
            ),
            (Some(ca), false) => {
                let mut roots = RootCertStore::empty();
                for cert in CertificateDer::pem_file_iter(ca)
                    .with_context(|| format!("reading {}", ca.display()))?
                {
                    let cert = cert.with_context(|| format!("parsing {}", ca.display()))?;
                    roots
                        .add(cert)
                        .with_context(|| format!("a CA certificate in {}", ca.display()))?;
                }
                if roots.is_empty() {
                    bail!("{}: no certificate", ca.display());
                }
                (
                    builder.with_root_certificates(roots).with_no_client_auth(),
                    Verification::Ca,
                )
            }
            (None, true) => (
                builder
                    .dangerous()
                    .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
                    .with_no_client_auth(),
                Verification::Insecure,
            ),
        };
        let names = servers
            .iter()
            .map(|(addr, host)| {
                let name = args.tls_server_name.as_deref().unwrap_or(host);
                let name = ServerName::try_from(name.to_owned())
                    .with_context(|| format!("{name:?} is not a valid TLS server name"))?;
                Ok((*addr, name))
            })
            .collect::<anyhow::Result<_>>()?;
        Ok(Some(Arc::new(Self {
            config: Arc::new(config),
            names,
            verification,
        })))
    }

    /// A new client session for the server at `addr`.
    pub fn session(&self, addr: SocketAddr) -> Result<ClientConnection, rustls::Error> {
        let name = self.names.iter().find(|(a, _)| *a == addr).map_or_else(
            || ServerName::IpAddress(addr.ip().into()),
            |(_, n)| n.clone(),
        );
        ClientConnection::new(self.config.clone(), name)
    }

    /// A session with `addr` over the connected (still blocking) `stream`, its handshake
    /// finished within `timeout` per read or write.
    pub fn handshake(
        &self,
        addr: SocketAddr,
        stream: &std::net::TcpStream,
        timeout: std::time::Duration,
    ) -> std::io::Result<ClientConnection> {
        let mut session = self.session(addr).map_err(std::io::Error::other)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        let mut stream = stream;
        while session.is_handshaking() {
            session.complete_io(&mut stream)?;
        }
        Ok(session)
    }

    /// The report's view, with what `conn` (a finished handshake) negotiated.
    pub fn report(&self, conn: Option<&ClientConnection>) -> TlsReport {
        TlsReport {
            verification: self.verification,
            server_names: self.names.iter().map(|(_, n)| n.to_str().into()).collect(),
            protocol: conn
                .and_then(|c| c.protocol_version())
                .map_or_else(String::new, |v| format!("{v:?}")),
            cipher_suite: conn
                .and_then(|c| c.negotiated_cipher_suite())
                .map_or_else(String::new, |s| format!("{:?}", s.suite())),
        }
    }
}

/// The host part of `HOST:PORT` (`[::1]:11211` gives `::1`).
pub fn host_of(server: &str) -> &str {
    let host = server.rsplit_once(':').map_or(server, |(h, _)| h);
    host.strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
}

/// `--tls-insecure`: any certificate is accepted, the handshake signatures are checked.
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_and_option_checks() {
        assert_eq!(host_of("127.0.0.1:11211"), "127.0.0.1");
        assert_eq!(host_of("localhost:1"), "localhost");
        assert_eq!(host_of("[::1]:11211"), "::1");
        let servers = [("127.0.0.1:1".parse().unwrap(), "127.0.0.1".to_owned())];
        let plain = TlsArgs::default();
        assert!(TlsTarget::from_args(&plain, &servers).unwrap().is_none());
        let without_trust = TlsArgs {
            enabled: true,
            ..TlsArgs::default()
        };
        assert!(TlsTarget::from_args(&without_trust, &servers).is_err());
        let stray = TlsArgs {
            tls_insecure: true,
            ..TlsArgs::default()
        };
        assert!(TlsTarget::from_args(&stray, &servers).is_err());
        let insecure = TlsArgs {
            enabled: true,
            tls_insecure: true,
            ..TlsArgs::default()
        };
        let target = TlsTarget::from_args(&insecure, &servers).unwrap().unwrap();
        assert_eq!(target.report(None).server_names, ["127.0.0.1"]);
        assert_eq!(target.report(None).verification, Verification::Insecure);
        let named = TlsArgs {
            tls_server_name: Some("cache.example".into()),
            ..insecure
        };
        let target = TlsTarget::from_args(&named, &servers).unwrap().unwrap();
        assert_eq!(target.report(None).server_names, ["cache.example"]);
    }
}
