//! memcached's `stats detail`: per key-prefix counts of gets, hits, sets and deletes.
//!
//! A key's prefix is everything before its first delimiter byte (`server.detail_delimiter`,
//! memcached's `-D`, default `:`); keys without the delimiter are not counted, as in
//! memcached. Counting is off until `stats detail on` (or `-D` / `server.detail_enabled`),
//! and a disabled table costs one relaxed atomic load per request.
//!
//! What is counted, as memcached 1.6.18 counts it (measured): every key of
//! `get`/`gets`/`gat`/`gats` (`get`, and `hit` when found), every classic storage command
//! whatever its outcome (`set`), every `delete` hit or miss (`del`). Meta commands,
//! `incr`/`decr` and `touch` are not counted.
//!
//! Concurrency: `enabled` is an atomic read on the request path; the table is behind one
//! mutex, taken only while counting is on (memcached takes its global stats lock there).
//! The table holds at most `server.detail_prefixes_max` prefixes; keys of further prefixes
//! are not counted (memcached's table grows without bound).

use cellcache_proto::{PrefixCounts, lines, write_detail_prefix};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

#[derive(Default)]
struct Table {
    /// Prefix → position in `order`.
    index: HashMap<Box<[u8]>, usize>,
    /// Prefixes in the order they were first seen, with their counts (the dump order).
    order: Vec<(Box<[u8]>, PrefixCounts)>,
}

/// The per-prefix table of one cell.
pub struct Detail {
    enabled: AtomicBool,
    delimiter: u8,
    prefixes_max: usize,
    /// Lock order: a leaf lock, see `cluster::Cluster`.
    table: Mutex<Table>,
}

/// Which count a request adds to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DetailOp {
    /// A retrieval of one key, found or not.
    Get { hit: bool },
    /// A classic storage command.
    Set,
    /// A `delete`.
    Delete,
}

impl Detail {
    pub fn new(enabled: bool, delimiter: u8, prefixes_max: usize) -> Self {
        Detail {
            enabled: AtomicBool::new(enabled),
            delimiter,
            prefixes_max,
            table: Mutex::new(Table::default()),
        }
    }

    pub fn set_enabled(&self, on: bool) {
        self.enabled.store(on, Ordering::Relaxed);
    }

    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    pub fn delimiter(&self) -> u8 {
        self.delimiter
    }

    /// Counts `op` on `key` when counting is on and the key has a prefix.
    pub fn record(&self, key: &[u8], op: DetailOp) {
        if !self.enabled() {
            return;
        }
        let Some(end) = key.iter().position(|&b| b == self.delimiter) else {
            return;
        };
        let prefix = &key[..end];
        let mut t = self.table.lock();
        let at = match t.index.get(prefix) {
            Some(&at) => at,
            None if t.order.len() < self.prefixes_max => {
                let at = t.order.len();
                t.order.push((prefix.into(), PrefixCounts::default()));
                t.index.insert(prefix.into(), at);
                at
            }
            None => return,
        };
        let c = &mut t.order[at].1;
        match op {
            DetailOp::Get { hit } => {
                c.get += 1;
                c.hit += u64::from(hit);
            }
            DetailOp::Set => c.set += 1,
            DetailOp::Delete => c.del += 1,
        }
    }

    /// memcached's `stats detail dump`: one `PREFIX` line per prefix, then `END`.
    pub fn dump(&self, out: &mut Vec<u8>) {
        let t = self.table.lock();
        for (prefix, counts) in &t.order {
            write_detail_prefix(out, prefix, *counts);
        }
        out.extend_from_slice(lines::END);
    }

    /// `stats reset` forgets every prefix, as memcached's does.
    pub fn clear(&self) {
        let mut t = self.table.lock();
        t.index.clear();
        t.order.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dump(d: &Detail) -> String {
        let mut out = Vec::new();
        d.dump(&mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn counts_by_prefix_only_when_enabled() {
        let d = Detail::new(false, b':', 16);
        d.record(b"foo:a", DetailOp::Set);
        assert_eq!(dump(&d), "END\r\n");
        d.set_enabled(true);
        d.record(b"foo:a", DetailOp::Set);
        d.record(b"foo:a", DetailOp::Get { hit: true });
        d.record(b"foo:b", DetailOp::Get { hit: false });
        d.record(b"bar:a", DetailOp::Delete);
        d.record(b"nodelim", DetailOp::Set);
        assert_eq!(
            dump(&d),
            "PREFIX foo get 2 hit 1 set 1 del 0\r\nPREFIX bar get 0 hit 0 set 0 del 1\r\nEND\r\n"
        );
        d.clear();
        assert_eq!(dump(&d), "END\r\n");
    }

    #[test]
    fn the_table_is_bounded() {
        let d = Detail::new(true, b'/', 1);
        d.record(b"a/1", DetailOp::Set);
        d.record(b"b/1", DetailOp::Set);
        d.record(b"a:1", DetailOp::Set);
        assert_eq!(dump(&d), "PREFIX a get 0 hit 0 set 1 del 0\r\nEND\r\n");
    }
}
