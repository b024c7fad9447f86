//! Checks one key used as an append log: created by a `set` of the empty value, then
//! extended by `append`s of unique tokens, each ending with [`TOKEN_END`] and holding no
//! other `TOKEN_END`.
//!
//! For every successful read the checker demands: each token appears at most once; no
//! token whose append was never sent or certainly failed; every token acknowledged before
//! the read began is present; tokens appear in real-time order (if one append was
//! acknowledged before another was sent, it comes first; a client's own appends are
//! sequential, so this includes each client's send order); and the read extends every read
//! that completed before it began. A miss, or an `append` answered `NOT_STORED`, after the
//! creating `set` was acknowledged means the key was lost.

use std::collections::HashMap;

use super::{Op, Operation, Outcome, Reply, Violation};

/// The byte that ends every token of an append log.
pub const TOKEN_END: u8 = b';';

#[derive(Clone, Copy, PartialEq, Eq)]
enum Status {
    Acknowledged,
    Unknown,
    Failed,
}

struct Token {
    status: Status,
    invoked: u64,
    /// Completion index when acknowledged, `u64::MAX` otherwise.
    acknowledged_at: u64,
}

/// Splits a log value into tokens, each with its terminator; a trailing fragment without
/// terminator comes back as a token too (it matches no sent token, so it is reported).
pub fn split_tokens(value: &[u8]) -> Vec<&[u8]> {
    let mut tokens = Vec::new();
    let mut start = 0;
    for (i, &byte) in value.iter().enumerate() {
        if byte == TOKEN_END {
            tokens.push(&value[start..=i]);
            start = i + 1;
        }
    }
    if start < value.len() {
        tokens.push(&value[start..]);
    }
    tokens
}

pub(crate) fn check_key(key: &str, operations: &[Operation], violations: &mut Vec<Violation>) {
    let mut tokens: HashMap<&[u8], Token> = HashMap::new();
    let mut created_at = u64::MAX;
    for operation in operations {
        match (&operation.op, &operation.outcome) {
            (Op::Set { value, .. }, _) if !value.is_empty() => {
                violations.push(Violation::MixedWorkload {
                    key: key.to_owned(),
                });
                return;
            }
            (Op::Set { .. }, Outcome::Ok(Reply::Stored)) => {
                created_at = created_at.min(operation.completed.unwrap_or(u64::MAX));
            }
            (Op::Append { token, .. }, outcome) => {
                let status = match outcome {
                    Outcome::Ok(Reply::Stored) => Status::Acknowledged,
                    Outcome::Unknown(_) => Status::Unknown,
                    Outcome::Ok(_) | Outcome::Fail(_) => Status::Failed,
                };
                let acknowledged_at = match status {
                    Status::Acknowledged => operation.completed.unwrap_or(u64::MAX),
                    _ => u64::MAX,
                };
                tokens.insert(
                    token.as_slice(),
                    Token {
                        status,
                        invoked: operation.invoked,
                        acknowledged_at,
                    },
                );
            }
            _ => {}
        }
    }

    let mut reads: Vec<(&Operation, &[u8])> = Vec::new();
    for operation in operations {
        let lost = match (&operation.op, &operation.outcome) {
            (Op::Append { .. }, Outcome::Ok(Reply::NotStored)) => true,
            (Op::Get { .. }, Outcome::Ok(Reply::Value(None))) => true,
            (Op::Get { .. }, Outcome::Ok(Reply::Value(Some(value)))) => {
                reads.push((operation, value));
                false
            }
            _ => false,
        };
        if lost && created_at < operation.invoked {
            violations.push(Violation::KeyLost {
                key: key.to_owned(),
                op: operation.clone(),
            });
        }
    }

    for &(read, value) in &reads {
        check_read(key, read, value, &tokens, violations);
    }
    for &(later, later_value) in &reads {
        for &(earlier, earlier_value) in &reads {
            let before = earlier.completed.is_some_and(|done| done < later.invoked);
            if before && !later_value.starts_with(earlier_value) {
                violations.push(Violation::Diverged {
                    key: key.to_owned(),
                    earlier: earlier.clone(),
                    later: later.clone(),
                });
            }
        }
    }
}

fn check_read(
    key: &str,
    read: &Operation,
    value: &[u8],
    tokens: &HashMap<&[u8], Token>,
    violations: &mut Vec<Violation>,
) {
    let mut present: HashMap<&[u8], usize> = HashMap::new();
    // (token, latest invocation among the tokens before it, and which token that was)
    let mut latest_before: Option<(u64, &[u8])> = None;
    for token in split_tokens(value) {
        let count = present.entry(token).or_insert(0);
        *count += 1;
        if *count == 2 {
            violations.push(Violation::DuplicateToken {
                key: key.to_owned(),
                read: read.clone(),
                token: token.to_vec(),
            });
        }
        if *count > 1 {
            continue;
        }
        let Some(sent) = tokens.get(token).filter(|t| t.status != Status::Failed) else {
            violations.push(Violation::FailedTokenPresent {
                key: key.to_owned(),
                read: read.clone(),
                token: token.to_vec(),
            });
            continue;
        };
        if let Some((invoked, second)) = latest_before
            && invoked > sent.acknowledged_at
        {
            violations.push(Violation::Reordered {
                key: key.to_owned(),
                read: read.clone(),
                first: token.to_vec(),
                second: second.to_vec(),
            });
        }
        if latest_before.is_none_or(|(invoked, _)| sent.invoked > invoked) {
            latest_before = Some((sent.invoked, token));
        }
    }
    let mut lost: Vec<(&[u8], u64)> = tokens
        .iter()
        .filter(|(token, t)| {
            t.status == Status::Acknowledged
                && t.acknowledged_at < read.invoked
                && !present.contains_key(*token)
        })
        .map(|(token, t)| (*token, t.invoked))
        .collect();
    lost.sort_by_key(|&(_, invoked)| invoked);
    for (token, _) in lost {
        violations.push(Violation::LostToken {
            key: key.to_owned(),
            read: read.clone(),
            token: token.to_vec(),
        });
    }
}
