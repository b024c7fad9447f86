//! What a peer connection runs on: plain TCP, or mutual TLS (`[cluster.tls]`) with the
//! operator's certificates, and what guards it ([`PeerAuth`]: the TLS configuration and the
//! ring's secret, loaded once at start).
//!
//! With TLS on, both sides present a certificate chained to `cluster.tls.ca_file`; the
//! connecting side checks that the cell it reached carries `cluster.tls.server_name`, and
//! the accepting side checks the same of the connecting cell's certificate. The TLS
//! handshake comes first, inside `cluster.peer_handshake_timeout_ms`; the secret's
//! challenge–response ([`super::handshake`]) then runs inside the session, unchanged.
//! A cell without TLS that is offered a TLS handshake answers it with a TLS alert, so the
//! TLS side learns at once that it cannot join that ring instead of retrying.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use cellcache_cluster::auth::Secret;
use cellcache_cluster::wire::WireConfig;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

use super::handshake::{self, HandshakeError, SecretError};
use crate::config::{ClusterConfig, PeerTlsConfig};

/// A peer connection's byte stream, whichever transport it runs on; split it with
/// `tokio::io::split`. Writes may be held in the TLS session until flushed: writers
/// flush after each batch.
pub enum PeerStream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::TlsStream<TcpStream>>),
}

impl AsyncRead for PeerStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            PeerStream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            PeerStream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for PeerStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            PeerStream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            PeerStream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            PeerStream::Plain(s) => Pin::new(s).poll_flush(cx),
            PeerStream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            PeerStream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            PeerStream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// Why `[cluster.tls]` could not be loaded: each names the file at fault.
#[derive(Debug, thiserror::Error)]
pub enum PeerTlsError {
    #[error("peer TLS (cluster.tls: --peer-tls-cert, --peer-tls-key, --peer-tls-ca)")]
    Files(#[source] Box<cellcache_io::tls::TlsError>),
    #[error("the peer TLS CA file {path} (cluster.tls.ca_file, --peer-tls-ca): {why}")]
    CaInvalid { path: String, why: String },
    #[error("cluster.tls.server_name {0:?} is not a DNS name")]
    ServerName(String),
    #[error(
        "the peer TLS certificate {cert} with the key {key} (cluster.tls.cert_file, \
         cluster.tls.key_file)"
    )]
    Config {
        cert: String,
        key: String,
        #[source]
        source: rustls::Error,
    },
}

/// The first byte of a TLS handshake record (a ClientHello); a cell frame starts with the
/// low byte of `wire::MAGIC`, never this.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// A fatal TLS alert record, `handshake_failure`: what a cell without TLS answers to a
/// ClientHello (TLS 1.2 record version, as TLS 1.3 sends too).
const TLS_HANDSHAKE_FAILURE_ALERT: [u8; 7] = [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x28];

/// The loaded `[cluster.tls]`: both ends' TLS configurations and the name every cell's
/// certificate carries.
pub struct PeerTls {
    connector: tokio_rustls::TlsConnector,
    acceptor: tokio_rustls::TlsAcceptor,
    server_name: ServerName<'static>,
}

impl std::fmt::Debug for PeerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerTls")
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

