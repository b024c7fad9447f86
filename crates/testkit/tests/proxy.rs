//! The fault proxy in front of a real `cellcache serve`: traffic passes untouched, each
//! fault does what it says to new and to open connections, healing restores service, and
//! a recorded workload through a proxy that adds jitter and resets connections still
//! checks out (with unknown outcomes where connections broke).

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use cellcache_testkit::history::{CheckConfig, check};
use cellcache_testkit::process::{Server, ServerSpec};
use cellcache_testkit::proxy::{Faults, Mode, Proxy};
use cellcache_testkit::workload::{Workload, WorkloadConfig};

fn cellcache(name: &str) -> Server {
    Server::start(ServerSpec::cellcache(name).expect("cellcache binary")).expect("server starts")
}

fn connect(proxy: &Proxy, timeout: Duration) -> TcpStream {
    let stream = TcpStream::connect(proxy.addr()).expect("connect to proxy");
    stream.set_read_timeout(Some(timeout)).expect("timeout");
    stream
}

/// Sends `request` and reads until `expected_end` or an error.
fn roundtrip(
    stream: &mut TcpStream,
    request: &[u8],
    expected_end: &[u8],
) -> std::io::Result<Vec<u8>> {
    stream.write_all(request)?;
    let mut reply = Vec::new();
    let mut chunk = [0u8; 64 * 1024];
    while !reply.ends_with(expected_end) {
        let read = stream.read(&mut chunk)?;
        if read == 0 {
            return Err(ErrorKind::UnexpectedEof.into());
        }
        reply.extend_from_slice(&chunk[..read]);
    }
    Ok(reply)
}

const LONG: Duration = Duration::from_secs(10);

#[test]
fn passes_traffic_and_counts_it() {
    let server = cellcache("pass");
    let proxy = Proxy::to(server.addr()).expect("proxy");
    let mut stream = connect(&proxy, LONG);
    let reply = roundtrip(&mut stream, b"set a 0 0 1\r\nx\r\n", b"\r\n").expect("set");
    assert_eq!(reply, b"STORED\r\n");
    let reply = roundtrip(&mut stream, b"get a\r\n", b"END\r\n").expect("get");
    assert_eq!(reply, b"VALUE a 0 1\r\nx\r\nEND\r\n");
    assert_eq!(proxy.connections_accepted(), 1);
    assert!(proxy.bytes_forwarded() >= reply.len() as u64);
}

#[test]
fn latency_and_blackhole_stall_until_healed() {
    let server = cellcache("stall");
    let proxy = Proxy::to(server.addr()).expect("proxy");
    let mut stream = connect(&proxy, Duration::from_millis(100));
    roundtrip(&mut stream, b"version\r\n", b"\r\n").expect("passes before the fault");

    // 2 s each way cannot be answered within a 100 ms read timeout
    proxy.set_faults(Faults {
        latency: Duration::from_secs(2),
        ..Faults::default()
    });
    let error = roundtrip(&mut stream, b"version\r\n", b"\r\n").expect_err("delayed");
    assert!(
        matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
        "{error}"
    );

    proxy.set_mode(Mode::Blackhole);
    let mut fresh = connect(&proxy, Duration::from_millis(100));
    let error = roundtrip(&mut fresh, b"version\r\n", b"\r\n").expect_err("blackholed");
    assert!(
        matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
        "{error}"
    );

    proxy.heal();
    let mut healed = connect(&proxy, LONG);
    let reply = roundtrip(&mut healed, b"version\r\n", b"\r\n").expect("healed");
    assert!(reply.starts_with(b"VERSION"));
}

