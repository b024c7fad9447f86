//! A fault-injecting TCP proxy: forwards every connection accepted on its listen address
//! to one target address, and applies [`Faults`] that a test switches at run time.
//!
//! The kernel here has no `netem`, so latency, stalls, resets and slow links between a
//! client and a cell (or between cells, by pointing a cell's peer address at a proxy) are
//! made here in user space:
//! - **latency**: every chunk read in either direction is held for `latency` plus a random
//!   share of `jitter` before it is written on; order is kept (a per-direction FIFO);
//! - **bandwidth**: writes in each direction of each connection are paced to
//!   `bandwidth_bytes_per_sec`;
//! - **modes** ([`Mode`]): `Pass`; `Blackhole` accepts and reads but forwards nothing (a
//!   peer that vanished without a FIN: clients time out); `Drop` closes new and existing
//!   connections with a FIN; `Reset` closes them with an RST (`SO_LINGER` 0);
//! - **flaky connections**: `reset_per_million` resets a connection at a random chunk;
//! - [`Proxy::reset_connections`] resets the connections open now and lets new ones pass.
//!
//! The proxy runs on its own small tokio runtime in a background thread, so synchronous
//! tests drive it with plain method calls; faults travel over a `watch` channel that every
//! connection task observes (a change of mode takes effect at once on open connections;
//! latency and bandwidth apply from the next chunk).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rand::Rng;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// What the proxy does to the traffic; [`Faults::default`] forwards untouched.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Faults {
    pub mode: Mode,
    /// Added to every chunk in each direction.
    pub latency: Duration,
    /// A uniformly random extra delay in `0..=jitter` per chunk.
    pub jitter: Duration,
    /// Cap per direction per connection; `None` is unlimited.
    pub bandwidth_bytes_per_sec: Option<u64>,
    /// Chance, in parts per million per chunk read, that the connection is reset (RST both
    /// ways) instead of forwarding the chunk: requests cut off mid-way, the closest a TCP
    /// proxy gets to packet loss that breaks connections.
    pub reset_per_million: u32,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    #[default]
    Pass,
    /// Accept, read and discard; forward nothing in either direction.
    Blackhole,
    /// Close new and open connections cleanly (FIN).
    Drop,
    /// Close new and open connections with an RST.
    Reset,
}

#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("binding the proxy's listen address {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("starting the proxy's runtime: {0}")]
    Runtime(std::io::Error),
}

/// Counters of a proxy, for tests to see that traffic flowed (or did not).
#[derive(Debug, Default)]
struct Counters {
    accepted: AtomicU64,
    bytes_forwarded: AtomicU64,
}

