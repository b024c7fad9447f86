//! I/O engines: the part of a cell that moves bytes between sockets and sessions.
//!
//! An engine accepts connections, reads what clients send, hands it to a [`Session`] and
//! writes back whatever the session produced. It knows nothing of the memcached protocol,
//! the store or the cluster: the node crate implements [`Service`]/[`Session`] and every
//! engine drives the same implementation, so engines can be compared (and swapped) with
//! the protocol and store code held constant.
//!
//! Guarantees every engine gives a session:
//! - `on_input` sees the connection's unconsumed bytes in order, never more than
//!   [`EngineConfig::input_buffer_max_bytes`]; a client that sends more without the session
//!   consuming it is disconnected (the session's parser bounds every frame well below that).
//! - Backpressure: while a connection's pending output is above
//!   [`EngineConfig::output_buffer_high_bytes`] the engine stops reading from it, so a client
//!   that does not read its replies cannot make the cell buffer without bound.
//! - Workers never block: sockets are non-blocking and every wait is the engine's poll.

#![forbid(unsafe_code)]

mod config;
pub mod epoll;
mod stats;

pub use config::{EngineConfig, IoEngineKind};
pub use stats::{EngineStats, EngineStatsSnapshot};

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// What a session wants after handling a batch of input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Progress {
    /// Bytes of the input the session consumed; the engine drops them.
    pub consumed: usize,
    /// The session stopped early because its output reached the budget it was given; call
    /// again once output has drained even if no new input arrives.
    pub output_full: bool,
    /// Close the connection once pending output has been written (e.g. `quit`, or a
    /// protocol error after which the stream cannot be resynchronised).
    pub close: bool,
}

/// One client connection's protocol state. Owned by exactly one worker thread.
pub trait Session: Send + 'static {
    /// Handles as much of `input` as forms complete requests, appending replies to
    /// `output`. Should stop once `output.len() >= output_budget` (setting `output_full`).
    fn on_input(&mut self, input: &[u8], output: &mut Vec<u8>, output_budget: usize) -> Progress;

    /// Called on the owning worker after the session's [`Notify`] fired on any thread:
    /// append output that became ready meanwhile (e.g. replies forwarded from another
    /// cell). The engine then offers unconsumed input to `on_input` again, so a session
    /// may leave input unconsumed while it waits. A notify may be spurious.
    fn on_notify(&mut self, output: &mut Vec<u8>, output_budget: usize) -> Progress {
        let _ = (output, output_budget);
        Progress::default()
    }

    /// Called once when the connection closes, for whatever reason.
    fn on_close(&mut self) {}
}

/// Creates a [`Session`] for each accepted connection. Shared by all workers.
pub trait Service: Send + Sync + 'static {
    type Session: Session;
    fn open(&self, peer: SocketAddr, notify: Notify) -> Self::Session;
}

/// Wakes one connection's session from any thread (see [`Session::on_notify`]).
#[derive(Clone)]
pub struct Notify {
    inner: Arc<dyn Fn() + Send + Sync>,
}

impl Notify {
    /// Wraps the engine-specific way of scheduling `on_notify` on the owning worker.
    pub fn new(f: impl Fn() + Send + Sync + 'static) -> Self {
        Self { inner: Arc::new(f) }
    }

    /// A notify that does nothing, for sessions driven outside an engine (tests).
    pub fn noop() -> Self {
        Self::new(|| {})
    }

    pub fn notify(&self) {
        (self.inner)()
    }
}

impl std::fmt::Debug for Notify {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Notify")
    }
}

/// Errors an engine reports at start or while running.
#[derive(Debug, thiserror::Error)]
pub enum IoError {
    #[error("cannot bind or configure listener on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot start worker thread: {0}")]
    Spawn(std::io::Error),
    #[error("event loop failed: {0}")]
    Poll(std::io::Error),
    #[error("invalid engine configuration: {0}")]
    Config(String),
}

/// A one-way flag every engine thread checks; set it (e.g. from a SIGTERM handler) and
/// call [`Shutdown::wake`] hooks so sleeping loops notice at once.
#[derive(Clone, Default)]
pub struct Shutdown {
    flag: Arc<AtomicBool>,
    wakers: Arc<std::sync::Mutex<Vec<Arc<mio::Waker>>>>,
}

impl Shutdown {
    pub fn new() -> Self {
        Self::default()
    }

    /// Asks every engine thread to stop accepting, finish in-flight requests and exit.
    pub fn trigger(&self) {
        self.flag.store(true, Ordering::Release);
        let wakers = self.wakers.lock().unwrap_or_else(|e| e.into_inner());
        for waker in wakers.iter() {
            // A failed wake means the loop is already gone; nothing to do.
            let _ = waker.wake();
        }
    }

    pub fn is_triggered(&self) -> bool {
        self.flag.load(Ordering::Acquire)
    }

    pub(crate) fn register(&self, waker: Arc<mio::Waker>) {
        let mut wakers = self.wakers.lock().unwrap_or_else(|e| e.into_inner());
        wakers.push(waker);
        if self.is_triggered() {
            let _ = wakers.last().map(|w| w.wake());
        }
    }
}

/// A running engine: its bound address and the threads to join.
pub struct RunningEngine {
    pub local_addr: SocketAddr,
    pub stats: Arc<EngineStats>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl RunningEngine {
    /// Waits until every engine thread has exited (after [`Shutdown::trigger`]).
    pub fn join(self) {
        for t in self.threads {
            if t.join().is_err() {
                tracing::error!("an engine thread panicked");
            }
        }
    }
}
