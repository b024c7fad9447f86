//! TLS for client connections (memcached's `-Z`), the same on every engine.
//!
//! [`TlsService`] wraps the cell's [`Service`], and each [`TlsSession`] wraps one session of
//! it: the engine moves ciphertext between the socket and the `TlsSession`, which feeds it
//! to a rustls [`ServerConnection`], offers the plaintext to the wrapped session and
//! encrypts whatever that session writes. The memcached session, the engines' buffers,
//! backpressure and yielding are unchanged; only what the engines read from [`Progress`]
//! grows by [`Buffered`], since decrypted input the wrapped session has not consumed yet is
//! held here, not in the engine:
//! - the engine offers input again (with no new bytes) while this session holds some
//!   (`Buffered::pending`), e.g. after a reply budget filled or a forwarded reply arrived;
//! - the request clock (`request`) runs while part of a request, or an unfinished
//!   handshake, is held, and restarts only when the wrapped session consumes some of it —
//!   so a slowloris client is closed after `request_timeout_secs` under TLS too.
//!
//! Decrypted input held here is bounded by the engine's `input_buffer_max_bytes`: past it
//! no more ciphertext is taken, which leaves it with the engine, whose own bound then
//! closes a client that sends without the session consuming.
//!
//! A client that speaks anything but TLS (plain memcached included) fails the handshake:
//! it is sent an alert and closed, counted in [`TlsStats::handshake_errors`].

use std::io::{Read as _, Write as _};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig, ServerConnection, SupportedProtocolVersion};
use serde::{Deserialize, Serialize};

use crate::{Accepted, Notify, Progress, Service, Session};

/// Client TLS (`[server.tls]`; memcached's `-Z` and `-o ssl_*` options).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsConfig {
    /// Serve clients over TLS only (memcached `-Z`): every client listener of the cell
    /// speaks TLS, and a client that does not is closed after its first bytes.
    pub enabled: bool,
    /// PEM file with the cell's certificate first, then the chain to its CA (memcached
    /// `-o ssl_chain_cert=`).
    pub chain_cert: String,
    /// PEM file with the certificate's private key: PKCS#8, PKCS#1 (RSA) or SEC1 (EC)
    /// (memcached `-o ssl_key=`).
    pub key: String,
    /// PEM file of the CA certificates client certificates must chain to (memcached
    /// `-o ssl_ca_cert=`); needed when `verify_mode` asks for client certificates.
    pub ca_cert: String,
    /// Client certificates, as memcached's `-o ssl_verify_mode=`: 0 not asked for, 1 asked
    /// for and verified when given, 2 required, 3 required once (TLS 1.3 and rustls have no
    /// renegotiation, so the same as 2).
    pub verify_mode: u8,
    /// Lowest TLS version accepted (memcached `-o ssl_min_version=`): `tlsv1.2` or
    /// `tlsv1.3`. Older versions are not implemented (rustls), so refused.
    pub min_version: String,
}

impl Default for TlsConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            chain_cert: String::new(),
            key: String::new(),
            ca_cert: String::new(),
            verify_mode: 0,
            min_version: "tlsv1.2".into(),
        }
    }
}

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("TLS needs {0} (a PEM file)")]
    Missing(&'static str),
    #[error("reading {what} from {path}")]
    Pem {
        what: &'static str,
        path: String,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("{path} holds no certificate")]
    NoCertificate { path: String },
    #[error("a CA certificate of {path}")]
    BadCa {
        path: String,
        #[source]
        source: rustls::Error,
    },
    #[error("ssl_verify_mode={0}: must be 0 (none), 1 (request), 2 (require) or 3 (once)")]
    VerifyMode(u8),
    #[error("ssl_min_version={0}: cellcache accepts tlsv1.2 or tlsv1.3")]
    MinVersion(String),
    #[error("the client certificate verifier")]
    Verifier(#[source] rustls::server::VerifierBuilderError),
    #[error("the certificate and key ({chain} and {key}) do not make a TLS server")]
    Server {
        chain: String,
        key: String,
        #[source]
        source: rustls::Error,
    },
}

/// The cryptography every TLS configuration of cellcache uses (*ring*).
pub fn crypto() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Every certificate of the PEM file at `path`, in order; at least one.
pub fn load_certs(path: &str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = |source| TlsError::Pem {
        what: "certificates",
        path: path.into(),
        source,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(pem)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(pem)?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate { path: path.into() });
    }
    Ok(certs)
}

/// The first private key of the PEM file at `path`.
pub fn load_key(path: &str) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|source| TlsError::Pem {
        what: "a private key",
        path: path.into(),
        source,
    })
}

