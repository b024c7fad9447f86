//! The capacity experiment against a server that evicts a whole slab of items at a time
//! (as cellcache does): the capacity is the most items it held before its first eviction,
//! not the fewer it holds right after it.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener};

use cellcache_bench::capacity::{CapacityParams, measure};

/// Items the fake server holds before it must evict.
const CAPACITY: u64 = 1_050;
/// Items one eviction removes (one "slab").
const SLAB_ITEMS: u64 = 300;

/// A one-connection memcached-text server that stores nothing but counts: `set` (always
/// STORED; past `CAPACITY` items it first evicts `SLAB_ITEMS`), `stats`, `version`.
fn slab_evicting_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    std::thread::spawn(move || {
        let Ok((stream, _)) = listener.accept() else {
            return;
        };
        let mut writer = stream.try_clone().expect("clone");
        let mut reader = BufReader::new(stream);
        let (mut items, mut evictions) = (0u64, 0u64);
        let mut line = String::new();
        loop {
            line.clear();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let words: Vec<&str> = line.split_whitespace().collect();
            let reply = match words.first().copied() {
                Some("set") => {
                    let len: usize = words.get(4).and_then(|w| w.parse().ok()).unwrap_or(0);
                    let mut data = vec![0u8; len + 2];
                    if reader.read_exact(&mut data).is_err() {
                        return;
                    }
                    if items == CAPACITY {
                        items -= SLAB_ITEMS;
                        evictions += SLAB_ITEMS;
                    }
                    items += 1;
                    "STORED\r\n".to_string()
                }
                Some("stats") => format!(
                    "STAT limit_maxbytes 1048576\r\nSTAT curr_items {items}\r\nSTAT evictions {evictions}\r\nEND\r\n"
                ),
                Some("version") => "VERSION fake-slab\r\n".to_string(),
                _ => "ERROR\r\n".to_string(),
            };
            if writer.write_all(reply.as_bytes()).is_err() {
                return;
            }
        }
    });
    addr
}

#[test]
fn capacity_is_the_most_held_before_a_slab_eviction() {
    let addr = slab_evicting_server();
    let params = CapacityParams {
        item_key_len: 14,
        item_value_len: 100,
        fill_batch: 100,
        fill_keys_max: 10_000,
    };
    let report = measure(addr, &params).expect("measure");
    assert_eq!(report.evictions, SLAB_ITEMS);
    assert_eq!(report.keys_written, 1_100);
    // After the batch that evicted it holds 1100 - 300 = 800; before that batch, 1000 (the
    // precision is one batch of the true 1050).
    assert_eq!(report.items_held, 1_000, "{report:?}");
}
