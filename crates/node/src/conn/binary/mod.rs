//! The binary protocol session: a connection whose first byte was `0x80`.
//!
//! Each frame (`cellcache_proto::binary::parse_request`) is translated into the meta
//! command that asks for what its binary reply carries ([`translate`]), parsed by the text
//! parser and run by [`Conn::run`] exactly like a text request: the same store, counters,
//! routing to the key's master through a ring, replication before the reply, and reply
//! order behind slots. The meta reply is then re-encoded as a binary response
//! ([`Encoding::finish`]), here or on whichever thread fills the request's slot.
//!
//! The price is a second copy of a value on the way out (store → text reply → binary
//! response) and one on the way in; the binary protocol is deprecated in memcached and kept
//! for compatibility, so sharing every semantic with the text path wins over the copy.

pub mod translate;

use std::sync::Arc;

use cellcache_io::Progress;
use cellcache_proto::binary::{
    BinaryParsed, HEADER_BYTES, Status, parse_request, write_error_message,
};
use cellcache_proto::{Parsed, parse};

use super::Conn;
use crate::cluster::Cluster;
use crate::local::Flow;
pub use translate::Shape;

/// How a request's reply goes back to its client.
#[derive(Debug, Clone)]
pub enum Encoding {
    /// As composed: a text or meta reply.
    Text,
    /// Re-encoded as the binary response of this shape.
    Binary(Shape),
}

impl Encoding {
    /// Whether replies are sent as composed.
    pub fn is_text(&self) -> bool {
        matches!(self, Encoding::Text)
    }

    /// The bytes the client gets for the composed reply `text`.
    pub fn finish(&self, text: Vec<u8>) -> Vec<u8> {
        match self {
            Encoding::Text => text,
            Encoding::Binary(shape) => shape.reply(&text),
        }
    }
}

impl Conn {
    /// Serves the binary frames in `input`, as `on_input` does for text lines: bounded by
    /// the output budget and the in-flight queue, swallowing refused values across reads.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn binary_input(
        &mut self,
        input: &[u8],
        output: &mut Vec<u8>,
        budget: usize,
        now: u32,
        cluster: Option<&Arc<Cluster>>,
        standby: bool,
        p: &mut Progress,
    ) {
        let limits = self.cell.limits;
        while self.next_request(input, output, budget, p) {
            let rest = &input[p.consumed..];
            if let Some(reply) = self.binary_refusal(rest) {
                // Not authenticated: refused on its header, then closed (memcached).
                self.emit(reply, output);
                p.consumed += HEADER_BYTES;
                self.closing = true;
                break;
            }
            match parse_request(rest, &limits) {
                BinaryParsed::Complete { frame, consumed } => {
                    p.consumed += consumed;
                    if self.sasl(&frame, output) {
                        continue;
                    }
                    let flow = match translate::to_text(&frame, &limits) {
                        Ok((text, shape)) => match parse(&text, &limits) {
                            Parsed::Complete { request, .. } => self.run(
                                &request,
                                &text,
                                now,
                                cluster,
                                standby,
                                output,
                                &Encoding::Binary(shape),
                                true,
                            ),
                            // Unreachable for a correct translation; answer rather than hang.
                            _ => {
                                let mut reply = Vec::new();
                                write_error_message(
                                    &mut reply,
                                    frame.opcode.code(),
                                    Status::InternalError,
                                    frame.opaque,
                                    b"untranslatable request",
                                );
                                self.emit(reply, output);
                                Flow::Continue
                            }
                        },
                        Err(reply) => {
                            self.emit(reply, output);
                            Flow::Continue
                        }
                    };
                    if flow == Flow::Close {
                        self.closing = true;
                        break;
                    }
                }
                BinaryParsed::Incomplete => break,
                BinaryParsed::Error(e) => {
                    self.counters.protocol_errors += 1;
                    let reply = self.sasl_refusal(&e).unwrap_or_else(|| {
                        let mut reply = Vec::new();
                        e.encode_reply(&mut reply);
                        reply
                    });
                    self.emit(reply, output);
                    if e.status == Some(cellcache_proto::binary::Status::ValueTooLarge) {
                        self.counters.store_too_large += 1;
                    }
                    if let Some(key) = e.failed_set_key {
                        // As for a text set refused as too large (see `conn`); a key
                        // that is no text token travels in base64.
                        let text = key.iter().all(|b| b.is_ascii_graphic());
                        let mut wire = Vec::new();
                        if text {
                            wire.extend_from_slice(key);
                        } else {
                            cellcache_proto::token::base64_encode(key, &mut wire);
                        }
                        let key = cellcache_proto::MetaKey {
                            wire: &wire,
                            base64: !text,
                        };
                        self.unlink(key, now, cluster);
                    }
                    p.consumed += e.consumed;
                    self.discard = e.discard();
                    if e.close {
                        self.closing = true;
                        break;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
