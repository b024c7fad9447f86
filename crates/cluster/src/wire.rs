//! The inter-cell frame codec, sans-IO.
//!
//! Cells talk over persistent, pipelined TCP connections carrying frames. This module maps
//! bytes to frames and back and nothing else: the node crate owns sockets and buffers.
//!
//! ```text
//! offset  size  field        (all integers little-endian)
//!      0     2  magic        0xCE11
//!      2     1  version      WIRE_VERSION
//!      3     1  kind         FrameKind
//!      4     8  epoch        map epoch of the sender (fencing: receivers refuse older epochs)
//!     12     8  request_id   pairs replies with requests on a pipelined connection
//!     20     4  payload_len  bounded by WireConfig::frame_payload_bytes_max
//!     24     n  payload
//!   24+n     4  crc32        crc32 (IEEE) of bytes [0, 24+n)
//! ```
//!
//! Guarantees: [`decode`] never panics and never reads past its input; an incomplete frame is
//! the normal [`Decoded::Incomplete`] outcome, never an error; a frame whose length exceeds the
//! configured maximum is refused from its header alone, before its payload arrives (bounded
//! memory); any corruption of a complete frame covered by the checksum is reported as an error.
//! Payload layouts live in [`payload`].

pub mod payload;

use serde::{Deserialize, Serialize};

/// First two bytes of every frame.
pub const MAGIC: u16 = 0xCE11;
/// Version of this layout; a receiver refuses any other.
pub const WIRE_VERSION: u8 = 2;
/// Bytes before the payload.
pub const HEADER_BYTES: usize = 24;
/// Bytes after the payload.
pub const TRAILER_BYTES: usize = 4;
/// Default payload bound: one maximal item (1 MiB value) plus key and metadata, with room.
pub const FRAME_PAYLOAD_BYTES_MAX_DEFAULT: u32 = 2 * 1024 * 1024;

/// Codec limits, embeddable in the node's TOML config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct WireConfig {
    /// Largest payload accepted or produced, in bytes.
    pub frame_payload_bytes_max: u32,
}

impl Default for WireConfig {
    fn default() -> Self {
        WireConfig {
            frame_payload_bytes_max: FRAME_PAYLOAD_BYTES_MAX_DEFAULT,
        }
    }
}

/// What a frame carries; the payload layout depends on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FrameKind {
    /// First frame on a connection: the sender's cell id (text) so fenced cells can be refused.
    Hello = 1,
    /// A client request forwarded to the key's master: memcached command bytes.
    ForwardRequest = 2,
    /// The master's reply to a forwarded request: memcached reply bytes.
    ForwardReply = 3,
    /// Master → backup: replication records ([`payload::ReplicationRecord`]).
    Replicate = 4,
    /// Backup → master: highest applied sequence ([`payload::RangeSeq`]).
    ReplicateAck = 5,
    /// Ring control traffic: an encoded `ring::RingMessage` (heartbeat, lease release).
    Heartbeat = 6,
    /// Reply to a heartbeat: an encoded `ring::RingMessage::HeartbeatAck` (lease grant).
    HeartbeatAck = 7,
    /// A committed cluster map (JSON, see `ClusterMap::encode`).
    MapUpdate = 8,
    /// Ask the peer for its map (sent on seeing a newer epoch).
    MapRequest = 9,
    /// Range hand-off: a batch of replication records of a snapshot.
    SnapshotChunk = 10,
    /// End of a snapshot stream: the sequence number at which live replication continues.
    SnapshotDone = 11,
    /// The receiver refused the request: stale epoch, fenced sender, not the owner. The frame's
    /// epoch is the refuser's map epoch; the payload is a UTF-8 reason for logs. It echoes the
    /// refused request's `request_id`.
    Refused = 12,
    /// Consensus-group traffic (opaque to this codec).
    Consensus = 13,
    /// First frame of a connection to a ring with a secret: the connecting cell's nonce
    /// ([`crate::auth`]).
    AuthInit = 14,
    /// The accepting cell's nonce and its proof of the secret over both nonces.
    AuthChallenge = 15,
    /// The connecting cell's proof of the secret; nothing else is read before it checks.
    AuthResponse = 16,
    /// An operator's ring command (a `cluster …` text line: join, leave) and, with the same
    /// request id, its text reply; only on a connection that proved the ring's secret.
    Control = 17,
}