#[test]
fn reset_and_drop_close_open_and_new_connections() {
    let server = cellcache("reset");
    let proxy = Proxy::to(server.addr()).expect("proxy");
    let mut open = connect(&proxy, LONG);
    roundtrip(&mut open, b"version\r\n", b"\r\n").expect("passes");

    proxy.set_mode(Mode::Reset);
    let error = roundtrip(&mut open, b"version\r\n", b"\r\n").expect_err("reset");
    assert!(
        matches!(
            error.kind(),
            ErrorKind::ConnectionReset | ErrorKind::BrokenPipe
        ),
        "open connection: {error}"
    );
    let mut new = connect(&proxy, LONG);
    let error = roundtrip(&mut new, b"version\r\n", b"\r\n").expect_err("reset");
    assert!(
        matches!(
            error.kind(),
            ErrorKind::ConnectionReset | ErrorKind::BrokenPipe
        ),
        "new connection: {error}"
    );

    proxy.heal();
    let mut open = connect(&proxy, LONG);
    roundtrip(&mut open, b"version\r\n", b"\r\n").expect("healed");
    proxy.set_mode(Mode::Drop);
    let error = roundtrip(&mut open, b"version\r\n", b"\r\n").expect_err("dropped");
    assert!(
        matches!(
            error.kind(),
            ErrorKind::UnexpectedEof | ErrorKind::ConnectionReset | ErrorKind::BrokenPipe
        ),
        "{error}"
    );
}

#[test]
fn reset_connections_spares_later_ones() {
    let server = cellcache("oneshot");
    let proxy = Proxy::to(server.addr()).expect("proxy");
    let mut open = connect(&proxy, LONG);
    roundtrip(&mut open, b"version\r\n", b"\r\n").expect("passes");
    proxy.reset_connections();
    let error = roundtrip(&mut open, b"version\r\n", b"\r\n").expect_err("reset");
    assert!(
        matches!(
            error.kind(),
            ErrorKind::ConnectionReset | ErrorKind::BrokenPipe
        ),
        "{error}"
    );
    let mut later = connect(&proxy, LONG);
    roundtrip(&mut later, b"version\r\n", b"\r\n").expect("a later connection passes");
}

#[test]
fn bandwidth_cap_and_jitter_keep_bytes_intact_and_in_order() {
    let server = cellcache("bandwidth");
    let proxy = Proxy::to(server.addr()).expect("proxy");
    proxy.set_faults(Faults {
        jitter: Duration::from_millis(5),
        bandwidth_bytes_per_sec: Some(2 * 1024 * 1024),
        ..Faults::default()
    });
    let value: Vec<u8> = (0..200_000u32).map(|i| b'a' + (i % 26) as u8).collect();
    let mut stream = connect(&proxy, LONG);
    let mut request = format!("set big 0 0 {}\r\n", value.len()).into_bytes();
    request.extend_from_slice(&value);
    request.extend_from_slice(b"\r\n");
    let reply = roundtrip(&mut stream, &request, b"\r\n").expect("set through the cap");
    assert_eq!(reply, b"STORED\r\n");
    let reply = roundtrip(&mut stream, b"get big\r\n", b"END\r\n").expect("get through the cap");
    let header = format!("VALUE big 0 {}\r\n", value.len()).into_bytes();
    assert_eq!(&reply[..header.len()], &header[..]);
    assert_eq!(&reply[header.len()..header.len() + value.len()], &value[..]);
}

#[test]
fn bandwidth_cap_bounds_the_bytes_forwarded() {
    let server = cellcache("rate");
    let proxy = Proxy::to(server.addr()).expect("proxy");
    let rate = 20_000u64;
    proxy.set_faults(Faults {
        bandwidth_bytes_per_sec: Some(rate),
        ..Faults::default()
    });
    let value = vec![b'x'; 200_000];
    let mut request = format!("set slow 0 0 {}\r\n", value.len()).into_bytes();
    request.extend_from_slice(&value);
    request.extend_from_slice(b"\r\n");
    let mut stream = connect(&proxy, LONG);
    let started = std::time::Instant::now();
    let mut writer = stream.try_clone().expect("clone");
    let sender = std::thread::spawn(move || writer.write_all(&request));
    std::thread::sleep(Duration::from_millis(300));
    // a rate bound, not a duration: whatever the scheduler did, the proxy cannot have
    // written more than the cap allows for the time that passed (plus one pacing slice)
    let allowed = rate as f64 * started.elapsed().as_secs_f64() + (rate / 20) as f64;
    let forwarded = proxy.bytes_forwarded();
    assert!(forwarded > 0, "paced, not stalled");
    assert!(
        (forwarded as f64) <= allowed,
        "{forwarded} bytes forwarded, cap allows {allowed:.0}"
    );
    proxy.heal();
    sender.join().expect("sender").expect("request sent");
    let reply = roundtrip(&mut stream, b"", b"\r\n").expect("stored once healed");
    assert_eq!(reply, b"STORED\r\n");
}