impl PeerTls {
    /// Reads the certificate, key and CA files; `None` when TLS is off (no file given).
    /// [`PeerTlsConfig::check`] has refused a partial configuration already.
    pub fn load(config: &PeerTlsConfig) -> Result<Option<PeerTls>, PeerTlsError> {
        if !config.enabled() {
            return Ok(None);
        }
        use cellcache_io::tls::{load_certs, load_key, load_roots};
        let certs = load_certs(&config.cert_file).map_err(|e| PeerTlsError::Files(Box::new(e)))?;
        let key = load_key(&config.key_file).map_err(|e| PeerTlsError::Files(Box::new(e)))?;
        let roots = load_roots(&config.ca_file).map_err(|e| PeerTlsError::Files(Box::new(e)))?;
        let ca_invalid = |why: &dyn std::fmt::Display| PeerTlsError::CaInvalid {
            path: config.ca_file.clone(),
            why: why.to_string(),
        };
        let roots = Arc::new(roots);
        let server_name = ServerName::try_from(config.server_name.clone())
            .map_err(|_| PeerTlsError::ServerName(config.server_name.clone()))?;
        let config_error = |source| PeerTlsError::Config {
            cert: config.cert_file.clone(),
            key: config.key_file.clone(),
            source,
        };
        let provider = cellcache_io::tls::crypto();
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            roots.clone(),
            provider.clone(),
        )
        .build()
        .map_err(|e| ca_invalid(&e))?;
        let server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(config_error)?
            .with_client_cert_verifier(verifier)
            .with_single_cert(certs.clone(), key.clone_key())
            .map_err(config_error)?;
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(config_error)?
            .with_root_certificates(roots)
            .with_client_auth_cert(certs, key)
            .map_err(config_error)?;
        Ok(Some(PeerTls {
            connector: tokio_rustls::TlsConnector::from(Arc::new(client)),
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(server)),
            server_name,
        }))
    }

    /// The connecting side's TLS handshake: the peer must present a certificate chained
    /// to the CA and carrying the server name; this cell presents its own.
    async fn connect(&self, tcp: TcpStream) -> Result<PeerStream, HandshakeError> {
        let tls = self
            .connector
            .connect(self.server_name.clone(), tcp)
            .await
            .map_err(HandshakeError::Tls)?;
        Ok(PeerStream::Tls(Box::new(tls.into())))
    }

    /// The accepting side's TLS handshake: the peer must present a certificate chained to
    /// the CA (rustls checks it) and carrying the server name (checked here).
    async fn accept(&self, tcp: TcpStream) -> Result<PeerStream, HandshakeError> {
        let tls = self
            .acceptor
            .accept(tcp)
            .await
            .map_err(HandshakeError::Tls)?;
        let named = tls
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|chain| chain.first())
            .is_some_and(|cert| {
                webpki::EndEntityCert::try_from(cert)
                    .and_then(|ee| ee.verify_is_valid_for_subject_name(&self.server_name))
                    .is_ok()
            });
        if !named {
            return Err(HandshakeError::TlsName(
                self.server_name.to_str().into_owned(),
            ));
        }
        Ok(PeerStream::Tls(Box::new(tls.into())))
    }
}

/// Why a cell's peer guards could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum PeerAuthError {
    #[error(transparent)]
    Secret(#[from] SecretError),
    #[error(transparent)]
    Tls(#[from] PeerTlsError),
}

/// What guards every peer connection of a cell: TLS, if configured, then the ring's
/// secret, if any. Loaded once at start; cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct PeerAuth {
    /// The ring's secret (`cluster.secret_file`): see [`super::handshake`].
    pub secret: Option<Secret>,
    /// `[cluster.tls]`, when on.
    pub tls: Option<Arc<PeerTls>>,
}

impl PeerAuth {
    /// Reads `cluster.secret_file` and `[cluster.tls]`'s files.
    pub fn load(config: &ClusterConfig) -> Result<PeerAuth, PeerAuthError> {
        Ok(PeerAuth {
            secret: handshake::load_secret(&config.secret_file)?,
            tls: PeerTls::load(&config.tls)?.map(Arc::new),
        })
    }

    /// How peers are admitted, as `ctl status` shows it: `secret+tls`, `secret`, `tls` or
    /// `open`.
    pub fn mode(&self) -> &'static str {
        match (self.secret.is_some(), self.tls.is_some()) {
            (true, true) => "secret+tls",
            (true, false) => "secret",
            (false, true) => "tls",
            (false, false) => "open",
        }
    }

    /// The connecting side of a fresh TCP connection: TLS first when on. The caller bounds
    /// it (and the secret's proofs after it) with the handshake timeout.
    pub async fn client(&self, tcp: TcpStream) -> Result<PeerStream, HandshakeError> {
        match &self.tls {
            Some(tls) => tls.connect(tcp).await,
            None => Ok(PeerStream::Plain(tcp)),
        }
    }

    /// The connecting side's whole handshake before its first frame: TLS when on, then the
    /// secret's proofs when set.
    pub async fn connect(
        &self,
        tcp: TcpStream,
        wire: &WireConfig,
    ) -> Result<PeerStream, HandshakeError> {
        let mut stream = self.client(tcp).await?;
        handshake::connect(&mut stream, wire, self.secret.as_ref()).await?;
        Ok(stream)
    }

    /// The accepting side of a fresh TCP connection: TLS first when on. Without TLS, a
    /// peer that opens with a TLS handshake gets a TLS alert (so a cell configured for TLS
    /// learns at once that this cell is not) and the error.
    pub async fn server(&self, mut tcp: TcpStream) -> Result<PeerStream, HandshakeError> {
        if let Some(tls) = &self.tls {
            return tls.accept(tcp).await;
        }
        let mut first = [0u8; 1];
        if tcp.peek(&mut first).await? == 1 && first[0] == TLS_HANDSHAKE_RECORD {
            let _ = tcp.write_all(&TLS_HANDSHAKE_FAILURE_ALERT).await;
            return Err(HandshakeError::TlsUnexpected);
        }
        Ok(PeerStream::Plain(tcp))
    }
}
