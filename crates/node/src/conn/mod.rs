//! One client connection: frames requests out of the engine's input buffer, executes them
//! in order and appends replies, so pipelined requests are answered in the order sent.
//!
//! In a ring, a request whose master is another cell (or a write waiting for its backups)
//! cannot be answered at once. Its place in the reply order is then held by a [`Slot`] in
//! the connection's queue: the request is handed to the cluster (which never blocks this
//! thread), later requests keep executing, their replies queue up behind the slot, and when
//! the slot is filled (on whichever thread the answer arrived) the engine is woken through
//! the session's `Notify` and `on_notify` writes out everything that is now in order. The
//! queue is bounded (`cluster.in_flight_per_connection_max`): past it the connection stops
//! consuming input until replies drain.
//!
//! The first byte of a connection picks its protocol for the connection's life, as in
//! memcached: `0x80` is the binary protocol ([`binary`]), anything else text. Binary
//! frames run through the same [`Conn::run`] as text requests, so both share the store,
//! the ring's routing, replication, stats and this reply order.
//!
//! With an auth file (memcached `-Y`) every request passes the connection's [`auth::Gate`]
//! first: until the client has logged in (text) or authenticated with SASL (binary), only
//! the login gets through; the rest is refused as memcached refuses it.
//!
//! The discard debt survives between batches: after a rejected storage command, memcached
//! swallows the announced data block, which may arrive over several reads. Counters are
//! folded into the cell's totals once per batch.
//!
//! memcached's `-R` (`server.requests_per_event_max`): one `on_input` runs at most that
//! many requests. With input left after them the session stops, sets `Progress::yielded`
//! and counts `conn_yields`; the engine serves the other ready connections and then offers
//! the rest again. A yielded request is simply not consumed yet, so whatever spans calls
//! (a long multi-get taken in batches, replies waiting on the ring in the queue) carries on
//! unchanged on the next call.

mod auth;
pub mod binary;
mod standalone;

use crate::cell::Cell;
use crate::cluster::Cluster;
use crate::cluster::route::{self, Ctx, Reply};
use crate::counters::LocalCounters;
use crate::latency::LocalLatency;
use crate::local::Flow;
use binary::Encoding;
use cellcache_io::{Accepted, Notify, Progress, Service, Session};
use cellcache_proto::binary::MAGIC_REQUEST;
use cellcache_proto::{Discard, Parsed, Request, RetrieveRest, lines, parse, parse_retrieve_rest};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Creates a [`Conn`] per accepted client.
pub struct ClientService {
    pub cell: Arc<Cell>,
    /// The cell's ring membership, once it has one.
    pub ring: Arc<crate::cluster::Slot>,
}

impl Service for ClientService {
    type Session = Conn;
    fn open(&self, accepted: Accepted, notify: Notify) -> Conn {
        Conn {
            registration: self.cell.conns.open(accepted, self.cell.now()),
            cell: self.cell.clone(),
            ring: self.ring.clone(),
            discard: Discard::default(),
            counters: LocalCounters::default(),
            latency: LocalLatency::default(),
            batch_started: Instant::now(),
            batch_answered: 0,
            notify,
            queue: VecDeque::new(),
            closing: false,
            retrieve_rest: None,
            skip_line: false,
            wire: Wire::Undecided,
            requests_this_event: 0,
            auth: auth::Gate::new(self.cell.credentials.is_some()),
            peer_ip: accepted.peer.ip(),
        }
    }
}

/// A reply that will arrive from another thread.
pub struct Slot {
    /// The reply, and when it was filled (its service time ends there).
    reply: parking_lot::Mutex<Option<(Vec<u8>, Instant)>>,
    notify: Notify,
    /// When the batch that started the request started (its service time begins there).
    since: Instant,
}

impl Slot {
    fn fill(&self, bytes: Vec<u8>) {
        *self.reply.lock() = Some((bytes, Instant::now()));
        self.notify.notify();
    }
}

enum Pending {
    Ready(Vec<u8>),
    Wait(Arc<Slot>),
}

/// The protocol a connection speaks, decided by its first byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wire {
    Undecided,
    Text,
    Binary,
}

/// The reply every keyed request gets from a standby cell (not in a ring yet).
const STANDBY: &[u8] = lines::SERVER_ERROR_STANDBY;

