//! A request on a cell outside any ring: executed against the store at once, or, with a
//! cache tier, through [`crate::tier::path`] — which may answer later (a load from the
//! backing store, a write-through reply held until the write is durable) through a reply
//! slot, exactly as a ring cell's forwarded requests do.

use super::{Conn, Encoding, strip_end};
use crate::local::{Flow, execute};
use crate::tier::Route;
use cellcache_proto::Request;

impl Conn {
    /// Runs `request` here; sets `slotted` when its reply went to a slot.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn run_standalone(
        &mut self,
        request: &Request<'_>,
        bytes: &[u8],
        now: u32,
        out: &mut Vec<u8>,
        encoding: &Encoding,
        end: bool,
        slotted: &mut bool,
    ) -> Flow {
        let start = out.len();
        match crate::tier::path::route(&self.cell, request, bytes, now, &mut self.counters) {
            Route::Here => {
                let flow = execute(&self.cell, request, now, out, &mut self.counters);
                strip_end(out, start, end);
                flow
            }
            Route::Answered(reply, flow) => {
                out.extend_from_slice(&reply);
                strip_end(out, start, end);
                flow
            }
            Route::Later(later) => {
                let slot = self.slot();
                *slotted = true;
                let enc = encoding.clone();
                later.start(Box::new(move |mut reply| {
                    strip_end(&mut reply, 0, end);
                    slot.fill(enc.finish(reply));
                }));
                Flow::Continue
            }
        }
    }
}