/// A running proxy; stops when dropped.
pub struct Proxy {
    addr: SocketAddr,
    target: SocketAddr,
    faults: watch::Sender<Faults>,
    /// Bumped by [`Proxy::reset_connections`]; connections older than it reset themselves.
    generation: watch::Sender<u64>,
    counters: Arc<Counters>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Proxy {
    /// Listens on `listen` (port 0 picks a free one) and forwards to `target`.
    pub fn start(listen: SocketAddr, target: SocketAddr) -> Result<Self, ProxyError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("faultproxy")
            .enable_all()
            .build()
            .map_err(ProxyError::Runtime)?;
        let listener = runtime
            .block_on(TcpListener::bind(listen))
            .map_err(|source| ProxyError::Bind {
                addr: listen,
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| ProxyError::Bind {
            addr: listen,
            source,
        })?;
        let (faults, faults_rx) = watch::channel(Faults::default());
        let (generation, generation_rx) = watch::channel(0u64);
        let counters = Arc::new(Counters::default());
        let (shutdown, shutdown_rx) = tokio::sync::oneshot::channel();
        let accept_counters = counters.clone();
        let thread = std::thread::Builder::new()
            .name(format!("faultproxy-{}", addr.port()))
            .spawn(move || {
                runtime.block_on(async move {
                    tokio::select! {
                        () = accept_loop(listener, target, faults_rx, generation_rx, accept_counters) => {}
                        _ = shutdown_rx => {}
                    }
                });
                // dropping the runtime cancels every connection task: their sockets close
                runtime.shutdown_timeout(Duration::from_millis(100));
            })
            .map_err(ProxyError::Runtime)?;
        tracing::debug!(%addr, %target, "fault proxy started");
        Ok(Self {
            addr,
            target,
            faults,
            generation,
            counters,
            shutdown: Some(shutdown),
            thread: Some(thread),
        })
    }

    /// Starts a proxy on a free loopback port.
    pub fn to(target: SocketAddr) -> Result<Self, ProxyError> {
        Self::start(SocketAddr::from(([127, 0, 0, 1], 0)), target)
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn target(&self) -> SocketAddr {
        self.target
    }

    pub fn faults(&self) -> Faults {
        *self.faults.borrow()
    }

    /// Replaces the faults.
    pub fn set_faults(&self, faults: Faults) {
        tracing::info!(proxy = %self.addr, ?faults, "faults set");
        self.faults.send_replace(faults);
    }

    /// Changes only the mode.
    pub fn set_mode(&self, mode: Mode) {
        self.set_faults(Faults {
            mode,
            ..self.faults()
        });
    }

    /// Back to forwarding untouched.
    pub fn heal(&self) {
        self.set_faults(Faults::default());
    }

    /// Resets (RST) every connection open now; later connections are not affected.
    pub fn reset_connections(&self) {
        self.generation.send_modify(|g| *g += 1);
    }

    /// Connections accepted so far.
    pub fn connections_accepted(&self) -> u64 {
        self.counters.accepted.load(Ordering::Relaxed)
    }

    /// Bytes written on, both directions together.
    pub fn bytes_forwarded(&self) -> u64 {
        self.counters.bytes_forwarded.load(Ordering::Relaxed)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn accept_loop(
    listener: TcpListener,
    target: SocketAddr,
    faults: watch::Receiver<Faults>,
    generation: watch::Receiver<u64>,
    counters: Arc<Counters>,
) {
    loop {
        let (client, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                // out of descriptors and the like: back off instead of spinning
                tracing::warn!(%error, "fault proxy accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        counters.accepted.fetch_add(1, Ordering::Relaxed);
        let faults = faults.clone();
        let generation = generation.clone();
        let counters = counters.clone();
        tokio::spawn(async move {
            let result = connection(client, target, faults, generation, &counters).await;
            tracing::debug!(%peer, ?result, "proxied connection ended");
        });
    }
}

/// Why a proxied connection ended.
#[derive(Debug)]
enum End {
    Closed,
    Dropped,
    Reset,
    ConnectFailed,
}

async fn connection(
    mut client: TcpStream,
    target: SocketAddr,
    mut faults: watch::Receiver<Faults>,
    mut generation: watch::Receiver<u64>,
    counters: &Counters,
) -> End {
    generation.mark_unchanged();
    match faults.borrow_and_update().mode {
        Mode::Reset => return reset(&client),
        Mode::Drop => return End::Dropped,
        Mode::Pass | Mode::Blackhole => {}
    }
    let mut server = match TcpStream::connect(target).await {
        Ok(server) => server,
        // as a dead target would look to a direct client: refused, so reset
        Err(_) => {
            reset(&client);
            return End::ConnectFailed;
        }
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let end = {
        let (client_read, client_write) = client.split();
        let (server_read, server_write) = server.split();
        // a direction that draws a random reset notifies the connection, which then resets
        // both sockets (a Notify keeps the permit if nobody waits yet)
        let abort = tokio::sync::Notify::new();
        let upstream = direction(client_read, server_write, faults.clone(), counters, &abort);
        let downstream = direction(server_read, client_write, faults.clone(), counters, &abort);
        let pumps = async { tokio::join!(upstream, downstream) };
        let watch_mode = async {
            loop {
                tokio::select! {
                    changed = faults.changed() => {
                        if changed.is_err() {
                            return End::Dropped;
                        }
                        match faults.borrow_and_update().mode {
                            Mode::Reset => return End::Reset,
                            Mode::Drop => return End::Dropped,
                            Mode::Pass | Mode::Blackhole => {}
                        }
                    }
                    changed = generation.changed() => {
                        if changed.is_err() {
                            return End::Dropped;
                        }
                        return End::Reset;
                    }
                }
            }
        };
        tokio::select! {
            _ = pumps => End::Closed,
            end = watch_mode => end,
            () = abort.notified() => End::Reset,
        }
    };
    if let End::Reset = end {
        reset(&server);
        reset(&client);
    }
    end
}

/// Makes the socket's close send an RST instead of a FIN.
fn reset(stream: &TcpStream) -> End {
    // tokio's own set_linger is deprecated because a zero linger blocks nothing here
    // (non-blocking socket), which is exactly the RST-on-close behaviour wanted
    let _ = nix::sys::socket::setsockopt(
        stream,
        nix::sys::socket::sockopt::Linger,
        &nix::libc::linger {
            l_onoff: 1,
            l_linger: 0,
        },
    );
    End::Reset
}

/// Chunks held back by latency per direction before reading stops (backpressure).
const CHUNKS_IN_FLIGHT_MAX: usize = 256;
const CHUNK_BYTES: usize = 16 * 1024;

/// Forwards one direction: a reader stamps chunks with their due time, a writer sends them
/// in order once due, paced to the bandwidth cap.
async fn direction<R, W>(
    mut from: R,
    mut to: W,
    faults: watch::Receiver<Faults>,
    counters: &Counters,
    abort: &tokio::sync::Notify,
) where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    let (queue, mut due) = mpsc::channel::<(Instant, Vec<u8>)>(CHUNKS_IN_FLIGHT_MAX);
    let reader_faults = faults.clone();
    let reader = async move {
        let mut buffer = vec![0u8; CHUNK_BYTES];
        loop {
            let read = match from.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(read) => read,
            };
            let now = *reader_faults.borrow();
            if now.mode == Mode::Blackhole {
                continue;
            }
            if now.reset_per_million > 0
                && rand::thread_rng().gen_range(0..1_000_000) < now.reset_per_million
            {
                abort.notify_one();
                return;
            }
            let jitter = if now.jitter.is_zero() {
                Duration::ZERO
            } else {
                rand::thread_rng().gen_range(Duration::ZERO..=now.jitter)
            };
            let at = Instant::now() + now.latency + jitter;
            if queue.send((at, buffer[..read].to_vec())).await.is_err() {
                return;
            }
        }
    };
    let writer = async move {
        while let Some((at, chunk)) = due.recv().await {
            // tokio's timer ticks in milliseconds: even an elapsed deadline waits for the
            // next tick, which would add about 1 ms per hop when no latency is asked for
            if at > Instant::now() {
                tokio::time::sleep_until(at).await;
            }
            if faults.borrow().mode == Mode::Blackhole {
                continue;
            }
            let cap = faults.borrow().bandwidth_bytes_per_sec;
            let slice = match cap {
                // pace in slices of about 1/20 s so a cap is smooth, not bursty
                Some(rate) => (rate / 20).clamp(1, CHUNK_BYTES as u64) as usize,
                None => chunk.len(),
            };
            for piece in chunk.chunks(slice) {
                if to.write_all(piece).await.is_err() {
                    return;
                }
                counters
                    .bytes_forwarded
                    .fetch_add(piece.len() as u64, Ordering::Relaxed);
                if let Some(rate) = cap {
                    let secs = piece.len() as f64 / rate.max(1) as f64;
                    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
                }
            }
        }
        // the source closed: pass the FIN on
        let _ = to.shutdown().await;
    };
    tokio::join!(reader, writer);
}