/// One connection's state; owned by the engine thread that owns the connection.
pub struct Conn {
    pub(crate) cell: Arc<Cell>,
    ring: Arc<crate::cluster::Slot>,
    /// This connection in the cell's `stats conns` registry (left on drop).
    registration: crate::conns::Registration,
    pub(crate) discard: Discard,
    pub(crate) counters: LocalCounters,
    /// Service times since the last fold (see [`crate::latency`]).
    latency: LocalLatency,
    /// When the current batch of input started.
    batch_started: Instant,
    /// Requests of the current batch answered in it (their service time is the batch's).
    batch_answered: u64,
    notify: Notify,
    queue: VecDeque<Pending>,
    /// `quit` (or `shutdown`) was executed behind replies still in flight: close once they
    /// are written, read nothing more.
    pub(crate) closing: bool,
    wire: Wire,
    /// Inside a retrieval line taken in batches (`Parsed::Partial`): the rest of the line
    /// is parsed with `parse_retrieve_rest`, and only its last batch's reply ends in `END`.
    retrieve_rest: Option<RetrieveRest>,
    /// A long retrieval line was refused before its end arrived: drop input through its `\n`.
    skip_line: bool,
    /// Requests started in the current `on_input` call, against
    /// `server.requests_per_event_max` (memcached's `-R`).
    requests_this_event: u32,
    /// Whether the client may be served yet (`server.auth_file`).
    auth: auth::Gate,
    /// The client's address (the login throttle's key).
    peer_ip: std::net::IpAddr,
}

impl Conn {
    /// Moves every reply that is next in order to `output`.
    fn flush(&mut self, output: &mut Vec<u8>) {
        while let Some(front) = self.queue.front() {
            match front {
                Pending::Ready(b) => output.extend_from_slice(b),
                Pending::Wait(slot) => match slot.reply.lock().take() {
                    Some((b, at)) => {
                        output.extend_from_slice(&b);
                        let took = at.saturating_duration_since(slot.since);
                        self.latency.record(took, 1);
                    }
                    None => return,
                },
            }
            self.queue.pop_front();
        }
    }

    fn slot(&mut self) -> Arc<Slot> {
        let slot = Arc::new(Slot {
            reply: parking_lot::Mutex::new(None),
            notify: self.notify.clone(),
            since: self.batch_started,
        });
        self.queue.push_back(Pending::Wait(slot.clone()));
        slot
    }

    /// Whether another request may be read from `input` now: input is left after the bytes
    /// being discarded, the output is under its `budget` (else `output_full`), the replies
    /// in flight are under their bound (resumed by `on_notify` once they drain), and this
    /// call has not yet started `server.requests_per_event_max` requests (else `yielded`,
    /// counted in `conn_yields`). Every `true` counts as a request started: a request, a
    /// batch of a long retrieval line's keys, or the skipped rest of a refused line.
    pub(crate) fn next_request(
        &mut self,
        input: &[u8],
        output: &[u8],
        budget: usize,
        p: &mut Progress,
    ) -> bool {
        p.consumed += self.discard.take(input.len() - p.consumed);
        if p.consumed == input.len() {
            return false;
        }
        if output.len() >= budget {
            p.output_full = true;
            return false;
        }
        if self.in_flight_full() {
            return false;
        }
        if self.requests_this_event >= self.cell.config.server.requests_per_event_max {
            // As memcached's conn_new_cmd once its reqs_per_event are spent: stop with
            // input left (maybe only part of a request, as memcached's rbytes > 0).
            p.yielded = true;
            self.counters.conn_yields += 1;
            return false;
        }
        self.requests_this_event += 1;
        true
    }

    /// Whether the queue of replies in flight is full (stop consuming input until it drains).
    pub(crate) fn in_flight_full(&self) -> bool {
        self.queue.len() >= self.cell.config.cluster.in_flight_per_connection_max
    }

    /// Appends a reply that is complete now: to the output when nothing waits before it,
    /// else behind what waits.
    pub(crate) fn emit(&mut self, reply: Vec<u8>, output: &mut Vec<u8>) {
        if reply.is_empty() {
            return;
        }
        if self.queue.is_empty() {
            output.extend_from_slice(&reply);
        } else {
            self.queue.push_back(Pending::Ready(reply));
        }
    }

