//! End-to-end tests against a real server: Debian's `memcached`, spawned on a free loopback
//! port. CI installs memcached; when it is missing these tests fail with a message saying so,
//! never skip.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use cellcache_bench::compare::{Experiment, free_port, memcached_template, running_as_root};
use cellcache_bench::{CompareArgs, LoadArgs};
use clap::Parser;

struct Memcached {
    child: Child,
    addr: SocketAddr,
}

impl Drop for Memcached {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn memcached(memory_mb: u64) -> Memcached {
    const ATTEMPTS: usize = 5;
    for _ in 0..ATTEMPTS {
        let port = free_port().unwrap();
        let mut cmd = Command::new("memcached");
        cmd.args([
            "-l",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-U",
            "0",
            "-t",
            "1",
            "-m",
            &memory_mb.to_string(),
        ]);
        if running_as_root() {
            cmd.args(["-u", "root"]);
        }
        let child = match cmd.stdout(Stdio::null()).stderr(Stdio::null()).spawn() {
            Ok(child) => child,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                panic!("memcached is not installed: `apt-get install memcached` (CI installs it)")
            }
            Err(e) => panic!("starting memcached: {e}"),
        };
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let server = Memcached { child, addr };
        if cellcache_bench::client::wait_ready(
            addr,
            Duration::from_secs(5),
            Duration::from_millis(10),
        )
        .is_ok()
        {
            return server;
        }
    }
    panic!("memcached did not become ready on any of {ATTEMPTS} ports");
}

#[derive(Parser)]
struct LoadCli {
    #[command(flatten)]
    load: LoadArgs,
}

fn load_args(args: &[&str]) -> LoadArgs {
    LoadCli::try_parse_from(std::iter::once("bench").chain(args.iter().copied()))
        .unwrap()
        .load
}

fn check_accounting(report: &cellcache_bench::report::RunReport) {
    let r = &report.results;
    assert!(r.all.sent > 0, "nothing was sent");
    assert_eq!(
        r.all.sent,
        r.all.replies + r.all.errors,
        "sent = replies + errors overall"
    );
    for (op, stats) in &r.ops {
        assert_eq!(
            stats.sent,
            stats.replies + stats.errors,
            "sent = replies + errors for {op}"
        );
        assert_eq!(
            stats.latency.count, stats.replies,
            "one latency sample per reply for {op}"
        );
    }
    let errors_by_kind: u64 = r.errors_by_kind.values().sum();
    assert_eq!(errors_by_kind, r.all.errors, "every error has a kind");
    assert_eq!(
        r.timeline_rps.iter().sum::<u64>(),
        r.all.replies,
        "the timeline counts every reply"
    );
    // The per-second timeline accounts for every reply, error and key looked up, and each
    // second with replies has its latencies.
    let sum = |f: fn(&cellcache_bench::report::SecondReport) -> u64| -> u64 {
        r.timeline.iter().map(f).sum()
    };
    assert_eq!(sum(|s| s.replies), r.all.replies, "timeline replies");
    assert_eq!(sum(|s| s.errors), r.all.errors, "timeline errors");
    assert_eq!(sum(|s| s.hits), r.all.hits, "timeline hits");
    assert_eq!(sum(|s| s.misses), r.all.misses, "timeline misses");
    assert_eq!(sum(|s| s.late_sends), r.late_sends, "timeline late sends");
    assert_eq!(
        sum(|s| s.late_sends_generator),
        r.late_sends_generator,
        "timeline late sends by the generator"
    );
    for (i, s) in r.timeline.iter().enumerate() {
        assert_eq!(s.second, i as u64);
        assert_eq!(s.p99_us.is_some(), s.replies > 0, "second {i}");
        if let (Some(p50), Some(p99), Some(max)) = (s.p50_us, s.p99_us, s.max_us) {
            assert!(p50 <= p99 && p99 <= max, "second {i}: {s:?}");
        }
    }
    assert!(
        r.measure_started_unix_secs > 1.0e9,
        "the measured phase's wall-clock start"
    );
}

#[test]
fn closed_loop_counts_add_up_and_preloaded_keys_hit() {
    let server = memcached(64);
    let load = load_args(&[
        "-c",
        "6",
        "--pipeline",
        "4",
        "-t",
        "2",
        "--requests",
        "20000",
        "--keys",
        "500",
        "--preload",
        "--popularity",
        "zipf",
        "--zipf-exponent",
        "1.345675",
        "--get-ratio",
        "0.9",
        "--value-size",
        "10..2000",
        "--multiget",
        "2",
    ]);
    let report = cellcache_bench::run_load(&[server.addr], &load, false).unwrap();
    check_accounting(&report);
    let r = &report.results;
    assert_eq!(
        r.all.sent, 20_000,
        "exactly the requested count is measured"
    );
    assert_eq!(r.all.errors, 0, "{:?}", r.errors_by_kind);
    assert_eq!(r.ops["get"].hit_ratio, Some(1.0), "every key was preloaded");
    assert_eq!(
        r.ops["get"].hits,
        2 * r.ops["get"].replies,
        "two keys per multi-get"
    );
    let gets = r.ops["get"].sent as f64 / 20_000.0;
    assert!((0.85..0.95).contains(&gets), "get share {gets}");
    assert_eq!(report.workload.preloaded, 500);
    // The JSON round-trips.
    let json = serde_json::to_string(&report).unwrap();
    assert_eq!(
        serde_json::from_str::<cellcache_bench::report::RunReport>(&json).unwrap(),
        report
    );
}

