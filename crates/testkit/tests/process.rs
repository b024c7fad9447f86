//! The process nemesis on real `cellcache serve` children: pause and resume (a request
//! sent while paused is answered after SIGCONT), kill -9 and restart (the restarted cell
//! is empty: the store is memory only), logs kept across restarts, children reaped on
//! drop, and a recorded workload across a pause and a kill/restart checked.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::Duration;

use cellcache_testkit::history::{CheckConfig, Violation, check};
use cellcache_testkit::process::{Server, ServerSpec, answers_version};
use cellcache_testkit::workload::{Workload, WorkloadConfig};
use nix::sys::signal::kill;
use nix::unistd::Pid;

fn cellcache(name: &str) -> Server {
    Server::start(ServerSpec::cellcache(name).expect("cellcache binary")).expect("server starts")
}

fn request(stream: &mut TcpStream, text: &str) -> std::io::Result<String> {
    stream.write_all(text.as_bytes())?;
    let mut line = String::new();
    BufReader::new(&*stream).read_line(&mut line)?;
    Ok(line)
}

#[test]
fn paused_server_answers_after_resume() {
    let server = cellcache("pause");
    let mut stream = TcpStream::connect(server.addr()).expect("connect");
    // Generous while the server runs (a loaded CI machine can take a while to answer);
    // short only for the one read that must find the server stopped.
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    assert_eq!(
        request(&mut stream, "set k 0 0 1\r\nv\r\n").expect("set"),
        "STORED\r\n"
    );

    server.pause().expect("SIGSTOP");
    stream
        .set_read_timeout(Some(Duration::from_millis(200)))
        .expect("timeout");
    let error = request(&mut stream, "get k\r\n").expect_err("no answer while paused");
    assert!(matches!(
        error.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    ));
    server.resume().expect("SIGCONT");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut line = String::new();
    BufReader::new(&stream)
        .read_line(&mut line)
        .expect("the request sent while paused is answered");
    assert_eq!(line, "VALUE k 0 1\r\n");
}

#[test]
fn kill9_and_restart_come_back_empty_with_one_log() {
    let mut server = cellcache("restart");
    let mut stream = TcpStream::connect(server.addr()).expect("connect");
    assert_eq!(
        request(&mut stream, "set k 0 0 1\r\nv\r\n").expect("set"),
        "STORED\r\n"
    );
    let pid = server.pid().expect("running");

    let status = server.kill9().expect("kill -9");
    assert!(!status.success());
    assert!(!server.is_running());
    assert!(!answers_version(server.addr(), Duration::from_millis(200)));
    assert!(server.pause().is_err(), "no process to signal");

    server.restart().expect("restart");
    assert_ne!(server.pid(), Some(pid));
    let mut stream = TcpStream::connect(server.addr()).expect("connect again");
    assert_eq!(request(&mut stream, "get k\r\n").expect("get"), "END\r\n");

    let log = server.log();
    assert!(log.contains("=== testkit: start 1"), "{log}");
    assert!(log.contains("=== testkit: killed with SIGKILL"), "{log}");
    assert!(log.contains("=== testkit: start 2"), "{log}");
}

#[test]
fn dropping_a_server_reaps_it() {
    let server = cellcache("drop");
    let pid = Pid::from_raw(server.pid().expect("running") as i32);
    drop(server);
    assert_eq!(kill(pid, None), Err(nix::errno::Errno::ESRCH));
}

#[test]
fn workload_across_pause_and_kill_is_checked() {
    let mut server = cellcache("nemesis");
    let workload = Workload::start(WorkloadConfig {
        request_timeout: Duration::from_millis(200),
        ops_per_client: 100_000,
        ..WorkloadConfig::registers(vec![server.addr()])
    })
    .expect("workload starts");
    let long = Duration::from_secs(20);
    assert!(workload.wait_completed(200, long));

    server.pause().expect("SIGSTOP");
    std::thread::sleep(Duration::from_millis(400));
    server.resume().expect("SIGCONT");
    let done = workload.completed();
    assert!(workload.wait_completed(done + 200, long), "load resumes");

    server.kill9().expect("kill -9");
    server.restart().expect("restart");
    let done = workload.completed();
    assert!(workload.wait_completed(done + 200, long), "load resumes");
    let run = workload.finish();
    assert!(
        run.summary.unknown + run.summary.failed > 0,
        "{:?}",
        run.summary
    );

    // a restarted single memcached-style server forgets everything: the checker must
    // see lost writes: 8 keys, hundreds of writes before the kill and reads after it
    let report = check(&run.history, CheckConfig::default());
    assert!(
        report
            .violations
            .iter()
            .all(|v| matches!(v, Violation::NotLinearizable { .. })),
        "{report}"
    );
    assert!(
        !report.is_valid(),
        "a restart of a lone cell loses data: {report}"
    );
}
