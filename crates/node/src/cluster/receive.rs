//! The replication receiver: which `Replicate`, `SnapshotChunk` and `SnapshotDone` frames of
//! an identified sender this cell applies, and how it answers.
//!
//! A frame is refused while it comes from a newer map than this cell's (the sender retries
//! once this cell caught up), or from an older one once this cell serves any of its keys as
//! master (fencing: the sender was deposed). Otherwise it must continue the sender's lane:
//! its records' positions consecutive and the first at most one past what was applied
//! ([`check_sequence`]); a frame that jumps is refused with the position expected
//! ([`SequenceGap`], `cluster_replicate_gaps`) and nothing of it is applied, so a forged
//! frame numbered far ahead cannot make the lane skip the master's later records as
//! resends. Then each record is applied only for a key this cell holds a copy of **and**
//! the sender masters — in the installed map or, for a frame stamped with an older epoch,
//! in the maps installed around it ([`cellcache_cluster::Ring::master_ranges`]); a division
//! parent masters the range it streams to its child. Records of other keys are dropped
//! (`cluster_replicate_unentitled`), and a replicated flush reaches only the part of its
//! range the sender masters.

use std::cell::Cell as Counter;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use cellcache_cluster::wire::FrameKind;
use cellcache_cluster::wire::payload::{RangeSeq, SequenceGap};
use cellcache_cluster::{CellId, HashRange, Migration};

use super::Cluster;
use super::link::OwnedFrame;
use super::repl::{SequenceError, apply_records, check_sequence};

/// A replication receiver's watermarks for one sending master: live records (`Replicate`)
/// and snapshot items (`SnapshotChunk`, `SnapshotDone`) arrive in two lanes, each in order
/// but interleaved with the other (see `repl`), so each has its own: the last position
/// applied, the next one accepted being one more.
///
/// `connection` numbers the sender's replication-carrying connections to this cell (its bulk
/// link's; a connection gets its number with its first replication frame accepted). The
/// lanes' order holds only within one connection: a sender opens a new one after giving the
/// old one up (its link dropped it), and frames still buffered on the old one may be read
/// after the new one's — an old snapshot copy of a key could then overwrite a newer live
/// write. So records are applied only from the sender's latest such connection (checked
/// under the same lock as the apply); the sender resends what the old one did not get
/// acknowledged.
#[derive(Default)]
pub struct Applied {
    pub live: u64,
    pub snapshot: u64,
    pub connection: u64,
    /// Values arriving in parts from this sender.
    pub parts: super::repl::Assembly,
}

/// What the listener does with a replication frame.
pub(super) enum Answer {
    /// Send this frame back (an acknowledgement or a refusal).
    Reply(FrameKind, Vec<u8>),
    /// Nothing (an undecodable payload: the sender's timeout resends it).
    Silent,
    /// Close the connection: its replication was superseded by a newer connection of the
    /// same sender (see [`Applied`]).
    Close,
}

/// What decides a frame's fate, copied out of the ring before `Cluster::applied` is taken
/// (lock order: the ring's is a leaf lock).
struct Rules {
    /// Whether this cell holds a copy of a hash (as master or backup, or as the division
    /// child of the sender, which keeps all it is sent until it is Active).
    holds: Box<dyn Fn(u64) -> bool>,
    /// This cell masters the hash itself: a replicated flush never reaches it.
    mine: Box<dyn Fn(u64) -> bool>,
    /// The ranges the sender masters for this frame's epoch.
    sender: Vec<HashRange>,
}

impl Rules {
    fn entitled(&self, hash: u64) -> bool {
        self.sender.iter().any(|r| r.contains(hash))
    }

    /// The parts of a flush of `range` the sender may ask for: what it masters of it.
    fn flushable_parts(&self, range: HashRange) -> Vec<HashRange> {
        let mut parts: Vec<HashRange> = Vec::new();
        for r in &self.sender {
            for p in range.intersect(r) {
                if !parts.iter().any(|q| q.covers(&p)) {
                    parts.retain(|q| !p.covers(q));
                    parts.push(p);
                }
            }
        }
        parts
    }
}