#[test]
fn workload_through_flaky_proxy_checks_out() {
    let server = cellcache("flaky");
    let proxy = Proxy::to(server.addr()).expect("proxy");
    proxy.set_faults(Faults {
        latency: Duration::from_millis(1),
        jitter: Duration::from_millis(3),
        ..Faults::default()
    });
    for config in [
        WorkloadConfig::registers(vec![proxy.addr(), server.addr()]),
        WorkloadConfig::append_logs(vec![proxy.addr(), server.addr()]),
    ] {
        let workload = Workload::start(WorkloadConfig {
            request_timeout: Duration::from_millis(500),
            ..config
        })
        .expect("workload starts");
        for round in 1..=5 {
            assert!(workload.wait_completed(round * 100, LONG), "load flows");
            proxy.reset_connections();
        }
        let run = workload.finish();
        check(&run.history, CheckConfig::default()).assert_valid();
        assert_eq!(run.summary.final_reads_missing, 0);
        assert!(run.summary.ok > 0, "{:?}", run.summary);
    }
}

#[test]
fn flaky_connections_give_unknown_outcomes_that_check_out() {
    let server = cellcache("flaky-resets");
    let proxy = Proxy::to(server.addr()).expect("proxy");
    proxy.set_faults(Faults {
        reset_per_million: 50_000, // one chunk in 20
        ..Faults::default()
    });
    for config in [
        WorkloadConfig::registers(vec![proxy.addr()]),
        WorkloadConfig::append_logs(vec![proxy.addr()]),
    ] {
        let run = cellcache_testkit::workload::run(WorkloadConfig {
            attempts_max: 200,
            ..config
        })
        .expect("workload runs");
        assert!(run.summary.unknown > 0, "{:?}", run.summary);
        assert!(run.summary.ok > 0, "{:?}", run.summary);
        assert_eq!(run.summary.final_reads_missing, 0, "{:?}", run.summary);
        run.assert_valid("flaky-resets");
    }
}

#[test]
fn the_faultproxy_binary_takes_commands_on_stdin() {
    use std::io::BufRead;
    use std::process::{Command, Stdio};

    let server = cellcache("binary");
    let mut child = Command::new(env!("CARGO_BIN_EXE_cellcache-faultproxy"))
        .args(["--target", &server.addr().to_string(), "--latency-ms", "1"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn cellcache-faultproxy");
    let mut stdin = child.stdin.take().expect("stdin");
    let mut stdout = std::io::BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    stdout.read_line(&mut line).expect("banner");
    // "listening 127.0.0.1:PORT -> TARGET"
    let addr: std::net::SocketAddr = line
        .split_whitespace()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no address in {line:?}"));
    let ask = |request: &[u8]| -> std::io::Result<Vec<u8>> {
        let mut stream = TcpStream::connect(addr)?;
        stream.set_read_timeout(Some(LONG))?;
        roundtrip(&mut stream, request, b"\r\n")
    };
    assert!(ask(b"version\r\n").expect("passes").starts_with(b"VERSION"));

    let mut command = |text: &str| {
        writeln!(stdin, "{text}").expect("command");
        line.clear();
        stdout.read_line(&mut line).expect("status line");
        line.clone()
    };
    assert!(command("mode reset").contains("Reset"), "{line}");
    assert!(ask(b"version\r\n").is_err(), "reset by the proxy");
    assert!(command("heal").contains("Pass"), "{line}");
    assert!(ask(b"version\r\n").expect("healed").starts_with(b"VERSION"));
    let _ = child.kill();
    let _ = child.wait();
}
