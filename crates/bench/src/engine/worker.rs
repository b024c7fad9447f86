//! One load thread: its own `mio` event loop over its connections, request stream, schedule
//! and histograms (see the parent module for the accounting guarantee it keeps).
//!
//! Under `--tls` a connection also owns a rustls `ClientConnection` whose handshake was
//! finished (blocking) in `setup`, before the clock starts. Requests are still encoded into
//! `out` and replies parsed from `buf`, as plaintext; `flush_tls` and `read_conn_tls` move
//! them through the session. The plain path only pays for one `Option` check per flush and
//! per read.

use super::*;
use crate::workload::Planned;
use cellcache_proto::{
    Decoded, Expect, Reply, Request, Response, StoreHead, StoreMode, decode_reply,
    write_retrieve_with, write_store_with,
};

/// One request waiting for its reply.
#[derive(Debug, Clone, Copy)]
struct InFlight {
    op: OpKind,
    keys: u32,
    /// The first (for set-on-miss, the only) key.
    key: u64,
    intended_ns: u64,
    measured: bool,
}

struct Conn {
    stream: TcpStream,
    out: Vec<u8>,
    out_pos: usize,
    buf: Vec<u8>,
    start: usize,
    filled: usize,
    in_flight: VecDeque<InFlight>,
    alive: bool,
    /// The TLS session (`--tls`), handshake done; `None` for plain TCP.
    tls: Option<Box<rustls::ClientConnection>>,
}

/// Makes room at the end of `conn.buf` for the next read: slides the unparsed bytes to the
/// front, or, when one reply fills the whole buffer, grows it (bounded by the parse limits,
/// which reject any reply line or value beyond them).
#[inline]
fn make_room(conn: &mut Conn) {
    if conn.filled == conn.buf.len() {
        if conn.start > 0 {
            conn.buf.copy_within(conn.start..conn.filled, 0);
            conn.filled -= conn.start;
            conn.start = 0;
        } else {
            let len = conn.buf.len();
            conn.buf.resize(len * 2, 0);
        }
    }
}

/// Read-buffer size and growth step.
const READ_CHUNK_BYTES: usize = 64 * 1024;
/// Longest the event loop sleeps, so progress and deadlines are checked regularly.
const POLL_SLICE: Duration = Duration::from_millis(50);
/// Poll events handled per wake-up.
const EVENTS_CAPACITY: usize = 1024;

/// What one load thread measured.
pub(super) struct ThreadOutcome {
    pub(super) stats: ThreadStats,
    pub(super) cpu_ns: u64,
    pub(super) connections_failed: u64,
}

pub(super) struct Worker {
    config: EngineConfig,
    index: usize,
    gen_: RequestGen,
    /// Measured requests this thread may still send (request-count runs).
    quota: Option<u64>,
    progress: Arc<Progress>,
    stats: ThreadStats,
    conns: Vec<Conn>,
    backlog: VecDeque<u64>,
    fills: VecDeque<u64>,
    /// A delete's key, written here before the codec encodes the request.
    key_buf: Vec<u8>,
    cursor: usize,
    measure_start_ns: u64,
    issue_end_ns: u64,
    /// The run's clock at the event loop's last turn, in nanoseconds.
    clock_ns: u64,
    connections_failed: u64,
    completed: u64,
    /// Open loop on Linux: wakes the poll just before the next arrival.
    #[cfg(target_os = "linux")]
    timer: Option<crate::timer::WakeTimer>,
}

/// Poll token of the wake timer (connections use their index).
const TIMER_TOKEN: Token = Token(usize::MAX - 1);

impl Worker {
    pub(super) fn new(
        config: EngineConfig,
        index: usize,
        gen_: RequestGen,
        quota: Option<u64>,
        progress: Arc<Progress>,
    ) -> Self {
        let measure_start_ns = config.warmup.as_nanos() as u64;
        let issue_end_ns = match config.stop {
            StopAfter::Duration { secs } => measure_start_ns + (secs * 1e9) as u64,
            StopAfter::Requests { .. } => u64::MAX,
        };
        Self {
            config,
            index,
            gen_,
            quota,
            progress,
            stats: ThreadStats::default(),
            conns: Vec::new(),
            backlog: VecDeque::new(),
            fills: VecDeque::new(),
            key_buf: Vec::new(),
            cursor: 0,
            measure_start_ns,
            issue_end_ns,
            clock_ns: 0,
            connections_failed: 0,
            completed: 0,
            #[cfg(target_os = "linux")]
            timer: None,
        }
    }

