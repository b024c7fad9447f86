//! Engine-only overhead: the three I/O engines serving a toy line-echo protocol (no
//! memcached parsing, no store), driven by a closed-loop load generator that keeps
//! `depth` requests in flight on each of `connections` connections.
//!
//! Modes:
//! - `bench` (default): for each connection count, repetitions interleaved across engines
//!   (A,B,C,A,B,C,...), server and load generator in one process; prints req/s per run and
//!   min/median/max of each engine's ratio to the first engine of the list.
//! - `serve --engine E --port P --seconds S`: the server alone (for `strace -c -f`); prints
//!   the requests it answered, so syscalls can be divided by requests.
//! - `load --port P --connections N --depth D --seconds S`: the load generator alone.
//!
//! Example: `cargo run --release -p cellcache-io --example engine_bench -- bench
//! --engines epoll,uring,threads --connections 10,100,1000 --depth 8 --seconds 2 --reps 3`

use cellcache_io::{EngineConfig, IoEngineKind, Notify, Progress, Service, Session, Shutdown};
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Every request is this many bytes, newline included; replies are the same bytes.
const REQUEST: &[u8] = b"get bench:key:0000000000000000\n";

struct Echo {
    answered: Arc<AtomicU64>,
}

struct EchoSession {
    answered: Arc<AtomicU64>,
}

impl Service for Echo {
    type Session = EchoSession;
    fn open(&self, _peer: SocketAddr, _notify: Notify) -> EchoSession {
        EchoSession {
            answered: self.answered.clone(),
        }
    }
}

impl Session for EchoSession {
    fn on_input(&mut self, input: &[u8], output: &mut Vec<u8>, budget: usize) -> Progress {
        let mut p = Progress::default();
        let mut lines = 0;
        while let Some(nl) = input[p.consumed..].iter().position(|&b| b == b'\n') {
            if output.len() >= budget {
                p.output_full = true;
                break;
            }
            output.extend_from_slice(&input[p.consumed..=p.consumed + nl]);
            p.consumed += nl + 1;
            lines += 1;
        }
        self.answered.fetch_add(lines, Ordering::Relaxed);
        p
    }
}

struct Args {
    mode: String,
    engines: Vec<IoEngineKind>,
    connections: Vec<usize>,
    depth: usize,
    seconds: f64,
    warmup_seconds: f64,
    reps: usize,
    server_threads: usize,
    client_threads: usize,
    port: u16,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        mode: "bench".into(),
        engines: vec![
            IoEngineKind::Epoll,
            IoEngineKind::Uring,
            IoEngineKind::Threads,
        ],
        connections: vec![10, 100, 1000],
        depth: 8,
        seconds: 2.0,
        warmup_seconds: 0.5,
        reps: 3,
        server_threads: 1,
        client_threads: 1,
        port: 0,
    };
    let mut it = std::env::args().skip(1).peekable();
    if let Some(mode) = it.next_if(|a| !a.starts_with("--")) {
        args.mode = mode;
    }
    while let Some(flag) = it.next() {
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        let bad = |e: &dyn std::fmt::Display| format!("{flag} {value}: {e}");
        match flag.as_str() {
            "--engines" | "--engine" => {
                args.engines = value
                    .split(',')
                    .map(str::parse)
                    .collect::<Result<_, _>>()
                    .map_err(|e| bad(&e))?
            }
            "--connections" => {
                args.connections = value
                    .split(',')
                    .map(str::parse)
                    .collect::<Result<_, _>>()
                    .map_err(|e| bad(&e))?
            }
            "--depth" => args.depth = value.parse().map_err(|e| bad(&e))?,
            "--seconds" => args.seconds = value.parse().map_err(|e| bad(&e))?,
            "--warmup" => args.warmup_seconds = value.parse().map_err(|e| bad(&e))?,
            "--reps" => args.reps = value.parse().map_err(|e| bad(&e))?,
            "--server-threads" => args.server_threads = value.parse().map_err(|e| bad(&e))?,
            "--client-threads" => args.client_threads = value.parse().map_err(|e| bad(&e))?,
            "--port" => args.port = value.parse().map_err(|e| bad(&e))?,
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(args)
}

/// Raises the soft open-files limit to the hard one: 1000 connections need 2000+ fds
/// in one process (both ends of each connection, plus eventfds for `threads`).
fn raise_nofile_limit() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut limit = getrlimit(Resource::Nofile);
    limit.current = limit.maximum;
    if let Err(e) = setrlimit(Resource::Nofile, limit) {
        eprintln!("warning: cannot raise RLIMIT_NOFILE: {e}");
    }
}

