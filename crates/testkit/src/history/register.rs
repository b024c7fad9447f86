//! Linearizability of one key used as a register (`set` of unique values, `get`), decided
//! with the Wing-Gong search as improved by Lowe (memoising visited configurations), the
//! algorithm of Knossos and Porcupine.
//!
//! Every operation becomes a call entry and a return entry on a doubly linked list ordered
//! by history index. The search walks the list: at a call it tries to linearize that
//! operation now (the model must accept it), lifting both entries out of the list; at a
//! return entry it has found an operation that had to take effect already but could not,
//! so it backtracks. A configuration (set of linearized operations, register value) seen
//! once is never explored again, which keeps the search polynomial for the histories CI
//! tests produce; a step bound turns the rare explosive case into "undecided".
//!
//! What enters the search: `set`s that were acknowledged (returning at their completion)
//! or whose outcome is unknown (returning after everything else: they may take effect at
//! any point after their invocation, or never, since a write placed after every read is
//! unobservable); `get`s that returned a value or a miss. Failed operations and failed or
//! unknown reads constrain nothing and are left out. The register starts absent (a miss).

use std::collections::{HashMap, HashSet};

use super::{Op, Operation, Outcome, Reply, Violation};

pub(crate) enum Verdict {
    Linearizable,
    Violations(Vec<Violation>),
    Undecided,
}

/// What an operation does to, or expects of, the register; values are interned, 0 is absent.
#[derive(Clone, Copy)]
enum Action {
    Write(u32),
    Read(u32),
}

const NIL: usize = usize::MAX;

struct Entry {
    /// Index into the checked operations.
    op: usize,
    is_call: bool,
    /// For a call, the list position of its return entry.
    matching: usize,
    prev: usize,
    next: usize,
}

pub(crate) fn check_key(key: &str, operations: &[Operation], steps_max: u64) -> Verdict {
    let mut values: HashMap<&[u8], u32> = HashMap::new();
    for operation in operations {
        if let Op::Set { value, .. } = &operation.op {
            let next = values.len() as u32 + 1;
            values.entry(value.as_slice()).or_insert(next);
        }
    }

    let read: HashSet<&[u8]> = operations
        .iter()
        .filter_map(|operation| match (&operation.op, &operation.outcome) {
            (Op::Get { .. }, Outcome::Ok(Reply::Value(Some(value)))) => Some(value.as_slice()),
            _ => None,
        })
        .collect();

    let mut phantoms = Vec::new();
    let mut checked: Vec<(&Operation, Action)> = Vec::new();
    for operation in operations {
        match (&operation.op, &operation.outcome) {
            // An unknown-outcome write nobody read can always be placed after every other
            // operation, where it changes nothing observed: leaving it out keeps the search
            // small when a fault leaves many writes unknown.
            (Op::Set { value, .. }, Outcome::Unknown(_)) if !read.contains(value.as_slice()) => {}
            (Op::Set { value, .. }, Outcome::Ok(_) | Outcome::Unknown(_)) => {
                checked.push((operation, Action::Write(values[value.as_slice()])));
            }
            (Op::Get { .. }, Outcome::Ok(Reply::Value(None))) => {
                checked.push((operation, Action::Read(0)));
            }
            (Op::Get { .. }, Outcome::Ok(Reply::Value(Some(value)))) => {
                match values.get(value.as_slice()) {
                    Some(&id) => checked.push((operation, Action::Read(id))),
                    None => phantoms.push(Violation::Phantom {
                        key: key.to_owned(),
                        read: operation.clone(),
                    }),
                }
            }
            _ => {}
        }
    }
    if !phantoms.is_empty() {
        return Verdict::Violations(phantoms);
    }
    search(key, &checked, steps_max)
}

