//! Prints, for each input stream, what a server built on this parser would
//! send back as protocol errors: one line per stream, `<mn reached>\t<error
//! lines joined by |>`. Input: one hex-encoded byte stream per line on stdin.
//!
//! Used by `differential/compare_with_memcached.py`, which sends the same
//! streams to a real memcached and compares the error lines; see
//! docs/protocol.md.

use std::io::BufRead;

use cellcache_proto::{Discard, Limits, Parsed, Request, parse};

fn unhex(text: &str) -> Option<Vec<u8>> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

fn main() {
    let limits = Limits::default();
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let Some(stream) = unhex(line.trim()) else {
            println!("false\tbad hex input");
            continue;
        };
        let mut rest: &[u8] = &stream;
        let mut errors: Vec<String> = Vec::new();
        let mut noop_reached = false;
        let mut discard = Discard::default();
        // Every pass consumes bytes or stops, so the stream length bounds it.
        for _ in 0..=stream.len() {
            let now = discard.take(rest.len());
            rest = &rest[now..];
            if !discard.is_done() {
                break;
            }
            match parse(rest, &limits) {
                Parsed::Complete { request, consumed } => {
                    match request {
                        Request::MetaNoop => noop_reached = true,
                        Request::Quit => {
                            errors.push("QUIT".into());
                            break;
                        }
                        _ => {}
                    }
                    rest = &rest[consumed..];
                }
                // A long retrieval line in batches: no error line to compare, skip to its end.
                Parsed::Partial { .. } => {
                    let eol = rest.iter().position(|&b| b == b'\n');
                    rest = &rest[eol.map_or(rest.len(), |i| i + 1)..];
                }
                Parsed::Incomplete => break,
                Parsed::Error(e) => {
                    if !e.noreply {
                        let mut out = Vec::new();
                        e.reply.encode(&mut out);
                        errors.push(String::from_utf8_lossy(&out).trim_end().to_string());
                    }
                    if e.close {
                        break;
                    }
                    rest = &rest[e.consumed..];
                    discard = e.discard();
                }
            }
        }
        println!("{noop_reached}\t{}", errors.join("|"));
    }
}