    pub(super) fn run(
        mut self,
        addrs: Vec<SocketAddr>,
        barrier: &Barrier,
        epoch_cell: &std::sync::OnceLock<Instant>,
    ) -> Result<ThreadOutcome, EngineError> {
        // Connect and pin before the barrier, so set-up time is not part of the run; the
        // barrier is always reached, even on error, so the other threads are not stuck.
        let setup = self.setup(&addrs);
        barrier.wait();
        barrier.wait();
        let (poll, epoch) = match (setup, epoch_cell.get()) {
            (Ok(poll), Some(&epoch)) => (poll, epoch),
            (Err(e), _) => return Err(e),
            (Ok(_), None) => return Err(EngineError::Config("run clock was not started".into())),
        };
        let cpu_start = affinity::thread_cpu_ns();
        self.event_loop(poll, epoch)?;
        Ok(ThreadOutcome {
            stats: self.stats,
            cpu_ns: affinity::thread_cpu_ns().saturating_sub(cpu_start),
            connections_failed: self.connections_failed,
        })
    }

    fn setup(&mut self, addrs: &[SocketAddr]) -> Result<Poll, EngineError> {
        if !self.config.cpus.is_empty() {
            affinity::pin_current_thread(&self.config.cpus).map_err(|source| EngineError::Pin {
                cpus: self.config.cpus.clone(),
                source,
            })?;
        }
        let poll = Poll::new().map_err(EngineError::Poll)?;
        #[cfg(target_os = "linux")]
        if matches!(self.config.mode, LoadMode::Open { .. }) {
            let timer = crate::timer::WakeTimer::new().map_err(EngineError::Poll)?;
            poll.registry()
                .register(
                    &mut mio::unix::SourceFd(&timer.raw_fd()),
                    TIMER_TOKEN,
                    Interest::READABLE,
                )
                .map_err(EngineError::Poll)?;
            self.timer = Some(timer);
        }
        for (i, &addr) in addrs.iter().enumerate() {
            let connect = |source| EngineError::Connect { addr, source };
            let std_stream =
                std::net::TcpStream::connect_timeout(&addr, self.config.connect_timeout)
                    .map_err(connect)?;
            std_stream.set_nodelay(true).map_err(connect)?;
            let tls = match &self.config.tls {
                None => None,
                Some(target) => Some(Box::new(
                    target
                        .handshake(addr, &std_stream, self.config.connect_timeout)
                        .map_err(|source| EngineError::Handshake { addr, source })?,
                )),
            };
            std_stream.set_nonblocking(true).map_err(connect)?;
            let mut stream = TcpStream::from_std(std_stream);
            poll.registry()
                .register(
                    &mut stream,
                    Token(i),
                    Interest::READABLE | Interest::WRITABLE,
                )
                .map_err(EngineError::Poll)?;
            self.conns.push(Conn {
                stream,
                out: Vec::with_capacity(READ_CHUNK_BYTES),
                out_pos: 0,
                buf: vec![0; READ_CHUNK_BYTES],
                start: 0,
                filled: 0,
                in_flight: VecDeque::with_capacity(self.config.pipeline),
                alive: true,
                tls,
            });
        }
        Ok(poll)
    }

