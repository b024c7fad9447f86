//! `cellcache bench echo`: the limit a cell is measured against (issue 21).
//!
//! A server on one of the cell's own I/O engines (`cellcache-io`, the same code a cell runs)
//! whose session frames memcached text requests and answers each with a fixed reply, with
//! no parser beyond framing, no store, no routing and no statistics:
//! - `get`/`gets k1 k2 …`: `VALUE k 0 N` (`gets`: with cas 0) and the same N bytes for
//!   every key (`--value-size`), then `END` — a hit of the size the generator stores;
//! - `set`/`add`/`replace`/`append`/`prepend`/`cas`: the data block is skipped, `STORED`
//!   (nothing with `noreply`);
//! - `version`: `VERSION`; `stats`: `END`; `quit`: closes; any other line: `ERROR`.
//!
//! A cell does at least this much work per request (the same engine moves the same bytes),
//! so cell / echo, side by side under one generator (`bench compare --a-cmd` with this
//! command), is the share of the engine's limit a cell reaches: the rest is what parsing,
//! the store, routing and statistics cost. Text protocol only: a binary request gets no
//! reply and, with no line end in its first [`LINE_BYTES_MAX`] bytes, is disconnected.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use anyhow::Context;
use cellcache_io::{Accepted, EngineConfig, IoEngineKind, Notify, Progress, Service, Session};

/// Longest request line, terminator included: a cell's default limit, so a multi-get the
/// cell takes the echo server takes too.
pub const LINE_BYTES_MAX: usize = cellcache_proto::limits::LINE_BYTES_MAX_DEFAULT;
/// Largest data block of a storage command: memcached's default item size limit (`-I 1m`).
pub const VALUE_BYTES_MAX: usize = 1024 * 1024;

/// `cellcache bench echo` (mounted by the `cellcache` binary).
#[derive(Debug, Clone, clap::Args)]
pub struct EchoArgs {
    /// Address to listen on.
    #[arg(short = 'l', long, default_value = "127.0.0.1")]
    pub listen: IpAddr,
    /// TCP port.
    #[arg(short = 'p', long, default_value_t = 11311)]
    pub port: u16,
    /// Worker threads of the event-loop engines (as `cellcache serve -t`).
    #[arg(short = 't', long, default_value_t = 1)]
    pub threads: usize,
    /// I/O engine: auto, epoll, uring or threads (as `cellcache serve --io-engine`).
    #[arg(long, default_value = "auto")]
    pub io_engine: IoEngineKind,
    /// Bytes of the value every get returns (match the generator's `--value-size`).
    #[arg(long, default_value_t = 100)]
    pub value_size: usize,
}

/// Runs the echo server until the process is stopped (SIGINT or SIGTERM end it; it holds
/// nothing to save).
pub fn run(args: EchoArgs) -> anyhow::Result<()> {
    if args.value_size > VALUE_BYTES_MAX {
        anyhow::bail!("--value-size is above the echo's item limit of {VALUE_BYTES_MAX} bytes");
    }
    let config = EngineConfig {
        threads: args.threads,
        ..EngineConfig::default()
    };
    config.validate()?;
    let addr = SocketAddr::new(args.listen, args.port);
    let service = Arc::new(Echo::new(args.value_size));
    let engine = cellcache_io::start(
        args.io_engine,
        &[addr],
        &config,
        service,
        cellcache_io::Shutdown::new(),
    )
    .with_context(|| format!("starting the echo server on {addr}"))?;
    eprintln!(
        "echo server on {} ({} engine, {} byte values)",
        engine.local_addr, engine.engine, args.value_size
    );
    engine.join();
    Ok(())
}

/// The echo service: every session answers with the same value.
pub struct Echo {
    value: Arc<[u8]>,
}

impl Echo {
    pub fn new(value_size: usize) -> Self {
        Self {
            value: vec![b'x'; value_size].into(),
        }
    }
}

impl Service for Echo {
    type Session = EchoSession;
    fn open(&self, _conn: Accepted, _notify: Notify) -> EchoSession {
        EchoSession {
            value: self.value.clone(),
        }
    }
}

