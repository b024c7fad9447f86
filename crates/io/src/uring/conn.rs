//! One connection as an io_uring worker sees it: its buffers, the operations it has in
//! flight, and what its session may do next (receive, handle, yield, close).

use super::*;
use crate::request::{Expiry, RequestClock};

/// One connection as a worker sees it. Freed only when `closed` and no operation of it is
/// in flight (`recv_armed`, `send_inflight` both false).
pub(super) struct Conn<S> {
    /// The client's address (the per-address connection limit's key).
    pub(super) ip: std::net::IpAddr,
    pub(super) stream: TcpStream,
    pub(super) session: S,
    pub(super) generation: u32,
    /// Received, unconsumed bytes: `input[input_start..]`.
    pub(super) input: Vec<u8>,
    pub(super) input_start: usize,
    /// Replies the session appended, not yet handed to the kernel.
    pub(super) output: Vec<u8>,
    /// Replies handed to the kernel: `sending[sent..]` is in flight or next. Not touched
    /// while `send_inflight`.
    pub(super) sending: Vec<u8>,
    pub(super) sent: usize,
    pub(super) recv_armed: bool,
    pub(super) recv_cancelled: bool,
    pub(super) send_inflight: bool,
    pub(super) send_cancelled: bool,
    /// Input may hold a request the session has not been offered yet.
    pub(super) unprocessed: bool,
    /// The session holds input of its own not served yet (`Progress::buffered`, TLS).
    pub(super) held: bool,
    /// The session yielded and the slot waits in the worker's ready queue: its session is
    /// not run (input is only appended) until the queue is drained.
    pub(super) yielded: bool,
    pub(super) eof: bool,
    /// The session asked to close once output is written.
    pub(super) closing: bool,
    /// The socket failed (or must be abandoned): close without writing more.
    pub(super) dead: bool,
    /// `on_close` ran; waiting for in-flight operations before freeing the slot.
    pub(super) closed: bool,
    pub(super) last_active: Instant,
    /// How long part of a request has been held (`request_timeout_secs`).
    pub(super) request: RequestClock,
}

impl<S: Session> Conn<S> {
    /// A connection just accepted, nothing in flight.
    pub(super) fn new(
        stream: TcpStream,
        ip: std::net::IpAddr,
        session: S,
        generation: u32,
    ) -> Conn<S> {
        Conn {
            stream,
            ip,
            session,
            generation,
            input: Vec::new(),
            input_start: 0,
            output: Vec::new(),
            sending: Vec::new(),
            sent: 0,
            recv_armed: false,
            recv_cancelled: false,
            send_inflight: false,
            send_cancelled: false,
            unprocessed: false,
            held: false,
            yielded: false,
            eof: false,
            closing: false,
            dead: false,
            closed: false,
            last_active: Instant::now(),
            request: RequestClock::default(),
        }
    }

    /// Why housekeeping closes the connection now, if it does: part of a request held past
    /// `request_timeout_secs`, or idle (nothing pending, nothing to send) past
    /// `idle_timeout_secs`.
    pub(super) fn expired(&self, config: &EngineConfig, now: Instant) -> Option<Expiry> {
        if self.closed {
            return None;
        }
        if self.request.expired(config.request_timeout(), now) {
            return Some(Expiry::Request);
        }
        let idle = config.idle_timeout().is_some_and(|limit| {
            now.saturating_duration_since(self.last_active) >= limit
                && self.pending_output() == 0
                && !self.send_inflight
        });
        idle.then_some(Expiry::Idle)
    }
    pub(super) fn pending_output(&self) -> usize {
        self.sending.len() - self.sent + self.output.len()
    }

    pub(super) fn has_room(&self, config: &EngineConfig) -> bool {
        self.pending_output() < config.output_buffer_high_bytes
    }

    /// Takes what the session said of `offered` bytes of input; returns the bytes it
    /// consumed. The caller then tells the request clock ([`Self::clock`]).
    pub(super) fn apply(&mut self, progress: Progress, offered: usize) -> usize {
        self.unprocessed = progress.output_full || progress.yielded;
        self.yielded = progress.yielded;
        self.closing |= progress.close;
        self.held = progress.holds_input();
        progress.consumed.min(offered)
    }

    /// Input not served yet: unconsumed here, or held by the session.
    pub(super) fn has_input(&self) -> bool {
        self.input_start < self.input.len() || self.held
    }

    /// Takes bytes of a receive completion. With no leftover input the session parses
    /// them in place; whatever it leaves is copied into `input`. True when the session
    /// yielded (the caller queues the slot).
    pub(super) fn receive(&mut self, data: &[u8], config: &EngineConfig) -> bool {
        self.last_active = Instant::now();
        if self.closing || self.dead || self.closed {
            return false;
        }
        if self.input_start == self.input.len() && !self.yielded && self.has_room(config) {
            self.input.clear();
            self.input_start = 0;
            let progress =
                self.session
                    .on_input(data, &mut self.output, config.output_buffer_high_bytes);
            let consumed = self.apply(progress, data.len());
            self.input.extend_from_slice(&data[consumed..]);
            let (served, pending) = progress.for_clock(consumed, data.len() - consumed);
            self.request.offered(served, pending);
            self.yielded
        } else {
            self.input.extend_from_slice(data);
            self.unprocessed = true;
            self.request.received(self.input.len() - self.input_start);
            false
        }
    }

    /// Offers unconsumed input to the session when it has something new and room, and has
    /// not yielded. True when the session yielded now (the caller queues the slot).
    pub(super) fn handle(&mut self, config: &EngineConfig) -> bool {
        if self.dead || self.closing || self.yielded || !self.unprocessed || !self.has_room(config)
        {
            return false;
        }
        if !self.has_input() {
            self.unprocessed = false;
            return false;
        }
        let offered = self.input.len() - self.input_start;
        let progress = self.session.on_input(
            &self.input[self.input_start..],
            &mut self.output,
            config.output_buffer_high_bytes,
        );
        let consumed = self.apply(progress, offered);
        self.input_start += consumed;
        let (served, pending) = progress.for_clock(consumed, self.input.len() - self.input_start);
        self.request.offered(served, pending);
        if self.input_start == self.input.len() {
            self.input.clear();
            self.input_start = 0;
        } else if self.input_start > self.input.len() / 2 {
            self.input.drain(..self.input_start);
            self.input_start = 0;
        }
        self.yielded
    }

    pub(super) fn shrink_if_idle(&mut self, keep: usize) {
        if self.input_start == self.input.len() && self.input.capacity() > keep {
            self.input = Vec::new();
            self.input_start = 0;
        }
        if self.output.is_empty() && self.output.capacity() > keep {
            self.output = Vec::new();
        }
        if !self.send_inflight && self.sent == self.sending.len() && self.sending.capacity() > keep
        {
            self.sending = Vec::new();
            self.sent = 0;
        }
    }
}
