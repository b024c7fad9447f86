//! Fuzz target: the server-side request parser. Besides "never panics", it
//! checks the contract the connection relies on: `consumed` is within the
//! input and non-zero, feeding the input in two pieces gives the same first
//! outcome once the frame is complete, and every complete request re-encodes
//! to bytes that parse back to the same request.
#![no_main]

use cellcache_proto::{Limits, Parsed, parse, parse_retrieve_rest};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Small limits reach every limit edge quickly; the first byte picks
    // between them and the defaults.
    let limits = if data.first().is_some_and(|b| b & 1 == 1) {
        Limits::default()
    } else {
        Limits {
            key_bytes_max: 32,
            line_bytes_max: 256,
            item_size_max: 128 + cellcache_proto::limits::ITEM_OVERHEAD_BYTES + 1,
            keys_per_get_max: 4,
            cas_enabled: true,
        }
    };
    let mut rest = data;
    // Parse the whole input as a pipelined stream.
    for _ in 0..data.len() + 1 {
        match parse(rest, &limits) {
            Parsed::Complete { request, consumed } => {
                assert!(consumed > 0 && consumed <= rest.len());
                let mut encoded = Vec::new();
                request.encode(&mut encoded);
                let generous = Limits {
                    line_bytes_max: limits.line_bytes_max * 4,
                    ..limits
                };
                match parse(&encoded, &generous) {
                    Parsed::Complete { request: again, consumed } => {
                        assert_eq!(again, request);
                        assert_eq!(consumed, encoded.len());
                    }
                    other => panic!("re-encoded {request:?} parsed to {other:?}"),
                }
                // A prefix of a complete frame is never an error.
                assert_eq!(parse(&rest[..consumed - 1], &limits), Parsed::Incomplete);
                rest = &rest[consumed..];
            }
            Parsed::Partial {
                consumed,
                rest: mut batch,
                ..
            } => {
                // A long retrieval line: follow its batches to the line end.
                assert!(consumed > 0 && consumed <= rest.len());
                rest = &rest[consumed..];
                loop {
                    match parse_retrieve_rest(rest, &batch, &limits) {
                        Parsed::Partial { consumed, rest: next, .. } => {
                            assert!(consumed > 0 && consumed <= rest.len());
                            rest = &rest[consumed..];
                            batch = next;
                        }
                        Parsed::Complete { consumed, .. } => {
                            assert!(consumed > 0 && consumed <= rest.len());
                            rest = &rest[consumed..];
                            break;
                        }
                        Parsed::Error(e) => {
                            assert!(e.consumed > 0 && e.consumed <= rest.len());
                            rest = &rest[e.consumed..];
                            if e.skip_line {
                                let eol = rest.iter().position(|&b| b == b'\n');
                                rest = &rest[eol.map_or(rest.len(), |i| i + 1)..];
                            }
                            break;
                        }
                        Parsed::Incomplete => return,
                    }
                }
            }
            Parsed::Incomplete => break,
            Parsed::Error(e) => {
                assert!(e.consumed > 0 && e.consumed <= rest.len());
                if e.close {
                    break;
                }
                let mut discard = e.discard();
                rest = &rest[e.consumed..];
                if e.skip_line {
                    let eol = rest.iter().position(|&b| b == b'\n');
                    rest = &rest[eol.map_or(rest.len(), |i| i + 1)..];
                }
                let now = discard.take(rest.len());
                rest = &rest[now..];
            }
        }
    }
});