impl FrameKind {
    /// The kind for a wire byte, if known.
    pub fn from_u8(byte: u8) -> Option<FrameKind> {
        use FrameKind::*;
        Some(match byte {
            1 => Hello,
            2 => ForwardRequest,
            3 => ForwardReply,
            4 => Replicate,
            5 => ReplicateAck,
            6 => Heartbeat,
            7 => HeartbeatAck,
            8 => MapUpdate,
            9 => MapRequest,
            10 => SnapshotChunk,
            11 => SnapshotDone,
            12 => Refused,
            13 => Consensus,
            14 => AuthInit,
            15 => AuthChallenge,
            16 => AuthResponse,
            17 => Control,
            _ => return None,
        })
    }
}

/// A decoded frame borrowing its payload from the input buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame<'a> {
    /// What it carries.
    pub kind: FrameKind,
    /// Sender's map epoch.
    pub epoch: u64,
    /// Request/reply pairing on a pipelined connection.
    pub request_id: u64,
    /// Kind-specific bytes.
    pub payload: &'a [u8],
}

/// Outcome of [`decode`] on well-formed (so far) input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decoded<'a> {
    /// More bytes are needed; nothing was consumed.
    Incomplete,
    /// A frame, and how many input bytes it used.
    Complete { frame: Frame<'a>, consumed: usize },
}

/// A malformed or refused frame. The connection carrying it cannot be resynchronized and must
/// be closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Not a cellcache frame.
    #[error("bad magic {0:#06x}")]
    BadMagic(u16),
    /// A layout version this build does not speak.
    #[error("unsupported wire version {0}")]
    UnsupportedVersion(u8),
    /// Unknown frame kind.
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    /// The declared payload exceeds the configured maximum.
    #[error("payload of {len} bytes exceeds the {max} allowed")]
    TooLarge { len: u64, max: u32 },
    /// The checksum does not match: corrupted in transit.
    #[error("checksum mismatch: frame says {expected:#010x}, bytes give {actual:#010x}")]
    Checksum { expected: u32, actual: u32 },
    /// A payload does not follow its kind's layout.
    #[error("malformed payload: {0}")]
    Payload(&'static str),
    /// Fewer bytes than a header were given where a whole header is needed.
    #[error("a frame header is {HEADER_BYTES} bytes, got {0}")]
    ShortHeader(usize),
}

fn u16_at(buf: &[u8], at: usize) -> u16 {
    let mut b = [0u8; 2];
    b.copy_from_slice(&buf[at..at + 2]);
    u16::from_le_bytes(b)
}

fn u32_at(buf: &[u8], at: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&buf[at..at + 4]);
    u32::from_le_bytes(b)
}

fn u64_at(buf: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&buf[at..at + 8]);
    u64::from_le_bytes(b)
}