fn main() {
    let args = match parse_args() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("engine_bench: {e}");
            std::process::exit(2);
        }
    };
    raise_nofile_limit();
    match args.mode.as_str() {
        "bench" => bench(&args),
        "serve" => serve(&args),
        "load" => {
            let addr = SocketAddr::from(([127, 0, 0, 1], args.port));
            for &n in &args.connections {
                let rate = load(addr, n, &args);
                println!("connections={n} depth={} req_per_sec={rate:.0}", args.depth);
            }
        }
        other => {
            eprintln!("engine_bench: unknown mode {other} (bench, serve, load)");
            std::process::exit(2);
        }
    }
}

fn engine_config(args: &Args) -> EngineConfig {
    EngineConfig {
        threads: args.server_threads,
        max_connections: 4096,
        ..Default::default()
    }
}

fn serve(args: &Args) {
    let kind = args.engines[0];
    let answered = Arc::new(AtomicU64::new(0));
    let shutdown = Shutdown::new();
    let engine = cellcache_io::start(
        kind,
        SocketAddr::from(([127, 0, 0, 1], args.port)),
        &engine_config(args),
        Arc::new(Echo {
            answered: answered.clone(),
        }),
        shutdown.clone(),
    )
    .expect("engine starts");
    eprintln!("serving {} on {}", engine.engine, engine.local_addr);
    std::thread::sleep(Duration::from_secs_f64(args.seconds));
    shutdown.trigger();
    engine.join();
    println!(
        "engine={kind} requests_answered={}",
        answered.load(Ordering::Relaxed)
    );
}

fn bench(args: &Args) {
    println!(
        "engine-only overhead (toy echo, {}-byte requests), depth={}, server_threads={}, client_threads={}, {}s per run after {}s warm-up",
        REQUEST.len(),
        args.depth,
        args.server_threads,
        args.client_threads,
        args.seconds,
        args.warmup_seconds
    );
    for &connections in &args.connections {
        // rates[engine][rep]
        let mut rates = vec![Vec::new(); args.engines.len()];
        for rep in 0..args.reps {
            for (i, &kind) in args.engines.iter().enumerate() {
                let answered = Arc::new(AtomicU64::new(0));
                let shutdown = Shutdown::new();
                let engine = cellcache_io::start(
                    kind,
                    "127.0.0.1:0".parse().expect("loopback address"),
                    &engine_config(args),
                    Arc::new(Echo { answered }),
                    shutdown.clone(),
                )
                .expect("engine starts");
                let rate = load(engine.local_addr, connections, args);
                shutdown.trigger();
                engine.join();
                println!(
                    "  run connections={connections} rep={rep} engine={kind} req_per_sec={rate:.0}"
                );
                rates[i].push(rate);
            }
        }
        println!("connections={connections}:");
        let base = &rates[0];
        for (i, &kind) in args.engines.iter().enumerate() {
            let (min, med, max) = summary(&rates[i]);
            let ratios: Vec<f64> = rates[i].iter().zip(base).map(|(r, b)| r / b).collect();
            let (rmin, rmed, rmax) = summary(&ratios);
            println!(
                "  {kind:8} req/s min {min:>9.0} median {med:>9.0} max {max:>9.0} | ratio to {} min {rmin:.2} median {rmed:.2} max {rmax:.2}",
                args.engines[0]
            );
        }
    }
}