    fn event_loop(&mut self, mut poll: Poll, epoch: Instant) -> Result<(), EngineError> {
        let now_ns = || epoch.elapsed().as_nanos() as u64;
        let threads = self.config.threads as f64;
        let mut schedule = match self.config.mode {
            LoadMode::Open {
                rate_per_sec,
                arrival,
            } => {
                // Each thread takes an equal share of the rate; uniform schedules are staggered
                // so the threads' arrivals interleave evenly instead of coinciding.
                let share = rate_per_sec / threads;
                let offset = (1e9 / rate_per_sec * self.index as f64) as u64;
                Some(Schedule::new(
                    share,
                    arrival,
                    offset,
                    self.config.seed.wrapping_add(1_000 + self.index as u64),
                ))
            }
            LoadMode::Closed => None,
        };
        let mut events = Events::with_capacity(EVENTS_CAPACITY);
        let mut drain_deadline: Option<u64> = None;
        loop {
            let now = now_ns();
            self.clock_ns = now;
            let issuing =
                drain_deadline.is_none() && now < self.issue_end_ns && self.quota != Some(0);
            if issuing {
                match schedule.as_mut() {
                    None => self.fill_closed(now),
                    Some(s) => self.dispatch_open(s, now),
                }
            } else {
                if drain_deadline.is_none() {
                    drain_deadline =
                        Some(now.saturating_add(self.config.drain_timeout.as_nanos() as u64));
                }
                // Keep sending what arrived before the end; it is part of the measured load.
                self.dispatch_backlog(now);
            }
            self.flush_all();
            let outstanding = !self.backlog.is_empty()
                || self
                    .conns
                    .iter()
                    .any(|c| c.alive && !c.in_flight.is_empty());
            if let Some(deadline) = drain_deadline
                && (!outstanding || now >= deadline)
            {
                self.finish_drain();
                return Ok(());
            }
            if self.conns.iter().all(|c| !c.alive) {
                self.finish_drain();
                return Ok(());
            }
            let timeout = self.poll_timeout(schedule.as_ref(), now, issuing, drain_deadline);
            match poll.poll(&mut events, Some(timeout)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(EngineError::Poll(e)),
            }
            for event in events.iter() {
                if event.token() == TIMER_TOKEN {
                    #[cfg(target_os = "linux")]
                    if let Some(timer) = &self.timer {
                        timer.clear();
                    }
                    continue;
                }
                let i = event.token().0;
                if i >= self.conns.len() || !self.conns[i].alive {
                    continue;
                }
                if event.is_readable() || event.is_read_closed() || event.is_error() {
                    self.read_conn(i, &now_ns);
                }
                if event.is_writable() && self.conns[i].alive {
                    self.flush(i);
                }
            }
            self.progress
                .completed
                .fetch_add(std::mem::take(&mut self.completed), Ordering::Relaxed);
            self.progress.elapsed_ns.fetch_max(now, Ordering::Relaxed);
        }
    }

    fn poll_timeout(
        &self,
        schedule: Option<&Schedule>,
        now: u64,
        issuing: bool,
        drain_deadline: Option<u64>,
    ) -> Duration {
        let mut wake = now + POLL_SLICE.as_nanos() as u64;
        if issuing {
            wake = wake.min(self.issue_end_ns);
            if let Some(s) = schedule {
                let next = s.peek_ns();
                let spin = self.config.spin_threshold.as_nanos() as u64;
                if next <= now.saturating_add(spin) {
                    return Duration::ZERO;
                }
                let wake_for_arrival = next - spin;
                #[cfg(target_os = "linux")]
                if let Some(timer) = &self.timer
                    && wake_for_arrival < wake
                    && timer
                        .arm(Duration::from_nanos(wake_for_arrival - now))
                        .is_ok()
                {
                    // The timer wakes the poll precisely; the poll timeout stays a backstop.
                    return Duration::from_nanos(wake.saturating_sub(now));
                }
                // Without a timer, wake a spin-threshold early: epoll rounds up to milliseconds.
                wake = wake.min(wake_for_arrival);
            }
        }
        if let Some(deadline) = drain_deadline {
            wake = wake.min(deadline);
        }
        Duration::from_nanos(wake.saturating_sub(now))
    }

    /// Closed loop: top every live connection up to the pipeline depth.
    fn fill_closed(&mut self, now: u64) {
        for i in 0..self.conns.len() {
            while self.conns[i].alive
                && self.conns[i].in_flight.len() < self.config.pipeline
                && self.quota != Some(0)
            {
                self.issue(i, now, now, false);
            }
        }
    }

    /// Open loop: hand every due arrival to a free slot, else to the backlog.
    fn dispatch_open(&mut self, schedule: &mut Schedule, now: u64) {
        self.dispatch_backlog(now);
        while now < self.issue_end_ns
            && self.quota != Some(0)
            && let Some(intended) = schedule.next_due(now)
        {
            if intended >= self.issue_end_ns {
                break;
            }
            if self.quota.is_some() && intended >= self.measure_start_ns {
                // Reserve quota at arrival time so backlogged arrivals are not over-issued.
                self.quota = self.quota.map(|q| q - 1);
            }
            match self.free_conn() {
                Some(i) if self.backlog.is_empty() => self.issue(i, intended, now, false),
                _ if self.backlog.len() < self.config.backlog_max => {
                    self.backlog.push_back(intended)
                }
                _ => {
                    if intended >= self.measure_start_ns {
                        self.stats.dropped += 1;
                    }
                }
            }
        }
    }

