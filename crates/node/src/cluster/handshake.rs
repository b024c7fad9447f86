//! The start of every peer connection, on its stream (after TLS, when `[cluster.tls]` is
//! on: see [`super::transport`]): with a cluster secret, the mutual
//! challenge–response of `cellcache_cluster::auth` (the math lives there), then the
//! connecting cell's `Hello`; without one, just the `Hello`. The accepting side reads each
//! frame of it exactly (no byte of what follows), and nothing after it is read before both
//! proofs checked, so a peer without the secret is closed before any frame of its is
//! processed.

use cellcache_cluster::auth::{self, AuthError, NONCE_BYTES, Secret};
use cellcache_cluster::wire::payload::{self, Hello};
use cellcache_cluster::wire::{self, Decoded, FrameKind, HEADER_BYTES, WireConfig, WireError};
use rand::RngCore;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::link::OwnedFrame;
use super::transport::PeerAuth;

/// Why a peer connection was closed during its handshake.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    #[error("connection: {0}")]
    Io(#[from] std::io::Error),
    #[error("frame: {0}")]
    Wire(#[from] WireError),
    #[error("{0}")]
    Auth(#[from] AuthError),
    #[error(
        "the peer sent {0:?} where this cell expected {1:?}: every cell of a ring needs the \
         same cluster secret (cluster.secret_file), or none"
    )]
    Unexpected(FrameKind, FrameKind),
    #[error("the peer refused the connection: {0}")]
    Refused(String),
    #[error("malformed Hello: {0}")]
    Hello(String),
    #[error("no answer within the timeout")]
    TimedOut,
    #[error(
        "TLS handshake: {0} (every cell of a ring needs cluster.tls with the same CA, or none)"
    )]
    Tls(std::io::Error),
    #[error("the peer's certificate does not carry the name {0:?} (cluster.tls.server_name)")]
    TlsName(String),
    #[error("the peer opened a TLS handshake, and this cell runs without cluster.tls")]
    TlsUnexpected,
    #[error("the peer answered in TLS: it runs with cluster.tls, and this cell without")]
    TlsExpected,
}

impl HandshakeError {
    /// A failure a retry cannot change: the peer's TLS refused this cell's certificate or
    /// this cell refused the peer's (as against a connection that was merely cut).
    fn is_tls_refusal(&self) -> bool {
        match self {
            HandshakeError::Tls(e) => e
                .get_ref()
                .is_some_and(|inner| inner.downcast_ref::<rustls::Error>().is_some()),
            HandshakeError::TlsName(_)
            | HandshakeError::TlsUnexpected
            | HandshakeError::TlsExpected => true,
            _ => false,
        }
    }
}

/// Why the ring's secret file could not be read or made.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("reading the cluster secret file {path}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the cluster secret file {path} (`cellcache ctl secret new`)")]
    Invalid {
        path: String,
        #[source]
        source: AuthError,
    },
    #[error("creating the secret file {path}")]
    Create {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// Reads the ring's secret from `path` (`cluster.secret_file`); an empty path is no secret.
/// A file others may read is used, with a warning: the secret is the ring's only key.
pub fn load_secret(path: &str) -> Result<Option<Secret>, SecretError> {
    use std::os::unix::fs::PermissionsExt as _;
    if path.is_empty() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path).map_err(|source| SecretError::Read {
        path: path.to_string(),
        source,
    })?;
    let secret = Secret::parse(&text).map_err(|source| SecretError::Invalid {
        path: path.to_string(),
        source,
    })?;
    if let Ok(meta) = std::fs::metadata(path) {
        if meta.permissions().mode() & 0o077 != 0 {
            tracing::warn!(
                path,
                "the cluster secret file is readable by other users: chmod 600 it"
            );
        }
    }
    Ok(Some(secret))
}

/// Writes a fresh secret to a new file at `path`, readable by its owner only (mode 0600);
/// an existing file is left alone and is an error.
pub fn write_new_secret(path: &std::path::Path) -> Result<(), SecretError> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut bytes = [0u8; auth::SECRET_BYTES];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    let create = |source| SecretError::Create {
        path: path.display().to_string(),
        source,
    };
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(create)?;
    file.write_all(Secret::from_bytes(bytes).to_text().as_bytes())
        .map_err(create)?;
    Ok(())
}

