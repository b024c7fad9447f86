//! Engine-only overhead: the three I/O engines serving a toy line-echo protocol (no
//! memcached parsing, no store), driven by a closed-loop load generator that keeps
//! `depth` requests in flight on each of `connections` connections.
//!
//! Modes:
//! - `bench` (default): for each connection count, repetitions interleaved across engines
//!   (A,B,C,A,B,C,...); the engine runs in a child process (`serve`) so its CPU time per
//!   request can be measured apart from the load generator's; prints req/s and server CPU
//!   µs per request per run, and min/median/max of both and of their per-rep ratios to
//!   the first engine of the list.
//! - `serve --engine E --port P --seconds S`: the server alone (for `strace -c -f`); prints
//!   the requests it answered and its CPU time, so syscalls and CPU can be divided by
//!   requests. `--seconds 0` serves until stdin closes.
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
    fn open(&self, _conn: cellcache_io::Accepted, _notify: Notify) -> EchoSession {
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

/// Total CPU time of this process so far (all threads, including exited ones).
fn process_cpu_seconds() -> f64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    t.tv_sec as f64 + t.tv_nsec as f64 / 1e9
}

/// Runs one engine until `--seconds` pass (0: until stdin closes), then prints what it
/// answered and the CPU it used. The first stdout line is `addr=<listening address>`.
fn serve(args: &Args) {
    let kind = args.engines[0];
    let answered = Arc::new(AtomicU64::new(0));
    let shutdown = Shutdown::new();
    let cpu_before = process_cpu_seconds();
    let engine = cellcache_io::start(
        kind,
        &[SocketAddr::from(([127, 0, 0, 1], args.port))],
        &engine_config(args),
        Arc::new(Echo {
            answered: answered.clone(),
        }),
        shutdown.clone(),
    )
    .expect("engine starts");
    println!("addr={}", engine.local_addr);
    let _ = std::io::stdout().flush();
    if args.seconds > 0.0 {
        std::thread::sleep(Duration::from_secs_f64(args.seconds));
    } else {
        // The parent closes our stdin when its load is done.
        let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
    }
    shutdown.trigger();
    let running = engine.engine;
    engine.join();
    let cpu = process_cpu_seconds() - cpu_before;
    let requests = answered.load(Ordering::Relaxed);
    println!(
        "engine={running} requests_answered={requests} cpu_seconds={cpu:.3} cpu_us_per_request={:.3}",
        cpu * 1e6 / requests.max(1) as f64
    );
}

/// One measured run: the engine in a child process (so its CPU time is its own), the
/// load generator here. Returns (requests per second, server CPU µs per request).
fn run_once(kind: IoEngineKind, connections: usize, args: &Args) -> Result<(f64, f64), String> {
    use std::io::BufRead;
    use std::process::{Command, Stdio};
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut child = Command::new(exe)
        .args([
            "serve",
            "--engine",
            kind.as_str(),
            "--seconds",
            "0",
            "--server-threads",
            &args.server_threads.to_string(),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    let mut out = std::io::BufReader::new(child.stdout.take().ok_or("no child stdout")?);
    let mut line = String::new();
    out.read_line(&mut line).map_err(|e| e.to_string())?;
    let addr: SocketAddr = line
        .trim()
        .strip_prefix("addr=")
        .ok_or_else(|| format!("unexpected server output {line:?}"))?
        .parse()
        .map_err(|e| format!("{e}"))?;
    let rate = load(addr, connections, args);
    drop(child.stdin.take());
    line.clear();
    out.read_line(&mut line).map_err(|e| e.to_string())?;
    let _ = child.wait();
    let cpu_per_request = line
        .split_whitespace()
        .find_map(|f| f.strip_prefix("cpu_us_per_request="))
        .ok_or_else(|| format!("unexpected server output {line:?}"))?
        .parse()
        .map_err(|e| format!("{e}"))?;
    Ok((rate, cpu_per_request))
}

fn bench(args: &Args) {
    println!(
        "engine-only overhead (toy echo, {}-byte requests), depth={}, server_threads={}, client_threads={}, {}s per run after {}s warm-up, engine in a child process",
        REQUEST.len(),
        args.depth,
        args.server_threads,
        args.client_threads,
        args.seconds,
        args.warmup_seconds
    );
    for &connections in &args.connections {
        // [engine][rep] of (req/s, server CPU µs per request)
        let mut runs = vec![Vec::new(); args.engines.len()];
        for rep in 0..args.reps {
            for (i, &kind) in args.engines.iter().enumerate() {
                match run_once(kind, connections, args) {
                    Ok((rate, cpu)) => {
                        println!(
                            "  run connections={connections} rep={rep} engine={kind} req_per_sec={rate:.0} server_cpu_us_per_request={cpu:.2}"
                        );
                        runs[i].push((rate, cpu));
                    }
                    Err(e) => {
                        eprintln!("engine_bench: run {kind} failed: {e}");
                        std::process::exit(1);
                    }
                }
            }
        }
        println!("connections={connections} depth={}:", args.depth);
        let base = &runs[0];
        for (i, &kind) in args.engines.iter().enumerate() {
            let rates: Vec<f64> = runs[i].iter().map(|r| r.0).collect();
            let cpus: Vec<f64> = runs[i].iter().map(|r| r.1).collect();
            let rate_ratios: Vec<f64> = runs[i].iter().zip(base).map(|(r, b)| r.0 / b.0).collect();
            let cpu_ratios: Vec<f64> = runs[i].iter().zip(base).map(|(r, b)| r.1 / b.1).collect();
            let (min, med, max) = summary(&rates);
            let (cmin, cmed, cmax) = summary(&cpus);
            let (rmin, rmed, rmax) = summary(&rate_ratios);
            let (qmin, qmed, qmax) = summary(&cpu_ratios);
            println!(
                "  {kind:8} req/s {min:>8.0} / {med:>8.0} / {max:>8.0} (x{rmin:.2} / x{rmed:.2} / x{rmax:.2})   cpu us/req {cmin:>5.2} / {cmed:>5.2} / {cmax:>5.2} (x{qmin:.2} / x{qmed:.2} / x{qmax:.2})"
            );
        }
        println!(
            "  (min / median / max over {} interleaved reps; ratios are per rep, to {})",
            args.reps, args.engines[0]
        );
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