    fn dispatch_backlog(&mut self, now: u64) {
        while !self.backlog.is_empty() {
            let Some(i) = self.free_conn() else { break };
            if let Some(intended) = self.backlog.pop_front() {
                self.issue(i, intended, now, true);
            }
        }
    }

    /// A live connection with a free pipeline slot, round-robin.
    fn free_conn(&mut self) -> Option<usize> {
        let n = self.conns.len();
        for step in 0..n {
            let i = (self.cursor + step) % n;
            let c = &self.conns[i];
            if c.alive && c.in_flight.len() < self.config.pipeline {
                self.cursor = (i + 1) % n;
                return Some(i);
            }
        }
        None
    }

    /// Encodes one request on connection `i`. `intended` is when it should have been sent.
    /// `from_backlog` says whether the request waited for a free slot; a late send that did
    /// not is the generator's own lag (it was descheduled or too busy).
    fn issue(&mut self, i: usize, intended: u64, now: u64, from_backlog: bool) {
        let measured = intended >= self.measure_start_ns;
        let fill = self.fills.pop_front();
        let conn = &mut self.conns[i];
        let gen_ = &mut self.gen_;
        // A read-through fill sets the key that missed; otherwise the stream plans.
        let planned = fill.map_or_else(|| gen_.next_at(intended), Planned::Set);
        let (op, keys, key) = match planned {
            Planned::Get => {
                let n = gen_.workload().multiget;
                let mut first = 0;
                write_retrieve_with(&mut conn.out, false, None, n, |k, out| {
                    let key = gen_.next_key();
                    if k == 0 {
                        first = key;
                    }
                    gen_.workload().keys.write_key(key, out);
                });
                (OpKind::Get, n as u32, first)
            }
            Planned::Set(key) => {
                let len = gen_.next_value_len();
                let (workload, value) = (gen_.workload(), gen_.pool().value(len));
                let set = StoreHead {
                    mode: StoreMode::Set,
                    flags: 0,
                    exptime: workload.ttl_secs,
                    noreply: false,
                };
                write_store_with(
                    &mut conn.out,
                    set,
                    |out| workload.keys.write_key(key, out),
                    value,
                );
                (OpKind::Set, 1, key)
            }
            Planned::Delete(key) => {
                self.key_buf.clear();
                gen_.workload().keys.write_key(key, &mut self.key_buf);
                let key_bytes = &self.key_buf[..];
                Request::Delete {
                    key: key_bytes,
                    noreply: false,
                }
                .encode(&mut conn.out);
                (OpKind::Delete, 1, key)
            }
        };
        conn.in_flight.push_back(InFlight {
            op,
            keys,
            key,
            intended_ns: intended,
            measured,
        });
        if measured {
            self.stats.op(op).sent += 1;
            if self.config.mode != LoadMode::Closed
                && now.saturating_sub(intended) > self.config.late_threshold.as_nanos() as u64
            {
                self.stats
                    .late_send_at(intended - self.measure_start_ns, !from_backlog);
            }
            if let (Some(q), LoadMode::Closed) = (self.quota.as_mut(), self.config.mode) {
                *q -= 1;
            }
        } else {
            self.stats.warmup_sent += 1;
        }
    }

    fn flush_all(&mut self) {
        for i in 0..self.conns.len() {
            let conn = &self.conns[i];
            if conn.alive
                && (conn.out_pos < conn.out.len()
                    || conn.tls.as_ref().is_some_and(|t| t.wants_write()))
            {
                self.flush(i);
            }
        }
    }

    fn flush(&mut self, i: usize) {
        if self.conns[i].tls.is_some() {
            return self.flush_tls(i);
        }
        let conn = &mut self.conns[i];
        while conn.out_pos < conn.out.len() {
            match conn.stream.write(&conn.out[conn.out_pos..]) {
                Ok(0) => return self.fail(i, "connection"),
                Ok(n) => conn.out_pos += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return self.fail(i, "connection"),
            }
        }
        conn.out.clear();
        conn.out_pos = 0;
    }

