//! Proof of ring membership on a peer connection, sans-IO: a mutual challenge–response
//! over fresh nonces with HMAC-SHA256 under the ring's secret.
//!
//! ```text
//! connecting cell (C)                         accepting cell (S)
//!   AuthInit      nc                    ──▶
//!                                       ◀──   AuthChallenge  ns · HMAC(k, ACCEPT · nc · ns)
//!   checks S's proof, then
//!   AuthResponse  HMAC(k, CONNECT · nc · ns) ──▶   checks C's proof
//!   Hello, then any frame               ──▶   nothing else is read before the check
//! ```
//!
//! Each side proves it holds the secret `k` over a nonce the *other* side drew at random
//! for this connection, so a recorded exchange proves nothing on a later one (no replay),
//! and the two proofs are labelled by direction (`ACCEPT`, `CONNECT`), so an accepting
//! cell's answer cannot be reflected back to it as a connecting cell's. Proofs are compared
//! in constant time. What this does not give is integrity of the frames after the
//! handshake: an attacker *on the path* can take over an authenticated connection; peer
//! TLS is the answer to that one (docs/security.md).

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Bytes of a nonce, drawn fresh by each side for each connection.
pub const NONCE_BYTES: usize = 32;
/// Bytes of a proof (an HMAC-SHA256 tag).
pub const PROOF_BYTES: usize = 32;
/// Bytes of a secret (256 bits of randomness).
pub const SECRET_BYTES: usize = 32;

/// Domain separation of the accepting side's proof.
const ACCEPT: &[u8] = b"cellcache peer accept v1";
/// Domain separation of the connecting side's proof.
const CONNECT: &[u8] = b"cellcache peer connect v1";

/// Why a secret or a handshake message was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error(
        "a cluster secret is {expected} hex digits (from `cellcache ctl secret new`), got {got} characters"
    )]
    SecretLength { expected: usize, got: usize },
    #[error("a cluster secret is hex digits only")]
    SecretNotHex,
    #[error("handshake message of {got} bytes, expected {expected}")]
    MessageLength { expected: usize, got: usize },
    #[error("the peer's proof does not match: it does not hold this ring's secret")]
    BadProof,
}

/// The ring's shared secret. Its `Debug` shows nothing of it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret([u8; SECRET_BYTES]);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(…)")
    }
}

impl Secret {
    /// A secret from its bytes (the caller draws them from a CSPRNG).
    pub fn from_bytes(bytes: [u8; SECRET_BYTES]) -> Secret {
        Secret(bytes)
    }

    /// Parses a secret file's text: hex digits, surrounding whitespace ignored.
    pub fn parse(text: &str) -> Result<Secret, AuthError> {
        let text = text.trim();
        if text.len() != 2 * SECRET_BYTES {
            return Err(AuthError::SecretLength {
                expected: 2 * SECRET_BYTES,
                got: text.len(),
            });
        }
        let mut bytes = [0u8; SECRET_BYTES];
        hex::decode_to_slice(text, &mut bytes).map_err(|_| AuthError::SecretNotHex)?;
        Ok(Secret(bytes))
    }

    /// The text of a secret file (hex, one line).
    pub fn to_text(&self) -> String {
        format!("{}\n", hex::encode(self.0))
    }

    fn mac(&self, label: &[u8], nc: &[u8; NONCE_BYTES], ns: &[u8; NONCE_BYTES]) -> Hmac<Sha256> {
        let mut mac =
            <Hmac<Sha256> as Mac>::new_from_slice(&self.0).expect("HMAC takes a key of any length");
        mac.update(label);
        mac.update(nc);
        mac.update(ns);
        mac
    }

    /// The accepting side's proof for nonces `nc` (connecting) and `ns` (accepting).
    pub fn accept_proof(
        &self,
        nc: &[u8; NONCE_BYTES],
        ns: &[u8; NONCE_BYTES],
    ) -> [u8; PROOF_BYTES] {
        self.mac(ACCEPT, nc, ns).finalize().into_bytes().into()
    }

    /// The connecting side's proof for the same nonces.
    pub fn connect_proof(
        &self,
        nc: &[u8; NONCE_BYTES],
        ns: &[u8; NONCE_BYTES],
    ) -> [u8; PROOF_BYTES] {
        self.mac(CONNECT, nc, ns).finalize().into_bytes().into()
    }

    /// Checks the accepting side's proof, in constant time.
    pub fn verify_accept(
        &self,
        nc: &[u8; NONCE_BYTES],
        ns: &[u8; NONCE_BYTES],
        proof: &[u8],
    ) -> Result<(), AuthError> {
        self.mac(ACCEPT, nc, ns)
            .verify_slice(proof)
            .map_err(|_| AuthError::BadProof)
    }

    /// Checks the connecting side's proof, in constant time.
    pub fn verify_connect(
        &self,
        nc: &[u8; NONCE_BYTES],
        ns: &[u8; NONCE_BYTES],
        proof: &[u8],
    ) -> Result<(), AuthError> {
        self.mac(CONNECT, nc, ns)
            .verify_slice(proof)
            .map_err(|_| AuthError::BadProof)
    }
}

