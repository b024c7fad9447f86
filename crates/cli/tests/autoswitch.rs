//! The automatic policy (`serve --auto-switch`, `[switching]`, docs/switching.md), with a real
//! cell: a cache-aside client whose access pattern changes makes the cell switch its
//! eviction policy by itself — to S3-FIFO under a scan (every evicted item was never read),
//! back to slab LRU under uniform re-reads (most new keys are ones S3-FIFO dropped) — with
//! no failed request and no foreign value read; turned off, it still says what it would do
//! and switches nothing.

mod common;

use std::collections::HashSet;

use common::{Client, Server, is_memcached};

/// Keys per multi-get (and at most as many sets after it).
const BATCH: usize = 64;
/// Hot keys of the scan phase: they fit many times over.
const HOT_KEYS: u64 = 2_000;
/// Keys of the uniform phase: 14 + 100 bytes each, about twice what `-m 8` holds.
const UNIFORM_KEYS: u64 = 140_000;
/// Bound on the batches each phase runs, whatever the machine's pace.
const BATCHES_MAX: usize = 50_000;
/// Batches between two looks at the cell's automatic policy.
const BATCHES_PER_LOOK: usize = 100;
const VALUE_BYTES: usize = 100;

/// The value of `key`: the key, padded to 100 bytes (a read of another key's value shows).
fn value_of(key: &str) -> String {
    format!("{key:x>VALUE_BYTES$}")
}

/// One cache-aside round: a multi-get of `keys` (every value read must be its key's), a set
/// of each key that missed and of each `fresh` key; every set must be stored.
fn cache_aside(c: &mut Client, keys: &[String], fresh: &[String]) {
    c.send(format!("get {}\r\n", keys.join(" ")).as_bytes());
    let mut found = HashSet::new();
    loop {
        let line = c.line();
        if line == "END" {
            break;
        }
        let key = line
            .strip_prefix("VALUE ")
            .and_then(|l| l.strip_suffix(&format!(" 0 {VALUE_BYTES}")))
            .unwrap_or_else(|| panic!("not a value line: {line:?}"))
            .to_string();
        let data = c.read_exact_len(VALUE_BYTES + 2);
        assert_eq!(&data[..VALUE_BYTES], value_of(&key).as_bytes(), "{key}");
        found.insert(key);
    }
    let missed = keys.iter().filter(|k| !found.contains(*k));
    let mut sets = String::new();
    let mut count = 0;
    for k in missed.chain(fresh) {
        sets += &format!("set {k} 0 0 {VALUE_BYTES}\r\n{}\r\n", value_of(k));
        count += 1;
    }
    c.send(sets.as_bytes());
    for _ in 0..count {
        assert_eq!(c.line(), "STORED");
    }
}

/// A small xorshift: the uniform phase's keys, the same on every run.
struct Keys(u64);