    /// TLS: hands the plaintext in `out` to the session (which encrypts it at once, up to
    /// its buffer limit) and writes the ciphertext to the socket until either is exhausted
    /// or the socket would block (the next writable event resumes it).
    fn flush_tls(&mut self, i: usize) {
        let conn = &mut self.conns[i];
        let Some(tls) = conn.tls.as_deref_mut() else {
            return;
        };
        let failed = loop {
            if conn.out_pos < conn.out.len() {
                match tls.writer().write(&conn.out[conn.out_pos..]) {
                    Ok(n) => conn.out_pos += n,
                    Err(_) => break true,
                }
                if conn.out_pos == conn.out.len() {
                    conn.out.clear();
                    conn.out_pos = 0;
                }
            }
            if !tls.wants_write() {
                break false;
            }
            match tls.write_tls(&mut conn.stream) {
                Ok(0) => break true,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break false,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break true,
            }
        };
        if failed {
            self.fail(i, "connection");
        }
    }

    /// TLS: reads ciphertext until the socket would block, decrypting it and parsing the
    /// replies from the plaintext as it comes. A record that does not decrypt or a TLS alert
    /// fails the connection as `protocol`; a close (with or without close_notify), as
    /// `connection`, after the replies that came before it.
    fn read_conn_tls(&mut self, i: usize, now_ns: &impl Fn() -> u64) {
        loop {
            let conn = &mut self.conns[i];
            let Some(tls) = conn.tls.as_deref_mut() else {
                return;
            };
            let (mut closed, mut drained) = (false, false);
            match tls.read_tls(&mut conn.stream) {
                Ok(0) => closed = true,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => drained = true,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return self.fail(i, "connection"),
            }
            if tls.process_new_packets().is_err() {
                // rustls queued an alert; try to send it, then give the connection up.
                let _ = tls.write_tls(&mut conn.stream);
                return self.fail(i, "protocol");
            }
            loop {
                let conn = &mut self.conns[i];
                make_room(conn);
                let Some(tls) = conn.tls.as_deref_mut() else {
                    return;
                };
                match tls.reader().read(&mut conn.buf[conn.filled..]) {
                    // close_notify: the server ended the session.
                    Ok(0) => return self.fail(i, "connection"),
                    Ok(n) => {
                        conn.filled += n;
                        if !self.parse_replies(i, now_ns()) {
                            return;
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(_) => return self.fail(i, "connection"),
                }
            }
            if self.conns[i].tls.as_ref().is_some_and(|t| t.wants_write()) {
                self.flush_tls(i);
            }
            if closed {
                return self.fail(i, "connection");
            }
            if drained || !self.conns[i].alive {
                return;
            }
        }
    }

    fn read_conn(&mut self, i: usize, now_ns: &impl Fn() -> u64) {
        if self.conns[i].tls.is_some() {
            return self.read_conn_tls(i, now_ns);
        }
        loop {
            let conn = &mut self.conns[i];
            make_room(conn);
            match conn.stream.read(&mut conn.buf[conn.filled..]) {
                Ok(0) => return self.fail(i, "connection"),
                Ok(n) => {
                    conn.filled += n;
                    if !self.parse_replies(i, now_ns()) {
                        return;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return self.fail(i, "connection"),
            }
        }
    }

    /// Consumes every complete reply in the buffer. Returns false if the connection failed.
    fn parse_replies(&mut self, i: usize, now: u64) -> bool {
        let limits = self.config.limits.codec();
        loop {
            let conn = &mut self.conns[i];
            let Some(&front) = conn.in_flight.front() else {
                if conn.start < conn.filled {
                    // Bytes nobody asked for: the stream is out of sync.
                    self.fail(i, "protocol");
                    return false;
                }
                break;
            };
            let expect = match front.op {
                OpKind::Get => Expect::Values,
                OpKind::Set | OpKind::Delete => Expect::Line,
            };
            let decoded = decode_reply(&conn.buf[conn.start..conn.filled], expect, &limits);
            let outcome = match decoded {
                Ok(Decoded::Incomplete) => break,
                Ok(Decoded::Complete { reply, consumed }) => match classify(&reply) {
                    Some(outcome) => {
                        conn.start += consumed;
                        outcome
                    }
                    // A reply no set gets: the stream is out of sync.
                    None => {
                        self.fail(i, "protocol");
                        return false;
                    }
                },
                Err(_) => {
                    self.fail(i, "protocol");
                    return false;
                }
            };
            conn.in_flight.pop_front();
            self.completed += u64::from(front.measured);
            self.record(front, outcome, now);
        }
        let conn = &mut self.conns[i];
        if conn.start == conn.filled {
            conn.start = 0;
            conn.filled = 0;
        }
        true
    }

    fn record(&mut self, req: InFlight, outcome: Outcome, now: u64) {
        self.gen_.settled(req.op, req.key);
        if let Outcome::Hits(0) = outcome
            && self.config.set_on_miss
            && req.op == OpKind::Get
            && self.fills.len() < self.config.backlog_max
        {
            self.fills.push_back(req.key);
        }
        if !req.measured {
            return;
        }
        let since_start = now.saturating_sub(self.measure_start_ns);
        let latency = latency_ns(req.intended_ns, now);
        let stats = self.stats.op(req.op);
        let (mut hits, mut misses) = (0, 0);
        match outcome {
            Outcome::Error(kind) => return self.stats.error_at(req.op, kind, since_start),
            Outcome::Hits(found) => {
                hits = found as u64;
                misses = u64::from(req.keys).saturating_sub(hits);
                stats.hits += hits;
                stats.misses += misses;
            }
            Outcome::Stored => {}
            Outcome::NotStored => stats.not_stored += 1,
        }
        stats.replies += 1;
        stats.latency.record(latency);
        self.stats.reply_at(since_start, latency, hits, misses);
    }

    /// Nanoseconds since measurement began, as of the event loop's last turn (0 during
    /// warm-up): when an error found outside a reply is counted in the timeline.
    fn since_start(&self) -> u64 {
        self.clock_ns.saturating_sub(self.measure_start_ns)
    }

    /// Marks connection `i` dead and counts everything it had in flight as errors of `kind`.
    fn fail(&mut self, i: usize, kind: &'static str) {
        let conn = &mut self.conns[i];
        if !conn.alive {
            return;
        }
        conn.alive = false;
        self.connections_failed += 1;
        let lost: Vec<InFlight> = conn.in_flight.drain(..).collect();
        let since_start = self.since_start();
        for req in lost {
            self.gen_.settled(req.op, req.key);
            if req.measured {
                self.completed += 1;
                self.stats.error_at(req.op, kind, since_start);
            }
        }
    }

    /// End of the run: whatever is still unanswered is a timeout; backlog never sent is dropped.
    fn finish_drain(&mut self) {
        let since_start = self.since_start();
        for i in 0..self.conns.len() {
            let lost: Vec<InFlight> = self.conns[i].in_flight.drain(..).collect();
            for req in lost {
                if req.measured {
                    self.stats.error_at(req.op, "timeout", since_start);
                }
            }
        }
        let never_sent = self
            .backlog
            .drain(..)
            .filter(|&t| t >= self.measure_start_ns)
            .count();
        self.stats.dropped += never_sent as u64;
        self.progress
            .completed
            .fetch_add(std::mem::take(&mut self.completed), Ordering::Relaxed);
    }
}

/// What a reply means for the statistics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Hits(usize),
    Stored,
    NotStored,
    Error(&'static str),
}

/// `None` for a reply neither a get nor a set can get.
fn classify(reply: &Reply<'_>) -> Option<Outcome> {
    Some(match reply {
        Reply::Values(v) => Outcome::Hits(v.count()),
        Reply::Line(Response::Stored | Response::Deleted) => Outcome::Stored,
        Reply::Line(Response::NotStored | Response::Exists | Response::NotFound) => {
            Outcome::NotStored
        }
        Reply::Line(Response::Error) => Outcome::Error("error"),
        Reply::Line(Response::ClientError(_)) => Outcome::Error("client_error"),
        Reply::Line(Response::ServerError(_)) => Outcome::Error("server_error"),
        Reply::Line(_) | Reply::Stats(_) => return None,
    })
}