/// `AuthInit`'s payload: the connecting side's nonce.
pub fn decode_init(payload: &[u8]) -> Result<[u8; NONCE_BYTES], AuthError> {
    payload.try_into().map_err(|_| AuthError::MessageLength {
        expected: NONCE_BYTES,
        got: payload.len(),
    })
}

/// `AuthChallenge`'s payload: the accepting side's nonce, then its proof.
pub fn encode_challenge(ns: &[u8; NONCE_BYTES], proof: &[u8; PROOF_BYTES]) -> Vec<u8> {
    let mut out = Vec::with_capacity(NONCE_BYTES + PROOF_BYTES);
    out.extend_from_slice(ns);
    out.extend_from_slice(proof);
    out
}

/// The parts of an `AuthChallenge` payload: (nonce, proof).
pub fn decode_challenge(payload: &[u8]) -> Result<([u8; NONCE_BYTES], &[u8]), AuthError> {
    if payload.len() != NONCE_BYTES + PROOF_BYTES {
        return Err(AuthError::MessageLength {
            expected: NONCE_BYTES + PROOF_BYTES,
            got: payload.len(),
        });
    }
    let (ns, proof) = payload.split_at(NONCE_BYTES);
    let ns: [u8; NONCE_BYTES] = ns.try_into().expect("split at NONCE_BYTES");
    Ok((ns, proof))
}

/// `AuthResponse`'s payload (the connecting side's proof), checked for length.
pub fn decode_response(payload: &[u8]) -> Result<&[u8], AuthError> {
    if payload.len() != PROOF_BYTES {
        return Err(AuthError::MessageLength {
            expected: PROOF_BYTES,
            got: payload.len(),
        });
    }
    Ok(payload)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn secret(b: u8) -> Secret {
        Secret::from_bytes([b; SECRET_BYTES])
    }

    #[test]
    fn a_full_handshake_between_holders_of_the_secret_succeeds() {
        let (client, server) = (secret(7), secret(7));
        let (nc, ns) = ([1u8; NONCE_BYTES], [2u8; NONCE_BYTES]);
        let challenge = encode_challenge(&ns, &server.accept_proof(&nc, &ns));
        let (ns2, proof) = decode_challenge(&challenge).expect("well-formed");
        assert_eq!(ns2, ns);
        client
            .verify_accept(&nc, &ns2, proof)
            .expect("the server holds the secret");
        let response = client.connect_proof(&nc, &ns2);
        server
            .verify_connect(&nc, &ns, decode_response(&response).expect("length"))
            .expect("the client holds the secret");
    }

    #[test]
    fn another_secret_proves_nothing() {
        let (nc, ns) = ([1u8; NONCE_BYTES], [2u8; NONCE_BYTES]);
        let forged = secret(8).connect_proof(&nc, &ns);
        assert_eq!(
            secret(7).verify_connect(&nc, &ns, &forged),
            Err(AuthError::BadProof)
        );
    }

    #[test]
    fn an_accepting_proof_reflected_back_is_not_a_connecting_one() {
        let k = secret(7);
        let (nc, ns) = ([1u8; NONCE_BYTES], [2u8; NONCE_BYTES]);
        let reflected = k.accept_proof(&nc, &ns);
        assert_eq!(
            k.verify_connect(&nc, &ns, &reflected),
            Err(AuthError::BadProof)
        );
    }

    #[test]
    fn secrets_parse_from_their_text_only() {
        let k = secret(0xab);
        assert_eq!(Secret::parse(&k.to_text()).expect("round trip"), k);
        assert_eq!(
            Secret::parse("abc"),
            Err(AuthError::SecretLength {
                expected: 64,
                got: 3
            })
        );
        assert_eq!(
            Secret::parse(&"zz".repeat(32)),
            Err(AuthError::SecretNotHex)
        );
        assert_eq!(format!("{k:?}"), "Secret(…)", "Debug leaks nothing");
    }

    #[test]
    fn handshake_messages_of_the_wrong_length_are_refused() {
        assert!(decode_init(&[0; NONCE_BYTES - 1]).is_err());
        assert!(decode_challenge(&[0; NONCE_BYTES + PROOF_BYTES + 1]).is_err());
        assert!(decode_response(&[]).is_err());
    }

    proptest! {
        /// A recorded proof is worth nothing once either nonce is fresh.
        #[test]
        fn a_proof_is_bound_to_both_nonces(
            nc in any::<[u8; NONCE_BYTES]>(),
            ns in any::<[u8; NONCE_BYTES]>(),
            other in any::<[u8; NONCE_BYTES]>(),
        ) {
            let k = secret(3);
            let proof = k.connect_proof(&nc, &ns);
            prop_assert!(k.verify_connect(&nc, &ns, &proof).is_ok());
            if other != ns {
                prop_assert!(k.verify_connect(&nc, &other, &proof).is_err());
            }
            if other != nc {
                prop_assert!(k.verify_connect(&other, &ns, &proof).is_err());
            }
        }
    }
}
