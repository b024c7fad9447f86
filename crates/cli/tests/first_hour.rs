//! A new user's first hour (issue 17): what the binary says when something is wrong — one
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
    let dir = std::env::temp_dir().join(format!(
        "cellcache-first-hour-{}-{name}",
        std::process::id()
    ));
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

#[test]
fn an_invalid_flag_value_says_the_cause_once() {
    let mut cmd = cellcache();
    cmd.args(["serve", "-p", "0", "-m", "1"])
        .env("RUST_BACKTRACE", "1");
    let line = one_error_line(&run(cmd));
    assert!(line.contains("too small"), "{line}");
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
