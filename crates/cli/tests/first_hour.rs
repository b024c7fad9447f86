//! A new user's first hour: what the binary says when something is wrong — one
//! line per error, the path as typed, no backtrace, no colour codes in a log file, every
//! flag's default in `--help`. Each test runs the real binary with a bounded wait.

mod common;

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A bound on how long one command may run before the test calls it hung (never a claim
/// about speed).
const HANG_GUARD: Duration = Duration::from_secs(30);

fn cellcache() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_cellcache"));
    c.stdin(Stdio::null());
    c
}

/// Runs `cmd` to completion (killing it after [`HANG_GUARD`]) and returns its output.
fn run(mut cmd: Command) -> Output {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("cellcache starts");
    let deadline = Instant::now() + HANG_GUARD;
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() >= deadline {
            let _ = child.kill();
            panic!("{cmd:?} did not exit");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("output")
}

/// Asserts that `out` failed with exactly one line on stderr, starting `error: `, and
/// returns that line.
fn one_error_line(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !out.status.success(),
        "expected a failure, stderr: {stderr}"
    );
    assert_eq!(
        out.status.code(),
        Some(1),
        "an exit status, not a signal: {stderr}"
    );
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line, got: {stderr}");
    assert!(lines[0].starts_with("error: "), "{stderr}");
    lines[0].to_string()
}

