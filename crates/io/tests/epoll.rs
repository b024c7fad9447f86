//! Engine behaviour with a toy line protocol: each `\n`-terminated line is answered with
//! the line upper-cased; the line `quit` closes the connection. No memcached here: these
//! tests pin down what the engine promises any session (ordering, partial reads,
//! pipelining, connection limit, backpressure, graceful shutdown).

use cellcache_io::{EngineConfig, Notify, Progress, Service, Session, Shutdown, epoll};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

struct Upper {
    consumed_total: Arc<AtomicUsize>,
}

struct UpperSession {
    consumed_total: Arc<AtomicUsize>,
    notify: Notify,
    deferred: Arc<AtomicUsize>,
}

impl Service for Upper {
    type Session = UpperSession;
    fn open(&self, _peer: SocketAddr, notify: Notify) -> UpperSession {
        UpperSession {
            consumed_total: self.consumed_total.clone(),
            notify,
            deferred: Arc::new(AtomicUsize::new(0)),
        }
    }
}

impl Session for UpperSession {
    fn on_input(&mut self, input: &[u8], output: &mut Vec<u8>, budget: usize) -> Progress {
        let mut p = Progress::default();
        while let Some(nl) = input[p.consumed..].iter().position(|&b| b == b'\n') {
            if output.len() >= budget {
                p.output_full = true;
                break;
            }
            let line = &input[p.consumed..p.consumed + nl];
            p.consumed += nl + 1;
            if line == b"quit" {
                p.close = true;
                break;
            }
            if line == b"defer" {
                // Answered later, from another thread, through the notify path.
                let (notify, deferred) = (self.notify.clone(), self.deferred.clone());
                std::thread::spawn(move || {
                    deferred.fetch_add(1, Ordering::Release);
                    notify.notify();
                });
                continue;
            }
            output.extend(line.iter().map(u8::to_ascii_uppercase));
            output.push(b'\n');
        }
        self.consumed_total.fetch_add(p.consumed, Ordering::Relaxed);
        p
    }

    fn on_notify(&mut self, output: &mut Vec<u8>, _budget: usize) -> Progress {
        for _ in 0..self.deferred.swap(0, Ordering::Acquire) {
            output.extend_from_slice(b"DEFERRED\n");
        }
        Progress::default()
    }
}

fn start(config: EngineConfig) -> (cellcache_io::RunningEngine, Shutdown, Arc<AtomicUsize>) {
    let consumed = Arc::new(AtomicUsize::new(0));
    let shutdown = Shutdown::new();
    let engine = epoll::start(
        "127.0.0.1:0".parse().unwrap(),
        &config,
        Arc::new(Upper {
            consumed_total: consumed.clone(),
        }),
        shutdown.clone(),
    )
    .expect("engine starts");
    (engine, shutdown, consumed)
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

#[test]
fn answers_pipelined_and_byte_by_byte_input_in_order() {
    let (engine, shutdown, _) = start(EngineConfig {
        threads: 2,
        ..Default::default()
    });
    let mut s = connect(engine.local_addr);
    s.write_all(b"one\ntwo\nthr").unwrap();
    for b in b"ee\nfour\n" {
        s.write_all(&[*b]).unwrap();
    }
    let mut r = BufReader::new(s.try_clone().unwrap());
    for want in ["ONE\n", "TWO\n", "THREE\n", "FOUR\n"] {
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        assert_eq!(line, want);
    }
    s.write_all(b"quit\n").unwrap();
    let mut rest = Vec::new();
    r.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty(), "quit closes without further output");
    shutdown.trigger();
    engine.join();
}

#[test]
fn refuses_connections_past_the_limit_with_memcached_error() {
    let (engine, shutdown, _) = start(EngineConfig {
        threads: 1,
        max_connections: 1,
        ..Default::default()
    });
    let mut first = connect(engine.local_addr);
    first.write_all(b"hi\n").unwrap();
    let mut line = String::new();
    BufReader::new(first.try_clone().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "HI\n");
    let mut second = connect(engine.local_addr);
    let mut reply = Vec::new();
    second.read_to_end(&mut reply).unwrap();
    assert_eq!(reply, b"ERROR Too many open connections\r\n");
    assert_eq!(engine.stats.snapshot().rejected_connections, 1);
    shutdown.trigger();
    engine.join();
}

#[test]
fn stops_reading_from_a_client_that_does_not_read_replies() {
    let high = 64 * 1024;
    let (engine, shutdown, consumed) = start(EngineConfig {
        threads: 1,
        output_buffer_high_bytes: high,
        ..Default::default()
    });
    let s = connect(engine.local_addr);
    s.set_write_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut w = s.try_clone().unwrap();
    let mut msg = vec![b'x'; 1023];
    msg.push(b'\n');
    let mut sent = 0usize;
    // Write until the kernel buffers on both sides are full and the server stops reading.
    for _ in 0..200_000 {
        match w.write_all(&msg) {
            Ok(()) => sent += msg.len(),
            Err(_) => break,
        }
    }
    let handled = consumed.load(Ordering::Relaxed);
    assert!(
        handled < sent,
        "server must stop consuming: handled {handled} of {sent}"
    );
    assert!(
        sent < 200_000 * 1024,
        "writes never blocked: no backpressure"
    );
    shutdown.trigger();
    engine.join();
}

#[test]
fn graceful_shutdown_answers_what_was_received_then_closes() {
    let (engine, shutdown, _) = start(EngineConfig {
        threads: 1,
        ..Default::default()
    });
    let mut s = connect(engine.local_addr);
    s.write_all(b"last\n").unwrap();
    let mut line = String::new();
    let mut r = BufReader::new(s.try_clone().unwrap());
    r.read_line(&mut line).unwrap();
    assert_eq!(line, "LAST\n");
    shutdown.trigger();
    let mut rest = Vec::new();
    r.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty());
    let addr = engine.local_addr;
    engine.join();
    assert!(
        TcpStream::connect(addr).is_err(),
        "listener must be closed after shutdown"
    );
}

#[test]
fn notify_from_another_thread_delivers_deferred_output() {
    let (engine, shutdown, _) = start(EngineConfig {
        threads: 2,
        ..Default::default()
    });
    let mut s = connect(engine.local_addr);
    s.write_all(b"defer\n").unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    assert_eq!(line, "DEFERRED\n");
    shutdown.trigger();
    engine.join();
}
