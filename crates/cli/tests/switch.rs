//! Live switching of a cell's eviction policy (`ctl switch`), with real processes: clients
//! keep writing and reading through the memcached port while the admin plane switches the
//! policy back and forth; no request fails and no read returns an older version than the
//! last one its writer stored (an evicted key is a miss, never a stale value).

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use common::{Server, is_memcached};

/// Switches made while the clients run.
const SWITCHES: usize = 40;
/// Writer threads, each with its own connection and keys.
const WRITERS: usize = 3;
/// Keys per writer: 3 × 30,000 × ~330 bytes is more than the cell's 16 MiB, so it evicts.
const KEYS_PER_WRITER: usize = 30_000;
/// Writes (all writers) between two switches: 40 × 1,500 × ~330 bytes fill 16 MiB.
const WRITES_BETWEEN_SWITCHES: u64 = 1_500;
/// Bound on each writer's rounds, whatever the switches' pace.
const ROUNDS_MAX: usize = 200_000;

#[test]
fn eviction_switches_back_and_forth_under_load_without_errors_or_stale_reads() {
    if is_memcached() {
        return; // memcached has no admin plane to switch through
    }
    let server = Server::start(&["--standalone", "-m", "16"]);
    let listed = server.blocks();
    assert_eq!(
        listed,
        serde_json::json!({
            "eviction": {"current": "lru", "available": ["lru", "s3fifo"]},
            "layout": {"current": "shared", "available": ["shared"]},
            "write_policy": {"current": "none", "available": []},
            "replication": {"current": "none", "available": []},
        })
    );
    let (status, body) = server.admin_call("POST", "/switch/eviction/arc");
    assert_eq!(status, 400, "{body}");
    let done = AtomicBool::new(false);
    let writes = AtomicU64::new(0);
    let (hits, misses) = std::thread::scope(|scope| {
        let writers: Vec<_> = (0..WRITERS)
            .map(|w| {
                let (server, done, writes) = (&server, &done, &writes);
                scope.spawn(move || {
                    let mut c = server.connect();
                    let mut latest = vec![0u64; KEYS_PER_WRITER];
                    let (mut hits, mut misses) = (0u64, 0u64);
                    for round in 0..ROUNDS_MAX as u64 {
                        if done.load(Ordering::Relaxed) {
                            break;
                        }
                        let k = (round * 7919 + w as u64) as usize % KEYS_PER_WRITER;
                        let value = format!("{:0300}", round + 1);
                        c.send(format!("set w{w}-{k} 0 0 300\r\n{value}\r\n").as_bytes());
                        c.expect(b"STORED\r\n");
                        latest[k] = round + 1;
                        writes.fetch_add(1, Ordering::Relaxed);
                        let k = (round * 104_729 + 13) as usize % KEYS_PER_WRITER;
                        c.send(format!("get w{w}-{k}\r\n").as_bytes());
                        let line = c.line();
                        if line == "END" {
                            misses += 1;
                            continue;
                        }
                        assert_eq!(line, format!("VALUE w{w}-{k} 0 300"));
                        let got = String::from_utf8(c.read_exact_len(302)).unwrap();
                        let version: u64 = got.trim_end().parse().unwrap();
                        assert_eq!(version, latest[k], "key w{w}-{k}: stale or foreign value");
                        c.expect(b"END\r\n");
                        hits += 1;
                    }
                    (hits, misses)
                })
            })
            .collect();
        for i in 0..SWITCHES {
            let to = if i % 2 == 0 { "s3fifo" } else { "lru" };
            let (status, body) = server.admin_call("POST", &format!("/switch/eviction/{to}"));
            assert_eq!(status, 200, "{body}");
            let (_, list) = server.admin_call("GET", "/switch");
            let list: serde_json::Value = serde_json::from_str(&list).unwrap();
            assert_eq!(list["eviction"]["current"], to);
            // Let the writers make progress between switches (a bounded wait).
            let seen = writes.load(Ordering::Relaxed);
            for _ in 0..10_000 {
                if writes.load(Ordering::Relaxed) >= seen + WRITES_BETWEEN_SWITCHES {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        done.store(true, Ordering::Relaxed);
        writers
            .into_iter()
            .map(|h| h.join().unwrap())
            .fold((0, 0), |(h, m), (a, b)| (h + a, m + b))
    });
    assert!(hits > 0 && misses > 0, "hits {hits}, misses {misses}");
    // The cell evicted under this load, and reports the policy it runs now.
    let mut c = server.connect();
    c.send(b"stats settings\r\n");
    let settings: Vec<String> = std::iter::from_fn(|| Some(c.line()))
        .take_while(|l| l != "END")
        .collect();
    assert!(
        settings.contains(&"STAT eviction_policy lru".to_string()),
        "{settings:?}"
    );
    c.send(b"stats\r\n");
    let stats: Vec<String> = std::iter::from_fn(|| Some(c.line()))
        .take_while(|l| l != "END")
        .collect();
    let evictions: u64 = stats
        .iter()
        .find_map(|l| l.strip_prefix("STAT evictions "))
        .and_then(|v| v.parse().ok())
        .expect("stats has evictions");
    assert!(evictions > 0, "the load must make the cell evict");
}
