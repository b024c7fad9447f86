//! Malformed input of any kind gets a protocol error and never crashes, hangs or corrupts a
//! cell: seeded random and truncated byte streams are thrown at a running cell,
//! and after each burst the cell must still answer a fresh client exactly right.

mod common;

use common::Server;
use rand::{Rng, SeedableRng, rngs::StdRng};
use std::io::{Read, Write};
use std::time::Duration;

/// Bursts per run; bounded so the test's cost is fixed.
const BURSTS: usize = 300;

/// Fragments that look almost like the protocol, so the random streams reach deep states.
const FRAGMENTS: &[&[u8]] = &[
    b"set ",
    b"get ",
    b"gets ",
    b"cas ",
    b"add ",
    b"append ",
    b"incr ",
    b"decr ",
    b"touch ",
    b"gat ",
    b"delete ",
    b"flush_all",
    b"mg ",
    b"ms ",
    b"md ",
    b"ma ",
    b"mn",
    b"me ",
    b"stats",
    b"verbosity ",
    b"noreply",
    b" ",
    b"  ",
    b"\r\n",
    b"\n",
    b"\r",
    b"0",
    b"1",
    b"-1",
    b"4294967296",
    b"18446744073709551616",
    b"99999999999999999999",
    b"k",
    b"key",
    b"v",
    b"T10",
    b"F1",
    b"C1",
    b"E5",
    b"N0",
    b"J1",
    b"D1",
    b"MA",
    b"MP",
    b"MI",
    b"MD",
    b"q",
    b"b",
    b"O",
    b"\0",
    b"\xff",
    b"VALUE",
    b"\t",
];

fn burst(rng: &mut StdRng) -> Vec<u8> {
    let mut out = Vec::new();
    for _ in 0..rng.gen_range(1..40) {
        if rng.gen_bool(0.8) {
            out.extend_from_slice(FRAGMENTS[rng.gen_range(0..FRAGMENTS.len())]);
        } else {
            let n = rng.gen_range(1..16);
            out.extend((0..n).map(|_| rng.r#gen::<u8>()));
        }
    }
    out
}

fn assert_healthy(server: &Server, round: usize) {
    let mut c = server.connect();
    let key = format!("health{round}");
    c.roundtrip(
        format!("set {key} 7 0 5\r\nhello\r\n").as_bytes(),
        b"STORED\r\n",
    );
    c.roundtrip(
        format!("get {key}\r\n").as_bytes(),
        format!("VALUE {key} 7 5\r\nhello\r\nEND\r\n").as_bytes(),
    );
}

#[test]
fn random_and_truncated_streams_never_break_the_cell() {
    let seed: u64 = std::env::var("CELLCACHE_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_cafe);
    println!("seed {seed} (set CELLCACHE_FUZZ_SEED to replay)");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut server = Server::start(&["-m", "16", "-t", "2"]);
    for round in 0..BURSTS {
        let mut c = server.connect();
        c.stream
            .set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        let bytes = burst(&mut rng);
        // Sometimes truncate mid-frame and hang up; sometimes write in random pieces.
        let cut = if rng.gen_bool(0.3) {
            rng.gen_range(0..=bytes.len())
        } else {
            bytes.len()
        };
        let mut at = 0;
        while at < cut {
            let n = rng.gen_range(1..=cut - at);
            if c.stream.write_all(&bytes[at..at + n]).is_err() {
                break; // the cell closed on us: allowed after a protocol error
            }
            at += n;
        }
        let mut sink = [0u8; 4096];
        let _ = c.stream.read(&mut sink);
        drop(c);
        if round % 25 == 0 {
            assert!(
                server.is_running(),
                "cell died at round {round} (seed {seed})"
            );
            assert_healthy(&server, round);
        }
    }
    assert!(server.is_running(), "cell died (seed {seed})");
    assert_healthy(&server, BURSTS);
}
