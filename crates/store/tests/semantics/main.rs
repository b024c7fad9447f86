//! Behaviour of each memcached operation on the store, one scenario per test.

use std::sync::{Arc, Mutex};

use cellcache_store::*;

const NOW: u32 = 1_000_000;

fn small_config() -> StoreConfig {
    StoreConfig {
        memory_limit_bytes: 256 << 10,
        slab_size_bytes: 16 << 10,
        item_size_max_bytes: 16 << 10,
        ..StoreConfig::default()
    }
}

fn store() -> Store {
    Store::new(small_config()).unwrap()
}

fn get(s: &Store, key: &[u8], now: u32) -> Option<(Vec<u8>, u32, u64)> {
    s.get(key, now, |v| (v.value.to_vec(), v.flags, v.cas))
}

fn set(s: &Store, key: &[u8], value: &[u8]) -> u64 {
    match s.write(&WriteRequest::set(key, value), NOW).unwrap() {
        WriteOutcome::Stored { cas } => cas,
        other => panic!("set gave {other:?}"),
    }
}

fn req<'a>(mode: WriteMode, key: &'a [u8], value: &'a [u8]) -> WriteRequest<'a> {
    WriteRequest {
        mode,
        ..WriteRequest::set(key, value)
    }
}

/// A store of 500 items `r0`..`r499` (value and flags the index, expiring at NOW + 1000 + i).
fn filled(layout: Layout) -> Store {
    let s = Store::new(StoreConfig {
        layout,
        memory_limit_bytes: 1 << 20,
        ..small_config()
    })
    .unwrap();
    for i in 0..500u32 {
        let key = format!("r{i}");
        let value = i.to_le_bytes();
        let w = WriteRequest {
            flags: i,
            expiry: Expiry::at(NOW + 1000 + i),
            ..WriteRequest::set(key.as_bytes(), &value)
        };
        s.write(&w, NOW).unwrap();
    }
    s
}

mod commands;
mod drop_walk;
mod ranges;
mod s3fifo;
mod space;