/// The CA certificates of the PEM file at `path`, as trust anchors.
pub fn load_roots(path: &str) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in load_certs(path)? {
        roots.add(cert).map_err(|source| TlsError::BadCa {
            path: path.into(),
            source,
        })?;
    }
    Ok(roots)
}

/// The rustls server configuration `config` describes, its files read and checked.
pub fn server_config(config: &TlsConfig) -> Result<Arc<ServerConfig>, TlsError> {
    static TLS12_UP: &[&SupportedProtocolVersion] =
        &[&rustls::version::TLS13, &rustls::version::TLS12];
    static TLS13: &[&SupportedProtocolVersion] = &[&rustls::version::TLS13];
    if config.chain_cert.is_empty() {
        return Err(TlsError::Missing("ssl_chain_cert (server.tls.chain_cert)"));
    }
    if config.key.is_empty() {
        return Err(TlsError::Missing("ssl_key (server.tls.key)"));
    }
    let versions = match config.min_version.as_str() {
        "tlsv1.2" | "" => TLS12_UP,
        "tlsv1.3" => TLS13,
        other => return Err(TlsError::MinVersion(other.into())),
    };
    let builder = ServerConfig::builder_with_provider(crypto())
        .with_protocol_versions(versions)
        .map_err(|source| TlsError::Server {
            chain: config.chain_cert.clone(),
            key: config.key.clone(),
            source,
        })?;
    let builder = match config.verify_mode {
        0 => builder.with_no_client_auth(),
        mode @ 1..=3 => {
            if config.ca_cert.is_empty() {
                return Err(TlsError::Missing(
                    "ssl_ca_cert (server.tls.ca_cert) to verify client certificates",
                ));
            }
            let roots = Arc::new(load_roots(&config.ca_cert)?);
            let verifier = WebPkiClientVerifier::builder_with_provider(roots, crypto());
            let verifier = if mode == 1 {
                verifier.allow_unauthenticated()
            } else {
                verifier
            };
            builder.with_client_cert_verifier(verifier.build().map_err(TlsError::Verifier)?)
        }
        other => return Err(TlsError::VerifyMode(other)),
    };
    let server = builder
        .with_single_cert(load_certs(&config.chain_cert)?, load_key(&config.key)?)
        .map_err(|source| TlsError::Server {
            chain: config.chain_cert.clone(),
            key: config.key.clone(),
            source,
        })?;
    Ok(Arc::new(server))
}

/// What the TLS layer counts (memcached's `ssl_*` stats).
#[derive(Debug, Default)]
pub struct TlsStats {
    /// Handshakes completed (`ssl_new_sessions`).
    pub new_sessions: AtomicU64,
    /// Connections closed because their TLS failed: a handshake that did not complete, a
    /// record that did not decrypt, plain text on the TLS port (`ssl_handshake_errors`).
    pub handshake_errors: AtomicU64,
    /// Decrypted bytes handed to sessions: what clients sent, as memcached's `bytes_read`
    /// counts it under TLS (the engine counts the ciphertext).
    pub bytes_read: AtomicU64,
    /// Bytes sessions wrote, before encryption (memcached's `bytes_written` under TLS).
    pub bytes_written: AtomicU64,
}

impl TlsStats {
    /// `stats reset`: the byte counts (the TLS-specific ones are not reset, as memcached's).
    pub fn reset(&self) {
        self.bytes_read.store(0, Relaxed);
        self.bytes_written.store(0, Relaxed);
    }
}

/// The server certificate and key new TLS sessions use: read at start, and again on
/// [`TlsCerts::refresh`] (memcached's `refresh_certs`), after which new connections get the
/// new ones and open ones keep theirs.
#[derive(Debug)]
pub struct TlsCerts {
    config: TlsConfig,
    current: std::sync::RwLock<Arc<ServerConfig>>,
    refreshed: std::sync::Mutex<std::time::Instant>,
}

impl TlsCerts {
    /// Reads and checks the files `config` names.
    pub fn load(config: &TlsConfig) -> Result<Arc<TlsCerts>, TlsError> {
        Ok(Arc::new(TlsCerts {
            current: std::sync::RwLock::new(server_config(config)?),
            config: config.clone(),
            refreshed: std::sync::Mutex::new(std::time::Instant::now()),
        }))
    }

    /// Reads the files again; on an error the certificates in use stay.
    pub fn refresh(&self) -> Result<(), TlsError> {
        let fresh = server_config(&self.config)?;
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = fresh;
        *self.refreshed.lock().unwrap_or_else(|e| e.into_inner()) = std::time::Instant::now();
        Ok(())
    }