/// Handles one replication frame of `from` on a connection whose number (see [`Applied`])
/// is `number` (0 until one of its replication frames was accepted).
pub(super) fn frame(cl: &Arc<Cluster>, from: &CellId, number: &mut u64, f: OwnedFrame) -> Answer {
    // The frame's epoch is the map its records were produced under.
    if f.epoch > cl.epoch() {
        // Decide under the sender's map: catch up with it; the sender retries.
        cl.catch_up();
        return Answer::Reply(FrameKind::Refused, b"fetching the newer map".to_vec());
    }
    let Some(rules) = rules(cl, from, &f) else {
        cl.stats.replicate_refused.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(peer = %from, epoch = f.epoch, mine = cl.epoch(), "replication under an older map for keys this cell serves now: refused");
        return Answer::Reply(FrameKind::Refused, b"stale epoch".to_vec());
    };
    let mut applied = cl.applied.lock();
    let lanes = applied.entry(from.clone()).or_default();
    if *number != 0 && lanes.connection != *number {
        tracing::debug!(peer = %from, "replication on a superseded connection: closing it");
        return Answer::Close;
    }
    let Applied {
        live,
        snapshot,
        parts,
        connection,
    } = lanes;
    let lane = if f.kind == FrameKind::Replicate {
        live
    } else {
        snapshot
    };
    let checked = if f.kind == FrameKind::SnapshotDone {
        RangeSeq::decode(&f.payload)
            .map_err(SequenceError::from)
            .and_then(|d| check_done(&d, *lane).map(|()| d))
            .map(Some)
    } else {
        check_sequence(&f.payload, *lane).map(|()| None)
    };
    let done = match checked {
        Ok(done) => done,
        Err(SequenceError::Gap { expected, got }) => {
            cl.stats.replicate_gaps.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(peer = %from, expected, got, "replication frame out of sequence: refused");
            return Answer::Reply(FrameKind::Refused, SequenceGap { expected }.encode());
        }
        Err(SequenceError::Wire(e)) => {
            tracing::warn!(peer = %from, error = %e, "bad replication payload");
            return Answer::Silent;
        }
    };
    if *number == 0 {
        *connection += 1;
        *number = *connection;
    }
    let unentitled = Counter::new(0u64);
    let range = match done {
        Some(d) => {
            if d.seq > *lane {
                *lane = d.seq;
                if rules.sender.iter().any(|r| r.covers(&d.range)) {
                    let (cl2, from, epoch) = (cl.clone(), from.clone(), f.epoch);
                    cl.handle
                        .spawn(async move { cl2.resync_received(&from, d.range, epoch).await });
                } else {
                    unentitled.set(1);
                }
            }
            d.range
        }
        None => {
            let keep = |h| {
                let entitled = rules.entitled(h);
                if !entitled {
                    unentitled.set(unentitled.get() + 1);
                }
                entitled && (rules.holds)(h)
            };
            let flush = |range: HashRange, at| {
                let parts = rules.flushable_parts(range);
                if !parts.iter().any(|p| p.covers(&range)) {
                    unentitled.set(unentitled.get() + 1);
                }
                let flushable = |h| (rules.holds)(h) && !(rules.mine)(h);
                for part in parts {
                    cl.flush_received(part, at, &flushable);
                }
            };
            let bytes_max = cl.config.replication_backlog_bytes_max;
            let now = cl.cell.now();
            match apply_records(
                &cl.cell.store,
                &f.payload,
                lane,
                parts,
                bytes_max,
                now,
                keep,
                flush,
            ) {
                Ok(rebuilt) => {
                    cl.stats
                        .values_rebuilt
                        .fetch_add(rebuilt, Ordering::Relaxed);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "bad replication payload");
                    return Answer::Silent;
                }
            }
            HashRange::FULL
        }
    };
    if unentitled.get() > 0 {
        cl.stats
            .replicate_unentitled
            .fetch_add(unentitled.get(), Ordering::Relaxed);
        tracing::warn!(peer = %from, records = unentitled.get(), "replicated records for keys the sender does not master: dropped");
    }
    let mut ack = Vec::new();
    RangeSeq { range, seq: *lane }.encode(&mut ack);
    drop(applied);
    Answer::Reply(FrameKind::ReplicateAck, ack)
}