/// A fresh nonce from the thread's CSPRNG (seeded by the operating system).
fn nonce() -> [u8; NONCE_BYTES] {
    let mut n = [0u8; NONCE_BYTES];
    rand::thread_rng().fill_bytes(&mut n);
    n
}

/// Reads exactly one frame (and not a byte more) from `rd`. A TLS record where a frame
/// should be (a cell with `cluster.tls` answering one without: its alert) is said as such
/// rather than as a malformed or cut frame.
pub async fn read_frame(
    rd: &mut (impl AsyncRead + Unpin),
    wire: &WireConfig,
) -> Result<OwnedFrame, HandshakeError> {
    let mut buf = vec![0u8; HEADER_BYTES];
    rd.read_exact(&mut buf[..1]).await?;
    // TLS alert and handshake records; a frame starts with `wire::MAGIC`'s low byte.
    if matches!(buf[0], 0x15 | 0x16) {
        return Err(HandshakeError::TlsExpected);
    }
    rd.read_exact(&mut buf[1..]).await?;
    let total = wire::frame_bytes(wire, &buf)?;
    buf.resize(total, 0);
    rd.read_exact(&mut buf[HEADER_BYTES..]).await?;
    match wire::decode(wire, &buf)? {
        Decoded::Complete { frame, .. } => Ok(OwnedFrame::from_frame(&frame)),
        // `frame_bytes` gave the whole length and all of it was read
        Decoded::Incomplete => Err(WireError::Payload("frame shorter than its header says").into()),
    }
}

async fn write_frame(
    wr: &mut (impl AsyncWrite + Unpin),
    wire: &WireConfig,
    kind: FrameKind,
    payload: &[u8],
) -> Result<(), HandshakeError> {
    write_frame_with_id(wr, wire, kind, 0, payload).await
}

/// Writes one frame (epoch 0: handshake and operator frames carry no map).
pub async fn write_frame_with_id(
    wr: &mut (impl AsyncWrite + Unpin),
    wire: &WireConfig,
    kind: FrameKind,
    request_id: u64,
    payload: &[u8],
) -> Result<(), HandshakeError> {
    let mut out = Vec::with_capacity(HEADER_BYTES + payload.len() + wire::TRAILER_BYTES);
    wire::encode(wire, kind, 0, request_id, payload, &mut out)?;
    wr.write_all(&out).await?;
    wr.flush().await?;
    Ok(())
}

