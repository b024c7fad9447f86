//! Fuzz target: the server-side request parser. Besides "never panics", it
//! checks the contract the connection relies on: `consumed` is within the
//! input and non-zero, feeding the input in two pieces gives the same first
//! outcome once the frame is complete, and every complete request re-encodes
//! to bytes that parse back to the same request.
#![no_main]

use cellcache_proto::{Limits, Parsed, parse};
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
            value_bytes_max: 128,
            keys_per_get_max: 4,
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
            Parsed::Incomplete => break,
            Parsed::Error(e) => {
                assert!(e.consumed > 0 && e.consumed <= rest.len());
                if e.close {
                    break;
                }
                let mut discard = e.discard();
                rest = &rest[e.consumed..];
                let now = discard.take(rest.len());
                rest = &rest[now..];
            }
        }
    }
});
