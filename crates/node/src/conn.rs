//! One client connection: frames requests out of the engine's input buffer, executes them
//! in order and appends replies, so pipelined requests are answered in the order sent.
//!
//! The only state carried between batches is the discard debt: after a rejected storage
//! command, memcached swallows the announced data block, which may arrive over several
//! reads. Counters are folded into the cell's totals once per batch.

use crate::cell::Cell;
use crate::counters::LocalCounters;
use crate::local::{Flow, execute};
use cellcache_io::{Notify, Progress, Service, Session};
use cellcache_proto::{Discard, Parsed, parse};
use std::net::SocketAddr;
use std::sync::Arc;

/// Creates a [`Conn`] per accepted client.
pub struct ClientService {
    pub cell: Arc<Cell>,
}

impl Service for ClientService {
    type Session = Conn;
    fn open(&self, _peer: SocketAddr, _notify: Notify) -> Conn {
        Conn {
            cell: self.cell.clone(),
            discard: Discard::default(),
            counters: LocalCounters::default(),
        }
    }
}

pub struct Conn {
    cell: Arc<Cell>,
    discard: Discard,
    counters: LocalCounters,
}

impl Session for Conn {
    fn on_input(&mut self, input: &[u8], output: &mut Vec<u8>, budget: usize) -> Progress {
        let mut p = Progress::default();
        let now = self.cell.now();
        while p.consumed < input.len() {
            p.consumed += self.discard.take(input.len() - p.consumed);
            if p.consumed == input.len() {
                break;
            }
            if output.len() >= budget {
                p.output_full = true;
                break;
            }
            match parse(&input[p.consumed..], &self.cell.limits) {
                Parsed::Complete { request, consumed } => {
                    p.consumed += consumed;
                    if execute(&self.cell, &request, now, output, &mut self.counters) == Flow::Close
                    {
                        p.close = true;
                        break;
                    }
                }
                Parsed::Incomplete => break,
                Parsed::Error(e) => {
                    self.counters.protocol_errors += 1;
                    if !e.noreply {
                        e.reply.encode(output);
                    }
                    if let Some(key) = e.failed_set_key {
                        // memcached drops the old value when a set is refused as too
                        // large, so a reader never sees the value the client replaced.
                        self.cell
                            .store
                            .delete(key, now, cellcache_store::DeleteOptions::default());
                    }
                    p.consumed += e.consumed;
                    self.discard = e.discard();
                    if e.close {
                        p.close = true;
                        break;
                    }
                }
            }
        }
        self.cell.counters.absorb(&mut self.counters);
        p
    }
}