    /// Since the files were last read (memcached's `time_since_server_cert_refresh`).
    pub fn since_refresh(&self) -> std::time::Duration {
        self.refreshed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .elapsed()
    }

    fn current(&self) -> Arc<ServerConfig> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// A [`Service`] whose sessions speak TLS to their clients (see the module's doc), but on
/// the listeners given as plain (memcached's `-l notls:ADDR`).
pub struct TlsService<S> {
    inner: Arc<S>,
    certs: Arc<TlsCerts>,
    stats: Arc<TlsStats>,
    input_max: usize,
    plain_listeners: Vec<std::net::SocketAddr>,
}

impl<S: Service> TlsService<S> {
    /// Wraps `inner`; decrypted input held per connection is bounded by `input_max` (the
    /// engine's `input_buffer_max_bytes`). Connections accepted on `plain_listeners` are
    /// served without TLS.
    pub fn new(
        inner: Arc<S>,
        certs: Arc<TlsCerts>,
        input_max: usize,
        plain_listeners: Vec<std::net::SocketAddr>,
    ) -> Self {
        Self {
            inner,
            certs,
            stats: Arc::default(),
            input_max,
            plain_listeners,
        }
    }

    pub fn stats(&self) -> Arc<TlsStats> {
        self.stats.clone()
    }
}

/// A client session of a [`TlsService`]: TLS, or plain on a `notls` listener.
pub enum TlsOrPlain<S> {
    Tls(Box<TlsSession<S>>),
    Plain(S),
}

impl<S: Session> Session for TlsOrPlain<S> {
    fn on_input(&mut self, input: &[u8], output: &mut Vec<u8>, output_budget: usize) -> Progress {
        match self {
            TlsOrPlain::Tls(s) => s.on_input(input, output, output_budget),
            TlsOrPlain::Plain(s) => s.on_input(input, output, output_budget),
        }
    }

    fn on_notify(&mut self, output: &mut Vec<u8>, output_budget: usize) -> Progress {
        match self {
            TlsOrPlain::Tls(s) => s.on_notify(output, output_budget),
            TlsOrPlain::Plain(s) => s.on_notify(output, output_budget),
        }
    }

    fn on_close(&mut self) {
        match self {
            TlsOrPlain::Tls(s) => s.on_close(),
            TlsOrPlain::Plain(s) => s.on_close(),
        }
    }
}

impl<S: Service> Service for TlsService<S> {
    type Session = TlsOrPlain<S::Session>;

    fn open(&self, conn: Accepted, notify: Notify) -> Self::Session {
        if self.plain_listeners.contains(&conn.listener) {
            return TlsOrPlain::Plain(self.inner.open(conn, notify));
        }
        let tls = ServerConnection::new(self.certs.current())
            .inspect_err(|e| tracing::error!(error = %e, "cannot start a TLS session"))
            .ok()
            .map(|mut tls| {
                // Replies are moved out of rustls as soon as they are encrypted (`seal`), and
                // bounded by the engine's output budget: rustls's own 64 KiB limit on queued
                // plaintext would only refuse the rest of a large value.
                tls.set_buffer_limit(None);
                tls
            });
        TlsOrPlain::Tls(Box::new(TlsSession {
            tls,
            inner: self.inner.open(conn, notify),
            plain: Vec::new(),
            scratch: Vec::new(),
            input_max: self.input_max,
            stats: self.stats.clone(),
            handshaken: false,
            received: false,
            peer_closed: false,
            closed: false,
        }))
    }
}

/// One client connection's TLS state around its memcached session.
pub struct TlsSession<S> {
    /// None only when rustls refused to start a session (logged): the client is closed.
    tls: Option<ServerConnection>,
    inner: S,
    /// Decrypted input the wrapped session has not consumed yet.
    plain: Vec<u8>,
    /// The wrapped session's output, before it is encrypted.
    scratch: Vec<u8>,
    input_max: usize,
    stats: Arc<TlsStats>,
    handshaken: bool,
    /// Some ciphertext arrived (a handshake is under way, for the request clock).
    received: bool,
    /// The client sent its `close_notify`.
    peer_closed: bool,
    /// Closing: an alert or our `close_notify` is sent, nothing more is read.
    closed: bool,
}

impl<S: Session> TlsSession<S> {
    /// Offers decrypted input to the wrapped session (once the handshake is done), then
    /// encrypts what it wrote into `output`.
    fn serve(&mut self, consumed: usize, output: &mut Vec<u8>, budget: usize) -> Progress {
        let Some(tls) = self.tls.as_mut() else {
            return Progress::closing(consumed);
        };
        let mut progress = Progress::default();
        let mut progressed = false;
        if !self.plain.is_empty() && !tls.is_handshaking() {
            self.scratch.clear();
            let room = budget.saturating_sub(output.len());
            progress = self.inner.on_input(&self.plain, &mut self.scratch, room);
            let used = progress.consumed.min(self.plain.len());
            self.plain.drain(..used);
            progressed = used > 0;
        }
        if self.peer_closed && !progressed && !progress.output_full && !progress.yielded {
            // The client ended its TLS session and nothing it sent can be served any more.
            progress.close = true;
        }
        self.seal(output, progress.close);
        progress.consumed = consumed;
        progress.buffered = Some(crate::Buffered {
            progressed,
            pending: !self.plain.is_empty() || (self.received && !self.handshaken),
        });
        progress
    }