fn scratch_dir(name: &str) -> PathBuf {
    let dir = cellcache_testkit::process::scratch_dir(&format!("first-hour-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn config_errors_are_one_line_naming_the_path_as_typed_without_backtrace() {
    let dir = scratch_dir("config");
    std::fs::write(
        dir.join("bad.toml"),
        "[store]\nmemory_limit_bytes = \"lots\"\n",
    )
    .unwrap();
    std::fs::create_dir_all(dir.join("conf.d")).unwrap();
    let cases = [
        ("missing.toml", "config file missing.toml does not exist"),
        ("conf.d", "config file conf.d is not a file"),
        ("./bad.toml", "config file ./bad.toml: "),
    ];
    for (path, expected) in cases {
        let mut cmd = cellcache();
        cmd.current_dir(&dir)
            .args(["serve", "-p", "0", "--config", path])
            .env("RUST_BACKTRACE", "1");
        let line = one_error_line(&run(cmd));
        assert!(line.contains(expected), "{path}: {line}");
        // The path as typed, never rewritten to an absolute one.
        assert!(!line.contains(&*dir.to_string_lossy()), "{line}");
    }
}

/// A bad auth file (`-Y`) stops the start with one line naming the file as typed and the
/// line at fault, never a password; a file others may read is used, with a warning.
#[test]
fn auth_file_errors_are_one_line_and_a_readable_file_is_a_warning() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = scratch_dir("auth");
    std::fs::write(dir.join("bad"), "alice:secret\nbob\n").unwrap();
    std::fs::write(dir.join("empty"), "\n").unwrap();
    for (path, expected) in [
        ("missing", "reading the auth file missing"),
        ("bad", "the auth file bad, line 2: no ':'"),
        ("empty", "the auth file empty has no user:password line"),
    ] {
        let mut cmd = cellcache();
        cmd.current_dir(&dir)
            .args(["serve", "--standalone", "-p", "0", "-m", "8", "-Y", path]);
        let line = one_error_line(&run(cmd));
        assert!(line.contains(expected), "{path}: {line}");
        assert!(!line.contains("secret"), "{line}");
    }
    let readable = dir.join("readable");
    std::fs::write(&readable, "alice:secret\n").unwrap();
    std::fs::set_permissions(&readable, std::fs::Permissions::from_mode(0o644)).unwrap();
    let log = dir.join("cell.log");
    let child = cellcache()
        .args(["serve", "--standalone", "-p", "0", "-m", "8", "-Y"])
        .arg(&readable)
        .env("CELLCACHE_LOG__LEVEL", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let _cell = KillOnDrop(child);
    wait_for_log(&log, "listening");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("auth file is readable by other users"),
        "{text}"
    );
    assert!(!text.contains("secret"), "{text}");
}

#[test]
fn an_invalid_flag_value_says_the_cause_once() {
    let mut cmd = cellcache();
    cmd.args(["serve", "-p", "0", "-I", "512"])
        .env("RUST_BACKTRACE", "1");
    let line = one_error_line(&run(cmd));
    assert!(line.contains("1024"), "{line}");
    // Each cause once: no clause of the message repeats.
    let clauses: Vec<&str> = line.split(": ").collect();
    for (i, c) in clauses.iter().enumerate() {
        assert!(!clauses[i + 1..].contains(c), "{c:?} repeated in {line}");
    }
}

#[test]
fn a_log_file_gets_no_colour_codes() {
    let dir = scratch_dir("log");
    let log = std::fs::File::create(dir.join("cell.log")).unwrap();
    let mut child = cellcache()
        .args(["serve", "--standalone", "-p", "0", "-m", "8"])
        .env_remove("NO_COLOR")
        .env("CELLCACHE_LOG__LEVEL", "info")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    common::wait_until(
        "the cell logged that it listens",
        HANG_GUARD,
        Duration::from_millis(20),
        || {
            std::fs::read_to_string(dir.join("cell.log"))
                .unwrap_or_default()
                .contains("listening")
        },
    );
    let _ = child.kill();
    let _ = child.wait();
    let text = std::fs::read_to_string(dir.join("cell.log")).unwrap();
    assert!(
        !text.contains('\x1b'),
        "colour codes in a log file:\n{text}"
    );
}

/// MemTotal of this machine in MiB (the test runs on Linux, where /proc is mounted).
fn mem_total_mib() -> u64 {
    let text = std::fs::read_to_string("/proc/meminfo").expect("/proc/meminfo");
    let kb: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("MemTotal");
    kb >> 10
}

#[test]
fn a_memory_limit_above_the_machine_is_a_clear_error_not_an_abort() {
    // Four times what the machine has: refused before a byte is allocated, with an exit
    // status (1), not SIGABRT from a failed allocation.
    let mib = (mem_total_mib() * 4).to_string();
    for mode in [&["--standalone"][..], &[][..]] {
        let mut cmd = cellcache();
        cmd.args(["serve", "-p", "0", "-m", &mib])
            .args(mode)
            .env("RUST_BACKTRACE", "1");
        let line = one_error_line(&run(cmd));
        assert!(line.contains("memory"), "{line}");
        assert!(line.contains("-m"), "names the flag to change: {line}");
    }
}

/// A loopback port nobody listens on now, whose next two ports and their peer (+10000) and
/// admin (+20000) ports are free too (room for a `cluster up` of up to three cells).
fn free_cell_port() -> u16 {
    for _ in 0..500 {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let free = |p: u16| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok();
        if port < 45_000
            && (0..3).all(|i| free(port + i) && free(port + i + 10_000) && free(port + i + 20_000))
        {
            return port;
        }
    }
    panic!("no free port block");
}

/// Reads a growing log file until it contains `needle` (bounded by [`HANG_GUARD`]).
fn wait_for_log(path: &std::path::Path, needle: &str) {
    let deadline = Instant::now() + HANG_GUARD;
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.contains(needle) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{} never said {needle:?}; it says:\n{text}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A cell that must not outlive a failed test.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Whether a server at `addr` answers `version` (a listener alone is not a cell yet).
fn answers_version(addr: std::net::SocketAddr) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(addr) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let mut buf = [0u8; 64];
    s.write_all(b"version\r\n").is_ok()
        && s.read(&mut buf)
            .is_ok_and(|n| buf[..n].starts_with(b"VERSION "))
}

/// Sends SIGTERM and waits for the exit (the bound is a hang guard, not a speed claim).
fn terminate(child: &mut std::process::Child, what: &str) -> std::process::ExitStatus {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what}: SIGTERM did not stop it");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_signal_stops_a_cell_that_is_still_trying_to_join() {
    let dir = scratch_dir("join");
    let log = dir.join("cell.log");
    let nobody = free_cell_port();
    let port = free_cell_port();
    let mut child = cellcache()
        .args(["serve", "-p", &port.to_string(), "--state-dir", "off"])
        .args(["--join", &format!("127.0.0.1:{nobody}")])
        .env("CELLCACHE_LOG__LEVEL", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    wait_for_log(&log, "join not accepted yet");
    let status = terminate(&mut child, "a joining cell");
    assert_eq!(status.code(), Some(1), "start-up failed, so status 1");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("abandoned the join"), "{text}");
}