    /// Executes one complete request (`bytes` is its wire form, for forwarding) here or
    /// through the ring, and queues its reply in order, re-encoded by `encoding`;
    /// `end: false` drops the final `END` of a retrieval batch's reply.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn run(
        &mut self,
        request: &Request<'_>,
        bytes: &[u8],
        now: u32,
        cluster: Option<&Arc<Cluster>>,
        standby: bool,
        output: &mut Vec<u8>,
        encoding: &Encoding,
        end: bool,
    ) -> Flow {
        if standby
            && (route::key_hashes(request).is_some() || matches!(request, Request::FlushAll { .. }))
        {
            self.emit(encoding.finish(STANDBY.to_vec()), output);
            return Flow::Continue;
        }
        if let Request::FlushAll { noreply, .. } = request {
            // -F, decided where the client's request enters, before a ring broadcasts it.
            let mut refusal = Vec::new();
            if !crate::local::flush_allowed(&self.cell, *noreply, &mut refusal) {
                self.emit(encoding.finish(refusal), output);
                return Flow::Continue;
            }
            if cluster.is_some() {
                // Once per client request; every cell of the ring flushes its part.
                self.counters.cmd_flush += 1;
            }
        }
        // A text reply goes straight to the output when nothing waits before it; a binary
        // one is composed as text first and re-encoded.
        let direct = self.queue.is_empty() && encoding.is_text();
        let mut tmp = Vec::new();
        // The reply went to a slot (filled later, re-encoded by the filler).
        let mut slotted = false;
        let out: &mut Vec<u8> = if direct { output } else { &mut tmp };
        let flow = match cluster {
            None => self.run_standalone(request, bytes, now, out, encoding, end, &mut slotted),
            Some(cl) => {
                let decided = route::here(
                    cl,
                    request,
                    false,
                    None,
                    now,
                    out,
                    &mut self.counters,
                    |out, start| strip_end(out, start, end),
                );
                let local = match decided {
                    route::Here::Answered(flow) => Some(flow),
                    route::Here::Held {
                        flow,
                        positions,
                        reply,
                        quiet,
                    } => {
                        let slot = self.slot();
                        slotted = true;
                        let enc = encoding.clone();
                        let fill = Box::new(move |b| slot.fill(enc.finish(b)));
                        route::reply_after_replication(cl, positions, reply, quiet, fill);
                        Some(flow)
                    }
                    route::Here::Again | route::Here::Elsewhere(_) => None,
                };
                match local {
                    Some(flow) => flow,
                    None => {
                        let slot = self.slot();
                        slotted = true;
                        let ctx = Ctx {
                            forwarded: false,
                            from_epoch: 0,
                            parked: None,
                            deadline: Instant::now()
                                + Duration::from_millis(cl.config.request_timeout_ms),
                        };
                        let enc = encoding.clone();
                        route::dispatch(
                            cl,
                            bytes.to_vec(),
                            ctx,
                            Box::new(move |r| {
                                slot.fill(enc.finish(match r {
                                    Reply::Bytes(mut b) => {
                                        strip_end(&mut b, 0, end);
                                        b
                                    }
                                    Reply::Refused(_) => route::UNAVAILABLE.to_vec(),
                                }))
                            }),
                        );
                        Flow::Continue
                    }
                }
            }
        };
        if !slotted {
            self.batch_answered += 1;
            if !direct {
                self.emit(encoding.finish(tmp), output);
            }
        }
        flow
    }

    /// Writes what is in order, closes after `quit`, folds the counters: the end of every
    /// batch of input.
    fn end_batch(&mut self, output: &mut Vec<u8>, mut p: Progress) -> Progress {
        self.flush(output);
        if self.closing && self.queue.is_empty() {
            p.close = true;
        }
        self.cell.counters.absorb(&mut self.counters);
        if self.batch_answered > 0 {
            let took = self.batch_started.elapsed();
            self.latency
                .record(took, std::mem::take(&mut self.batch_answered));
        }
        self.cell.latency.absorb(&mut self.latency);
        p
    }

    /// One batch of a retrieval line taken in parts: a `Request::Retrieve` of its keys,
    /// re-encoded as a line of its own for forwarding. A last batch without keys is just
    /// the line's `END`.
    fn run_batch(
        &mut self,
        request: &Request<'_>,
        now: u32,
        cluster: Option<&Arc<Cluster>>,
        standby: bool,
        output: &mut Vec<u8>,
        end: bool,
    ) {
        let Request::Retrieve(r) = request else {
            return;
        };
        if r.keys.is_empty() {
            if end {
                self.emit(lines::END.to_vec(), output);
            }
            return;
        }
        let mut bytes = Vec::new();
        request.encode(&mut bytes);
        self.run(
            request,
            &bytes,
            now,
            cluster,
            standby,
            output,
            &Encoding::Text,
            end,
        );
    }

    /// Deletes `key` as a refused too-large write does: here, or in a ring at its master,
    /// through replication and in order with the requests around it (its reply dropped).
    pub(crate) fn unlink(
        &mut self,
        key: cellcache_proto::MetaKey<'_>,
        now: u32,
        cluster: Option<&Arc<Cluster>>,
    ) {
        let Some(cl) = cluster else {
            let mut buf = [0; cellcache_proto::token::BINARY_KEY_BYTES_MAX];
            self.cell.store.delete(
                key.binary(&mut buf),
                now,
                cellcache_store::DeleteOptions::default(),
            );
            return;
        };
        let mut md = Vec::new();
        Request::MetaDelete {
            key,
            flags: cellcache_proto::MetaDeleteFlags::default(),
        }
        .encode(&mut md);
        let ctx = Ctx {
            forwarded: false,
            from_epoch: 0,
            parked: None,
            deadline: Instant::now() + Duration::from_millis(cl.config.request_timeout_ms),
        };
        route::dispatch(cl, md, ctx, Box::new(|_| {}));
    }
}

