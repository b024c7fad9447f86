//! Histories of client operations, recorded the way Jepsen records them, and the checker
//! that decides whether a memcached-speaking cache kept its promises.
//!
//! A history is a sequence of [`Event`]s with a monotonic index: a client *invokes* an
//! operation (before sending it) and later *completes* it (after the reply, or after giving
//! up) with an [`Outcome`]: `Ok` with the reply, `Fail` when the operation certainly had no
//! effect (the connection was refused, the server rejected the command), or `Unknown` when
//! it may or may not have been applied (a timeout, a dropped connection, `SERVER_ERROR`).
//! The index order is real-time order: an event recorded after another happened after it.
//! A client runs one operation at a time; after an `Unknown` outcome a driver continues
//! under a fresh client id (Jepsen's "the process crashed"), since the old request may
//! still be in flight.
//!
//! The checker ([`check`]) handles the two workload shapes of the fault and division tests,
//! chosen per key by the operations the history holds for it:
//! - **registers** (`set` of unique values, `get`): a real linearizability check per key
//!   (keys are independent) with the Wing-Gong/Lowe search (see [`register`]), bounded by
//!   [`CheckConfig::search_steps_max`]. It implies that every acknowledged write is readable
//!   afterwards with its latest value or a later one from an unknown-outcome write, and that
//!   no read returns a value never written (reported separately, as a phantom);
//! - **append logs** (an initial `set` and `append`s of unique tokens): every read holds
//!   every token acknowledged before the read began exactly once, no token that was never
//!   sent (or whose append certainly failed), and tokens in real-time order, hence each
//!   client's tokens in its send order (see [`append`]).

pub mod append;
pub mod register;
pub mod timeline;

use std::fmt;
use std::io::Write;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Identifies one sequential client (Jepsen's "process").
pub type ClientId = u64;
/// Position of an event in the history; larger means later in real time.
pub type EventIndex = u64;

/// An operation as the client sent it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// `set key 0 0 len` with a value no other `set` of this history uses for the key.
    Set { key: String, value: Vec<u8> },
    /// `get key`.
    Get { key: String },
    /// `append key 0 0 len` with a token no other `append` of this history uses for the key.
    Append { key: String, token: Vec<u8> },
}

impl Op {
    /// The key the operation touches.
    pub fn key(&self) -> &str {
        match self {
            Op::Set { key, .. } | Op::Get { key } | Op::Append { key, .. } => key,
        }
    }
}

/// What the server answered to a completed operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// `STORED`.
    Stored,
    /// `NOT_STORED` (an `append` to a missing key): the operation had no effect.
    NotStored,
    /// The answer to a `get`: the value, or `None` for a miss.
    Value(Option<Vec<u8>>),
}

/// How an operation ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The server answered.
    Ok(Reply),
    /// The operation certainly had no effect; the text says why.
    Fail(String),
    /// The operation may or may not have taken effect; the text says why.
    Unknown(String),
}

/// One entry of a history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub index: EventIndex,
    /// When it was recorded, since the history's first event (for timelines and measured
    /// windows; the checker orders by `index` only).
    pub time: Duration,
    pub client: ClientId,
    pub kind: EventKind,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EventKind {
    Invoke(Op),
    /// Completes the operation invoked at event `invoke`.
    Complete {
        invoke: EventIndex,
        outcome: Outcome,
    },
}

/// An invocation paired with its completion.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Operation {
    pub client: ClientId,
    pub op: Op,
    /// Index of the invoke event; also identifies the operation.
    pub invoked: EventIndex,
    /// Index of the complete event; `None` if the history ends before it completed
    /// (treated as `Unknown`).
    pub completed: Option<EventIndex>,
    pub outcome: Outcome,
    pub invoked_at: Duration,
    pub completed_at: Option<Duration>,
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{} client {} ", self.invoked, self.client)?;
        match &self.op {
            Op::Set { key, value } => write!(f, "set {key} {}", value.escape_ascii())?,
            Op::Get { key } => write!(f, "get {key}")?,
            Op::Append { key, token } => write!(f, "append {key} {}", token.escape_ascii())?,
        }
        match &self.outcome {
            Outcome::Ok(Reply::Stored) => write!(f, " -> STORED")?,
            Outcome::Ok(Reply::NotStored) => write!(f, " -> NOT_STORED")?,
            Outcome::Ok(Reply::Value(None)) => write!(f, " -> miss")?,
            Outcome::Ok(Reply::Value(Some(v))) => write!(f, " -> {}", v.escape_ascii())?,
            Outcome::Fail(why) => write!(f, " -> fail ({why})")?,
            Outcome::Unknown(why) => write!(f, " -> unknown ({why})")?,
        }
        match (self.completed, self.completed_at) {
            (Some(done), Some(at)) => write!(
                f,
                " [{}..{}] [{:.3}..{:.3} ms]",
                self.invoked,
                done,
                self.invoked_at.as_secs_f64() * 1e3,
                at.as_secs_f64() * 1e3
            ),
            _ => write!(
                f,
                " [{}..] [{:.3}.. ms]",
                self.invoked,
                self.invoked_at.as_secs_f64() * 1e3
            ),
        }
    }
}

