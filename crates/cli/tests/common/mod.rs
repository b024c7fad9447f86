//! Test harness: starts a real server process on a free loopback port and talks to it over
//! TCP. `CELLCACHE_TEST_SERVER=memcached` runs the same suites against Debian's memcached,
//! which is how the expected bytes in these tables were proven.

#![allow(dead_code)]

mod ring;
pub mod tls;
pub use ring::{Ring, free_peer_port};

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a server may take to answer its first `version`.
const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// Read timeout for every reply; a hang fails the test instead of blocking CI.
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

pub struct Server {
    pub addr: SocketAddr,
    /// The admin plane's address (cellcache only).
    pub admin: Option<SocketAddr>,
    /// The admin token, when the cell was given one (`--admin-token-file`).
    admin_token: Option<String>,
    child: Child,
    /// Under `CELLCACHE_TEST_RING`: the other cells of the ring this one is the entry of.
    ring: Vec<Server>,
    /// The text login of the server's `-Y` auth file (its first entry), used by the
    /// harness's own requests ([`Server::admin`]); `None` without `-Y`.
    pub login: Option<Vec<u8>>,
    /// Started with `-Z`: the readiness probe only checks that the port speaks TLS.
    tls: bool,
    /// The TLS client [`Server::connect`] makes (set by a test of a server with `-Z`).
    pub tls_client: Option<std::sync::Arc<rustls::ClientConfig>>,
}

/// A new auth file (`user:password` lines) of mode 0600 in the temp directory; its path.
pub fn auth_file(text: &str) -> String {
    use std::os::unix::fs::PermissionsExt as _;
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    let path = cellcache_testkit::process::scratch_dir("auth")
        .join(N.fetch_add(1, Ordering::Relaxed).to_string());
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path.to_string_lossy().into_owned()
}

/// The log level of the cells a test starts: `warn`, or `CELLCACHE_TEST_LOG` (a filter such
/// as `info,openraft=info`) to see what the cells did in a failing test.
pub fn cell_log_level() -> String {
    std::env::var("CELLCACHE_TEST_LOG").unwrap_or_else(|_| "warn".into())
}

/// memcached's text login for `user` and `password`: a `set` whose data is "user password".
pub fn login(user: &str, password: &str) -> Vec<u8> {
    let token = format!("{user} {password}");
    format!("set auth 0 0 {}\r\n{token}\r\n", token.len()).into_bytes()
}

/// The login of the first entry of the auth file that `extra` names with `-Y`.
fn login_in(extra: &[&str]) -> Option<Vec<u8>> {
    let path = extra.windows(2).find(|w| w[0] == "-Y")?[1];
    let text = std::fs::read_to_string(path).ok()?;
    let (user, password) = text.lines().next()?.split_once(':')?;
    Some(login(user, password))
}

/// `CELLCACHE_TEST_RING=N` runs every single-server suite through one cell of a ring of
/// `N` cells (the second, so that keys of every master are forwarded): a ring must answer
/// exactly as one memcached does.
pub fn test_ring_size() -> usize {
    std::env::var("CELLCACHE_TEST_RING")
        .ok()
        .and_then(|n| n.parse().ok())
        .filter(|_| !is_memcached())
        .unwrap_or(1)
}

/// Which implementation the suite talks to.
pub fn target() -> String {
    std::env::var("CELLCACHE_TEST_SERVER").unwrap_or_else(|_| "cellcache".into())
}

/// The I/O engine the cellcache under test uses (`CELLCACHE_TEST_IO_ENGINE`), or its
/// default (`auto`) when unset.
pub fn io_engine() -> Option<String> {
    std::env::var("CELLCACHE_TEST_IO_ENGINE").ok()
}

/// Polls `done` every `poll` until it holds; fails the test naming `what` if it does not
/// within `timeout` (a bound on the test's run time, never a claim about speed).
pub fn wait_until(
    what: &str,
    timeout: std::time::Duration,
    poll: std::time::Duration,
    mut done: impl FnMut() -> bool,
) {
    let deadline = std::time::Instant::now() + timeout;
    while !done() {
        assert!(std::time::Instant::now() < deadline, "{what}");
        std::thread::sleep(poll);
    }
}