impl Session for Conn {
    fn on_input(&mut self, input: &[u8], output: &mut Vec<u8>, budget: usize) -> Progress {
        use crate::conns::Phase;
        let state = self.registration.state.clone();
        state.set_phase(Phase::ParseCmd);
        let p = self.handle_input(input, output, budget);
        if p.consumed > 0 {
            state.command_at(self.cell.now());
        }
        state.set_phase(if p.yielded {
            Phase::NewCmd
        } else if p.consumed < input.len() {
            Phase::Nread
        } else {
            Phase::Read
        });
        p
    }

    fn on_notify(&mut self, output: &mut Vec<u8>, _budget: usize) -> Progress {
        self.requests_this_event = 0;
        self.flush(output);
        self.cell.latency.absorb(&mut self.latency);
        Progress {
            close: self.closing && self.queue.is_empty(),
            ..Progress::default()
        }
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.cell.conns.close(&self.registration);
        self.cell.latency.absorb(&mut self.latency);
    }
}

impl Conn {
    /// [`Session::on_input`] proper (the trait method keeps `stats conns` state around it).
    fn handle_input(&mut self, input: &[u8], output: &mut Vec<u8>, budget: usize) -> Progress {
        let mut p = Progress::default();
        self.requests_this_event = 0;
        self.batch_started = Instant::now();
        let now = self.cell.now();
        self.flush(output);
        if self.closing {
            p.close = self.queue.is_empty();
            return p;
        }
        let cluster = self.ring.cluster.get().cloned();
        let standby = cluster.is_none() && self.cell.config.cluster.enabled;
        if self.wire == Wire::Undecided {
            use crate::config::BindingProtocol;
            self.wire = match (self.cell.config.server.binding_protocol, input.first()) {
                (_, None) => Wire::Undecided,
                (BindingProtocol::Ascii, _) => Wire::Text,
                (BindingProtocol::Binary, _) | (BindingProtocol::Auto, Some(&MAGIC_REQUEST)) => {
                    Wire::Binary
                }
                (BindingProtocol::Auto, Some(_)) => Wire::Text,
            };
        }
        if self.wire == Wire::Binary {
            self.binary_input(
                input,
                output,
                budget,
                now,
                cluster.as_ref(),
                standby,
                &mut p,
            );
            return self.end_batch(output, p);
        }
        while self.next_request(input, output, budget, &mut p) {
            if !self.auth.is_open() {
                match self.text_login(input, output, &mut p) {
                    auth::Next::Continue => continue,
                    auth::Next::Wait => break,
                }
            }
            let rest = &input[p.consumed..];
            if self.skip_line {
                match rest.iter().position(|&b| b == b'\n') {
                    Some(eol) => {
                        p.consumed += eol + 1;
                        self.skip_line = false;
                        continue;
                    }
                    None => {
                        p.consumed = input.len();
                        break;
                    }
                }
            }
            if let Some(batch) = self.retrieve_rest {
                // The rest of a long retrieval line: its keys, never a command.
                match parse_retrieve_rest(rest, &batch, &self.cell.limits) {
                    Parsed::Incomplete => break,
                    Parsed::Partial {
                        request, consumed, ..
                    } => {
                        p.consumed += consumed;
                        self.run_batch(&request, now, cluster.as_ref(), standby, output, false);
                    }
                    Parsed::Complete { request, consumed } => {
                        p.consumed += consumed;
                        self.retrieve_rest = None;
                        self.run_batch(&request, now, cluster.as_ref(), standby, output, true);
                    }
                    Parsed::Error(e) => {
                        p.consumed += e.consumed;
                        self.retrieve_rest = None;
                        self.skip_line = e.skip_line;
                        self.counters.protocol_errors += 1;
                        let mut line = Vec::new();
                        e.reply.encode(&mut line);
                        self.emit(line, output);
                    }
                }
                continue;
            }
            match parse(rest, &self.cell.limits) {
                Parsed::Partial {
                    request,
                    consumed,
                    rest: batch,
                } => {
                    p.consumed += consumed;
                    self.retrieve_rest = Some(batch);
                    self.run_batch(&request, now, cluster.as_ref(), standby, output, false);
                }
                Parsed::Complete { request, consumed } => {
                    let bytes = &rest[..consumed];
                    p.consumed += consumed;
                    let flow = self.run(
                        &request,
                        bytes,
                        now,
                        cluster.as_ref(),
                        standby,
                        output,
                        &Encoding::Text,
                        true,
                    );
                    if flow == Flow::Close {
                        self.closing = true;
                        break;
                    }
                }
                Parsed::Incomplete => break,
                Parsed::Error(e) => {
                    self.counters.protocol_errors += 1;
                    let direct = self.queue.is_empty();
                    let mut tmp = Vec::new();
                    let out: &mut Vec<u8> = if direct { output } else { &mut tmp };
                    if !e.noreply {
                        e.reply.encode(out);
                    }
                    if !tmp.is_empty() {
                        self.queue.push_back(Pending::Ready(tmp));
                    }
                    if e.reply
                        == cellcache_proto::ErrorReply::Server(
                            cellcache_proto::ServerError::ObjectTooLarge,
                        )
                    {
                        self.counters.store_too_large += 1;
                    }
                    if let Some(key) = e.failed_set_key {
                        // memcached drops the old value when a set or ms is refused as
                        // too large, so a reader never sees the value the client replaced.
                        self.unlink(key, now, cluster.as_ref());
                    }
                    p.consumed += e.consumed;
                    self.discard = e.discard();
                    self.skip_line = e.skip_line;
                    if e.close {
                        self.closing = true;
                        break;
                    }
                }
            }
        }
        self.end_batch(output, p)
    }
}

