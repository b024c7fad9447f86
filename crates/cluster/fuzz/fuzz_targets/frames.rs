//! Fuzz target: the inter-cell wire. Decoding never panics; `consumed` is within the input;
//! every complete frame re-encodes to exactly the bytes it came from; every replication
//! record decoded re-encodes to exactly its bytes (the layout is canonical); the other
//! payload decoders (acks, sequence-gap refusals, hello, ring messages, maps, the
//! handshake's messages and a secret file's text) take any bytes without panicking; `frame_bytes` (how the handshake reads a
//! frame exactly) agrees with the decoder on every complete frame's length.
#![no_main]

use cellcache_cluster::auth::{self, Secret};
use cellcache_cluster::wire::payload::{RangeSeq, ReplicationRecord, SequenceGap, decode_hello};
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
    if let Some(gap) = SequenceGap::decode(p) {
        assert_eq!(SequenceGap::decode(&gap.encode()), Some(gap));
    }
    let _ = decode_hello(p);
    let _ = RingMessage::decode(p);
    let _ = ClusterMap::decode(p, PAYLOAD_MAX as usize);
    let _ = auth::decode_init(p);
    let _ = auth::decode_response(p);
    if let Ok((ns, proof)) = auth::decode_challenge(p) {
        let key = Secret::from_bytes([7; auth::SECRET_BYTES]);
        assert!(
            key.verify_accept(&[0; auth::NONCE_BYTES], &ns, proof)
                .is_err()
                || proof == key.accept_proof(&[0; auth::NONCE_BYTES], &ns)
        );
    }
    let _ = Secret::parse(&String::from_utf8_lossy(p));
}

fuzz_target!(|data: &[u8]| {
    let config = WireConfig {
        frame_payload_bytes_max: PAYLOAD_MAX,
    };
    let mut rest = data;
    while let Ok(Decoded::Complete { frame, consumed }) = wire::decode(&config, rest) {
        assert!(consumed > 0 && consumed <= rest.len());
        assert_eq!(wire::frame_bytes(&config, rest).ok(), Some(consumed));
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