/// Where the cell on `port` keeps its membership file: [`state_dir`] and
/// [`Server::restart_on`] agree on it.
fn state_path(port: u16) -> std::path::PathBuf {
    cellcache_testkit::process::default_log_dir().join(format!("state-{port}"))
}

/// A fresh directory for the membership file of the cell on `port` (`cluster.state_dir`),
/// beside this test process's logs under `target/` (not left behind in the system's
/// temporary directory, one per cell of every run).
pub fn state_dir(port: u16) -> String {
    let dir = state_path(port);
    let _ = std::fs::remove_dir_all(&dir);
    dir.to_string_lossy().into_owned()
}

pub fn is_memcached() -> bool {
    target() == "memcached"
}

/// The `--admin-port` among `args`, if given.
fn admin_port_in(args: &[&str]) -> Option<u16> {
    args.windows(2)
        .find(|w| w[0] == "--admin-port")
        .and_then(|w| w[1].parse().ok())
}

/// The admin token of the file given with `--admin-token-file` among `args`, if any.
fn admin_token_in(args: &[&str]) -> Option<String> {
    let path = args
        .windows(2)
        .find(|w| w[0] == "--admin-token-file")
        .map(|w| w[1])?;
    let text = std::fs::read_to_string(path).expect("the admin token file");
    Some(text.lines().next().unwrap_or("").trim().to_string())
}

