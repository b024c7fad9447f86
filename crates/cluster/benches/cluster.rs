//! Costs of the cluster core on the request path and the control plane, measured with plain
//! timers (no harness, so it builds without extra dependencies). Run with
//! `cargo bench -p cellcache-cluster --no-default-features --bench cluster`.
//!
//! Request path: `key_hash`, `ClusterMap::owner`, `Ring::can_serve`, frame encode + decode.
//! Control plane: `change::apply` on a large map, repeated id division.

use std::hint::black_box;
use std::time::Instant;

use cellcache_cluster::change::{self, Change, Proposal};
use cellcache_cluster::ring::{Ring, RingConfig};
use cellcache_cluster::wire::{self, Decoded, FrameKind, WireConfig};
use cellcache_cluster::{CellAddress, CellId, ClusterMap, key_hash};

/// Iterations per measurement: enough to dwarf timer resolution, small enough to finish fast.
const ITERATIONS: u64 = 2_000_000;
const CELLS: u32 = 128;

fn addr(n: u32) -> CellAddress {
    CellAddress {
        client: format!("127.0.0.1:{}", 24000 + n),
        peer: format!("127.0.0.1:{}", 34000 + n),
    }
}

/// A map of `CELLS` Active cells, grown by always dividing the largest range.
fn big_map() -> ClusterMap {
    let mut map = ClusterMap::bootstrap(CellId::whole(1), addr(0), 2).expect("bootstrap");
    for n in 1..CELLS {
        let parent = map
            .active_cells()
            .max_by_key(|c| c.range.map(|r| r.len()))
            .unwrap()
            .id
            .clone();
        let begin = Change::BeginDivision {
            parent,
            child_address: addr(n),
        };
        map = change::apply(
            &map,
            &Proposal {
                based_on_epoch: map.epoch(),
                change: begin,
            },
        )
        .unwrap();
        let child = map
            .cells()
            .iter()
            .find(|c| c.range.is_none())
            .unwrap()
            .id
            .clone();
        let done = Change::CompleteDivision { child };
        map = change::apply(
            &map,
            &Proposal {
                based_on_epoch: map.epoch(),
                change: done,
            },
        )
        .unwrap();
    }
    map
}

fn report(name: &str, iterations: u64, start: Instant) {
    let ns = start.elapsed().as_nanos() as f64 / iterations as f64;
    println!("{name:<48} {ns:>10.1} ns/op  ({iterations} ops)");
}

fn main() {
    let map = big_map();
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };

    let keys: Vec<[u8; 32]> = (0..1024)
        .map(|i| *format!("key:{i:028}").as_bytes().first_chunk().unwrap())
        .collect();
    let start = Instant::now();
    for i in 0..ITERATIONS {
        black_box(key_hash(black_box(&keys[(i % 1024) as usize])));
    }
    report("key_hash (32-byte key)", ITERATIONS, start);

    let start = Instant::now();
    for _ in 0..ITERATIONS {
        black_box(map.owner(black_box(next())));
    }
    report(
        &format!("ClusterMap::owner ({CELLS} cells)"),
        ITERATIONS,
        start,
    );

    // A ring whose leases are all in place: the full can_serve check runs.
    let single = ClusterMap::bootstrap(CellId::whole(1), addr(0), 2).unwrap();
    let mut ring = Ring::new(CellId::whole(1), single, RingConfig::default(), 0);
    ring.map_confirmed(1, 0);
    let start = Instant::now();
    let mut served = 0u64;
    for _ in 0..ITERATIONS {
        served += u64::from(ring.can_serve(black_box(next()), 1));
    }
    assert_eq!(served, ITERATIONS);
    report(
        "Ring::can_serve (single cell, confirmed map)",
        ITERATIONS,
        start,
    );

    let cfg = WireConfig::default();
    let payload = vec![0xA5u8; 1024];
    let mut buf = Vec::with_capacity(2048);
    let start = Instant::now();
    for i in 0..ITERATIONS {
        buf.clear();
        wire::encode(&cfg, FrameKind::Replicate, 7, i, &payload, &mut buf).unwrap();
        match wire::decode(&cfg, black_box(&buf)).unwrap() {
            Decoded::Complete { frame, .. } => assert_eq!(frame.payload.len(), 1024),
            Decoded::Incomplete => unreachable!("a whole frame was given"),
        }
    }
    let elapsed = start.elapsed();
    report("wire encode+decode (1 KiB payload)", ITERATIONS, start);
    let gib_s = (ITERATIONS as f64 * 1024.0) / elapsed.as_secs_f64() / (1u64 << 30) as f64;
    println!("{:<48} {gib_s:>10.2} GiB/s of payload", "");

    let rounds = 1_000u64;
    let parent = map
        .active_cells()
        .nth(CELLS as usize / 2)
        .unwrap()
        .id
        .clone();
    let start = Instant::now();
    for n in 0..rounds {
        let change = Change::BeginDivision {
            parent: parent.clone(),
            child_address: addr(10_000 + n as u32),
        };
        black_box(
            change::apply(
                &map,
                &Proposal {
                    based_on_epoch: map.epoch(),
                    change,
                },
            )
            .unwrap(),
        );
    }
    report(
        &format!("change::apply BeginDivision ({CELLS} cells)"),
        rounds,
        start,
    );
    println!("{:<48} {:>10} bytes encoded map", "", map.encode().len());

    let start = Instant::now();
    let high = CellId::whole(2);
    let mut low = CellId::whole(1);
    for _ in 0..1_000 {
        low = CellId::between(&low, Some(&high)).unwrap();
    }
    report("CellId::between, 1,000 divisions at one spot", 1_000, start);
    println!(
        "{:<48} {:>10} fraction bytes after 1,000",
        "",
        low.fraction_bytes()
    );
}