/// A history that does not follow the recording rules.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HistoryError {
    #[error("event {index}: completes event {invoke}, which is not an open invocation")]
    NoSuchInvocation {
        index: EventIndex,
        invoke: EventIndex,
    },
    #[error("event {index}: completion by client {client} of an operation invoked by another")]
    WrongClient { index: EventIndex, client: ClientId },
    #[error("event {index}: client {client} invokes while its operation {open} is still open")]
    ClientBusy {
        index: EventIndex,
        client: ClientId,
        open: EventIndex,
    },
    #[error("event {index}: index out of order (expected {expected})")]
    IndexOutOfOrder {
        index: EventIndex,
        expected: EventIndex,
    },
}

/// A recorded history. Build one by hand with [`History::invoke`] and
/// [`History::complete`], or concurrently through a [`Recorder`].
#[derive(Clone, Debug, Default)]
pub struct History {
    events: Vec<Event>,
    /// Set by the first event; event times count from here.
    started: Option<Instant>,
}

impl History {
    pub fn new() -> Self {
        Self::default()
    }

    /// Records that `client` is about to send `op`; returns the event index that names it.
    pub fn invoke(&mut self, client: ClientId, op: Op) -> EventIndex {
        let index = self.events.len() as EventIndex;
        let time = self.now();
        self.events.push(Event {
            index,
            time,
            client,
            kind: EventKind::Invoke(op),
        });
        index
    }

    /// Records how the operation invoked at `invoke` ended. The client is taken from the
    /// invocation (an out-of-range index is recorded as client 0 and rejected by
    /// [`History::operations`]).
    pub fn complete(&mut self, invoke: EventIndex, outcome: Outcome) -> EventIndex {
        let client = self
            .events
            .get(invoke as usize)
            .map_or(0, |event| event.client);
        let index = self.events.len() as EventIndex;
        let time = self.now();
        self.events.push(Event {
            index,
            time,
            client,
            kind: EventKind::Complete { invoke, outcome },
        });
        index
    }

    /// Builds a history from raw events (for example read back from a dump); it is
    /// validated when checked.
    pub fn from_events(events: Vec<Event>) -> Self {
        Self {
            events,
            started: None,
        }
    }

    fn now(&mut self) -> Duration {
        self.started.get_or_insert_with(Instant::now).elapsed()
    }

    pub fn events(&self) -> &[Event] {
        &self.events
    }

    pub fn len(&self) -> usize {
        self.events.len()
    }

    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// Pairs invocations with completions, in invocation order, after checking the
    /// recording rules.
    pub fn operations(&self) -> Result<Vec<Operation>, HistoryError> {
        let mut operations: Vec<Operation> = Vec::new();
        // invoke index -> position in `operations`, for open operations only
        let mut open: std::collections::HashMap<EventIndex, usize> = Default::default();
        let mut open_by_client: std::collections::HashMap<ClientId, EventIndex> =
            Default::default();
        for (position, event) in self.events.iter().enumerate() {
            if event.index != position as EventIndex {
                return Err(HistoryError::IndexOutOfOrder {
                    index: event.index,
                    expected: position as EventIndex,
                });
            }
            match &event.kind {
                EventKind::Invoke(op) => {
                    if let Some(&busy) = open_by_client.get(&event.client) {
                        return Err(HistoryError::ClientBusy {
                            index: event.index,
                            client: event.client,
                            open: busy,
                        });
                    }
                    open_by_client.insert(event.client, event.index);
                    open.insert(event.index, operations.len());
                    operations.push(Operation {
                        client: event.client,
                        op: op.clone(),
                        invoked: event.index,
                        completed: None,
                        outcome: Outcome::Unknown("history ended before completion".into()),
                        invoked_at: event.time,
                        completed_at: None,
                    });
                }
                EventKind::Complete { invoke, outcome } => {
                    let Some(at) = open.remove(invoke) else {
                        return Err(HistoryError::NoSuchInvocation {
                            index: event.index,
                            invoke: *invoke,
                        });
                    };
                    let operation = &mut operations[at];
                    if operation.client != event.client {
                        return Err(HistoryError::WrongClient {
                            index: event.index,
                            client: event.client,
                        });
                    }
                    open_by_client.remove(&event.client);
                    operation.completed = Some(event.index);
                    operation.completed_at = Some(event.time);
                    operation.outcome = outcome.clone();
                }
            }
        }
        Ok(operations)
    }

