//! Responses: composed by the server straight into its output buffer, parsed back by
//! clients (tests, fuzzing).
//!
//! A response echoes its request's opcode and opaque. Success responses carry what the
//! command returns (flags as extras, key, value, CAS); error responses carry memcached's
//! short message for the status as their value ([`Status::message`]), or for a miss of a
//! get-with-key, the key and no message, as memcached does.

use super::header::{HEADER_BYTES, Header, MAGIC_RESPONSE, Status};

/// One response packet (client direction: what [`parse_response`] found).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BinaryResponse<'a> {
    /// The request's opcode byte.
    pub opcode: u8,
    /// Status code (see [`Status::from_code`]); kept raw so an unknown code is not an error.
    pub status: u16,
    /// The request's opaque.
    pub opaque: u32,
    /// The item's CAS (0 when the command has none).
    pub cas: u64,
    /// Extras (the flags of a get hit).
    pub extras: &'a [u8],
    /// Key (get-with-key, stat name).
    pub key: &'a [u8],
    /// Value (item data, counter, version, stat value, error message).
    pub value: &'a [u8],
}

impl BinaryResponse<'_> {
    /// Appends the packet.
    pub fn encode(&self, out: &mut Vec<u8>) {
        write_header(
            out,
            ResponseHead {
                opcode: self.opcode,
                status: self.status,
                opaque: self.opaque,
                cas: self.cas,
                extras_len: self.extras.len() as u8,
                key_len: self.key.len() as u16,
                value_len: self.value.len(),
            },
        );
        out.extend_from_slice(self.extras);
        out.extend_from_slice(self.key);
        out.extend_from_slice(self.value);
    }
}

/// The fields of a response header, for composing a response whose value is copied in
/// separately (straight from the store, without an intermediate buffer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResponseHead {
    /// The request's opcode byte.
    pub opcode: u8,
    /// Status code.
    pub status: u16,
    /// The request's opaque.
    pub opaque: u32,
    /// CAS.
    pub cas: u64,
    /// Extras that will follow.
    pub extras_len: u8,
    /// Key bytes that will follow.
    pub key_len: u16,
    /// Value bytes that will follow.
    pub value_len: usize,
}

/// Appends a response header; the caller appends extras, key and value.
pub fn write_header(out: &mut Vec<u8>, head: ResponseHead) {
    let body = usize::from(head.extras_len) + usize::from(head.key_len) + head.value_len;
    Header {
        magic: MAGIC_RESPONSE,
        opcode: head.opcode,
        key_len: head.key_len,
        extras_len: head.extras_len,
        data_type: 0,
        vbucket_or_status: head.status,
        body_len: u32::try_from(body).unwrap_or(u32::MAX),
        opaque: head.opaque,
        cas: head.cas,
    }
    .encode(out);
}

/// Appends an error response: the status and memcached's message for it as the value.
pub fn write_error(out: &mut Vec<u8>, opcode: u8, status: Status, opaque: u32) {
    write_error_message(out, opcode, status, opaque, status.message().as_bytes());
}

/// Appends an error response with `message` as its value.
pub fn write_error_message(
    out: &mut Vec<u8>,
    opcode: u8,
    status: Status,
    opaque: u32,
    message: &[u8],
) {
    BinaryResponse {
        opcode,
        status: status.code(),
        opaque,
        cas: 0,
        extras: b"",
        key: b"",
        value: message,
    }
    .encode(out);
}

/// Outcome of [`parse_response`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParsedResponse<'a> {
    /// A whole response is at the front of the buffer.
    Complete {
        /// The response, borrowing from the buffer.
        response: BinaryResponse<'a>,
        /// Bytes it occupies.
        consumed: usize,
    },
    /// Not enough bytes yet.
    Incomplete,
    /// The bytes are not a response; the client should drop the connection.
    Error(ResponseError),
}

/// Why a response could not be parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ResponseError {
    /// The first byte is not [`MAGIC_RESPONSE`].
    #[error("bad response magic {0:#04x}")]
    BadMagic(u8),
    /// Key and extras longer than the body.
    #[error("key and extras are longer than the body")]
    LengthsExceedBody,
    /// A body larger than the caller's bound.
    #[error("response body of {0} bytes is larger than the limit")]
    TooLarge(u32),
}

/// Parses the response at the front of `buf`; bodies over `body_bytes_max` are an error
/// (a client bounds what it buffers).
pub fn parse_response(buf: &[u8], body_bytes_max: usize) -> ParsedResponse<'_> {
    let Some(&magic) = buf.first() else {
        return ParsedResponse::Incomplete;
    };
    if magic != MAGIC_RESPONSE {
        return ParsedResponse::Error(ResponseError::BadMagic(magic));
    }
    let Some(h) = Header::decode(buf) else {
        return ParsedResponse::Incomplete;
    };
    let (ext, key, body) = (
        usize::from(h.extras_len),
        usize::from(h.key_len),
        h.body_len as usize,
    );
    if ext + key > body {
        return ParsedResponse::Error(ResponseError::LengthsExceedBody);
    }
    if body > body_bytes_max {
        return ParsedResponse::Error(ResponseError::TooLarge(h.body_len));
    }
    let Some(frame) = buf.get(..HEADER_BYTES + body) else {
        return ParsedResponse::Incomplete;
    };
    let b = &frame[HEADER_BYTES..];
    ParsedResponse::Complete {
        response: BinaryResponse {
            opcode: h.opcode,
            status: h.vbucket_or_status,
            opaque: h.opaque,
            cas: h.cas,
            extras: &b[..ext],
            key: &b[ext..ext + key],
            value: &b[ext + key..],
        },
        consumed: frame.len(),
    }
}
