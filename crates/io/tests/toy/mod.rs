//! The engine suite's toy line protocol (see `engines.rs`): each `\n`-terminated line is
//! answered upper-cased; `quit` closes; `defer` is answered later through `Notify`; `quiet…`
//! gets no answer; with a request limit the session yields. `Holding` wraps it as the TLS
//! layer wraps a session: it takes input into a buffer of its own.

use cellcache_io::{Notify, Progress, Service, Session};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

pub struct Upper {
    pub consumed_total: Arc<AtomicUsize>,
    pub closed_total: Arc<AtomicUsize>,
    /// Lines a session handles per `on_input` before it yields (`usize::MAX`: never).
    pub lines_per_call: usize,
    pub yields_total: Arc<AtomicUsize>,
}

impl Upper {
    pub fn new(consumed_total: Arc<AtomicUsize>, closed_total: Arc<AtomicUsize>) -> Self {
        Self {
            consumed_total,
            closed_total,
            lines_per_call: usize::MAX,
            yields_total: Arc::default(),
        }
    }
}

pub struct UpperSession {
    pub consumed_total: Arc<AtomicUsize>,
    pub closed_total: Arc<AtomicUsize>,
    pub notify: Notify,
    pub deferred: Arc<AtomicUsize>,
    pub lines_per_call: usize,
    pub yields_total: Arc<AtomicUsize>,
}

impl Service for Upper {
    type Session = UpperSession;
    fn open(&self, _conn: cellcache_io::Accepted, notify: Notify) -> UpperSession {
        UpperSession {
            consumed_total: self.consumed_total.clone(),
            closed_total: self.closed_total.clone(),
            notify,
            deferred: Arc::new(AtomicUsize::new(0)),
            lines_per_call: self.lines_per_call,
            yields_total: self.yields_total.clone(),
        }
    }
}

impl Session for UpperSession {
    fn on_input(&mut self, input: &[u8], output: &mut Vec<u8>, budget: usize) -> Progress {
        let mut p = Progress::default();
        let mut lines = 0;
        while let Some(nl) = input[p.consumed..].iter().position(|&b| b == b'\n') {
            if output.len() >= budget {
                p.output_full = true;
                break;
            }
            if lines == self.lines_per_call {
                p.yielded = true;
                self.yields_total.fetch_add(1, Ordering::Relaxed);
                break;
            }
            lines += 1;
            let line = &input[p.consumed..p.consumed + nl];
            p.consumed += nl + 1;
            if line == b"quit" {
                p.close = true;
                break;
            }
            if line == b"defer" {
                // Answered later, from another thread, through the notify path.
                let (notify, deferred) = (self.notify.clone(), self.deferred.clone());
                std::thread::spawn(move || {
                    deferred.fetch_add(1, Ordering::Release);
                    notify.notify();
                });
                continue;
            }
            if line.starts_with(b"quiet") {
                continue;
            }
            output.extend(line.iter().map(u8::to_ascii_uppercase));
            output.push(b'\n');
        }
        self.consumed_total.fetch_add(p.consumed, Ordering::Relaxed);
        p
    }

    fn on_notify(&mut self, output: &mut Vec<u8>, _budget: usize) -> Progress {
        for _ in 0..self.deferred.swap(0, Ordering::Acquire) {
            output.extend_from_slice(b"DEFERRED\n");
        }
        Progress::default()
    }

    fn on_close(&mut self) {
        self.closed_total.fetch_add(1, Ordering::Relaxed);
    }
}

/// A session that takes every byte into a buffer of its own before its inner session sees
/// it, as the TLS layer does (it must decrypt whole records), and says so in
/// `Progress::buffered`.
pub struct Holding {
    pub inner: UpperSession,
    pub held: Vec<u8>,
}

pub struct HoldingService(pub Upper);

impl Service for HoldingService {
    type Session = Holding;
    fn open(&self, conn: cellcache_io::Accepted, notify: Notify) -> Holding {
        Holding {
            inner: self.0.open(conn, notify),
            held: Vec::new(),
        }
    }
}

impl Holding {
    fn report(&self, mut p: Progress, consumed: usize, progressed: bool) -> Progress {
        p.consumed = consumed;
        p.buffered = Some(cellcache_io::Buffered {
            progressed,
            pending: !self.held.is_empty(),
        });
        p
    }
}

impl Session for Holding {
    fn on_input(&mut self, input: &[u8], output: &mut Vec<u8>, budget: usize) -> Progress {
        self.held.extend_from_slice(input);
        let p = self.inner.on_input(&self.held, output, budget);
        self.held.drain(..p.consumed);
        self.report(p, input.len(), p.consumed > 0)
    }

    fn on_notify(&mut self, output: &mut Vec<u8>, budget: usize) -> Progress {
        let p = self.inner.on_notify(output, budget);
        self.report(p, 0, false)
    }

    fn on_close(&mut self) {
        self.inner.on_close();
    }
}