    /// Writes one line per operation, for post-mortems of a failed check.
    pub fn write_to(&self, path: &Path) -> std::io::Result<()> {
        let mut file = std::io::BufWriter::new(std::fs::File::create(path)?);
        match self.operations() {
            Ok(operations) => {
                for operation in operations {
                    writeln!(file, "{operation}")?;
                }
            }
            Err(error) => {
                writeln!(file, "malformed history: {error}")?;
                for event in &self.events {
                    writeln!(file, "{event:?}")?;
                }
            }
        }
        file.flush()
    }
}

/// A [`History`] shared by concurrent clients. The lock is held only to append one event,
/// which is what makes the index order a real-time order: an event recorded after a reply
/// arrived gets a larger index than every event recorded before.
#[derive(Debug, Default)]
pub struct Recorder {
    history: Mutex<History>,
}

impl Recorder {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn invoke(&self, client: ClientId, op: Op) -> EventIndex {
        self.lock().invoke(client, op)
    }

    pub fn complete(&self, invoke: EventIndex, outcome: Outcome) -> EventIndex {
        self.lock().complete(invoke, outcome)
    }

    /// How many events were recorded so far: every operation invoked later gets an index at
    /// or above it (the index order is real-time order).
    pub fn events_recorded(&self) -> EventIndex {
        self.lock().len() as EventIndex
    }

    /// A copy of everything recorded so far.
    pub fn snapshot(&self) -> History {
        self.lock().clone()
    }

