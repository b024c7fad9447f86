//! Parse throughput of pipelined `get` and `set` requests: the hot path of
//! every connection. Run in release mode:
//!
//! ```text
//! cargo run --release -p cellcache-proto --example parse_throughput
//! ```
//!
//! It builds a buffer of pipelined requests once, then parses it repeatedly
//! in ten 200 ms rounds per workload and prints the best round's requests
//! per second, bytes per second and nanoseconds per request. The numbers are for comparing parser changes on one machine.

use std::hint::black_box;
use std::time::{Duration, Instant};

use cellcache_proto::{Limits, Parsed, Request, parse};

/// Requests in one pipelined buffer.
const REQUESTS_PER_BUFFER: usize = 10_000;
/// Rounds per workload; the best is reported.
const ROUNDS: usize = 10;
/// How long each round runs.
const ROUND_TIME: Duration = Duration::from_millis(200);

fn workload(name: &str, buffer: &[u8], limits: &Limits) {
    // The best of several short rounds: on a shared machine the best round
    // is the one least disturbed by other processes.
    let mut best_secs_per_pass = f64::INFINITY;
    let mut requests_per_pass: u64 = 0;
    for _ in 0..ROUNDS {
        let started = Instant::now();
        let mut passes: u64 = 0;
        while started.elapsed() < ROUND_TIME {
            requests_per_pass = 0;
            let mut rest = buffer;
            while !rest.is_empty() {
                match parse(black_box(rest), limits) {
                    Parsed::Complete { request, consumed } => {
                        black_box(&request);
                        requests_per_pass += 1;
                        rest = &rest[consumed..];
                    }
                    other => panic!("benchmark input did not parse: {other:?}"),
                }
            }
            passes += 1;
        }
        let secs_per_pass = started.elapsed().as_secs_f64() / passes as f64;
        best_secs_per_pass = best_secs_per_pass.min(secs_per_pass);
    }
    println!(
        "{name:<28} {:>8.2} M req/s  {:>8.1} MiB/s  {:>6.1} ns/req",
        requests_per_pass as f64 / best_secs_per_pass / 1e6,
        buffer.len() as f64 / best_secs_per_pass / (1024.0 * 1024.0),
        best_secs_per_pass * 1e9 / requests_per_pass as f64,
    );
}

fn pipeline(render: impl Fn(usize, &mut Vec<u8>)) -> Vec<u8> {
    let mut buffer = Vec::new();
    for i in 0..REQUESTS_PER_BUFFER {
        render(i, &mut buffer);
    }
    buffer
}

fn main() {
    let limits = Limits::default();
    let value = vec![b'v'; 100];
    let get = pipeline(|i, out| out.extend_from_slice(format!("get key:{i:08}\r\n").as_bytes()));
    let multi_get = pipeline(|i, out| {
        out.extend_from_slice(b"get");
        for k in 0..10 {
            out.extend_from_slice(format!(" key:{i:08}:{k}").as_bytes());
        }
        out.extend_from_slice(b"\r\n");
    });
    let set = pipeline(|i, out| {
        out.extend_from_slice(format!("set key:{i:08} 0 0 {}\r\n", value.len()).as_bytes());
        out.extend_from_slice(&value);
        out.extend_from_slice(b"\r\n");
    });
    let mg =
        pipeline(|i, out| out.extend_from_slice(format!("mg key:{i:08} v f t c\r\n").as_bytes()));
    let ms = pipeline(|i, out| {
        out.extend_from_slice(format!("ms key:{i:08} {} T60 F5\r\n", value.len()).as_bytes());
        out.extend_from_slice(&value);
        out.extend_from_slice(b"\r\n");
    });
    // Check once that the buffers hold what their names say.
    assert!(matches!(
        parse(&multi_get, &limits),
        Parsed::Complete { request: Request::Retrieve(r), .. } if r.keys.len() == 10
    ));
    workload("get (1 key)", &get, &limits);
    workload("get (10 keys)", &multi_get, &limits);
    workload("set (100 B value)", &set, &limits);
    workload("mg v f t c", &mg, &limits);
    workload("ms (100 B value) T F", &ms, &limits);
}
