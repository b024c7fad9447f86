//! The admin plane: operators' HTTP listener, apart from the memcached port (which speaks
//! only memcached). `cellcache ctl` talks to it; docs/protocol.md ("Admin interface") lists
//! its endpoints and docs/security.md who may use it.
//!
//! It binds loopback by default. With `admin.token_file` every request must carry
//! `Authorization: Bearer <token>` (compared in constant time), and only with a token may it
//! bind another address. Its connections are bounded (`admin.connections_max`, past which a
//! new one is closed at once) and each lives at most `admin.connection_timeout_ms`, so an
//! idle or slow client cannot hold it. It runs on a runtime of its own, one thread, so it
//! answers on a standalone or standby cell too and never competes with the peer plane.
//!
//! Replies are text: the ring's views are the lines `ctl` prints (`EPOCH …`, `CELL …`,
//! `END`), errors one line with an HTTP status saying which kind. [`client`] is the other
//! side, for `ctl` and the tests.

pub mod client;
pub mod metrics;
mod tier;

use std::future::Future as _;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};

use crate::cell::Cell;
use crate::cluster::{self, Slot};
use crate::config::{ADMIN_PORT_OFFSET, AdminConfig};

/// Why the admin plane did not start.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("reading the admin token file {path}")]
    Token {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the admin token file {path} is empty")]
    EmptyToken { path: String },
    #[error("binding the admin port {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("starting the admin runtime")]
    Runtime(#[source] std::io::Error),
}

/// The running admin plane; stopping it ([`Admin::stop`]) closes its listener.
pub struct Admin {
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Admin {
    /// Stops serving and waits for the admin thread.
    pub fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What every handler sees.
struct Plane {
    cell: Arc<Cell>,
    ring: Arc<Slot>,
    /// The bearer token, if one is required.
    token: Option<Vec<u8>>,
}

/// Reads the token (its first line, trimmed); empty path: none.
fn load_token(path: &str) -> Result<Option<Vec<u8>>, AdminError> {
    if path.is_empty() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path).map_err(|source| AdminError::Token {
        path: path.to_string(),
        source,
    })?;
    let token = text.lines().next().unwrap_or("").trim();
    if token.is_empty() {
        return Err(AdminError::EmptyToken {
            path: path.to_string(),
        });
    }
    Ok(Some(token.as_bytes().to_vec()))
}

/// Binds the admin port (see [`AdminConfig::port`]) next to the client port `client`.
fn bind(config: &AdminConfig, client: SocketAddr) -> Result<std::net::TcpListener, AdminError> {
    let at = |port| SocketAddr::new(config.listen, port);
    let bind = |addr: SocketAddr| {
        std::net::TcpListener::bind(addr)
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .map_err(|source| AdminError::Bind { addr, source })
    };
    if config.port != 0 {
        return bind(at(config.port));
    }
    let derived = client
        .port()
        .checked_add(ADMIN_PORT_OFFSET)
        .filter(|_| client.port() != 0);
    if let Some(l) = derived.and_then(|p| bind(at(p)).ok()) {
        return Ok(l);
    }
    bind(at(0))
}

/// The admin plane's token and bound listener, before it serves ([`start`]).
pub struct Prepared {
    config: AdminConfig,
    token: Option<Vec<u8>>,
    listener: std::net::TcpListener,
}

/// Reads the token and binds the admin port next to the client port `client`, if the admin
/// plane is enabled. A ring member does this before it joins its ring, so that a taken admin
/// port fails the start before the ring has made the cell a member.
pub fn prepare(config: &AdminConfig, client: SocketAddr) -> Result<Option<Prepared>, AdminError> {
    if !config.enabled {
        return Ok(None);
    }
    Ok(Some(Prepared {
        config: config.clone(),
        token: load_token(&config.token_file)?,
        listener: bind(config, client)?,
    }))
}

/// Starts serving the prepared admin plane of `cell` (its ring membership in `ring`).
pub fn start(
    prepared: Option<Prepared>,
    cell: Arc<Cell>,
    ring: Arc<Slot>,
) -> Result<Option<Admin>, AdminError> {
    let Some(Prepared {
        config,
        token,
        listener,
    }) = prepared
    else {
        return Ok(None);
    };
    let addr = listener.local_addr().map_err(|source| AdminError::Bind {
        addr: SocketAddr::new(config.listen, config.port),
        source,
    })?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(AdminError::Runtime)?;
    let plane = Arc::new(Plane { cell, ring, token });
    let (stop, stopped) = oneshot::channel::<()>();
    let thread = std::thread::Builder::new()
        .name("cellcache-admin".into())
        .spawn(move || {
            runtime.block_on(async move {
                let listener = match tokio::net::TcpListener::from_std(listener) {
                    Ok(l) => l,
                    Err(e) => {
                        tracing::error!(error = %e, "admin listener");
                        return;
                    }
                };
                let limited = Limited {
                    listener,
                    slots: Arc::new(Semaphore::new(config.connections_max)),
                    lifetime: Duration::from_millis(config.connection_timeout_ms),
                };
                let app = router(plane);
                let served = axum::serve(limited, app).with_graceful_shutdown(async {
                    let _ = stopped.await;
                });
                if let Err(e) = served.await {
                    tracing::error!(error = %e, "admin plane stopped");
                }
            });
        })
        .map_err(AdminError::Runtime)?;
    tracing::info!(%addr, token = !config.token_file.is_empty(), "admin listener bound");
    Ok(Some(Admin {
        addr,
        stop: Some(stop),
        thread: Some(thread),
    }))
}

fn router(plane: Arc<Plane>) -> Router {
    // Outside the token: the health probe (orchestrators' probes cannot send a token; it
    // says only `OK`) and the dashboard page (no data of its own: it sends the token the
    // user gives it, `/?token=`, with each of its requests).
    let public = Router::new()
        .route("/", get(dashboard))
        .route("/health", get(|| async { "OK\r\n" }));
    Router::new()
        .route("/metrics", get(metrics))
        .route("/cluster/status", get(status))
        .route("/cells", get(cells))
        .route("/events", get(events))
        .route("/cluster/ranges", get(ranges))
        .route("/cluster/peek/{key}", get(peek))
        .route("/cluster/leave/{cell}", post(leave))
        .route("/cluster/shift/{cell}", post(shift))
        .route("/cluster/invite", post(invite))
        .route("/autoscale", get(autoscale_status))
        .route("/cluster/autoscale", get(autoscale_text))
        .route("/cluster/autoscale/{switch}", post(autoscale_switch))
        .route("/tier", get(tier::status))
        .route("/tier/policy/{policy}", post(tier::policy))
        .route("/switch", get(switch_list))
        .route("/autoswitch", get(autoswitch_status))
        .route("/autoswitch/{switch}", post(autoswitch_switch))
        .route("/switch/{block}/{implementation}", post(switch_block))
        .route(
            "/cluster/switch/{block}/{implementation}",
            post(switch_ring),
        )
        .layer(middleware::from_fn_with_state(plane.clone(), authorize))
        .merge(public)
        .with_state(plane)
}

/// With a token configured, a request without `Authorization: Bearer <token>` gets 401.
async fn authorize(
    State(plane): State<Arc<Plane>>,
    headers: HeaderMap,
    request: Request,
    next: Next,
) -> Response {
    if let Some(token) = &plane.token {
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
            .unwrap_or(b"");
        use subtle::ConstantTimeEq as _;
        if !bool::from(given.ct_eq(token)) {
            return (
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, "Bearer")],
                "CLIENT_ERROR unauthenticated: this admin port needs its token\r\n",
            )
                .into_response();
        }
    }
    next.run(request).await
}