    pub fn into_history(self) -> History {
        self.history.into_inner().unwrap_or_else(|e| e.into_inner())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, History> {
        // A client thread that panicked left a whole event behind: the history stays usable.
        self.history.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Bounds of the checker.
#[derive(Clone, Copy, Debug)]
pub struct CheckConfig {
    /// Search steps allowed per key for the linearizability search; beyond it the key is
    /// reported as inconclusive (which fails [`Report::assert_valid`]).
    pub search_steps_max: u64,
}

impl Default for CheckConfig {
    fn default() -> Self {
        Self {
            search_steps_max: 2_000_000,
        }
    }
}

/// One broken promise found in a history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Violation {
    /// The history itself is malformed.
    Malformed(HistoryError),
    /// A key was used with both `set` of non-empty values and `append`.
    MixedWorkload { key: String },
    /// A read returned a value that no operation on the key ever sent.
    Phantom { key: String, read: Operation },
    /// No linearization of the key's register operations exists. `blocked` is an operation
    /// that could not be placed after the longest linearizable prefix found
    /// (`linearized` of `total` operations).
    NotLinearizable {
        key: String,
        blocked: Operation,
        linearized: usize,
        total: usize,
    },
    /// A read of an append log misses a token acknowledged before the read began (or the
    /// whole key).
    LostToken {
        key: String,
        read: Operation,
        token: Vec<u8>,
    },
    /// A token appears more than once in a read.
    DuplicateToken {
        key: String,
        read: Operation,
        token: Vec<u8>,
    },
    /// A read holds a token whose append certainly failed.
    FailedTokenPresent {
        key: String,
        read: Operation,
        token: Vec<u8>,
    },
    /// `first` was acknowledged before `second` was sent, yet a read shows `second` first.
    Reordered {
        key: String,
        read: Operation,
        first: Vec<u8>,
        second: Vec<u8>,
    },
    /// A read of an append log does not extend a read that completed before it began
    /// (append-only logs only grow).
    Diverged {
        key: String,
        earlier: Operation,
        later: Operation,
    },
    /// An `append` got `NOT_STORED` or a `get` missed although the key's initial `set` was
    /// acknowledged before it began: the key was lost.
    KeyLost { key: String, op: Operation },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::Malformed(error) => write!(f, "malformed history: {error}"),
            Violation::MixedWorkload { key } => {
                write!(f, "key {key}: mixes set of values with append")
            }
            Violation::Phantom { key, read } => {
                write!(f, "key {key}: read of a value never written: {read}")
            }
            Violation::NotLinearizable {
                key,
                blocked,
                linearized,
                total,
            } => write!(
                f,
                "key {key}: not linearizable; after {linearized} of {total} operations none \
                 fits, blocked at {blocked}"
            ),
            Violation::LostToken { key, read, token } => write!(
                f,
                "key {key}: acknowledged token {} missing from {read}",
                token.escape_ascii()
            ),
            Violation::DuplicateToken { key, read, token } => write!(
                f,
                "key {key}: token {} more than once in {read}",
                token.escape_ascii()
            ),
            Violation::FailedTokenPresent { key, read, token } => write!(
                f,
                "key {key}: token {} of a failed or never sent append in {read}",
                token.escape_ascii()
            ),
            Violation::Reordered {
                key,
                read,
                first,
                second,
            } => write!(
                f,
                "key {key}: {} was acknowledged before {} was sent, but {read} has them the \
                 other way round",
                first.escape_ascii(),
                second.escape_ascii()
            ),
            Violation::Diverged {
                key,
                earlier,
                later,
            } => write!(
                f,
                "key {key}: {later} does not extend the earlier {earlier}"
            ),
            Violation::KeyLost { key, op } => {
                write!(f, "key {key}: key lost after its acknowledged set: {op}")
            }
        }
    }
}

/// What the checker found.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub keys_checked: usize,
    pub operations_checked: usize,
    pub violations: Vec<Violation>,
    /// Keys whose linearizability search ran out of steps.
    pub inconclusive_keys: Vec<String>,
}

impl Report {
    /// True when no violation was found and every key was decided.
    pub fn is_valid(&self) -> bool {
        self.violations.is_empty() && self.inconclusive_keys.is_empty()
    }

    /// Panics with the findings unless [`Report::is_valid`].
    #[track_caller]
    pub fn assert_valid(&self) {
        assert!(self.is_valid(), "history check failed:\n{self}");
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} keys, {} operations, {} violations, {} inconclusive keys",
            self.keys_checked,
            self.operations_checked,
            self.violations.len(),
            self.inconclusive_keys.len()
        )?;
        for violation in self.violations.iter().take(20) {
            writeln!(f, "  {violation}")?;
        }
        if self.violations.len() > 20 {
            writeln!(f, "  ... and {} more", self.violations.len() - 20)?;
        }
        for key in &self.inconclusive_keys {
            writeln!(f, "  key {key}: search bound reached, undecided")?;
        }
        Ok(())
    }
}

/// Checks a whole history: splits it by key, and checks each key as a register or as an
/// append log depending on whether it saw any `append`.
pub fn check(history: &History, config: CheckConfig) -> Report {
    let mut report = Report::default();
    let operations = match history.operations() {
        Ok(operations) => operations,
        Err(error) => {
            report.violations.push(Violation::Malformed(error));
            return report;
        }
    };
    report.operations_checked = operations.len();
    let mut by_key: std::collections::BTreeMap<String, Vec<Operation>> = Default::default();
    for operation in operations {
        by_key
            .entry(operation.op.key().to_owned())
            .or_default()
            .push(operation);
    }
    report.keys_checked = by_key.len();
    for (key, operations) in by_key {
        let is_log = operations.iter().any(|o| matches!(o.op, Op::Append { .. }));
        if is_log {
            append::check_key(&key, &operations, &mut report.violations);
        } else {
            match register::check_key(&key, &operations, config.search_steps_max) {
                register::Verdict::Linearizable => {}
                register::Verdict::Violations(found) => report.violations.extend(found),
                register::Verdict::Undecided => report.inconclusive_keys.push(key),
            }
        }
    }
    report
}

#[cfg(test)]
mod tests;