/// Drops the `END\r\n` that closes a retrieval reply written at `from..` unless `end`: a
/// batch of a long retrieval line is followed by more values.
fn strip_end(out: &mut Vec<u8>, from: usize, end: bool) {
    if !end && out.len() >= from + lines::END.len() && out.ends_with(lines::END) {
        out.truncate(out.len() - lines::END.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::NodeConfig;

    /// A standalone cell with `requests_per_event_max` and a session on it, driven by hand.
    fn session(requests_per_event_max: u32, keys_per_get_max: usize) -> (Arc<Cell>, Conn) {
        let mut config = NodeConfig::default();
        config.cluster.enabled = false;
        config.store.memory_limit_bytes = 16 << 20;
        config.server.requests_per_event_max = requests_per_event_max;
        config.protocol.keys_per_get_max = keys_per_get_max;
        config.validate().expect("valid test config");
        let store = cellcache_store::Store::new(config.store.clone()).expect("store");
        let limits = config.protocol_limits();
        let cell = Arc::new(Cell::new(
            config,
            store,
            limits,
            cellcache_io::Shutdown::new(),
        ));
        let service = ClientService {
            cell: cell.clone(),
            ring: Default::default(),
        };
        let accepted = Accepted {
            peer: "127.0.0.1:40000".parse().unwrap(),
            listener: "127.0.0.1:11211".parse().unwrap(),
            fd: -1,
        };
        let conn = service.open(accepted, Notify::noop());
        (cell, conn)
    }

    fn sets(n: usize) -> Vec<u8> {
        (0..n)
            .flat_map(|i| format!("set k{i} 0 0 1\r\nx\r\n").into_bytes())
            .collect()
    }

    /// memcached's t/issue_61.t at the session: with -R 1, six pipelined sets take six
    /// calls, one request each; the first five stop with input left (five yields).
    #[test]
    fn limit_of_one_runs_one_request_per_call_and_counts_yields() {
        let (cell, mut conn) = session(1, 24);
        let input = sets(6);
        let one = b"set k0 0 0 1\r\nx\r\n".len();
        let mut at = 0;
        let mut output = Vec::new();
        for call in 0..6 {
            let before = output.len();
            let p = conn.on_input(&input[at..], &mut output, 1 << 20);
            assert_eq!(p.consumed, one, "call {call} consumes one set");
            assert_eq!(&output[before..], b"STORED\r\n", "call {call}");
            assert_eq!(p.yielded, call < 5, "call {call}: input left = yielded");
            assert!(!p.output_full && !p.close);
            at += p.consumed;
        }
        assert_eq!(at, input.len());
        let counts = cell.counters.snapshot();
        assert_eq!(counts.conn_yields, 5);
        assert_eq!(counts.cmd_set, 6);
    }

    /// With memcached's default (20) a pipelined batch under the limit runs in one call.
    #[test]
    fn default_limit_runs_a_small_batch_in_one_call() {
        let (cell, mut conn) = session(NodeConfig::default().server.requests_per_event_max, 24);
        let input = sets(5);
        let mut output = Vec::new();
        let p = conn.on_input(&input, &mut output, 1 << 20);
        assert_eq!(p.consumed, input.len());
        assert!(!p.yielded);
        assert_eq!(output, b"STORED\r\n".repeat(5));
        assert_eq!(cell.counters.snapshot().conn_yields, 0);
        // 25 requests: 20 run, the rest wait for the next call.
        let input = sets(25);
        let first20 = sets(20).len();
        output.clear();
        let p = conn.on_input(&input, &mut output, 1 << 20);
        assert_eq!((p.consumed, p.yielded), (first20, true));
        let p = conn.on_input(&input[first20..], &mut output, 1 << 20);
        assert_eq!((p.consumed, p.yielded), (input.len() - first20, false));
        assert_eq!(output, b"STORED\r\n".repeat(25));
        assert_eq!(cell.counters.snapshot().conn_yields, 1);
    }

    /// A long get taken in batches (`Parsed::Partial`) may yield between batches: the rest
    /// of the line is picked up on the next call and the reply is the same as in one go.
    #[test]
    fn a_multi_get_taken_in_batches_survives_yields() {
        let (cell, mut conn) = session(1, 2);
        let mut output = Vec::new();
        for (key, value) in [("a", "1"), ("b", "2"), ("c", "3"), ("d", "4"), ("e", "5")] {
            let set = format!("set {key} 0 0 1\r\n{value}\r\n");
            let p = conn.on_input(set.as_bytes(), &mut output, 1 << 20);
            assert_eq!(p.consumed, set.len());
        }
        output.clear();
        let input = b"get a b c d e\r\nget a\r\n";
        let mut at = 0;
        let mut calls = 0;
        while at < input.len() {
            let p = conn.on_input(&input[at..], &mut output, 1 << 20);
            assert!(p.consumed > 0, "every call makes progress");
            at += p.consumed;
            calls += 1;
            assert_eq!(p.yielded, at < input.len());
        }
        let want: String = [
            "a 0 1\r\n1",
            "b 0 1\r\n2",
            "c 0 1\r\n3",
            "d 0 1\r\n4",
            "e 0 1\r\n5",
        ]
        .iter()
        .map(|v| format!("VALUE {v}\r\n"))
        .chain(["END\r\nVALUE a 0 1\r\n1\r\nEND\r\n".to_string()])
        .collect();
        assert_eq!(String::from_utf8_lossy(&output), want);
        // Three batches of the long line (2 + 2 + 1 keys), then the second get.
        assert_eq!(calls, 4);
        assert_eq!(cell.counters.snapshot().conn_yields, 3);
    }

    /// Binary frames go through the same gate.
    #[test]
    fn binary_frames_yield_too() {
        let (cell, mut conn) = session(1, 24);
        // Two `version` requests (opcode 0x0b), no body.
        let mut frame = [0u8; 24];
        frame[0] = 0x80;
        frame[1] = 0x0b;
        let input = [frame, frame].concat();
        let mut output = Vec::new();
        let p = conn.on_input(&input, &mut output, 1 << 20);
        assert_eq!((p.consumed, p.yielded), (24, true));
        let p = conn.on_input(&input[24..], &mut output, 1 << 20);
        assert_eq!((p.consumed, p.yielded), (24, false));
        assert_eq!(
            output.iter().filter(|&&b| b == 0x81).count(),
            2,
            "two responses"
        );
        assert_eq!(cell.counters.snapshot().conn_yields, 1);
    }
}