/// A `SnapshotDone` marker takes one position of the snapshot lane, like a record.
fn check_done(d: &RangeSeq, applied: u64) -> Result<(), SequenceError> {
    let expected = applied.saturating_add(1);
    if d.seq > expected {
        return Err(SequenceError::Gap {
            expected,
            got: d.seq,
        });
    }
    Ok(())
}

/// The rules for `f` from `from`, or `None` when it must be refused as stale: records of an
/// older map once this cell serves any of their keys as master (the sender was deposed; its
/// write must not be acknowledged, nor clobber newer writes). Before that, they are the tail
/// of a master whose lease this cell's serving waits for, and are kept.
fn rules(cl: &Arc<Cluster>, from: &CellId, f: &OwnedFrame) -> Option<Rules> {
    let stale_candidate = f.kind != FrameKind::SnapshotDone;
    let hashes = if stale_candidate {
        record_hashes(&f.payload)
    } else {
        Vec::new()
    };
    let ring = cl.lock_ring();
    let map = ring.map().clone();
    let now = cl.now_ms();
    let serving = f.epoch < map.epoch()
        && hashes
            .iter()
            .any(|h| h.is_some_and(|h| ring.can_serve(h, now)));
    if serving {
        return None;
    }
    let sender = ring.master_ranges(from, f.epoch);
    drop(ring);
    let me = cl.me.clone();
    let child_of_sender = map.migrations().iter().any(|m| {
        matches!(m, Migration::Division { parent, child, .. } if *child == me && parent == from)
    });
    // A shift's target holds the part its giver streams to it before the flip.
    let incoming: Vec<HashRange> = map
        .migrations()
        .iter()
        .filter_map(|m| match m {
            Migration::Shift {
                from: giver,
                targets,
                range,
                ..
            } if giver == from && targets.contains(&me) => Some(*range),
            _ => None,
        })
        .collect();
    let map = Rc::new(map);
    let (owner_map, owner_me) = (map.clone(), me.clone());
    Some(Rules {
        holds: Box::new(move |h| {
            child_of_sender || incoming.iter().any(|r| r.contains(h)) || map.holds_copy(&me, h)
        }),
        mine: Box::new(move |h| owner_map.owner(h).id == owner_me),
        sender,
    })
}

/// Key hashes of a replication payload's records (`None` for a flush).
fn record_hashes(payload: &[u8]) -> Vec<Option<u64>> {
    use cellcache_cluster::wire::payload::ReplicationRecord;
    ReplicationRecord::decode_all(payload)
        .filter_map(Result::ok)
        .map(|r| r.op.key().map(cellcache_store::key_hash))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const HALF: u64 = u64::MAX / 2;

    fn rules(sender: Vec<HashRange>) -> Rules {
        Rules {
            holds: Box::new(|_| true),
            mine: Box::new(|_| false),
            sender,
        }
    }

    #[test]
    fn a_sender_is_entitled_to_the_hashes_it_masters_only() {
        let r = rules(vec![HashRange::new(0, HALF)]);
        assert!(r.entitled(0) && r.entitled(HALF));
        assert!(!r.entitled(HALF + 1));
        assert!(!rules(Vec::new()).entitled(0), "a cell mastering nothing");
    }

    #[test]
    fn a_flush_reaches_only_what_its_sender_masters() {
        let r = rules(vec![HashRange::new(0, HALF)]);
        assert_eq!(
            r.flushable_parts(HashRange::FULL),
            vec![HashRange::new(0, HALF)]
        );
        assert!(
            r.flushable_parts(HashRange::new(HALF + 1, u64::MAX))
                .is_empty()
        );
        // Its range in two maps (before and after a division): each hash once.
        let both = rules(vec![HashRange::new(0, HALF / 2), HashRange::new(0, HALF)]);
        assert_eq!(
            both.flushable_parts(HashRange::FULL),
            vec![HashRange::new(0, HALF)]
        );
    }

    #[test]
    fn a_snapshot_marker_takes_the_next_position_or_is_a_resend() {
        let at = |seq| RangeSeq {
            range: HashRange::FULL,
            seq,
        };
        assert!(check_done(&at(5), 4).is_ok());
        assert!(check_done(&at(3), 4).is_ok(), "a resend");
        assert!(matches!(
            check_done(&at(1 << 62), 4),
            Err(SequenceError::Gap { expected: 5, .. })
        ));
    }
}
