//! Fuzz target: the peer handshake's proofs and messages (`cellcache_cluster::auth`), the
//! first bytes a cell reads from anyone who reaches its peer port. The message decoders
//! take any bytes without panicking and accept exactly the lengths they document; a
//! challenge round-trips through its encoding; a proof checks only if it is the one the
//! secret computes for these nonces and this direction (an accepting proof is never a
//! connecting one, a proof for other nonces or another secret never checks); a secret
//! file's text parses only as 64 hex digits and round-trips through its text.
#![no_main]

use cellcache_cluster::auth::{self, NONCE_BYTES, PROOF_BYTES, SECRET_BYTES, Secret};
use libfuzzer_sys::fuzz_target;

/// `N` bytes from `data` at `at` (zero-padded past its end).
fn take<const N: usize>(data: &[u8], at: usize) -> [u8; N] {
    let mut out = [0u8; N];
    for (i, b) in out.iter_mut().enumerate() {
        *b = data.get(at + i).copied().unwrap_or(0);
    }
    out
}

fuzz_target!(|data: &[u8]| {
    // The three messages, from any bytes.
    match auth::decode_init(data) {
        Ok(nonce) => assert_eq!(&nonce[..], data),
        Err(_) => assert_ne!(data.len(), NONCE_BYTES),
    }
    match auth::decode_challenge(data) {
        Ok((ns, proof)) => {
            assert_eq!(data.len(), NONCE_BYTES + PROOF_BYTES);
            let proof: [u8; PROOF_BYTES] = proof.try_into().expect("a proof's length");
            assert_eq!(auth::encode_challenge(&ns, &proof), data);
        }
        Err(_) => assert_ne!(data.len(), NONCE_BYTES + PROOF_BYTES),
    }
    match auth::decode_response(data) {
        Ok(proof) => assert_eq!(proof, data),
        Err(_) => assert_ne!(data.len(), PROOF_BYTES),
    }
    // Proofs: a secret, both nonces and a candidate proof drawn from the input.
    let key = Secret::from_bytes(take::<SECRET_BYTES>(data, 0));
    let nc = take::<NONCE_BYTES>(data, SECRET_BYTES);
    let ns = take::<NONCE_BYTES>(data, SECRET_BYTES + NONCE_BYTES);
    let candidate = data
        .get(SECRET_BYTES + 2 * NONCE_BYTES..)
        .unwrap_or_default();
    let accept = key.accept_proof(&nc, &ns);
    let connect = key.connect_proof(&nc, &ns);
    key.verify_accept(&nc, &ns, &accept).expect("its own accepting proof");
    key.verify_connect(&nc, &ns, &connect).expect("its own connecting proof");
    assert!(key.verify_connect(&nc, &ns, &accept).is_err(), "reflected");
    assert!(key.verify_accept(&nc, &ns, &connect).is_err(), "reflected");
    assert_eq!(
        key.verify_accept(&nc, &ns, candidate).is_ok(),
        candidate == accept
    );
    assert_eq!(
        key.verify_connect(&nc, &ns, candidate).is_ok(),
        candidate == connect
    );
    let mut other_nonce = ns;
    other_nonce[0] ^= 1;
    assert!(key.verify_connect(&nc, &other_nonce, &connect).is_err());
    let mut other_key = take::<SECRET_BYTES>(data, 0);
    other_key[SECRET_BYTES - 1] ^= 1;
    let other = Secret::from_bytes(other_key);
    assert!(other.verify_connect(&nc, &ns, &connect).is_err());
    // A secret file's text.
    let text = String::from_utf8_lossy(data);
    if let Ok(secret) = Secret::parse(&text) {
        assert_eq!(text.trim().len(), 2 * SECRET_BYTES);
        assert!(text.trim().bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(Secret::parse(&secret.to_text()).ok(), Some(secret));
    }
});
