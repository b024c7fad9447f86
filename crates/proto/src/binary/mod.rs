//! The memcached binary protocol (magic `0x80`), sans-IO, both directions.
//!
//! memcached 1.6 still serves it (deprecated, but pylibmc's binary mode and Java clients
//! speak it). A packet is a 24-byte [`Header`] followed by extras, key and value, lengths
//! from the header. [`parse_request`] turns the front of a buffer into a [`Frame`] (or
//! says it is incomplete, or how to reject it: [`BinaryError`]); [`BinaryResponse`] and
//! [`write_header`] compose replies; [`parse_response`] reads them back for clients. The
//! node serves a binary connection by translating each frame into the equivalent meta
//! command, so the binary protocol shares every semantic of the text one.
//!
//! Like the text parser it never panics, bounds every length before trusting it, and
//! reports a partial frame as [`BinaryParsed::Incomplete`].

mod header;
mod request;
mod response;

pub use header::{HEADER_BYTES, Header, MAGIC_REQUEST, MAGIC_RESPONSE, Opcode, Status};
pub use request::{
    BinaryError, BinaryParsed, Command, Frame, FrameError, NO_CREATE_EXPTIME, SASL_DATA_BYTES_MAX,
    SASL_MECHANISM_BYTES_MAX, frame_bytes_max, parse_request,
};
pub use response::{
    BinaryResponse, ParsedResponse, ResponseError, ResponseHead, parse_response, write_error,
    write_error_message, write_header,
};

#[cfg(test)]
mod tests;