impl Keys {
    fn next(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// The workload of a phase.
#[derive(Clone, Copy)]
enum Phase {
    /// Hot keys read again and again, and a stream of fresh keys written once, never read.
    Scan,
    /// Keys drawn uniformly from twice what the cell holds.
    Uniform,
}

fn status(server: &Server) -> serde_json::Value {
    serde_json::from_str(&server.ctl(&["autoswitch", "status", "--json"])).unwrap()
}

/// Runs `phase` until `until` holds of the cell's automatic policy; the status then.
fn run_until(
    server: &Server,
    c: &mut Client,
    phase: Phase,
    fresh: &mut u64,
    until: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let mut keys = Keys(0x9e37_79b9_7f4a_7c15);
    for batch in 0..BATCHES_MAX {
        if batch % BATCHES_PER_LOOK == 0 {
            let st = status(server);
            if until(&st) {
                return st;
            }
        }
        let (gets, sets): (Vec<String>, Vec<String>) = match phase {
            Phase::Scan => (
                (0..BATCH / 2)
                    .map(|_| format!("h{:013}", keys.next(HOT_KEYS)))
                    .collect(),
                (0..BATCH / 2)
                    .map(|_| {
                        *fresh += 1;
                        format!("s{:013}", *fresh)
                    })
                    .collect(),
            ),
            Phase::Uniform => (
                (0..BATCH)
                    .map(|_| format!("u{:013}", keys.next(UNIFORM_KEYS)))
                    .collect(),
                Vec::new(),
            ),
        };
        cache_aside(c, &gets, &sets);
    }
    panic!(
        "the condition never held in {BATCHES_MAX} batches: {}",
        status(server)
    );
}

/// Runs `phase` until the cell made its `n`th switch; that switch's event.
fn run_until_switched(
    server: &Server,
    c: &mut Client,
    phase: Phase,
    fresh: &mut u64,
    n: u64,
) -> serde_json::Value {
    let st = run_until(server, c, phase, fresh, |st| st["switches"] == n);
    st["events"][n as usize - 1].clone()
}

/// The event is a switch `from` → `to` whose reason says `why`.
fn assert_switch(event: &serde_json::Value, from: &str, to: &str, why: &str) {
    assert_eq!(
        (event["from"].as_str(), event["to"].as_str()),
        (Some(from), Some(to)),
        "{event}"
    );
    assert!(event["reason"].as_str().unwrap().contains(why), "{event}");
}

#[test]
fn the_cell_switches_its_eviction_policy_by_the_access_pattern() {
    if is_memcached() {
        return; // memcached has no automatic policy
    }
    let server = Server::start_with_env(
        &["--standalone", "-m", "8", "--auto-switch"],
        &[
            ("CELLCACHE_SWITCHING__SAMPLE_INTERVAL_MS", "100"),
            ("CELLCACHE_SWITCHING__WINDOW_MS", "1500"),
            ("CELLCACHE_SWITCHING__COOLDOWN_MS", "2500"),
            ("CELLCACHE_SWITCHING__MIN_EVICTIONS", "2000"),
            // Uniform re-reads over 2x the memory bring ~40% of new keys back from the
            // ghost in-process (docs/benchmarks/switching.md); a margin for a short window.
            ("CELLCACHE_SWITCHING__TO_LRU_GHOST_HITS", "0.25"),
        ],
    );
    let mut c = server.connect();
    let mut fresh = 0;
    let st = status(&server);
    assert_eq!(st["enabled"], true, "{st}");
    assert_eq!(st["eviction"], "lru", "{st}");

    // A scan: what slab LRU evicts was never read, so the cell takes S3-FIFO.
    let event = run_until_switched(&server, &mut c, Phase::Scan, &mut fresh, 1);
    assert_switch(&event, "lru", "s3fifo", "never read");
    assert!(
        event["signal"]["unread_evicted"].as_f64().unwrap() >= 0.7,
        "{event}"
    );

    // Uniform re-reads: S3-FIFO's ghost keeps sending keys back, so the cell takes LRU.
    let event = run_until_switched(&server, &mut c, Phase::Uniform, &mut fresh, 2);
    assert_switch(&event, "s3fifo", "lru", "ghost");

    // Shown where an operator looks: ctl status, stats and the metrics.
    let text = server.ctl(&["status"]);
    assert!(
        text.contains("AUTOSWITCH on eviction lru switches 2"),
        "{text}"
    );
    assert!(text.contains("SWITCHED at "), "{text}");
    assert!(text.contains("eviction lru -> s3fifo: "), "{text}");
    assert_eq!(c.stat_of("cellcache", "auto_switches"), "2");
    assert_eq!(c.stat_of("cellcache", "auto_switch"), "1");
    let (_, metrics) = server.admin_call("GET", "/metrics");
    assert!(
        metrics.contains("cellcache_auto_switches_total 2"),
        "{metrics}"
    );

    // Off: the scan again, long enough that the policy would switch — it only says so.
    assert!(
        server
            .ctl(&["autoswitch", "off"])
            .contains("OK autoswitch off")
    );
    let st = run_until(&server, &mut c, Phase::Scan, &mut fresh, |st| {
        st["verdict"]["switch_to"] == "s3fifo"
    });
    assert_eq!(st["enabled"], false, "{st}");
    assert_eq!(st["eviction"], "lru", "{st}");
    assert_eq!(st["switches"], 2, "{st}");
    assert_eq!(c.stat_of("cellcache", "auto_switch"), "0");
    let (status, body) = server.admin_call("POST", "/autoswitch/sometimes");
    assert_eq!(status, 400, "{body}");
}