fn search(key: &str, checked: &[(&Operation, Action)], steps_max: u64) -> Verdict {
    let total = checked.len();
    // (time, is_return, op): calls at their invoke index, returns at their completion or,
    // when unknown, after every finite event.
    let mut timeline: Vec<(u64, bool, usize)> = Vec::with_capacity(total * 2);
    for (op, (operation, _)) in checked.iter().enumerate() {
        timeline.push((operation.invoked, false, op));
        let returns_at = match (&operation.outcome, operation.completed) {
            (Outcome::Ok(_), Some(done)) => done,
            _ => u64::MAX,
        };
        timeline.push((returns_at, true, op));
    }
    timeline.sort_unstable();

    // position 0 is the head sentinel; entries follow in time order
    let mut list: Vec<Entry> = Vec::with_capacity(timeline.len() + 1);
    list.push(Entry {
        op: NIL,
        is_call: false,
        matching: NIL,
        prev: NIL,
        next: if timeline.is_empty() { NIL } else { 1 },
    });
    let mut return_position = vec![NIL; total];
    for (i, &(_, is_return, op)) in timeline.iter().enumerate() {
        let position = i + 1;
        if is_return {
            return_position[op] = position;
        }
        list.push(Entry {
            op,
            is_call: !is_return,
            matching: NIL,
            prev: position - 1,
            next: if position == timeline.len() {
                NIL
            } else {
                position + 1
            },
        });
    }
    for entry in list.iter_mut().skip(1) {
        if entry.is_call {
            entry.matching = return_position[entry.op];
        }
    }

    // The set of linearized operations is memoised by a 128-bit Zobrist hash (the XOR of a
    // random tag per operation), updated in O(1) per step; copying and hashing a bitset of
    // all operations per step made one key with 16,000 operations take seconds. A false
    // "seen" needs a 128-bit collision among the configurations of one key.
    let tags: Vec<u128> = (0..total as u64).map(zobrist_tag).collect();
    let mut linearized: u128 = 0;
    let mut state: u32 = 0;
    let mut seen: HashSet<(u128, u32)> = HashSet::new();
    let mut calls: Vec<(usize, u32)> = Vec::new();
    let mut best_depth = 0usize;
    let mut blocked: Option<usize> = None;
    let mut steps: u64 = 0;
    let mut cursor = list[0].next;
    while list[0].next != NIL {
        steps += 1;
        if steps > steps_max {
            return Verdict::Undecided;
        }
        // never NIL: every call still in the list is followed by its return entry
        let entry = &list[cursor];
        if entry.is_call {
            let op = entry.op;
            let next_state = match checked[op].1 {
                Action::Write(value) => Some(value),
                Action::Read(value) => (value == state).then_some(state),
            };
            if let Some(next_state) = next_state {
                linearized ^= tags[op];
                if seen.insert((linearized, next_state)) {
                    calls.push((cursor, state));
                    state = next_state;
                    lift(&mut list, cursor);
                    cursor = list[0].next;
                    continue;
                }
                linearized ^= tags[op];
            }
            cursor = list[cursor].next;
        } else {
            if calls.len() >= best_depth {
                best_depth = calls.len();
                blocked = Some(entry.op);
            }
            let Some((call, previous_state)) = calls.pop() else {
                break;
            };
            let op = list[call].op;
            linearized ^= tags[op];
            state = previous_state;
            unlift(&mut list, call);
            cursor = list[call].next;
        }
    }
    if list[0].next == NIL {
        return Verdict::Linearizable;
    }
    let blocked = blocked.unwrap_or(0);
    Verdict::Violations(vec![Violation::NotLinearizable {
        key: key.to_owned(),
        blocked: checked[blocked].0.clone(),
        linearized: best_depth,
        total,
    }])
}

/// A fixed pseudo-random 128-bit tag for operation `op` (two rounds of splitmix64), so a
/// check is deterministic.
fn zobrist_tag(op: u64) -> u128 {
    let mix = |mut z: u64| {
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let seed = op
        .wrapping_mul(2)
        .wrapping_add(1)
        .wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (u128::from(mix(seed)) << 64) | u128::from(mix(seed ^ 0xd1b5_4a32_d192_ed03))
}

fn lift(list: &mut [Entry], call: usize) {
    let (prev, next) = (list[call].prev, list[call].next);
    list[prev].next = next;
    if next != NIL {
        list[next].prev = prev;
    }
    let ret = list[call].matching;
    let (prev, next) = (list[ret].prev, list[ret].next);
    list[prev].next = next;
    if next != NIL {
        list[next].prev = prev;
    }
}

fn unlift(list: &mut [Entry], call: usize) {
    let ret = list[call].matching;
    let (prev, next) = (list[ret].prev, list[ret].next);
    list[prev].next = ret;
    if next != NIL {
        list[next].prev = ret;
    }
    let (prev, next) = (list[call].prev, list[call].next);
    list[prev].next = call;
    if next != NIL {
        list[next].prev = call;
    }
}