fn summary(values: &[f64]) -> (f64, f64, f64) {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    (v[0], v[v.len() / 2], v[v.len() - 1])
}

/// Closed-loop load: `connections` connections spread over the client threads, each
/// keeping `depth` requests in flight. Returns answered requests per second measured after
/// the warm-up.
fn load(addr: SocketAddr, connections: usize, args: &Args) -> f64 {
    let stop = Arc::new(AtomicBool::new(false));
    let counters: Vec<Arc<AtomicU64>> = (0..args.client_threads)
        .map(|_| Arc::new(AtomicU64::new(0)))
        .collect();
    let handles: Vec<_> = (0..args.client_threads)
        .map(|t| {
            let mine = (t..connections).step_by(args.client_threads).count();
            let (stop, counter, depth) = (stop.clone(), counters[t].clone(), args.depth);
            std::thread::spawn(move || client(addr, mine, depth, &stop, &counter))
        })
        .collect();
    let total = || {
        counters
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .sum::<u64>()
    };
    std::thread::sleep(Duration::from_secs_f64(args.warmup_seconds));
    let (start_count, start) = (total(), Instant::now());
    std::thread::sleep(Duration::from_secs_f64(args.seconds));
    let (end_count, elapsed) = (total(), start.elapsed());
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        if let Err(e) = h.join().expect("client thread") {
            eprintln!("client error: {e}");
        }
    }
    (end_count - start_count) as f64 / elapsed.as_secs_f64()
}

struct ClientConn {
    stream: TcpStream,
    /// Requests written but not answered.
    in_flight: usize,
    /// Bytes of a reply received so far (replies are exactly REQUEST.len()).
    partial: usize,
    /// Bytes of requests not yet written.
    unsent: Vec<u8>,
}

fn client(
    addr: SocketAddr,
    connections: usize,
    depth: usize,
    stop: &AtomicBool,
    answered: &AtomicU64,
) -> std::io::Result<()> {
    let mut poll = Poll::new()?;
    let mut conns = Vec::with_capacity(connections);
    for i in 0..connections {
        let std_stream = std::net::TcpStream::connect(addr)?;
        std_stream.set_nodelay(true)?;
        std_stream.set_nonblocking(true)?;
        let mut stream = TcpStream::from_std(std_stream);
        poll.registry().register(
            &mut stream,
            Token(i),
            Interest::READABLE | Interest::WRITABLE,
        )?;
        let mut conn = ClientConn {
            stream,
            in_flight: depth,
            partial: 0,
            unsent: REQUEST.repeat(depth),
        };
        flush(&mut conn)?;
        conns.push(conn);
    }
    let mut events = Events::with_capacity(1024);
    let mut buf = vec![0u8; 64 * 1024];
    while !stop.load(Ordering::Relaxed) {
        poll.poll(&mut events, Some(Duration::from_millis(100)))?;
        for event in events.iter() {
            let conn = &mut conns[event.token().0];
            if event.is_readable() {
                loop {
                    match conn.stream.read(&mut buf) {
                        Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                        Ok(n) => {
                            let bytes = conn.partial + n;
                            let replies = bytes / REQUEST.len();
                            conn.partial = bytes % REQUEST.len();
                            conn.in_flight -= replies.min(conn.in_flight);
                            answered.fetch_add(replies as u64, Ordering::Relaxed);
                            // Closed loop: one new request per answer.
                            for _ in 0..replies {
                                conn.unsent.extend_from_slice(REQUEST);
                            }
                            conn.in_flight += replies;
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(e),
                    }
                }
            }
            flush(conn)?;
        }
    }
    Ok(())
}

fn flush(conn: &mut ClientConn) -> std::io::Result<()> {
    while !conn.unsent.is_empty() {
        match conn.stream.write(&conn.unsent) {
            Ok(n) => {
                conn.unsent.drain(..n);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
