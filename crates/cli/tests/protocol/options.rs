//! memcached's command-line options: `-l`, `-t`, `-b`, `-F`, `-C`, `-M`, `-B` and a tiny `-m`.

use super::*;

/// A repeated `-l` adds a listener (memcached 1.6.18: `-l 127.0.0.1 -l 127.0.0.2` serves
/// both, `stats settings inter` is `127.0.0.1,127.0.0.2`, and `stats conns` gives each
/// connection the listener it came through).
#[test]
fn repeated_dash_l_listens_on_every_address() {
    let s = Server::start(&["-m", "64", "-l", "127.0.0.2"]);
    let second = std::net::SocketAddr::from(([127, 0, 0, 2], s.addr.port()));
    let mut c = common::Client::to(second);
    c.roundtrip(b"set k 0 0 1\r\nx\r\n", b"STORED\r\n");
    let mut first = s.connect();
    first.roundtrip(b"get k\r\n", b"VALUE k 0 1\r\nx\r\nEND\r\n");
    let settings = c.stats("settings");
    assert!(
        settings.contains(&("inter".into(), "127.0.0.1,127.0.0.2".into())),
        "{settings:?}"
    );
    let listen = |conns: &[(String, String)], addr: std::net::SocketAddr| {
        conns
            .iter()
            .filter(|(k, v)| k.ends_with(":listen_addr") && *v == format!("tcp:{addr}"))
            .count()
    };
    // The server's readiness probe came through the first listener and is closed, but the
    // server may not have seen its close yet: wait (bounded) until it has.
    let mut conns = c.stats("conns");
    for _ in 0..100 {
        if listen(&conns, s.addr) <= 1 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
        conns = c.stats("conns");
    }
    let listen = |addr| listen(&conns, addr);
    assert_eq!(listen(s.addr), 1, "{conns:?}");
    assert_eq!(listen(second), 1, "{conns:?}");
    assert_eq!(
        conns.iter().filter(|(_, v)| v == "conn_listening").count(),
        2
    );
}

/// An `-l IP:PORT` entry listens on its own port (memcached 1.6.18:
/// `-l 127.0.0.1:21601,127.0.0.1 -p 21600` serves both ports). One server only: a ring's
/// cells cannot share the fixed port.
#[test]
fn dash_l_with_a_port_listens_there() {
    if common::test_ring_size() > 1 {
        return;
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let own = format!("127.0.0.1:{port}");
    let s = Server::start(&["-m", "64", "-l", &own]);
    let mut c = common::Client::to(own.parse().unwrap());
    c.roundtrip(b"set k 0 0 1\r\nx\r\n", b"STORED\r\n");
    s.connect()
        .roundtrip(b"get k\r\n", b"VALUE k 0 1\r\nx\r\nEND\r\n");
    let settings = c.stats("settings");
    assert!(
        settings.contains(&("inter".into(), format!("127.0.0.1,{own}"))),
        "{settings:?}"
    );
}

/// The same address twice in one `-l` list fails the start with "Address already in use",
/// as memcached 1.6.18 (`-l 127.0.0.1,127.0.0.1`: "failed to listen on one of
/// interface(s) …: Address already in use", exit 71).
#[test]
fn dash_l_with_an_address_twice_fails() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string();
    let mut cmd = if common::is_memcached() {
        let mut c = std::process::Command::new("memcached");
        c.args(["-U", "0", "-u", "root"]);
        c
    } else {
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_cellcache"));
        c.args(["serve", "--standalone"]);
        if let Some(engine) = common::io_engine() {
            c.args(["--io-engine", &engine]);
        }
        c
    };
    cmd.args(["-l", "127.0.0.1,127.0.0.1", "-p", &port])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            panic!("the server kept running with an address given twice");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert!(!status.success());
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(err.contains("Address already in use"), "{err}");
}