#[test]
fn open_loop_sends_the_scheduled_arrivals_and_counts_add_up() {
    let server = memcached(64);
    let load = load_args(&[
        "-c",
        "4",
        "--rate",
        "2000",
        "--arrival",
        "poisson",
        "--requests",
        "1000",
        "--keys",
        "100",
        "--get-ratio",
        "0.5",
        "--warmup",
        "100ms",
    ]);
    let report = cellcache_bench::run_load(&[server.addr], &load, false).unwrap();
    check_accounting(&report);
    let r = &report.results;
    assert_eq!(
        r.all.sent + r.dropped,
        1000,
        "every measured arrival is sent or counted as dropped"
    );
    assert!(
        r.warmup_sent > 0,
        "warm-up requests are sent but not measured"
    );
    assert_eq!(r.all.errors, 0, "{:?}", r.errors_by_kind);
    // Without preload, the first get of each key misses; sets make later gets hit.
    assert!(r.ops["get"].misses > 0);
}

#[test]
fn a_dead_server_is_counted_as_errors_not_hidden() {
    let server = memcached(64);
    let addr = server.addr;
    let load = load_args(&[
        "-c",
        "2",
        "--duration",
        "3s",
        "--keys",
        "10",
        "--drain-timeout",
        "1s",
    ]);
    let killer = std::thread::spawn(move || {
        // Kill the server once the run is under way (bounded wait for traffic).
        let mut client = cellcache_bench::client::BlockingClient::connect(
            addr,
            Duration::from_secs(1),
            Duration::from_secs(1),
        )
        .unwrap();
        for _ in 0..500 {
            let stats = client.stats().unwrap();
            if stats
                .get("cmd_get")
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
                > 1000
            {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        drop(server);
    });
    let report = cellcache_bench::run_load(&[addr], &load, false).unwrap();
    killer.join().unwrap();
    check_accounting(&report);
    assert_eq!(report.results.connections_failed, 2);
    assert!(report.results.all.replies > 1000);
}

#[test]
fn capacity_fills_until_evictions() {
    let server = memcached(8);
    let params = cellcache_bench::capacity::CapacityParams {
        item_key_len: 14,
        item_value_len: 100,
        fill_batch: 500,
        fill_keys_max: 1_000_000,
    };
    let report = cellcache_bench::capacity::measure(server.addr, &params).unwrap();
    assert_eq!(report.limit_bytes, 8 * 1024 * 1024);
    assert_eq!(report.key_len, 14);
    assert!(report.evictions > 0);
    assert!(
        report.items_held > 10_000 && report.items_held <= report.keys_written,
        "{report:?}"
    );
    assert!(report.overhead_bytes_per_item > 0.0, "{report:?}");
}

#[derive(Parser)]
struct CompareCli {
    #[command(flatten)]
    compare: CompareArgs,
}

#[test]
fn compare_runs_memcached_against_itself() {
    let template = memcached_template(std::path::Path::new("memcached"));
    let args = CompareCli::try_parse_from([
        "compare",
        "--a-cmd",
        &template,
        "--b-cmd",
        &template,
        "--a-name",
        "mc1",
        "--b-name",
        "mc2",
        "--repetitions",
        "2",
        "--memory-mb",
        "16",
        "-c",
        "2",
        "--requests",
        "2000",
        "--keys",
        "100",
        "--preload",
    ])
    .unwrap()
    .compare;
    assert_eq!(args.experiment, Experiment::Load);
    let report = cellcache_bench::compare::compare(&args).unwrap();
    assert_eq!(report.runs.len(), 4);
    let sides: Vec<&str> = report.runs.iter().map(|r| r.side.as_str()).collect();
    assert_eq!(sides, ["mc1", "mc2", "mc1", "mc2"], "interleaved");
    let throughput = report
        .metrics
        .iter()
        .find(|m| m.metric == "throughput_rps")
        .unwrap();
    assert!(throughput.ratio_b_over_a.median > 0.0);
    let hit = report
        .metrics
        .iter()
        .find(|m| m.metric == "hit_ratio")
        .unwrap();
    assert_eq!(hit.ratio_b_over_a.median, 1.0, "both sides preloaded");
    assert!(report.table().contains("throughput_rps"));
    // The plotter draws every load run of a comparison report.
    let dir = cellcache_testkit::process::scratch_dir("compare-plot");
    let json = dir.join("compare.json");
    std::fs::write(&json, serde_json::to_string(&report).unwrap()).unwrap();
    cellcache_bench::plot::run(cellcache_bench::plot::PlotArgs {
        reports: vec![json.display().to_string()],
        out: dir.clone(),
        font: None,
        title: "compare".into(),
        marks: Vec::new(),
    })
    .expect("plotting needs a TrueType font: `apt-get install fonts-dejavu-core`");
    let svg = std::fs::read_to_string(dir.join("throughput.svg")).unwrap();
    for series in ["mc1 #1", "mc2 #1", "mc1 #2", "mc2 #2"] {
        assert!(svg.contains(series), "series {series} drawn");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_growing_data_set_grows_holds_and_shrinks_and_every_get_hits() {
    let server = memcached(64);
    // 2,000 writes/s: the 2,000 keys are written in the first second (of the warm-up and the
    // measured phase), held, deleted from 1.5 s down to 500, then overwritten.
    let load = load_args(&[
        "-c",
        "4",
        "-t",
        "2",
        "--pipeline",
        "4",
        "--rate",
        "4000",
        "--warmup",
        "500ms",
        "--duration",
        "3s",
        "--keys",
        "2000",
        "--get-ratio",
        "0.5",
        "--value-size",
        "200",
        "--grow",
        "--shrink-at",
        "1.5s",
        "--shrink-to",
        "500",
    ]);
    let report = cellcache_bench::run_load(&[server.addr], &load, false).unwrap();
    check_accounting(&report);
    let r = &report.results;
    let (gets, sets, deletes) = (&r.ops["get"], &r.ops["set"], &r.ops["delete"]);
    assert_eq!(r.all.errors, 0);
    assert!(gets.replies > 3_000, "{gets:?}");
    assert_eq!(gets.misses, 0, "a get reads only answered, undeleted keys");
    assert_eq!(
        deletes.replies, 1_500,
        "the oldest 1,500 keys deleted once each"
    );
    assert_eq!(deletes.not_stored, 0, "every delete found its key");
    assert!(sets.replies > 1_000, "{sets:?}");
    let five = Duration::from_secs(5);
    let client = cellcache_bench::client::BlockingClient::connect(server.addr, five, five);
    let stats = client.unwrap().stats().unwrap();
    assert_eq!(stats["curr_items"], "500", "the kept keys");
    assert_eq!(report.workload.growth.unwrap().keep, 500);
}

#[test]
fn read_through_fills_each_missing_key_once() {
    let server = memcached(64);
    // One connection, one request in flight: a fill is always the request right after its
    // miss, so each of the 50 keys misses exactly once and is then found.
    let load = load_args(&[
        "-c",
        "1",
        "--requests",
        "3000",
        "--keys",
        "50",
        "--get-ratio",
        "1",
        "--set-on-miss",
    ]);
    let report = cellcache_bench::run_load(&[server.addr], &load, false).unwrap();
    check_accounting(&report);
    let r = &report.results;
    let (gets, sets) = (&r.ops["get"], &r.ops["set"]);
    assert_eq!(gets.misses, 50, "every key misses once");
    assert_eq!(sets.replies, gets.misses, "one fill per miss");
    assert_eq!(gets.hits + gets.misses, gets.replies);
    assert_eq!(gets.sent + sets.sent, 3000);
}

#[test]
fn several_servers_share_the_connections_and_are_all_preloaded() {
    let (a, b) = (memcached(16), memcached(16));
    let load = load_args(&[
        "-c",
        "4",
        "--requests",
        "4000",
        "--keys",
        "200",
        "--preload",
        "--get-ratio",
        "1",
    ]);
    let report = cellcache_bench::run_load(&[a.addr, b.addr], &load, false).unwrap();
    check_accounting(&report);
    assert_eq!(report.config.servers.len(), 2);
    assert_eq!(
        report.results.ops["get"].hit_ratio,
        Some(1.0),
        "each server got the whole key space"
    );
    for server in [&a, &b] {
        let mut client = cellcache_bench::client::BlockingClient::connect(
            server.addr,
            Duration::from_secs(1),
            Duration::from_secs(5),
        )
        .unwrap();
        let stats = client.stats().unwrap();
        let gets: u64 = stats["cmd_get"].parse().unwrap();
        let items: u64 = stats["curr_items"].parse().unwrap();
        // Each server got connections of the load. How many requests each served depends
        // on how fast each answered (closed loop on a shared machine: CI saw 922 of 4000
        // on one side), so only a share is required, not an even one.
        assert!(
            gets > 0,
            "{} served no get: connections are spread over servers",
            server.addr
        );
        assert_eq!(items, 200, "{} holds the preloaded key space", server.addr);
    }
}
