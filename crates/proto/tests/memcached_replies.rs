//! The client parser against real server output: `tests/data/
//! memcached-1.6.18-replies.bin` is every reply byte memcached 1.6.18 sent
//! (on 127.0.0.1) to one pipelined session exercising every command: storage
//! and retrieval hits and misses, cas, incr/decr (including the padded
//! result), touch, version, verbosity, all stats groups, an unknown command,
//! a bad command line, and mg/ms/md/ma/me/mn with return flags, opaque,
//! stale/win (`X W`, `Z X`) and quiet replies. It must parse completely, in
//! any split, with no error.

use cellcache_proto::{Limits, MetaStatus, ParsedReply, Response, parse_reply};

const REPLIES: &[u8] = include_bytes!("data/memcached-1.6.18-replies.bin");

fn parse_all(bytes: &[u8]) -> Vec<Response<'_>> {
    let limits = Limits::default();
    let mut rest = bytes;
    let mut replies = Vec::new();
    while !rest.is_empty() {
        match parse_reply(rest, &limits) {
            ParsedReply::Complete { reply, consumed } => {
                replies.push(reply);
                rest = &rest[consumed..];
            }
            other => panic!(
                "after {} replies: {other:?} at {:?}",
                replies.len(),
                String::from_utf8_lossy(&rest[..rest.len().min(80)])
            ),
        }
    }
    replies
}

#[test]
fn every_memcached_reply_parses() {
    let replies = parse_all(REPLIES);
    assert_eq!(replies.len(), 273);
    let count = |f: &dyn Fn(&Response<'_>) -> bool| replies.iter().filter(|r| f(r)).count();
    assert!(count(&|r| matches!(r, Response::Stat { .. })) > 100);
    assert_eq!(count(&|r| matches!(r, Response::Error)), 1);
    assert_eq!(count(&|r| matches!(r, Response::ClientError(_))), 1);
    assert_eq!(count(&|r| matches!(r, Response::MetaDebug { .. })), 1);
    assert_eq!(count(&|r| matches!(r, Response::MetaNoop)), 2);
    assert_eq!(count(&|r| matches!(r, Response::Reset)), 1);
    // `md b I` then two `mg b v c`: the first wins (X W), the second sees Z X.
    let stale: Vec<_> = replies
        .iter()
        .filter_map(|r| match r {
            Response::Meta(m) if m.flags.stale => Some((m.flags.won, m.flags.win_sent)),
            _ => None,
        })
        .collect();
    assert_eq!(stale, vec![(true, false), (false, true)]);
    assert!(replies.iter().any(|r| matches!(
        r,
        Response::Meta(m) if m.status == MetaStatus::En && m.flags.opaque == Some(b"2")
    )));
}

#[test]
fn memcached_replies_parse_the_same_in_pieces() {
    let whole = parse_all(REPLIES).len();
    // Feed the stream in pieces of every size from 1 to 64 bytes, the way
    // a client reads it, and count complete replies.
    for piece in 1..=64 {
        let limits = Limits::default();
        let mut buffer: Vec<u8> = Vec::new();
        let mut complete = 0;
        for chunk in REPLIES.chunks(piece) {
            buffer.extend_from_slice(chunk);
            // Each pass consumes a reply or stops, so this bound is never hit.
            for _ in 0..=REPLIES.len() {
                match parse_reply(&buffer, &limits) {
                    ParsedReply::Complete { consumed, .. } => {
                        complete += 1;
                        buffer.drain(..consumed);
                    }
                    ParsedReply::Incomplete => break,
                    ParsedReply::Error(e) => panic!("piece size {piece}: {e}"),
                }
            }
        }
        assert!(buffer.is_empty());
        assert_eq!(complete, whole, "piece size {piece}");
    }
}
