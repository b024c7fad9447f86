//! Fuzz target: the inter-cell wire. Decoding never panics; `consumed` is within the input;
//! every complete frame re-encodes to exactly the bytes it came from; every replication
//! record decoded re-encodes to exactly its bytes (the layout is canonical); the other
//! payload decoders (acks, hello, ring messages, maps) take any bytes without panicking.
#![no_main]

use cellcache_cluster::wire::payload::{RangeSeq, ReplicationRecord, decode_hello};
use cellcache_cluster::wire::{self, Decoded, WireConfig};
use cellcache_cluster::{ClusterMap, RingMessage};
use libfuzzer_sys::fuzz_target;

/// Small bounds so the fuzzer reaches the "too large" paths.
const PAYLOAD_MAX: u32 = 4096;

fn payloads(p: &[u8]) {
    let mut at = 0;
    while at < p.len() {
        let Ok((rec, used)) = ReplicationRecord::decode(&p[at..]) else {
            break;
        };
        assert!(used > 0 && at + used <= p.len());
        let mut again = Vec::new();
        rec.encode(&mut again).expect("a decoded record encodes");
        assert_eq!(again, &p[at..at + used]);
        at += used;
    }
    for r in ReplicationRecord::decode_all(p) {
        let _ = r;
    }
    let _ = RangeSeq::decode(p);
    let _ = decode_hello(p);
    let _ = RingMessage::decode(p);
    let _ = ClusterMap::decode(p, PAYLOAD_MAX as usize);
}

fuzz_target!(|data: &[u8]| {
    let config = WireConfig {
        frame_payload_bytes_max: PAYLOAD_MAX,
    };
    let mut rest = data;
    while let Ok(Decoded::Complete { frame, consumed }) = wire::decode(&config, rest) {
        assert!(consumed > 0 && consumed <= rest.len());
        let mut again = Vec::new();
        wire::encode(
            &config,
            frame.kind,
            frame.epoch,
            frame.request_id,
            frame.payload,
            &mut again,
        )
        .expect("a decoded frame encodes");
        assert_eq!(again, &rest[..consumed]);
        payloads(frame.payload);
        rest = &rest[consumed..];
    }
    // Frames with a valid checksum are rare in random input: the payload decoders get the
    // raw bytes as well.
    payloads(data);
});