#[test]
fn a_signal_stops_a_cell_receiving_its_range_and_says_so() {
    let dir = scratch_dir("handoff");
    let first = free_cell_port();
    // The first cell streams hand-offs at 64 KiB/s: 2 MiB of items keep a joining cell
    // receiving its half for several seconds, long enough to catch it there.
    let parent = cellcache()
        .args(["serve", "-p", &first.to_string(), "--state-dir", "off"])
        .env("CELLCACHE_CLUSTER__HANDOFF_BYTES_PER_SEC", "65536")
        .env("CELLCACHE_LOG__LEVEL", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut parent = KillOnDrop(parent);
    let addr: std::net::SocketAddr = format!("127.0.0.1:{first}").parse().unwrap();
    common::wait_until(
        "the first cell answers",
        HANG_GUARD,
        Duration::from_millis(20),
        || answers_version(addr),
    );
    let mut c = common::Client::to(addr);
    let value = vec![b'v'; 1000];
    for i in 0..2048 {
        let mut req = format!("set key{i} 0 0 {}\r\n", value.len()).into_bytes();
        req.extend_from_slice(&value);
        req.extend_from_slice(b"\r\n");
        c.roundtrip(&req, b"STORED\r\n");
    }
    let log = dir.join("joiner.log");
    let port = free_cell_port();
    let mut joiner = cellcache()
        .args(["serve", "-p", &port.to_string(), "--state-dir", "off"])
        .args(["--join", &format!("127.0.0.1:{}", first + 10_000)])
        .env("CELLCACHE_LOG__LEVEL", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    wait_for_log(&log, "ring membership");
    let status = terminate(&mut joiner, "a cell receiving its range");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("abandoned") && text.contains("joining the ring"),
        "exit {status}; log:\n{text}"
    );
    terminate(&mut parent.0, "the first cell");
}

#[test]
fn cluster_up_with_a_port_in_use_reports_it_and_leaves_no_process() {
    let dir = scratch_dir("up");
    let base = free_cell_port();
    // Cell 2's client port is taken by someone else.
    let _squatter = std::net::TcpListener::bind(("127.0.0.1", base + 1)).ok();
    let mut cmd = cellcache();
    cmd.args([
        "cluster",
        "up",
        "--cells",
        "3",
        "--base-port",
        &base.to_string(),
    ])
    .args(["--run-file", &dir.join("ring.pids").to_string_lossy()])
    .args(["--", "--state-dir", "off", "--log-level", "warn"]);
    let out = run(cmd);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stdout}{stderr}");
    assert!(!stdout.contains("cell 2 up"), "claimed success: {stdout}");
    assert!(
        stderr.contains(&format!("127.0.0.1:{}", base + 1)),
        "{stderr}"
    );
    assert!(stderr.contains("not free"), "{stderr}");
    // Cell 1 started and was stopped: its pid, printed when it came up, is gone.
    let pid = stdout
        .lines()
        .find_map(|l| l.strip_prefix("cell 1 up: "))
        .and_then(|l| l.split_whitespace().last())
        .expect("cell 1 came up first");
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "cell 1 (pid {pid}) left running"
    );
    assert!(!dir.join("ring.pids").exists(), "run file left behind");
}

#[test]
fn cluster_down_stops_exactly_the_ring_up_started() {
    let dir = scratch_dir("down");
    let run_file = dir.join("ring.pids").to_string_lossy().into_owned();
    let base = free_cell_port();
    let mut up = cellcache()
        .args([
            "cluster",
            "up",
            "--cells",
            "2",
            "--base-port",
            &base.to_string(),
        ])
        .args(["--run-file", &run_file])
        .args(["--", "--state-dir", "off", "--log-level", "warn"])
        .stdout(std::fs::File::create(dir.join("up.out")).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for_log(&dir.join("up.out"), "ring of 2 up");
    let mut pid = cellcache();
    pid.args(["cluster", "pid", "2", "--base-port", &base.to_string()])
        .args(["--run-file", &run_file]);
    let out = run(pid);
    assert!(out.status.success());
    let cell2: u32 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    let mut down = cellcache();
    down.args(["cluster", "down", "--base-port", &base.to_string()])
        .args(["--run-file", &run_file]);
    let out = run(down);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!std::path::Path::new(&format!("/proc/{cell2}")).exists());
    let status = terminate(&mut up, "cluster up after cluster down");
    assert!(status.success(), "cluster up exits 0 once stopped");
}

/// A cell whose log reader went away (`serve 2>&1 | head -2`, a log shipper that died)
/// still stops on SIGTERM: a log line it cannot write is dropped, it does not kill the
/// thread that handles signals (it did: the cell then ignored every SIGTERM).
#[test]
fn a_signal_stops_a_cell_whose_log_pipe_is_closed() {
    let port = free_cell_port();
    let child = cellcache()
        .args(["serve", "--standalone", "-p", &port.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start a cell");
    let mut cell = KillOnDrop(child);
    // The reader goes away: every later log line meets a closed pipe.
    drop(cell.0.stderr.take());
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let deadline = Instant::now() + HANG_GUARD;
    while !answers_version(addr) {
        assert!(Instant::now() < deadline, "the cell never answered");
        std::thread::sleep(Duration::from_millis(20));
    }
    let status = terminate(&mut cell.0, "a cell with a closed log pipe");
    assert!(status.success(), "{status}");
}

/// As memcached: `-I` above half of `-m` is refused at start, with memcached's reason.
#[test]
fn an_item_size_over_half_the_memory_is_refused() {
    let mut cmd = cellcache();
    cmd.args(["serve", "-p", "0", "--standalone", "-I", "256m"]);
    let line = one_error_line(&run(cmd));
    assert!(
        line.contains("Cannot set item size limit higher than 1/2 of memory max"),
        "{line}"
    );
}