/// `-t 0` is refused with a clear message (memcached 1.6.18: "Number of threads must be
/// greater than 0"); `-b` (listen backlog) is accepted.
#[test]
fn serve_refuses_zero_threads_and_accepts_a_backlog() {
    if common::is_memcached() {
        println!("not run against memcached: checks cellcache's command line");
        return;
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cellcache"))
        .args([
            "serve",
            "--standalone",
            "-l",
            "127.0.0.1",
            "-p",
            "0",
            "-t",
            "0",
        ])
        .output()
        .expect("cellcache runs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("threads must be greater than 0"), "{err}");
    let s = Server::start(&["-m", "64", "-b", "64"]);
    let mut c = s.connect();
    c.roundtrip(b"set k 0 0 1\r\nv\r\n", b"STORED\r\n");
}

/// `-F`: memcached 1.6.18 refuses every `flush_all` with `CLIENT_ERROR flush_all not
/// allowed` (nothing with `noreply`) and keeps the items.
#[test]
fn flush_all_is_refused_with_dash_f() {
    let s = Server::start(&["-m", "64", "-F"]);
    let mut c = s.connect();
    let steps: &[(&[u8], &[u8])] = &[
        (b"set a 0 0 1\r\n1\r\n", b"STORED\r\n"),
        (b"flush_all\r\n", b"CLIENT_ERROR flush_all not allowed\r\n"),
        (
            b"flush_all 0\r\n",
            b"CLIENT_ERROR flush_all not allowed\r\n",
        ),
        (b"flush_all noreply\r\nmn\r\n", b"MN\r\n"),
        (b"get a\r\n", b"VALUE a 0 1\r\n1\r\nEND\r\n"),
    ];
    for (req, want) in steps {
        c.roundtrip(req, want);
    }
    assert_eq!(c.stat_of("settings", "flush_enabled"), "no");
}

/// `-C`: memcached 1.6.18 keeps no CAS. Every CAS it reports is 0; the storage commands'
/// compare (`cas`, `ms C`) never matches an existing item; `md C` / `ma C` compare with 0;
/// `ms E` is an invalid flag.
#[test]
fn no_cas_with_dash_c() {
    let s = Server::start(&["-m", "64", "-C"]);
    let mut c = s.connect();
    let steps: &[(&[u8], &[u8])] = &[
        (b"set a 0 0 1\r\n1\r\n", b"STORED\r\n"),
        (b"gets a\r\n", b"VALUE a 0 1 0\r\n1\r\nEND\r\n"),
        (b"gats 0 a\r\n", b"VALUE a 0 1 0\r\n1\r\nEND\r\n"),
        (b"mg a c v\r\n", b"VA 1 c0\r\n1\r\n"),
        (b"cas a 0 0 1 0\r\n2\r\n", b"EXISTS\r\n"),
        (b"cas a 0 0 1 1\r\n2\r\n", b"EXISTS\r\n"),
        (b"cas zz 0 0 1 0\r\n2\r\n", b"NOT_FOUND\r\n"),
        (b"ms a 1 C0\r\n2\r\n", b"EX\r\n"),
        (b"ms a 1 C1 I\r\n2\r\n", b"EX\r\n"),
        (b"ms a 1 c\r\n3\r\n", b"HD c0\r\n"),
        (b"ms a 1 E5\r\n4\r\n", b"CLIENT_ERROR invalid flag\r\n"),
        (b"mg a v\r\n", b"VA 1\r\n3\r\n"),
        (b"ma n N0 c\r\n", b"HD c0\r\n"),
        (b"ma n C1\r\n", b"EX\r\n"),
        (b"ma n C0\r\n", b"HD\r\n"),
        (b"md a C1\r\n", b"EX\r\n"),
        (b"md a C0\r\n", b"HD\r\n"),
        (b"md zz C0\r\n", b"NF\r\n"),
    ];
    for (req, want) in steps {
        c.roundtrip(req, want);
    }
    assert_eq!(c.stat_of("settings", "cas_enabled"), "no");
}

/// `-M`: memcached answers `SERVER_ERROR out of memory storing object` when full instead of
/// evicting, and the items already stored stay.
#[test]
fn out_of_memory_instead_of_evicting_with_dash_m() {
    let s = Server::start(&["-m", "8", "-M"]);
    let mut c = s.connect();
    let value = vec![b'v'; 100 * 1024];
    let mut stored = 0;
    loop {
        assert!(stored < 2000, "8 MB never filled with 100 KB values");
        let mut req = format!("set k{stored} 0 0 {}\r\n", value.len()).into_bytes();
        req.extend_from_slice(&value);
        req.extend_from_slice(b"\r\n");
        c.send(&req);
        match c.line().as_str() {
            "STORED" => stored += 1,
            "SERVER_ERROR out of memory storing object" => break,
            other => panic!("set k{stored}: {other}"),
        }
    }
    assert!(stored > 10, "only {stored} values fit");
    for i in [0, stored / 2, stored - 1] {
        c.send(format!("mg k{i} s\r\n").as_bytes());
        assert_eq!(c.line(), format!("HD s{}", value.len()), "k{i} was evicted");
    }
    assert_eq!(c.stat("evictions"), "0");
    assert_eq!(c.stat_of("settings", "evictions"), "off");
}

/// `-B ascii`: memcached reads a binary request's bytes as text (no reply until a line end,
/// then `ERROR`) and the connection stays usable; cellcache does the same.
#[test]
fn binary_magic_is_read_as_text_with_dash_b_ascii() {
    let s = Server::start(&["-m", "64", "-B", "ascii"]);
    let mut c = s.connect();
    let mut version_request = vec![0x80, 0x0b];
    version_request.resize(24, 0);
    c.send(&version_request);
    c.roundtrip(b"version\r\n", b"ERROR\r\n");
    c.roundtrip(b"set a 0 0 1\r\n1\r\n", b"STORED\r\n");
    assert_eq!(c.stat_of("settings", "binding_protocol"), "ascii");
}

/// `-B binary`: binary frames only. A binary `version` is answered (response magic 0x81);
/// a text line gets no text reply (cellcache closes the connection, as on any bad magic).
#[test]
fn only_binary_frames_with_dash_b_binary() {
    let s = Server::start(&["-m", "64", "-B", "binary"]);
    let mut c = s.connect();
    let mut version_request = vec![0x80, 0x0b];
    version_request.resize(24, 0);
    c.send(&version_request);
    let header = c.read_exact_len(24);
    assert_eq!(header[0], 0x81, "a binary response");
    assert_eq!(header[1], 0x0b, "to version");
    let body = u32::from_be_bytes([header[8], header[9], header[10], header[11]]) as usize;
    assert!(c.read_exact_len(body).starts_with(b"1."));
    if common::is_memcached() {
        return;
    }
    let mut c = s.connect();
    c.send(b"version\r\n");
    assert!(c.is_closed(), "no text protocol with -B binary");
}

/// `-M -m 2` (memcached's t/dash-M.t): a memory limit below the store's minimum is raised
/// to it rather than refused; once full, sets fail with memcached's out-of-memory error,
/// counted in `store_no_memory`, and every item stored before stays readable.
#[test]
fn a_tiny_memory_limit_without_evictions_fills_then_refuses() {
    let s = Server::start(&["-M", "-m", "2"]);
    let mut c = s.connect();
    let value = "B".repeat(8192);
    let mut stored = 0;
    loop {
        c.send(format!("set dash{stored} 0 0 {}\r\n{value}\r\n", value.len()).as_bytes());
        let line = c.line();
        if line != "STORED" {
            assert_eq!(line, "SERVER_ERROR out of memory storing object");
            break;
        }
        stored += 1;
        assert!(stored < 10_000, "a 2 MB cell never filled");
    }
    assert!(stored > 100, "only {stored} items of 8 KB in 2 MB");
    if common::test_ring_size() <= 1 {
        c.roundtrip(
            format!("set more 0 0 {}\r\n{value}\r\n", value.len()).as_bytes(),
            b"SERVER_ERROR out of memory storing object\r\n",
        );
        assert_eq!(c.stat("store_no_memory"), "2");
    }
    // In a ring every cell fills on its own: the next key's cell may still have room.
    for i in 0..stored {
        c.send(format!("get dash{i}\r\n").as_bytes());
        assert_eq!(c.lines_until_end().len(), 2, "dash{i}");
    }
}