    /// Encrypts the wrapped session's output (in `scratch`) into `output`, with a
    /// `close_notify` after it when `close`.
    fn seal(&mut self, output: &mut Vec<u8>, close: bool) {
        let Some(tls) = self.tls.as_mut() else { return };
        if !self.scratch.is_empty() {
            self.stats
                .bytes_written
                .fetch_add(self.scratch.len() as u64, Relaxed);
            // Without a buffer limit (removed in `open`) rustls takes every byte.
            if let Err(e) = tls.writer().write_all(&self.scratch) {
                tracing::warn!(error = %e, "TLS refused a reply; closing");
                self.closed = true;
            }
            self.scratch.clear();
        }
        if close && !self.closed {
            tls.send_close_notify();
            self.closed = true;
        }
        flush(tls, output);
    }
}

/// Moves every TLS record rustls has ready into `output`.
fn flush(tls: &mut ServerConnection, output: &mut Vec<u8>) {
    while tls.wants_write() {
        // Writing into a Vec cannot fail.
        if tls.write_tls(output).is_err() {
            break;
        }
    }
}

/// Decrypts what rustls has received into `plain`; true when the client sent its
/// `close_notify`.
fn decrypt(tls: &mut ServerConnection, plain: &mut Vec<u8>) -> Result<bool, rustls::Error> {
    let state = tls.process_new_packets()?;
    let n = state.plaintext_bytes_to_read();
    if n > 0 {
        let start = plain.len();
        plain.resize(start + n, 0);
        let got = tls.reader().read(&mut plain[start..]).unwrap_or(0);
        plain.truncate(start + got);
    }
    Ok(state.peer_has_closed())
}

impl<S: Session> Session for TlsSession<S> {
    fn on_input(&mut self, input: &[u8], output: &mut Vec<u8>, output_budget: usize) -> Progress {
        let Some(tls) = self.tls.as_mut() else {
            return Progress::closing(input.len());
        };
        if self.closed {
            return Progress::closing(input.len());
        }
        let mut consumed = 0;
        while consumed < input.len() && self.plain.len() < self.input_max {
            match tls.read_tls(&mut &input[consumed..]) {
                Ok(0) | Err(_) => break,
                Ok(n) => consumed += n,
            }
            self.received = true;
            let before = self.plain.len();
            match decrypt(tls, &mut self.plain) {
                Ok(closed) => {
                    self.peer_closed |= closed;
                    let n = self.plain.len() - before;
                    self.stats.bytes_read.fetch_add(n as u64, Relaxed);
                }
                Err(e) => {
                    self.stats.handshake_errors.fetch_add(1, Relaxed);
                    tracing::debug!(error = %e, handshaken = self.handshaken, "TLS failed; closing the connection");
                    // rustls queued an alert telling the client why.
                    flush(tls, output);
                    self.closed = true;
                    return Progress::closing(input.len());
                }
            }
            if !self.handshaken && !tls.is_handshaking() {
                self.handshaken = true;
                self.stats.new_sessions.fetch_add(1, Relaxed);
            }
        }
        self.serve(consumed, output, output_budget)
    }

    fn on_notify(&mut self, output: &mut Vec<u8>, output_budget: usize) -> Progress {
        if self.tls.is_none() || self.closed {
            return Progress::default();
        }
        self.scratch.clear();
        let room = output_budget.saturating_sub(output.len());
        let mut progress = self.inner.on_notify(&mut self.scratch, room);
        self.seal(output, progress.close);
        progress.consumed = 0;
        progress.buffered = Some(crate::Buffered {
            progressed: false,
            pending: !self.plain.is_empty(),
        });
        progress
    }

    fn on_close(&mut self) {
        self.inner.on_close();
    }
}

#[cfg(test)]
mod tests;