/// Appends one frame to `out`. Refuses payloads above the configured maximum.
pub fn encode(
    config: &WireConfig,
    kind: FrameKind,
    epoch: u64,
    request_id: u64,
    payload: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), WireError> {
    let len = payload.len() as u64;
    if len > u64::from(config.frame_payload_bytes_max) {
        return Err(WireError::TooLarge {
            len,
            max: config.frame_payload_bytes_max,
        });
    }
    let start = out.len();
    out.reserve(HEADER_BYTES + payload.len() + TRAILER_BYTES);
    out.extend_from_slice(&MAGIC.to_le_bytes());
    out.push(WIRE_VERSION);
    out.push(kind as u8);
    out.extend_from_slice(&epoch.to_le_bytes());
    out.extend_from_slice(&request_id.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(payload);
    let crc = crc32fast::hash(&out[start..]);
    out.extend_from_slice(&crc.to_le_bytes());
    Ok(())
}

/// Decodes the first frame of `buf`; see the module docs for the guarantees.
pub fn decode<'a>(config: &WireConfig, buf: &'a [u8]) -> Result<Decoded<'a>, WireError> {
    // Reject garbage as early as the bytes allow, so a confused peer is cut off at once.
    if buf.len() >= 2 && u16_at(buf, 0) != MAGIC {
        return Err(WireError::BadMagic(u16_at(buf, 0)));
    }
    if buf.len() >= 3 && buf[2] != WIRE_VERSION {
        return Err(WireError::UnsupportedVersion(buf[2]));
    }
    if buf.len() < HEADER_BYTES {
        return Ok(Decoded::Incomplete);
    }
    let total = frame_bytes(config, buf)?;
    let body_end = total - TRAILER_BYTES;
    if buf.len() < total {
        return Ok(Decoded::Incomplete);
    }
    let expected = u32_at(buf, body_end);
    let actual = crc32fast::hash(&buf[..body_end]);
    if expected != actual {
        return Err(WireError::Checksum { expected, actual });
    }
    let kind = FrameKind::from_u8(buf[3]).ok_or(WireError::UnknownKind(buf[3]))?;
    let frame = Frame {
        kind,
        epoch: u64_at(buf, 4),
        request_id: u64_at(buf, 12),
        payload: &buf[HEADER_BYTES..body_end],
    };
    Ok(Decoded::Complete {
        frame,
        consumed: total,
    })
}

