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
    check_key_with(key, operations, violations, false);
}

/// `each_read`: check every read on its own even when the reads form a chain (the
/// reference the chain path is tested against).
pub(super) fn check_key_with(
    key: &str,
    operations: &[Operation],
    violations: &mut Vec<Violation>,
    each_read: bool,
) {
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

    match check_reads_agree(key, &reads, violations) {
        Some(chain) if !each_read => check_chain(key, &chain, &tokens, violations),
        // reads disagree: check each on its own (slower, only on this failure path)
        _ => {
            for &(read, value) in &reads {
                check_read(key, read, value, &tokens, violations);
            }
        }
    }
}

/// The per-read checks of [`check_read`] for reads that form a chain (each a prefix of the
/// next): each read adds only its new tokens to a running state, so the cost is the length
/// of the longest read plus the number of tokens, not their product. A violation is
/// reported once, against the shortest read that shows it.
fn check_chain(
    key: &str,
    chain: &[(&Operation, &[u8])],
    tokens: &HashMap<&[u8], Token>,
    violations: &mut Vec<Violation>,
) {
    let mut present: HashMap<&[u8], usize> = HashMap::new();
    let mut latest_before: Option<(u64, &[u8])> = None;
    // end of the last complete token of the previous read: the next read continues there
    let mut boundary = 0;
    for (index, &(read, value)) in chain.iter().enumerate() {
        for token in split_tokens(&value[boundary..]) {
            if token.last() != Some(&TOKEN_END) {
                // a torn fragment at the end of this read: never a sent token
                violations.push(Violation::FailedTokenPresent {
                    key: key.to_owned(),
                    read: read.clone(),
                    token: token.to_vec(),
                });
                break;
            }
            boundary += token.len();
            if let Some(first) = present.get(token) {
                if *first != usize::MAX {
                    violations.push(Violation::DuplicateToken {
                        key: key.to_owned(),
                        read: read.clone(),
                        token: token.to_vec(),
                    });
                    // report each duplicated token once
                    present.insert(token, usize::MAX);
                }
                continue;
            }
            present.insert(token, index);
            check_token_order(key, read, token, tokens, &mut latest_before, violations);
        }
    }
    // An acknowledged token first shown by chain read `f` is in every read from `f` on; it
    // is lost if a read before `f` (or any read, if it never shows) began after its
    // acknowledgement. `latest[i]`: the latest-invoked read among the first `i`.
    let mut latest: Vec<Option<&Operation>> = Vec::with_capacity(chain.len() + 1);
    latest.push(None);
    for &(read, _) in chain {
        let previous = *latest.last().expect("starts with one entry");
        latest.push(match previous {
            Some(p) if p.invoked >= read.invoked => Some(p),
            _ => Some(read),
        });
    }
    let mut lost: Vec<(&[u8], u64, &Operation)> = Vec::new();
    for (token, t) in tokens {
        if t.status != Status::Acknowledged {
            continue;
        }
        let first = match present.get(token) {
            Some(&index) if index != usize::MAX => index,
            Some(_) => continue, // duplicated: present from its first read on, reported
            None => chain.len(),
        };
        if let Some(read) = latest[first]
            && read.invoked > t.acknowledged_at
        {
            lost.push((token, t.invoked, read));
        }
    }
    lost.sort_by_key(|&(_, invoked, _)| invoked);
    for (token, _, read) in lost {
        violations.push(Violation::LostToken {
            key: key.to_owned(),
            read: read.clone(),
            token: token.to_vec(),
        });
    }
}

/// Reads of an append-only log must all be prefixes of one another, and a read must extend
/// every read that completed before it began. Sorted by length, the reads form a chain iff
/// each is a prefix of the next, and along a chain "extends" means "at least as long", so
/// both checks take O(n log n) comparisons instead of comparing every pair.
///
/// Returns the reads in chain order when they form a chain.
fn check_reads_agree<'a>(
    key: &str,
    reads: &[(&'a Operation, &'a [u8])],
    violations: &mut Vec<Violation>,
) -> Option<Vec<(&'a Operation, &'a [u8])>> {
    let mut by_length: Vec<&(&Operation, &[u8])> = reads.iter().collect();
    by_length.sort_by_key(|(read, value)| (value.len(), read.invoked));
    for pair in by_length.windows(2) {
        let (shorter, shorter_value) = *pair[0];
        let (longer, longer_value) = *pair[1];
        if !longer_value.starts_with(shorter_value) {
            violations.push(Violation::Diverged {
                key: key.to_owned(),
                earlier: shorter.clone(),
                later: longer.clone(),
            });
            // the other checks assume a chain
            return None;
        }
    }
    let mut by_completion: Vec<&(&Operation, &[u8])> = reads
        .iter()
        .filter(|(read, _)| read.completed.is_some())
        .collect();
    by_completion.sort_by_key(|(read, _)| read.completed);
    let mut by_invocation: Vec<&(&Operation, &[u8])> = reads.iter().collect();
    by_invocation.sort_by_key(|(read, _)| read.invoked);
    let mut done = by_completion.iter().peekable();
    let mut longest_done: Option<&(&Operation, &[u8])> = None;
    for later in by_invocation {
        while let Some(earlier) = done.next_if(|(read, _)| read.completed < Some(later.0.invoked)) {
            if longest_done.is_none_or(|(_, value)| earlier.1.len() > value.len()) {
                longest_done = Some(earlier);
            }
        }
        if let Some((earlier, earlier_value)) = longest_done
            && earlier_value.len() > later.1.len()
        {
            violations.push(Violation::Diverged {
                key: key.to_owned(),
                earlier: (*earlier).clone(),
                later: later.0.clone(),
            });
        }
    }
    Some(by_length.into_iter().copied().collect())
}

/// One token of a read, after the tokens before it in the same read: it must have been sent
/// by an append that did not fail, and it must not stand after a token whose append was
/// invoked only after this token's append was acknowledged (`latest_before` carries the
/// latest invocation among the earlier tokens and is updated with this one).
fn check_token_order<'a>(
    key: &str,
    read: &Operation,
    token: &'a [u8],
    tokens: &HashMap<&[u8], Token>,
    latest_before: &mut Option<(u64, &'a [u8])>,
    violations: &mut Vec<Violation>,
) {
    let Some(sent) = tokens.get(token).filter(|t| t.status != Status::Failed) else {
        violations.push(Violation::FailedTokenPresent {
            key: key.to_owned(),
            read: read.clone(),
            token: token.to_vec(),
        });
        return;
    };
    if let Some((invoked, second)) = *latest_before
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
        *latest_before = Some((sent.invoked, token));
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
        check_token_order(key, read, token, tokens, &mut latest_before, violations);
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