/// The peer port among `args` (`--peer-port`), if given.
pub fn peer_port_in(args: &[&str]) -> Option<u16> {
    args.windows(2)
        .find(|w| w[0] == "--peer-port")
        .and_then(|w| w[1].parse().ok())
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A free port that is none of the ports `args` name (a `--peer-port` or `--admin-port`
/// picked earlier) nor any of `taken` (see testkit's `free_port_besides`).
fn free_port_besides(args: &[&str], taken: &[u16]) -> u16 {
    let mut not: Vec<u16> = args.iter().filter_map(|a| a.parse().ok()).collect();
    not.extend_from_slice(taken);
    cellcache_testkit::process::free_port_besides(&not).expect("a free port")
}

impl Server {
    /// One request to the cell's admin plane: (HTTP status, body).
    pub fn admin_call(&self, method: &str, path: &str) -> (u16, String) {
        let at = self
            .admin
            .expect("a cellcache cell has an admin port")
            .to_string();
        let token = self.admin_token.as_deref();
        let reply = cellcache_node::admin::client::call(&at, method, path, token, REPLY_TIMEOUT)
            .unwrap_or_else(|e| panic!("admin {method} {path} on {at}: {e}"));
        (reply.status, reply.body)
    }

    /// `cellcache ctl -s ADMIN ARGS` against this cell: its output, or a failure with its
    /// error.
    pub fn ctl(&self, args: &[&str]) -> String {
        let admin = self
            .admin
            .expect("a cellcache cell has an admin port")
            .to_string();
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_cellcache"));
        let out = command
            .args(["ctl", "-s", &admin])
            .args(args)
            .stdin(std::process::Stdio::null())
            .output()
            .expect("ctl runs");
        assert!(
            out.status.success(),
            "ctl {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("ctl prints UTF-8")
    }

    /// `ctl switch --list --json`: every block's implementation and the others.
    pub fn blocks(&self) -> serde_json::Value {
        serde_json::from_str(&self.ctl(&["switch", "--list", "--json"])).expect("JSON blocks")
    }

    /// The body of a GET on the admin plane, split into lines, without a final `END`.
    pub fn admin_lines(&self, path: &str) -> Vec<String> {
        let (_, body) = self.admin_call("GET", path);
        body.lines()
            .take_while(|l| *l != "END")
            .map(str::to_string)
            .collect()
    }

    /// Starts the target with `extra` flags (memcached spelling: -m, -t, -c, -I ...).
    pub fn start(extra: &[&str]) -> Server {
        Self::start_with_env(extra, &[])
    }

    pub fn start_with_env(extra: &[&str], env: &[(&str, &str)]) -> Server {
        let n = test_ring_size();
        let ring_member = extra.iter().any(|a| *a == "--join" || *a == "--standby");
        // `-B binary` leaves no text port to form a ring through (`cluster …` is text).
        let binary_only = extra.windows(2).any(|w| w == ["-B", "binary"]);
        if n < 2 || ring_member || binary_only || extra.contains(&"--standalone") {
            return Self::start_one(extra, env);
        }
        let peer = free_peer_port().to_string();
        let mut first = extra.to_vec();
        first.extend(["--peer-port", &peer]);
        let mut cells = vec![Self::start_one(&first, env)];
        let join = format!("127.0.0.1:{peer}");
        for _ in 1..n {
            let mut args = extra.to_vec();
            args.extend(["--join", &join]);
            cells.push(Self::start_one(&args, env));
        }
        let formed = Ring { cells };
        formed.wait_formed(n);
        let mut cells = formed.cells;
        let mut entry = cells.remove(1);
        entry.ring = cells;
        entry
    }

    fn start_one(extra: &[&str], env: &[(&str, &str)]) -> Server {
        for _attempt in 0..5 {
            let port = free_port_besides(extra, &[]);
            let mut admin = None;
            let mut cmd = if is_memcached() {
                let mut c = Command::new("memcached");
                c.args(["-U", "0", "-l", "127.0.0.1", "-p", &port.to_string()]);
                if nix_is_root() {
                    c.args(["-u", "root"]);
                }
                c
            } else {
                let mut c = Command::new(env!("CARGO_BIN_EXE_cellcache"));
                c.args(["serve", "-l", "127.0.0.1", "-p", &port.to_string()]);
                if let Some(engine) = io_engine() {
                    c.args(["--io-engine", &engine]);
                }
                c.env("CELLCACHE_LOG__LEVEL", cell_log_level());
                // Each server its own membership file (none left for a later run's port).
                c.env("CELLCACHE_CLUSTER__STATE_DIR", state_dir(port));
                let port = admin_port_in(extra).unwrap_or_else(|| {
                    let p = free_port_besides(extra, &[port]);
                    c.args(["--admin-port", &p.to_string()]);
                    p
                });
                admin = Some(SocketAddr::from(([127, 0, 0, 1], port)));
                c
            };
            cmd.args(extra).stdin(Stdio::null()).stdout(Stdio::null());
            for (k, v) in env {
                cmd.env(k, v);
            }
            let child = cmd.spawn().expect("server binary starts");
            let mut server = Server {
                addr: SocketAddr::from(([127, 0, 0, 1], port)),
                admin,
                admin_token: admin_token_in(extra),
                child,
                ring: Vec::new(),
                login: login_in(extra),
                tls: extra.contains(&"-Z"),
                tls_client: None,
            };
            if server.wait_ready() {
                return server;
            }
        }
        panic!("server did not become ready");
    }

    /// Starts cellcache again on `port` (a restart with the same command line: `extra`),
    /// keeping the membership file the first start left in [`state_dir`]'s directory, or
    /// with `state_dir` given instead. Returns the server, whether or not it became ready.
    pub fn restart_on(port: u16, extra: &[&str], state_dir: Option<&str>) -> (Server, bool) {
        let dir = state_dir.map_or_else(
            || state_path(port).to_string_lossy().into_owned(),
            str::to_string,
        );
        // The port was the killed process's; until the kernel lets it go (or while another
        // socket briefly holds it as its local port) a restart fails to bind: wait for it,
        // bounded, so the test sees the restart and not the port.
        wait_until(
            "the restart's port is free",
            Duration::from_secs(10),
            Duration::from_millis(20),
            || std::net::TcpListener::bind(("127.0.0.1", port)).is_ok(),
        );
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_cellcache"));
        cmd.args(["serve", "-l", "127.0.0.1", "-p", &port.to_string()]);
        if let Some(engine) = io_engine() {
            cmd.args(["--io-engine", &engine]);
        }
        cmd.env("CELLCACHE_LOG__LEVEL", cell_log_level())
            .env("CELLCACHE_CLUSTER__STATE_DIR", dir)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        let child = cmd.spawn().expect("server binary starts");
        let mut server = Server {
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            admin: admin_port_in(extra).map(|p| SocketAddr::from(([127, 0, 0, 1], p))),
            admin_token: admin_token_in(extra),
            child,
            ring: Vec::new(),
            login: login_in(extra),
            tls: extra.contains(&"-Z"),
            tls_client: None,
        };
        let ready = server.wait_ready();
        (server, ready)
    }

    /// The exit status once the process ended by itself within `timeout`, else `None`.
    pub fn exit_within(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    fn wait_ready(&mut self) -> bool {
        let deadline = Instant::now() + READY_TIMEOUT;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false; // exited: port taken or bad flags
            }
            if self.tls {
                if self.speaks_tls() {
                    return true;
                }
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            // A text `version` (after the login under -Y), or a binary one (a server started
            // with `-B binary`; version needs no SASL authentication either).
            let mut binary_version = vec![0x80, 0x0b];
            binary_version.resize(24, 0);
            let login = self.login.clone().unwrap_or_default();
            let text_probe = [&login[..], b"version\r\n"].concat();
            let text_answer = [
                if login.is_empty() {
                    &b""[..]
                } else {
                    b"STORED\r\n"
                },
                b"VERSION ",
            ]
            .concat();
            let probes: [(&[u8], &[u8]); 2] = [
                (&text_probe, &text_answer),
                (&binary_version, &[0x81, 0x0b]),
            ];
            for (i, (probe, answer)) in probes.into_iter().enumerate() {
                if let Ok(mut c) = TcpStream::connect(self.addr) {
                    c.set_read_timeout(Some(REPLY_TIMEOUT)).unwrap();
                    if c.write_all(probe).is_ok() {
                        let mut buf = [0u8; 64];
                        let mut n = 0;
                        // The login's reply and the version's may come in two reads.
                        while n < answer.len() {
                            match c.read(&mut buf[n..]) {
                                Ok(got) if got > 0 => n += got,
                                _ => break,
                            }
                        }
                        if buf[..n].starts_with(answer) {
                            return self.answering_is_mine(i == 0);
                        }
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// Whether the port answers a ClientHello with a TLS handshake record.
    fn speaks_tls(&self) -> bool {
        let Ok(mut c) = TcpStream::connect(self.addr) else {
            return false;
        };
        c.set_read_timeout(Some(REPLY_TIMEOUT)).unwrap();
        let mut first = [0u8; 1];
        c.write_all(&tls::client_hello()).is_ok()
            && c.read_exact(&mut first).is_ok()
            && first[0] == 0x16
    }

    /// Whether the server that answered on our port is our child: another test's server may
    /// have taken the port our child then failed to bind (it exits; its `pid` tells). A
    /// binary-only server (`-B binary`) is taken at its word.
    fn answering_is_mine(&mut self, text: bool) -> bool {
        if !text {
            return true;
        }
        let mine = self.child.id().to_string();
        let Ok(mut c) = TcpStream::connect(self.addr) else {
            return false;
        };
        c.set_read_timeout(Some(REPLY_TIMEOUT)).unwrap();
        let login = self.login.clone().unwrap_or_default();
        if c.write_all(&[&login[..], b"stats\r\n"].concat()).is_err() {
            return false;
        }
        let mut reply = Vec::new();
        let mut buf = [0u8; 8192];
        while !reply.ends_with(b"END\r\n") {
            match c.read(&mut buf) {
                Ok(n) if n > 0 => reply.extend_from_slice(&buf[..n]),
                _ => return false,
            }
        }
        String::from_utf8_lossy(&reply)
            .lines()
            .any(|l| l.strip_prefix("STAT pid ") == Some(mine.as_str()))
    }

    /// A new connection, not logged in.
    pub fn connect(&self) -> Client {
        let mut c = match &self.tls_client {
            Some(config) => Client::tls_to(self.addr, config),
            None => Client::to(self.addr),
        };
        c.admin = self.admin;
        c
    }

    /// A new connection, logged in with the first entry of the server's `-Y` file (if any):
    /// the harness's own requests (stats, readiness) go through it.
    pub fn logged_in(&self) -> Client {
        let mut c = self.connect();
        if let Some(login) = &self.login {
            c.roundtrip(login, b"STORED\r\n");
        }
        c
    }

    /// Sends SIGTERM and waits for the process to exit; returns its exit status.
    pub fn terminate(mut self) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "server ignored SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL, no goodbye (the process is reaped when the `Server` drops).
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

fn nix_is_root() -> bool {
    std::env::var("USER").map(|u| u == "root").unwrap_or(false)
        || Command::new("id")
            .arg("-u")
            .output()
            .map(|o| o.stdout.starts_with(b"0"))
            .unwrap_or(false)
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub struct Client {
    pub stream: TcpStream,
    pending: Vec<u8>,
    /// The admin plane of the cell this client talks to, when known ([`Server::connect`]).
    admin: Option<SocketAddr>,
    /// A TLS client's session: `stream` carries its records.
    tls: Option<Box<rustls::ClientConnection>>,
}

impl Client {
    /// A client of the server at `addr` (usable from any thread).
    pub fn to(addr: SocketAddr) -> Client {
        Client::to_stream(TcpStream::connect(addr).unwrap())
    }

    /// Waits up to `timeout` for each reply from now on (a ring whose cells wait longer
    /// than [`REPLY_TIMEOUT`] for each other before answering).
    #[allow(dead_code)]
    pub fn reply_timeout(self, timeout: Duration) -> Client {
        self.stream.set_read_timeout(Some(timeout)).unwrap();
        self
    }

    fn to_stream(stream: TcpStream) -> Client {
        stream.set_read_timeout(Some(REPLY_TIMEOUT)).unwrap();
        stream.set_nodelay(true).unwrap();
        Client {
            stream,
            pending: Vec::new(),
            admin: None,
            tls: None,
        }
    }

    /// A client of the server at `addr` connecting from the loopback address `source` (e.g.
    /// 127.0.0.2: another client host, for per-address limits).
    pub fn from_source(source: std::net::IpAddr, addr: SocketAddr) -> Client {
        let socket = socket2::Socket::new(
            socket2::Domain::for_address(addr),
            socket2::Type::STREAM,
            None,
        )
        .unwrap();
        socket.bind(&SocketAddr::new(source, 0).into()).unwrap();
        socket.connect(&addr.into()).unwrap();
        let mut c = Client::to_stream(socket.into());
        c.admin = None;
        c
    }

    /// A TLS client of the server at `addr` (started with `-Z`); the handshake happens with
    /// the first request.
    pub fn tls_to(addr: SocketAddr, config: &std::sync::Arc<rustls::ClientConfig>) -> Client {
        let mut c = Client::to(addr);
        c.tls = Some(Box::new(tls::session(config)));
        c
    }

    /// One read of the connection (decrypted for a TLS client): 0 at its end.
    pub fn read_some(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match &mut self.tls {
            None => self.stream.read(buf),
            Some(tls) => match rustls::Stream::new(tls.as_mut(), &mut self.stream).read(buf) {
                // A peer that closes without its close_notify has still closed.
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(0),
                other => other,
            },
        }
    }

    /// The cell's own copy of `key` (`/cluster/peek` on its admin plane, never forwarded):
    /// the `VALUE` line and the value, or nothing.
    pub fn peek_lines(&self, key: &str) -> Vec<String> {
        let at = self
            .admin
            .expect("a client of a cellcache cell")
            .to_string();
        let path = format!("/cluster/peek/{key}");
        let reply = cellcache_node::admin::client::call(&at, "GET", &path, None, REPLY_TIMEOUT)
            .unwrap_or_else(|e| panic!("peek {key} on {at}: {e}"));
        reply
            .body
            .lines()
            .take_while(|l| *l != "END")
            .map(str::to_string)
            .collect()
    }

    pub fn send(&mut self, bytes: &[u8]) {
        match &mut self.tls {
            None => self.stream.write_all(bytes).unwrap(),
            Some(tls) => rustls::Stream::new(tls.as_mut(), &mut self.stream)
                .write_all(bytes)
                .unwrap(),
        }
    }

    /// Reads until exactly `expected.len()` bytes arrived and compares them.
    pub fn expect(&mut self, expected: &[u8]) {
        let got = self.read_exact_len(expected.len());
        assert_eq!(
            String::from_utf8_lossy(&got),
            String::from_utf8_lossy(expected),
            "reply mismatch"
        );
    }

    pub fn read_exact_len(&mut self, n: usize) -> Vec<u8> {
        while self.pending.len() < n {
            let mut buf = [0u8; 65536];
            let got = match self.read_some(&mut buf) {
                Ok(got) => got,
                Err(e) => panic!(
                    "no reply before timeout ({e}); have {} bytes, ending {:?}",
                    self.pending.len(),
                    String::from_utf8_lossy(
                        &self.pending[self.pending.len().saturating_sub(200)..]
                    )
                ),
            };
            assert!(
                got > 0,
                "connection closed; have {:?}",
                String::from_utf8_lossy(&self.pending)
            );
            self.pending.extend_from_slice(&buf[..got]);
        }
        let rest = self.pending.split_off(n);
        std::mem::replace(&mut self.pending, rest)
    }

    /// Reads one `\r\n`-terminated line.
    pub fn line(&mut self) -> String {
        loop {
            if let Some(i) = self.pending.windows(2).position(|w| w == b"\r\n") {
                let line = self.read_exact_len(i + 2);
                return String::from_utf8_lossy(&line[..i]).into_owned();
            }
            let mut buf = [0u8; 65536];
            let got = match self.read_some(&mut buf) {
                Ok(got) => got,
                Err(e) => panic!(
                    "no reply before timeout ({e}); have {} bytes, ending {:?}",
                    self.pending.len(),
                    String::from_utf8_lossy(
                        &self.pending[self.pending.len().saturating_sub(200)..]
                    )
                ),
            };
            assert!(got > 0, "connection closed mid-line");
            self.pending.extend_from_slice(&buf[..got]);
        }
    }

    /// Reads lines until `END`, returning them (without END).
    pub fn lines_until_end(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        loop {
            let l = self.line();
            if l == "END" {
                return out;
            }
            out.push(l);
        }
    }

    /// Sends `req` and checks the reply bytes.
    pub fn roundtrip(&mut self, req: &[u8], expected: &[u8]) {
        self.send(req);
        self.expect(expected);
    }

    /// True once the server closed the connection (reads EOF), false on timeout.
    pub fn is_closed(&mut self) -> bool {
        let mut buf = [0u8; 64];
        matches!(self.read_some(&mut buf), Ok(0))
    }

    /// `stats` as (name, value) pairs.
    pub fn stats(&mut self, arg: &str) -> Vec<(String, String)> {
        let cmd = if arg.is_empty() {
            "stats\r\n".to_string()
        } else {
            format!("stats {arg}\r\n")
        };
        self.send(cmd.as_bytes());
        self.lines_until_end()
            .into_iter()
            .map(|l| {
                let mut p = l.splitn(3, ' ');
                assert_eq!(p.next(), Some("STAT"), "{l}");
                (
                    p.next().unwrap().to_string(),
                    p.next().unwrap_or("").to_string(),
                )
            })
            .collect()
    }

    /// One figure of the cell this client talks to: its own (`stats cell`), not the ring's
    /// (`stats`); memcached knows only `stats`.
    pub fn stat(&mut self, name: &str) -> String {
        self.stat_of(if is_memcached() { "" } else { "cell" }, name)
    }

    /// The value of `key` by a text `get` (one key), `None` on a miss.
    pub fn get_value(&mut self, key: &str) -> Option<String> {
        self.send(format!("get {key}\r\n").as_bytes());
        match self.lines_until_end().as_slice() {
            [] => None,
            [_header, v] => Some(v.clone()),
            other => panic!("unexpected get reply {other:?}"),
        }
    }

    /// One field of `stats <group>`.
    pub fn stat_of(&mut self, group: &str, name: &str) -> String {
        self.stats(group)
            .into_iter()
            .find(|(k, _)| k == name)
            .unwrap_or_else(|| panic!("no stat {name} in stats {group}"))
            .1
    }
}