/// The whole length of the frame whose header starts `header` (at least [`HEADER_BYTES`]
/// bytes), after checking the header's magic, version and length bound: for a reader that
/// must take exactly one frame off a stream and not a byte more (the peer handshake).
pub fn frame_bytes(config: &WireConfig, header: &[u8]) -> Result<usize, WireError> {
    if header.len() < HEADER_BYTES {
        return Err(WireError::ShortHeader(header.len()));
    }
    if u16_at(header, 0) != MAGIC {
        return Err(WireError::BadMagic(u16_at(header, 0)));
    }
    if header[2] != WIRE_VERSION {
        return Err(WireError::UnsupportedVersion(header[2]));
    }
    let len = u32_at(header, 20);
    if len > config.frame_payload_bytes_max {
        return Err(WireError::TooLarge {
            len: u64::from(len),
            max: config.frame_payload_bytes_max,
        });
    }
    Ok(HEADER_BYTES + len as usize + TRAILER_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const KINDS: [FrameKind; 13] = [
        FrameKind::Hello,
        FrameKind::ForwardRequest,
        FrameKind::ForwardReply,
        FrameKind::Replicate,
        FrameKind::ReplicateAck,
        FrameKind::Heartbeat,
        FrameKind::HeartbeatAck,
        FrameKind::MapUpdate,
        FrameKind::MapRequest,
        FrameKind::SnapshotChunk,
        FrameKind::SnapshotDone,
        FrameKind::Refused,
        FrameKind::Consensus,
    ];

    fn small() -> WireConfig {
        WireConfig {
            frame_payload_bytes_max: 4096,
        }
    }

    #[test]
    fn golden_bytes() {
        // Pins the layout: a change here breaks every deployed peer. Version 2: replication
        // records carry the stale bit and large values travel as `SetPart`s.
        let mut out = Vec::new();
        encode(
            &small(),
            FrameKind::ForwardRequest,
            7,
            9,
            b"get a\r\n",
            &mut out,
        )
        .unwrap();
        let mut expected = vec![
            0x11, 0xCE, 2, 2, 7, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0,
        ];
        expected.extend_from_slice(b"get a\r\n");
        expected.extend_from_slice(&crc32fast::hash(&expected).to_le_bytes());
        assert_eq!(out, expected);
    }

    #[test]
    fn limits_and_garbage() {
        let cfg = small();
        let mut out = Vec::new();
        assert!(matches!(
            encode(&cfg, FrameKind::Replicate, 1, 1, &[0; 4097], &mut out),
            Err(WireError::TooLarge { .. })
        ));
        // A header announcing a huge payload is refused before the payload arrives.
        encode(
            &WireConfig::default(),
            FrameKind::Replicate,
            1,
            1,
            &[0; 5000],
            &mut out,
        )
        .unwrap();
        assert!(matches!(
            decode(&cfg, &out[..HEADER_BYTES]),
            Err(WireError::TooLarge { .. })
        ));
        assert_eq!(
            decode(&cfg, b"GE"),
            Err(WireError::BadMagic(u16::from_le_bytes(*b"GE")))
        );
        assert_eq!(
            decode(&cfg, &[0x11, 0xCE, 9]),
            Err(WireError::UnsupportedVersion(9))
        );
        assert_eq!(decode(&cfg, &[]), Ok(Decoded::Incomplete));
        let mut unknown = Vec::new();
        encode(&cfg, FrameKind::Hello, 1, 1, b"", &mut unknown).unwrap();
        unknown[3] = 200;
        let crc = crc32fast::hash(&unknown[..HEADER_BYTES]);
        unknown[HEADER_BYTES..].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(decode(&cfg, &unknown), Err(WireError::UnknownKind(200)));
    }

    fn arb_frame() -> impl Strategy<Value = (FrameKind, u64, u64, Vec<u8>)> {
        (
            0..KINDS.len(),
            any::<u64>(),
            any::<u64>(),
            proptest::collection::vec(any::<u8>(), 0..300),
        )
            .prop_map(|(k, e, r, p)| (KINDS[k], e, r, p))
    }

    proptest! {
        #[test]
        fn round_trip_with_arbitrary_splits(
            frames in proptest::collection::vec(arb_frame(), 1..6),
            chunk in 1usize..64,
        ) {
            let cfg = small();
            let mut stream = Vec::new();
            for (k, e, r, p) in &frames {
                encode(&cfg, *k, *e, *r, p, &mut stream).unwrap();
            }
            // Feed the stream in `chunk`-sized pieces, as a socket would deliver it.
            let mut buf: Vec<u8> = Vec::new();
            let mut got = Vec::new();
            for piece in stream.chunks(chunk) {
                buf.extend_from_slice(piece);
                while let Decoded::Complete { frame, consumed } = decode(&cfg, &buf).unwrap() {
                    got.push((frame.kind, frame.epoch, frame.request_id, frame.payload.to_vec()));
                    buf.drain(..consumed);
                }
            }
            prop_assert!(buf.is_empty());
            prop_assert_eq!(got, frames);
        }

        #[test]
        fn corruption_is_detected((k, e, r, p) in arb_frame(), at in any::<prop::sample::Index>(), bit in 0u8..8) {
            let cfg = small();
            let mut bytes = Vec::new();
            encode(&cfg, k, e, r, &p, &mut bytes).unwrap();
            let i = at.index(bytes.len());
            bytes[i] ^= 1 << bit;
            // A flipped length byte may make the frame look longer (Incomplete) or too large;
            // any other flip is caught by magic, version or checksum. Never a wrong frame.
            match decode(&cfg, &bytes) {
                Ok(Decoded::Complete { .. }) => prop_assert!(false, "corruption at byte {} undetected", i),
                Ok(Decoded::Incomplete) => prop_assert!((20..24).contains(&i)),
                Err(_) => {}
            }
        }

        #[test]
        fn never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200), valid_prefix in any::<bool>()) {
            let mut input = if valid_prefix { vec![0x11, 0xCE, WIRE_VERSION] } else { Vec::new() };
            input.extend_from_slice(&bytes);
            let _ = decode(&small(), &input);
        }
    }
}
