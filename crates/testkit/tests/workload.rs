//! The workload driver against real servers and against a deliberately broken one: the
//! recorded history of a correct server (Debian's memcached) passes the checker, the
//! history of a server that acknowledges writes and then loses some fails it, and a server
//! that stalls past the request timeout yields unknown outcomes that still pass.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cellcache_testkit::history::{CheckConfig, Violation, check};
use cellcache_testkit::workload::{self, Shape, WorkloadConfig};

/// A `memcached` child on a free loopback port, killed on drop.
struct Memcached {
    child: Child,
    addr: SocketAddr,
}

impl Drop for Memcached {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn memcached() -> Option<Memcached> {
    let port = TcpListener::bind("127.0.0.1:0")
        .ok()?
        .local_addr()
        .ok()?
        .port();
    let child = match Command::new("memcached")
        .args(["-l", "127.0.0.1", "-U", "0", "-p", &port.to_string()])
        // memcached refuses to run as root without -u, and ignores -u otherwise
        .args(["-u", "root"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
    {
        Ok(child) => child,
        Err(error) => {
            println!("SKIPPED: memcached is not runnable here ({error}); .ci/run installs it");
            return None;
        }
    };
    let server = Memcached {
        child,
        addr: SocketAddr::from(([127, 0, 0, 1], port)),
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(server.addr).is_err() {
        assert!(
            Instant::now() < deadline,
            "memcached did not start listening"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    Some(server)
}

#[test]
fn registers_against_memcached_pass() {
    let Some(server) = memcached() else { return };
    let mut config = WorkloadConfig::registers(vec![server.addr, server.addr]);
    config.ops_per_client = 300;
    let run = workload::run(config).expect("workload runs");
    let report = check(&run.history, CheckConfig::default());
    report.assert_valid();
    assert_eq!(run.summary.final_reads_missing, 0);
    assert!(run.summary.ok >= 4 * 300, "{:?}", run.summary);
    assert_eq!(run.summary.unknown + run.summary.failed, 0);
}

#[test]
fn append_logs_against_memcached_pass() {
    let Some(server) = memcached() else { return };
    let run = workload::run(WorkloadConfig::append_logs(vec![server.addr])).expect("runs");
    check(&run.history, CheckConfig::default()).assert_valid();
    assert_eq!(run.summary.final_reads_missing, 0);
}

/// What the toy server gets wrong.
#[derive(Clone, Copy)]
enum Flaw {
    /// Acknowledges every write but forgets every `n`th one.
    ForgetEvery(u64),
    /// Applies every `n`th write, then never answers it (the client times out).
    StallEvery(u64),
}

/// A minimal memcached (set/append/get) with a flaw, on a loopback port.
fn toy_server(flaw: Flaw) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
    let addr = listener.local_addr().expect("local addr");
    let store: Arc<Mutex<HashMap<String, Vec<u8>>>> = Arc::default();
    let writes = Arc::new(AtomicU64::new(0));
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let (store, writes) = (store.clone(), writes.clone());
            std::thread::spawn(move || serve(stream, &store, &writes, flaw));
        }
    });
    addr
}

fn serve(
    stream: TcpStream,
    store: &Mutex<HashMap<String, Vec<u8>>>,
    writes: &AtomicU64,
    flaw: Flaw,
) {
    let mut out = stream.try_clone().expect("clone stream");
    let mut input = BufReader::new(stream);
    let mut line = String::new();
    while input.read_line(&mut line).is_ok_and(|n| n > 0) {
        let words: Vec<String> = line.split_whitespace().map(str::to_owned).collect();
        line.clear();
        let reply: Vec<u8> = match words.first().map(String::as_str) {
            Some("get") => match store.lock().expect("store").get(&words[1]) {
                Some(v) => [
                    format!("VALUE {} 0 {}\r\n", words[1], v.len()).as_bytes(),
                    v,
                    b"\r\nEND\r\n",
                ]
                .concat(),
                None => b"END\r\n".to_vec(),
            },
            Some(command @ ("set" | "append")) => {
                let length: usize = words[4].parse().expect("length");
                let mut data = vec![0; length + 2];
                if input.read_exact(&mut data).is_err() {
                    return;
                }
                data.truncate(length);
                let n = writes.fetch_add(1, Ordering::Relaxed) + 1;
                let mut store = store.lock().expect("store");
                let forget = matches!(flaw, Flaw::ForgetEvery(k) if n % k == 0);
                let reply = match (command, store.get_mut(&words[1])) {
                    (_, _) if forget => b"STORED\r\n".to_vec(),
                    ("set", _) => {
                        store.insert(words[1].clone(), data);
                        b"STORED\r\n".to_vec()
                    }
                    (_, Some(log)) => {
                        log.extend_from_slice(&data);
                        b"STORED\r\n".to_vec()
                    }
                    (_, None) => b"NOT_STORED\r\n".to_vec(),
                };
                if matches!(flaw, Flaw::StallEvery(k) if n % k == 0) {
                    drop(store);
                    std::thread::sleep(Duration::from_millis(300));
                    return; // the connection closes without a reply
                }
                reply
            }
            _ => b"ERROR\r\n".to_vec(),
        };
        if out.write_all(&reply).is_err() {
            return;
        }
    }
}

#[test]
fn server_that_forgets_acknowledged_writes_fails_the_check() {
    for shape in [
        Shape::Registers { read_percent: 50 },
        Shape::AppendLogs { read_percent: 20 },
    ] {
        let mut config = WorkloadConfig::registers(vec![toy_server(Flaw::ForgetEvery(7))]);
        config.shape = shape;
        let run = workload::run(config).expect("workload runs");
        let report = check(&run.history, CheckConfig::default());
        assert!(!report.is_valid(), "{shape:?}: lost writes went unnoticed");
        assert!(
            report.violations.iter().all(|v| matches!(
                v,
                Violation::NotLinearizable { .. }
                    | Violation::LostToken { .. }
                    | Violation::Diverged { .. }
                    | Violation::KeyLost { .. }
            )),
            "{report}"
        );
    }
}

#[test]
fn a_failed_run_keeps_its_history_for_the_post_mortem() {
    let config = WorkloadConfig::registers(vec![toy_server(Flaw::ForgetEvery(5))]);
    let run = workload::run(config).expect("workload runs");
    let path = cellcache_testkit::process::default_log_dir().join("forgetful.history");
    let _ = std::fs::remove_file(&path);
    let failed = std::panic::catch_unwind(|| run.assert_valid("forgetful"));
    assert!(failed.is_err(), "lost writes must fail the run");
    let saved = std::fs::read_to_string(&path).expect("history saved");
    assert_eq!(saved.lines().count(), run.history.len() / 2);
}

#[test]
fn timeouts_are_unknown_and_still_pass() {
    for shape in [
        Shape::Registers { read_percent: 50 },
        Shape::AppendLogs { read_percent: 20 },
    ] {
        let mut config = WorkloadConfig::registers(vec![toy_server(Flaw::StallEvery(13))]);
        config.shape = shape;
        config.ops_per_client = 100;
        config.request_timeout = Duration::from_millis(100);
        let run = workload::run(config).expect("workload runs");
        assert!(run.summary.unknown > 0, "{:?}", run.summary);
        check(&run.history, CheckConfig::default()).assert_valid();
    }
}