/// The reply to a ring command on a cell that is no ring member.
fn not_a_member() -> Response {
    (
        StatusCode::CONFLICT,
        "SERVER_ERROR not a ring member (standalone or standby cell)\r\n",
    )
        .into_response()
}

/// A text reply whose status follows its first line: `CLIENT_ERROR` 400, `SERVER_ERROR`
/// 409, anything else 200.
fn text(reply: Vec<u8>) -> Response {
    let status = if reply.starts_with(b"CLIENT_ERROR") {
        StatusCode::BAD_REQUEST
    } else if reply.starts_with(b"SERVER_ERROR") {
        StatusCode::CONFLICT
    } else {
        StatusCode::OK
    };
    (status, reply).into_response()
}

/// Prometheus's scrape ([`metrics`](self::metrics)).
async fn metrics(State(plane): State<Arc<Plane>>) -> Response {
    match metrics::render(&plane.cell, &plane.ring) {
        Ok(body) => (
            [(
                axum::http::header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        )
            .into_response(),
        Err(_) => (
            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            "metrics could not be encoded\r\n",
        )
            .into_response(),
    }
}

/// The dashboard: one page, no build step, that draws `/cells` and `/events` every second.
async fn dashboard() -> Response {
    (
        [(axum::http::header::CONTENT_TYPE, "text/html; charset=utf-8")],
        include_str!("dashboard.html"),
    )
        .into_response()
}

/// The ring's recent events as JSON, oldest first (`cluster::events`).
async fn events(State(plane): State<Arc<Plane>>) -> Response {
    match plane.ring.cluster.get() {
        Some(cl) => axum::Json(cl.recent_events()).into_response(),
        None => not_a_member(),
    }
}

/// The ring as JSON (`cluster::view::RingView`).
async fn cells(State(plane): State<Arc<Plane>>) -> Response {
    match plane.ring.cluster.get() {
        Some(cl) => axum::Json(cluster::view::gather(cl, cluster::view::Gather::Figures).await)
            .into_response(),
        None => not_a_member(),
    }
}

async fn status(State(plane): State<Arc<Plane>>) -> Response {
    match plane.ring.cluster.get() {
        Some(cl) => text(cluster::ext::status_text(cl).await.into_bytes()),
        None => not_a_member(),
    }
}

async fn ranges(State(plane): State<Arc<Plane>>) -> Response {
    match plane.ring.cluster.get() {
        Some(cl) => text(cluster::ext::ranges_text(cl).into_bytes()),
        None => not_a_member(),
    }
}

async fn peek(State(plane): State<Arc<Plane>>, Path(key): Path<String>) -> Response {
    text(cluster::ext::peek(&plane.cell, key.as_bytes()))
}

async fn leave(State(plane): State<Arc<Plane>>, Path(cell): Path<String>) -> Response {
    match plane.ring.cluster.get() {
        Some(cl) => text(cluster::ext::leave(cl, &cell).await),
        None => not_a_member(),
    }
}

/// The ring's autoscaling as its deciding cell sees it (JSON: `cluster::autoscale::Status`).
async fn autoscale_status(State(plane): State<Arc<Plane>>) -> Response {
    match plane.ring.cluster.get() {
        Some(cl) => match cluster::autoscale::ring_status(cl).await {
            Some(v) => axum::Json(v).into_response(),
            None => text(b"SERVER_ERROR autoscale unavailable\r\n".to_vec()),
        },
        None => not_a_member(),
    }
}

/// The same as `ctl autoscale status` prints it.
async fn autoscale_text(State(plane): State<Arc<Plane>>) -> Response {
    match plane.ring.cluster.get() {
        Some(cl) => match cluster::autoscale::ring_status(cl).await {
            Some(s) => text(s.text().into_bytes()),
            None => text(b"SERVER_ERROR autoscale unavailable\r\n".to_vec()),
        },
        None => not_a_member(),
    }
}

/// `on` or `off` on every cell of the ring.
async fn autoscale_switch(State(plane): State<Arc<Plane>>, Path(switch): Path<String>) -> Response {
    let on = match switch.as_str() {
        "on" => true,
        "off" => false,
        _ => return text(b"CLIENT_ERROR autoscale on or off\r\n".to_vec()),
    };
    match plane.ring.cluster.get() {
        Some(cl) => text(cluster::autoscale::switch_ring(cl, on).await),
        None => not_a_member(),
    }
}

/// Every live-switchable block of this cell (`ctl switch --list --json`, see
/// [`crate::blocks::list`]).
async fn switch_list(State(plane): State<Arc<Plane>>) -> Response {
    let cluster = plane.ring.cluster.get();
    axum::Json(crate::blocks::list(&plane.cell, cluster.map(|c| &**c))).into_response()
}

/// Switches `block` of this cell to `implementation` while it serves (`ctl switch`).
async fn switch_block(
    State(plane): State<Arc<Plane>>,
    Path((block, implementation)): Path<(String, String)>,
) -> Response {
    let cluster = plane.ring.cluster.get();
    match crate::blocks::switch(&plane.cell, cluster.map(|c| &**c), &block, &implementation).await {
        Ok(line) => text(format!("OK {line}\r\n").into_bytes()),
        Err(e) => text(e.reply()),
    }
}

/// This cell's automatic policy: on or off, its verdict and signals, its recent switches
/// (`ctl autoswitch status --json`, JSON: [`crate::blocks::auto::Status`]).
async fn autoswitch_status(State(plane): State<Arc<Plane>>) -> Response {
    axum::Json(plane.cell.auto_switch.status(&plane.cell)).into_response()
}

/// Turns this cell's automatic policy on or off (`ctl autoswitch on|off`).
async fn autoswitch_switch(
    State(plane): State<Arc<Plane>>,
    Path(switch): Path<String>,
) -> Response {
    let on = match switch.as_str() {
        "on" => true,
        "off" => false,
        _ => return text(b"CLIENT_ERROR autoswitch on or off\r\n".to_vec()),
    };
    plane.cell.auto_switch.set_enabled(on);
    text(format!("OK autoswitch {switch}\r\n").into_bytes())
}

/// Switches `block` on every cell of the ring (`ctl switch --ring`).
async fn switch_ring(
    State(plane): State<Arc<Plane>>,
    Path((block, implementation)): Path<(String, String)>,
) -> Response {
    match plane.ring.cluster.get() {
        Some(cl) => text(crate::blocks::switch_ring(cl, &block, &implementation).await),
        None => not_a_member(),
    }
}

#[derive(serde::Deserialize)]
struct Shift {
    /// The neighbour taking the part.
    to: String,
    /// Of the giving cell's range, 0 to 1.
    share: f64,
}

/// Begins a shift: `share` of `cell`'s range, the end next to `to`, moves to `to`.
async fn shift(
    State(plane): State<Arc<Plane>>,
    Path(cell): Path<String>,
    Query(s): Query<Shift>,
) -> Response {
    match plane.ring.cluster.get() {
        Some(cl) => text(cluster::ext::shift(cl, &cell, &s.to, s.share).await),
        None => not_a_member(),
    }
}

#[derive(serde::Deserialize)]
struct Invitation {
    /// The peer address of a cell of the ring to join.
    via: String,
    /// The cell to divide.
    parent: String,
}

/// A standby cell joins the ring through `via` as a division of `parent` (blocks until it
/// is a member or failed; runs on a thread of its own, as joining is blocking).
async fn invite(State(plane): State<Arc<Plane>>, Query(inv): Query<Invitation>) -> Response {
    let (cell, ring) = (plane.cell.clone(), plane.ring.clone());
    let joined =
        tokio::task::spawn_blocking(move || cluster::invite(&cell, &ring, &inv.via, &inv.parent))
            .await;
    match joined {
        Ok(reply) => text(reply),
        Err(_) => text(cellcache_proto::lines::SERVER_ERROR_JOIN_NOT_STARTED.to_vec()),
    }
}

/// The admin listener with its connection limit and connection lifetime.
struct Limited {
    listener: tokio::net::TcpListener,
    slots: Arc<Semaphore>,
    lifetime: Duration,
}

impl axum::serve::Listener for Limited {
    type Io = Bounded;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Bounded, SocketAddr) {
        loop {
            let (stream, peer) = match self.listener.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of descriptors, mostly: back off instead of spinning.
                    tracing::warn!(error = %e, "admin accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let Ok(slot) = self.slots.clone().try_acquire_owned() else {
                tracing::debug!(%peer, "admin connection refused: admin.connections_max reached");
                continue; // dropped: closed at once
            };
            return (
                Bounded {
                    stream,
                    _slot: slot,
                    deadline: Box::pin(tokio::time::sleep(self.lifetime)),
                },
                peer,
            );
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }
}

/// An admin connection: holds its slot while it lives, and fails every read and write once
/// its lifetime is over, which makes the server close it.
struct Bounded {
    stream: tokio::net::TcpStream,
    _slot: OwnedSemaphorePermit,
    deadline: Pin<Box<tokio::time::Sleep>>,
}

impl Bounded {
    fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        self.deadline.as_mut().poll(cx).is_ready()
    }
}

fn timed_out() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "admin.connection_timeout_ms reached",
    )
}

impl AsyncRead for Bounded {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.expired(cx) {
            return Poll::Ready(Err(timed_out()));
        }
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Bounded {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if self.expired(cx) {
            return Poll::Ready(Err(timed_out()));
        }
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}