/// One connection of the echo server.
pub struct EchoSession {
    value: Arc<[u8]>,
}

impl Session for EchoSession {
    fn on_input(&mut self, input: &[u8], output: &mut Vec<u8>, output_budget: usize) -> Progress {
        let mut consumed = 0;
        loop {
            if output.len() >= output_budget {
                return Progress {
                    consumed,
                    output_full: true,
                    ..Progress::default()
                };
            }
            match answer(&input[consumed..], &self.value, output) {
                Step::Need => {
                    return Progress {
                        consumed,
                        ..Progress::default()
                    };
                }
                Step::Answered { consumed: n } => consumed += n,
                Step::Close { consumed: n } => return Progress::closing(consumed + n),
            }
        }
    }
}

/// What [`answer`] did with the front of the input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// No whole request yet: wait for more bytes.
    Need,
    /// One request answered; `consumed` bytes of it.
    Answered { consumed: usize },
    /// Answered (or refused) and the connection is to close after the reply.
    Close { consumed: usize },
}

/// Frames the first request of `input` and appends its fixed reply to `out`.
pub fn answer(input: &[u8], value: &[u8], out: &mut Vec<u8>) -> Step {
    let search = &input[..input.len().min(LINE_BYTES_MAX)];
    let Some(nl) = search.iter().position(|&b| b == b'\n') else {
        if input.len() >= LINE_BYTES_MAX {
            out.extend_from_slice(b"CLIENT_ERROR line too long\r\n");
            return Step::Close {
                consumed: input.len(),
            };
        }
        return Step::Need;
    };
    let line = input[..nl].strip_suffix(b"\r").unwrap_or(&input[..nl]);
    let line_len = nl + 1;
    let mut tokens = line.split(|&b| b == b' ').filter(|t| !t.is_empty());
    let Some(command) = tokens.next() else {
        out.extend_from_slice(b"ERROR\r\n");
        return Step::Answered { consumed: line_len };
    };
    match command {
        b"get" | b"gets" => {
            let cas: &[u8] = if command == b"gets" { b" 0" } else { b"" };
            let len = value.len().to_string();
            for key in tokens {
                out.extend_from_slice(b"VALUE ");
                out.extend_from_slice(key);
                out.extend_from_slice(b" 0 ");
                out.extend_from_slice(len.as_bytes());
                out.extend_from_slice(cas);
                out.extend_from_slice(b"\r\n");
                out.extend_from_slice(value);
                out.extend_from_slice(b"\r\n");
            }
            out.extend_from_slice(b"END\r\n");
            Step::Answered { consumed: line_len }
        }
        b"set" | b"add" | b"replace" | b"append" | b"prepend" | b"cas" => {
            let rest: Vec<&[u8]> = tokens.collect();
            let bytes = rest
                .get(3)
                .and_then(|t| std::str::from_utf8(t).ok())
                .and_then(|t| t.parse::<usize>().ok());
            let Some(bytes) = bytes else {
                out.extend_from_slice(b"CLIENT_ERROR bad command line format\r\n");
                return Step::Answered { consumed: line_len };
            };
            if bytes > VALUE_BYTES_MAX {
                out.extend_from_slice(b"SERVER_ERROR object too large for cache\r\n");
                return Step::Close { consumed: line_len };
            }
            let total = line_len + bytes + 2;
            if input.len() < total {
                return Step::Need;
            }
            if rest.last() != Some(&b"noreply".as_slice()) {
                out.extend_from_slice(b"STORED\r\n");
            }
            Step::Answered { consumed: total }
        }
        b"version" => {
            out.extend_from_slice(
                concat!("VERSION ", env!("CARGO_PKG_VERSION"), " echo\r\n").as_bytes(),
            );
            Step::Answered { consumed: line_len }
        }
        b"stats" => {
            out.extend_from_slice(b"END\r\n");
            Step::Answered { consumed: line_len }
        }
        b"quit" => Step::Close { consumed: line_len },
        _ => {
            out.extend_from_slice(b"ERROR\r\n");
            Step::Answered { consumed: line_len }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(value_size: usize) -> EchoSession {
        let conn = Accepted {
            peer: "127.0.0.1:1".parse().unwrap(),
            listener: "127.0.0.1:2".parse().unwrap(),
            fd: 0,
        };
        Echo::new(value_size).open(conn, Notify::noop())
    }

    /// Feeds `input` through a session in chunks of `chunk` bytes, as an engine would
    /// (unconsumed bytes offered again with the next chunk); returns the output.
    fn serve(input: &[u8], chunk: usize) -> (Vec<u8>, bool) {
        let mut session = session(3);
        let (mut pending, mut out) = (Vec::new(), Vec::new());
        for piece in input.chunks(chunk) {
            pending.extend_from_slice(piece);
            let p = session.on_input(&pending, &mut out, usize::MAX);
            pending.drain(..p.consumed);
            if p.close {
                return (out, true);
            }
        }
        (out, false)
    }

    #[test]
    fn every_request_gets_its_fixed_reply_in_any_chunking() {
        let input = b"version\r\nset a 1 0 4\r\nab\r\n\r\nget a bb\r\ngets c\r\n\
            add d 0 0 1 noreply\r\nz\r\nstats\r\nflush_all\r\n\r\nquit\r\nget never\r\n";
        let want = concat!(
            "VERSION ",
            env!("CARGO_PKG_VERSION"),
            " echo\r\n",
            "STORED\r\n",
            "VALUE a 0 3\r\nxxx\r\nVALUE bb 0 3\r\nxxx\r\nEND\r\n",
            "VALUE c 0 3 0\r\nxxx\r\nEND\r\n",
            "END\r\n",
            "ERROR\r\nERROR\r\n"
        );
        for chunk in [1, 2, 7, 64, input.len()] {
            let (out, closed) = serve(input, chunk);
            assert_eq!(String::from_utf8_lossy(&out), want, "chunks of {chunk}");
            assert!(closed, "quit closes (chunks of {chunk})");
        }
    }

    #[test]
    fn a_get_of_many_long_keys_is_answered_whole() {
        let keys: Vec<String> = (0..100).map(|i| format!("{i:032}")).collect();
        let line = format!("get {}\r\n", keys.join(" "));
        assert!(line.len() > 2048, "longer than memcached's key line limit");
        let (out, closed) = serve(line.as_bytes(), 1000);
        assert!(!closed);
        let out = String::from_utf8(out).unwrap();
        assert_eq!(out.matches("VALUE ").count(), 100);
        assert!(out.ends_with("END\r\n"));
    }

    #[test]
    fn bad_and_oversized_requests_are_refused_not_waited_for() {
        let mut out = Vec::new();
        assert_eq!(
            answer(b"set k 0 0 many\r\n", b"", &mut out),
            Step::Answered { consumed: 16 }
        );
        assert_eq!(out, b"CLIENT_ERROR bad command line format\r\n");
        out.clear();
        let big = format!("set k 0 0 {}\r\n", VALUE_BYTES_MAX + 1);
        assert_eq!(
            answer(big.as_bytes(), b"", &mut out),
            Step::Close {
                consumed: big.len()
            }
        );
        out.clear();
        let endless = vec![b'a'; LINE_BYTES_MAX];
        assert_eq!(
            answer(&endless, b"", &mut out),
            Step::Close {
                consumed: LINE_BYTES_MAX
            }
        );
        assert_eq!(out, b"CLIENT_ERROR line too long\r\n");
        out.clear();
        assert_eq!(answer(b"get k", b"", &mut out), Step::Need);
        assert_eq!(answer(b"set k 0 0 5\r\nab", b"", &mut out), Step::Need);
        assert!(out.is_empty());
    }

    #[test]
    fn a_full_output_stops_the_session_until_it_drains() {
        let mut session = session(1);
        let mut out = Vec::new();
        let p = session.on_input(b"get a\r\nget b\r\n", &mut out, 4);
        assert_eq!((p.consumed, p.output_full), (7, true));
        assert_eq!(out, b"VALUE a 0 1\r\nx\r\nEND\r\n");
    }
}
