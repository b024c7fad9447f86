//! Fuzz target: the client-side reply parser and the whole-reply decoder
//! above it. Never panics, `consumed` is within the input, every complete
//! reply re-encodes to bytes that parse back to the same reply, and a decoded
//! retrieval holds as many values as it counts.
#![no_main]

use cellcache_proto::{Decoded, Expect, Limits, ParsedReply, Reply, decode_reply, parse_reply};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let limits = Limits {
        key_bytes_max: 32,
        line_bytes_max: 256,
        item_size_max: 128 + cellcache_proto::limits::ITEM_OVERHEAD_BYTES + 1,
        keys_per_get_max: 4,
        cas_enabled: true,
    };
    for expect in [Expect::Values, Expect::Stats, Expect::Line] {
        if let Ok(Decoded::Complete { reply, consumed }) = decode_reply(data, expect, &limits) {
            assert!(consumed > 0 && consumed <= data.len());
            match reply {
                Reply::Values(values) => assert_eq!(values.iter().count(), values.count()),
                Reply::Stats(stats) => {
                    let _ = stats.iter().count();
                }
                Reply::Line(_) => {}
            }
        }
    }
    let mut rest = data;
    for _ in 0..data.len() + 1 {
        match parse_reply(rest, &limits) {
            ParsedReply::Complete { reply, consumed } => {
                assert!(consumed > 0 && consumed <= rest.len());
                let mut encoded = Vec::new();
                reply.encode(&mut encoded);
                let generous = Limits {
                    line_bytes_max: 4096,
                    ..limits
                };
                match parse_reply(&encoded, &generous) {
                    ParsedReply::Complete {
                        reply: again,
                        consumed,
                    } => {
                        assert_eq!(again, reply);
                        assert_eq!(consumed, encoded.len());
                    }
                    other => panic!("re-encoded {reply:?} parsed to {other:?}"),
                }
                rest = &rest[consumed..];
            }
            ParsedReply::Incomplete | ParsedReply::Error(_) => break,
        }
    }
});
