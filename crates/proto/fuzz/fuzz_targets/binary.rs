//! Fuzz target: the binary protocol's request parser (and the response parser on the
//! same bytes). Besides "never panics", it checks what the connection relies on:
//! `consumed` is within the input and non-zero, an error that closes the connection says
//! so and one that answers has a status, every complete frame re-encodes to the same
//! bytes, and a strict prefix of a complete frame is never anything but incomplete.
#![no_main]

use cellcache_proto::Limits;
use cellcache_proto::binary::{BinaryParsed, parse_request, parse_response};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Small limits reach every limit edge quickly; the first byte picks between them and
    // the defaults (the first byte is also the magic, so both kinds of stream are tried).
    let limits = if data.first().is_some_and(|b| b & 1 == 1) {
        Limits::default()
    } else {
        Limits {
            key_bytes_max: 32,
            line_bytes_max: 256,
            // Tiny items (at least the 59 bytes memcached counts for an item's header).
            item_size_max: 256,
            cas_enabled: true,
            keys_per_get_max: 4,
        }
    };
    let mut rest = data;
    for _ in 0..data.len() + 1 {
        match parse_request(rest, &limits) {
            BinaryParsed::Complete { frame, consumed } => {
                assert!(consumed > 0 && consumed <= rest.len());
                let mut encoded = Vec::new();
                frame.encode(&mut encoded);
                // Only the vbucket and data type bytes are not kept.
                let mut original = rest[..consumed].to_vec();
                original[5] = 0;
                original[6] = 0;
                original[7] = 0;
                assert_eq!(encoded, original, "{frame:?}");
                assert_eq!(
                    parse_request(&rest[..consumed - 1], &limits),
                    BinaryParsed::Incomplete
                );
                rest = &rest[consumed..];
            }
            BinaryParsed::Incomplete => break,
            BinaryParsed::Error(e) => {
                assert!(e.consumed > 0 && e.consumed <= rest.len());
                let mut reply = Vec::new();
                e.encode_reply(&mut reply);
                assert_eq!(reply.is_empty(), e.status.is_none());
                assert!(e.status.is_some() || e.close, "a silent error must close");
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
    let _ = parse_response(data, 1 << 16);
});