/// Sends one operator command (a `cluster …` line) to the cell whose peer port is `peer`,
/// over TLS when `auth` has it, proving the ring's secret first when it has one, and
/// returns the cell's text reply.
/// Blocking (its own small runtime), for a cell before it serves: `serve --join`, and a
/// restarted cell asking whether its ring is alive. Gives up early once `cancel` is
/// triggered (a signal stops a joining cell promptly).
pub fn operator_call(
    peer: &str,
    auth: &PeerAuth,
    wire: &WireConfig,
    line: &str,
    timeout: std::time::Duration,
    cancel: Option<&cellcache_io::Shutdown>,
) -> Result<String, OperatorCallError> {
    let at = |source| OperatorCallError::Failed {
        peer: peer.to_string(),
        source,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(OperatorCallError::Runtime)?;
    runtime.block_on(async {
        let call = async {
            let stream = tokio::net::TcpStream::connect(peer).await?;
            let mut stream = auth.connect(stream, wire).await?;
            write_frame_with_id(&mut stream, wire, FrameKind::Control, 1, line.as_bytes()).await?;
            let reply = read_frame(&mut stream, wire).await?;
            match reply.kind {
                FrameKind::Control => Ok(String::from_utf8_lossy(&reply.payload).into_owned()),
                FrameKind::Refused => Err(HandshakeError::Refused(
                    String::from_utf8_lossy(&reply.payload).into_owned(),
                )),
                other => Err(HandshakeError::Unexpected(other, FrameKind::Control)),
            }
        };
        let cancelled = async {
            let Some(cancel) = cancel else {
                return std::future::pending().await;
            };
            while !cancel.is_triggered() {
                tokio::time::sleep(CANCEL_POLL).await;
            }
        };
        tokio::select! {
            reply = tokio::time::timeout(timeout, call) => match reply {
                Ok(reply) => reply.map_err(at),
                Err(_) => Err(at(HandshakeError::TimedOut)),
            },
            () = cancelled => Err(OperatorCallError::Cancelled),
        }
    })
}

/// How often a blocked [`operator_call`] looks at its cancel flag.
const CANCEL_POLL: std::time::Duration = std::time::Duration::from_millis(100);

/// Why an operator command got no reply from a cell's peer port.
#[derive(Debug, thiserror::Error)]
pub enum OperatorCallError {
    #[error("cancelled")]
    Cancelled,
    #[error("starting a runtime for the operator call")]
    Runtime(#[source] std::io::Error),
    #[error("calling the peer port {peer}")]
    Failed {
        peer: String,
        #[source]
        source: HandshakeError,
    },
}

impl OperatorCallError {
    /// The cell refused this caller for a reason a retry cannot change: its secret (a proof
    /// that failed, a peer that wants none or another), its TLS (a certificate refused
    /// either way, a peer without TLS) or the command itself.
    pub fn is_final(&self) -> bool {
        match self {
            OperatorCallError::Failed { source, .. } => {
                source.is_tls_refusal()
                    || matches!(
                        source,
                        HandshakeError::Auth(_)
                            | HandshakeError::Refused(_)
                            | HandshakeError::Unexpected(..)
                    )
            }
            _ => false,
        }
    }
}

/// The connecting side: proves the secret and checks the peer's proof. The caller sends its
/// `Hello` next. Without a secret there is nothing to do.
pub async fn connect(
    stream: &mut (impl AsyncRead + AsyncWrite + Unpin),
    wire: &WireConfig,
    secret: Option<&Secret>,
) -> Result<(), HandshakeError> {
    let Some(secret) = secret else {
        return Ok(());
    };
    let nc = nonce();
    write_frame(stream, wire, FrameKind::AuthInit, &nc).await?;
    let reply = read_frame(stream, wire).await?;
    match reply.kind {
        FrameKind::AuthChallenge => {}
        FrameKind::Refused => {
            return Err(HandshakeError::Refused(
                String::from_utf8_lossy(&reply.payload).into_owned(),
            ));
        }
        other => return Err(HandshakeError::Unexpected(other, FrameKind::AuthChallenge)),
    }
    let (ns, proof) = auth::decode_challenge(&reply.payload)?;
    secret.verify_accept(&nc, &ns, proof)?;
    let response = secret.connect_proof(&nc, &ns);
    write_frame(stream, wire, FrameKind::AuthResponse, &response).await
}

/// Who opened an accepted connection.
#[derive(Debug)]
pub enum Opening {
    /// A cell, introduced by its `Hello`.
    Cell(Hello),
    /// An operator (`cellcache ctl`, or a cell not yet in the ring asking to join) that
    /// proved the secret and sent a `Control` command instead of a `Hello`: this is its
    /// first command. Only with a secret.
    Operator(OwnedFrame),
}

/// The accepting side: with a secret, requires the peer's proof before anything else; then
/// reads the peer's `Hello` (or, after a proof, an operator's first `Control` frame). A peer
/// that does not follow gets a `Refused` frame saying why (for its operator's log) and the
/// error.
pub async fn accept(
    stream: &mut (impl AsyncRead + AsyncWrite + Unpin),
    wire: &WireConfig,
    secret: Option<&Secret>,
) -> Result<Opening, HandshakeError> {
    let first = read_frame(stream, wire).await?;
    let hello = match (secret, first.kind) {
        (Some(secret), FrameKind::AuthInit) => {
            let nc = auth::decode_init(&first.payload)?;
            let ns = nonce();
            let challenge = auth::encode_challenge(&ns, &secret.accept_proof(&nc, &ns));
            write_frame(stream, wire, FrameKind::AuthChallenge, &challenge).await?;
            let response = read_frame(stream, wire).await?;
            if response.kind != FrameKind::AuthResponse {
                return Err(HandshakeError::Unexpected(
                    response.kind,
                    FrameKind::AuthResponse,
                ));
            }
            let proof = auth::decode_response(&response.payload)?;
            if let Err(e) = secret.verify_connect(&nc, &ns, proof) {
                refuse(stream, wire, "authentication failed").await;
                return Err(e.into());
            }
            let next = read_frame(stream, wire).await?;
            if next.kind == FrameKind::Control {
                return Ok(Opening::Operator(next));
            }
            next
        }
        (Some(_), other) => {
            refuse(stream, wire, "this ring requires a cluster secret").await;
            return Err(HandshakeError::Unexpected(other, FrameKind::AuthInit));
        }
        (None, FrameKind::AuthInit) => {
            refuse(stream, wire, "this cell runs without a cluster secret").await;
            return Err(HandshakeError::Unexpected(
                FrameKind::AuthInit,
                FrameKind::Hello,
            ));
        }
        // Without a secret the peer plane is open: a cell's operator commands come as is.
        (None, FrameKind::Control) => return Ok(Opening::Operator(first)),
        (None, _) => first,
    };
    if hello.kind != FrameKind::Hello {
        return Err(HandshakeError::Unexpected(hello.kind, FrameKind::Hello));
    }
    payload::decode_hello(&hello.payload)
        .map(Opening::Cell)
        .map_err(|e| HandshakeError::Hello(e.to_string()))
}

/// Tells the peer why it is being closed; a failure to say so changes nothing.
async fn refuse(stream: &mut (impl AsyncWrite + Unpin), wire: &WireConfig, why: &str) {
    let _ = write_frame(stream, wire, FrameKind::Refused, why.as_bytes()).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(b: u8) -> Secret {
        Secret::from_bytes([b; auth::SECRET_BYTES])
    }

    fn hello() -> Hello {
        Hello {
            cell: cellcache_cluster::CellId::whole(2),
            ring: 9,
            client: "127.0.0.1:1".into(),
        }
    }

    /// Runs both sides over an in-memory pipe; the connecting side sends its Hello after
    /// its handshake, as a link does.
    async fn pair(
        connecting: Option<Secret>,
        accepting: Option<Secret>,
    ) -> (Result<(), HandshakeError>, Result<Hello, HandshakeError>) {
        let (mut c, mut s) = tokio::io::duplex(4096);
        let wire = WireConfig::default();
        let client = async move {
            // A failed side drops its end at once, as a link does, so the other sees EOF.
            connect(&mut c, &wire, connecting.as_ref()).await?;
            let h = payload::encode_hello(&hello());
            write_frame(&mut c, &wire, FrameKind::Hello, &h).await?;
            // keep the pipe open until the accepting side is done
            let mut sink = Vec::new();
            let _ = c.read_to_end(&mut sink).await;
            Ok(())
        };
        let server = async move {
            let r = accept(&mut s, &wire, accepting.as_ref()).await;
            drop(s);
            match r {
                Ok(Opening::Cell(hello)) => Ok(hello),
                Ok(Opening::Operator(f)) => {
                    Err(HandshakeError::Unexpected(f.kind, FrameKind::Hello))
                }
                Err(e) => Err(e),
            }
        };
        tokio::join!(client, server)
    }

    fn run<T>(f: impl std::future::Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime")
            .block_on(f)
    }

    #[test]
    fn cells_with_the_same_secret_connect() {
        let (c, s) = run(pair(Some(secret(1)), Some(secret(1))));
        c.expect("connecting side");
        assert_eq!(s.expect("accepting side"), hello());
    }

    #[test]
    fn cells_without_a_secret_connect_as_before() {
        let (c, s) = run(pair(None, None));
        c.expect("connecting side");
        assert_eq!(s.expect("accepting side"), hello());
    }

    #[test]
    fn a_wrong_secret_is_refused_by_both_sides() {
        let (c, s) = run(pair(Some(secret(1)), Some(secret(2))));
        assert!(
            matches!(c, Err(HandshakeError::Auth(AuthError::BadProof))),
            "{c:?}"
        );
        assert!(s.is_err(), "{s:?}");
    }

    #[test]
    fn a_hello_without_the_secret_is_refused_before_it_is_read() {
        let (c, s) = run(pair(None, Some(secret(1))));
        c.expect("the connecting side only sent its Hello");
        assert!(
            matches!(
                s,
                Err(HandshakeError::Unexpected(
                    FrameKind::Hello,
                    FrameKind::AuthInit
                ))
            ),
            "{s:?}"
        );
    }

    #[test]
    fn a_secret_offered_to_an_open_cell_is_refused_with_the_reason() {
        let (c, s) = run(pair(Some(secret(1)), None));
        assert!(
            matches!(&c, Err(HandshakeError::Refused(why)) if why.contains("without a cluster secret")),
            "{c:?}"
        );
        assert!(s.is_err());
    }

    /// After its proof, an operator may send a command instead of a Hello; an open ring takes
    /// it without one, a ring with a secret never does.
    #[test]
    fn an_operator_that_proved_the_secret_sends_a_command() {
        let wire = WireConfig::default();
        let opened = |accepting: Option<Secret>, connecting: Option<Secret>| {
            run(async move {
                let (mut c, mut s) = tokio::io::duplex(4096);
                let client = async move {
                    connect(&mut c, &wire, connecting.as_ref()).await?;
                    write_frame(&mut c, &wire, FrameKind::Control, b"cluster status").await?;
                    let mut sink = Vec::new();
                    let _ = c.read_to_end(&mut sink).await;
                    Ok::<(), HandshakeError>(())
                };
                let server = async move {
                    let r = accept(&mut s, &wire, accepting.as_ref()).await;
                    drop(s);
                    r
                };
                tokio::join!(client, server).1
            })
        };
        let with = opened(Some(secret(4)), Some(secret(4)));
        assert!(
            matches!(&with, Ok(Opening::Operator(f)) if f.payload == b"cluster status"),
            "{with:?}"
        );
        // An open ring (no secret) takes its operator commands as they come: a joining
        // cell's `cluster join` has nothing to prove.
        let without = opened(None, None);
        assert!(
            matches!(&without, Ok(Opening::Operator(f)) if f.payload == b"cluster status"),
            "{without:?}"
        );
        // A ring with a secret never takes one from a connection that did not prove it.
        let unproven = opened(Some(secret(4)), None);
        assert!(
            matches!(
                unproven,
                Err(HandshakeError::Unexpected(
                    FrameKind::Control,
                    FrameKind::AuthInit
                ))
            ),
            "{unproven:?}"
        );
    }

    /// A frame read during the handshake takes exactly its own bytes.
    #[test]
    fn a_new_secret_file_is_private_loadable_and_never_overwritten() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = std::env::temp_dir().join(format!("cellcache-secret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temp dir");
        let path = dir.join("ring.secret");
        let _ = std::fs::remove_file(&path);
        write_new_secret(&path).expect("written");
        let mode = std::fs::metadata(&path)
            .expect("metadata")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let loaded = load_secret(path.to_str().expect("utf-8 path")).expect("loads");
        assert!(loaded.is_some());
        assert!(write_new_secret(&path).is_err(), "an existing file is kept");
        assert!(load_secret("").expect("no path").is_none());
        std::fs::remove_dir_all(&dir).expect("cleaned up");
    }

    #[test]
    fn read_frame_takes_one_frame_and_no_more() {
        run(async {
            let wire = WireConfig::default();
            let mut bytes = Vec::new();
            wire::encode(&wire, FrameKind::AuthInit, 0, 0, &[1; 32], &mut bytes).expect("frame");
            wire::encode(&wire, FrameKind::Hello, 0, 0, b"next", &mut bytes).expect("frame");
            let mut rd: &[u8] = &bytes;
            let first = read_frame(&mut rd, &wire).await.expect("first");
            assert_eq!(first.kind, FrameKind::AuthInit);
            let second = read_frame(&mut rd, &wire).await.expect("second");
            assert_eq!(
                (second.kind, second.payload.as_slice()),
                (FrameKind::Hello, &b"next"[..])
            );
        });
    }
}
