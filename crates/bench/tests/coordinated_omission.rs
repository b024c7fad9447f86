//! The open loop must not hide a server stall (no coordinated omission).
//!
//! A scripted loopback server answers every `get` with `END`, except that it stops answering
//! for `STALL` once, early in the run. At 1000 req/s over one connection, about 300 arrivals
//! fall due during the stall. Measured from their intended send times their latencies spread
//! from ~0 to the full stall, so well over 10 % of all requests take longer than a third of
//! it. A generator that measured from the actual send time (or that stopped sending while
//! blocked) would record the stall for a single request and report a p90 of microseconds.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use cellcache_bench::engine::{self, EngineConfig, LoadMode, Progress, StopAfter};
use cellcache_bench::schedule::Arrival;
use cellcache_bench::workload::keys::KeySpace;
use cellcache_bench::workload::values::{ValuePool, ValueSize};
use cellcache_bench::workload::{OpKind, Popularity, Workload};

const STALL: Duration = Duration::from_millis(300);
/// The server stalls before answering this request (0-based), ~100 ms into the run.
const STALL_AT_REQUEST: usize = 100;

/// Serves one connection: `END` for every `get` line, with one stall. Returns when the client
/// closes the connection (bounded by the client's run).
fn scripted_server() -> (SocketAddr, std::thread::JoinHandle<usize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let handle = std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        let mut writer = stream.try_clone().unwrap();
        let mut reader = BufReader::new(stream);
        let mut line = String::new();
        let mut served = 0;
        loop {
            line.clear();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => return served,
                Ok(_) => {}
            }
            assert!(line.starts_with("get "), "only gets are sent: {line:?}");
            if served == STALL_AT_REQUEST {
                std::thread::sleep(STALL);
            }
            if writer.write_all(b"END\r\n").is_err() {
                return served;
            }
            served += 1;
        }
    });
    (addr, handle)
}

#[test]
fn a_server_stall_shows_in_the_latency_of_every_request_due_during_it() {
    let (addr, server) = scripted_server();
    let workload = Arc::new(Workload {
        keys: KeySpace::new("k", 100, None).unwrap(),
        popularity: Popularity::Uniform,
        get_ratio: 1.0,
        multiget: 1,
        value_size: ValueSize::Fixed(1),
        ttl_secs: 0,
        growth: None,
    });
    let config = EngineConfig {
        servers: vec![addr],
        connections: 1,
        pipeline: 1,
        threads: 1,
        mode: LoadMode::Open {
            rate_per_sec: 1000.0,
            arrival: Arrival::Uniform,
        },
        stop: StopAfter::Requests { count: 1000 },
        drain_timeout: Duration::from_secs(10),
        ..EngineConfig::default()
    };
    let pool = Arc::new(ValuePool::new(1, &mut rand::thread_rng()));
    let result = engine::run(&config, workload, pool, Arc::new(Progress::default())).unwrap();
    let gets = &result.stats.ops[&OpKind::Get];
    assert_eq!((gets.sent, gets.replies, gets.errors), (1000, 1000, 0));
    assert_eq!(server.join().unwrap(), 1000);
    let latency = gets.latency.summary();
    let third_of_stall_us = STALL.as_micros() as f64 / 3.0;
    assert!(
        latency.p90_us > third_of_stall_us,
        "p90 {} µs: the stall must count for every request due during it ({latency:?})",
        latency.p90_us
    );
    assert!(
        latency.max_us >= STALL.as_micros() as f64 * 0.9,
        "{latency:?}"
    );
    assert!(
        result.stats.late_sends >= 100,
        "requests due during the stall were sent late"
    );
}
