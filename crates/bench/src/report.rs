//! The result of a run: a serialisable [`RunReport`] (the `--json` output, also the input of the
//! plotter and of the side-by-side comparison) and its human-readable table.
//!
//! The JSON schema is versioned by [`SCHEMA`]; docs/benchmarks/bench-tool.md documents every
//! field. Latencies are microseconds, rates are per second.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::engine::{EngineResult, LoadMode, StopAfter};
use crate::stats::{LatencySummary, SpectrumPoint};
use crate::workload::{OpKind, Popularity};

/// Identifies the JSON layout; bumped on incompatible changes.
pub const SCHEMA: &str = "cellcache-bench/1";

/// Where a run happened.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    pub hostname: String,
    /// Cores available to the process (`nproc`).
    pub nproc: usize,
    pub cpu_model: String,
    pub kernel: String,
    /// /proc/loadavg when the report was made: other work on the machine skews results.
    #[serde(default)]
    pub load_average: String,
}

impl Machine {
    /// Reads the current machine's description from /proc (fields stay empty where unknown).
    pub fn current() -> Self {
        let read = |p: &str| {
            std::fs::read_to_string(p)
                .unwrap_or_default()
                .trim()
                .to_owned()
        };
        let cpu_model = read("/proc/cpuinfo")
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_owned())
            .unwrap_or_default();
        Self {
            hostname: read("/proc/sys/kernel/hostname"),
            nproc: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cpu_model,
            kernel: read("/proc/sys/kernel/osrelease"),
            load_average: read("/proc/loadavg")
                .split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" "),
        }
    }

    /// One line for tables: `2 cores, AMD EPYC, Linux 6.1`.
    pub fn describe(&self) -> String {
        format!(
            "{} cores ({}), Linux {}, load average {}",
            self.nproc, self.cpu_model, self.kernel, self.load_average
        )
    }
}

/// The workload as run (echoed so a report is self-describing).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkloadReport {
    pub key_count: u64,
    pub key_prefix: String,
    pub key_len: usize,
    pub popularity: Popularity,
    pub get_ratio: f64,
    pub multiget: usize,
    /// Value-size distribution in the `--value-size` syntax.
    pub value_size: String,
    pub ttl_secs: i64,
    pub set_on_miss: bool,
    /// Keys written before the run (0 = no preload).
    pub preloaded: u64,
    /// A growing data set (`--grow`): when it shrinks and to how many keys.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub growth: Option<crate::workload::growth::Growth>,
    /// Keys confined to this hash range (`--key-hash-range`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_hash_range: Option<cellcache_keyspace::HashRange>,
}

/// How the run was driven.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunConfigReport {
    pub servers: Vec<String>,
    pub connections: usize,
    pub pipeline: usize,
    pub threads: usize,
    pub mode: LoadMode,
    pub stop: StopAfter,
    pub warmup_secs: f64,
    /// Cores the generator threads were pinned to (empty = not pinned).
    pub generator_cpus: Vec<usize>,
    pub seed: u64,
    /// TLS to the target (`--tls`); absent for plain runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<crate::tls::TlsReport>,
}

/// Counters and latency of one operation kind (or of all together).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct OpReport {
    pub sent: u64,
    pub replies: u64,
    pub errors: u64,
    pub hits: u64,
    pub misses: u64,
    pub not_stored: u64,
    /// Replies per second of the measured phase.
    pub throughput_rps: f64,
    /// hits / (hits + misses); absent when no key was looked up.
    pub hit_ratio: Option<f64>,
    pub latency: LatencySummary,
    pub spectrum: Vec<SpectrumPoint>,
}

/// Cost of the load generator itself.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GeneratorReport {
    pub cpu_secs: f64,
    /// Busiest generator thread's CPU time / wall time; near 1.0 the generator may be the
    /// bottleneck and the numbers understate the server.
    pub busiest_thread_utilization: f64,
    /// True when `busiest_thread_utilization` exceeds [`GENERATOR_SATURATION`], or when more
    /// than [`GENERATOR_LATE_FRACTION`] of the sends were late by the generator's own lag.
    pub may_be_bottleneck: bool,
}

/// Above this utilisation a generator thread is considered saturated.
pub const GENERATOR_SATURATION: f64 = 0.9;
/// Above this fraction of sends late through the generator's own fault, it is a bottleneck.
pub const GENERATOR_LATE_FRACTION: f64 = 0.01;

/// What was measured.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Results {
    pub measured_secs: f64,
    pub wall_secs: f64,
    /// All operation kinds together.
    pub all: OpReport,
    /// Per operation kind (`get`, `set`).
    pub ops: BTreeMap<String, OpReport>,
    pub errors_by_kind: BTreeMap<String, u64>,
    /// Open loop: arrivals never sent (backlog full, or still waiting at the end).
    pub dropped: u64,
    /// Open loop: sends later than the late threshold after their intended time.
    pub late_sends: u64,
    /// Open loop: the late sends that had not waited for a connection slot — the generator's
    /// own lag (a starved or saturated generator thread).
    #[serde(default)]
    pub late_sends_generator: u64,
    pub warmup_sent: u64,
    pub connections_failed: u64,
    /// Wall-clock time (seconds since the Unix epoch, fractional) at which the measured phase
    /// began; second `i` of the timelines covers `[this + i, this + i + 1)`. 0 in reports
    /// made before the field existed.
    #[serde(default)]
    pub measure_started_unix_secs: f64,
    /// Replies per second, second by second, over the measured phase.
    pub timeline_rps: Vec<u64>,
    /// Second by second over the measured phase (at most
    /// [`crate::stats::TIMELINE_DETAIL_SECONDS_MAX`] entries): counts and latency of what
    /// completed in that second. Empty in reports made before the field existed.
    #[serde(default)]
    pub timeline: Vec<SecondReport>,
    pub generator: GeneratorReport,
}

/// One whole second of the measured phase, all operation kinds together.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SecondReport {
    /// Index of the second: it covers `[second, second + 1)` s after measurement began.
    pub second: u64,
    /// Replies completed in this second.
    pub replies: u64,
    /// Errors counted in this second (an error reply or a lost connection when seen; a
    /// request unanswered at the end of the drain, at the drain's end).
    pub errors: u64,
    /// Keys found and not found by the gets completed in this second.
    pub hits: u64,
    pub misses: u64,
    /// Open loop: requests intended in this second and sent late, and the part of those late
    /// by the generator's own lag (a second whose latency rose with many of these measured
    /// the generator as much as the server).
    pub late_sends: u64,
    pub late_sends_generator: u64,
    /// Latency of the replies completed in this second, in microseconds, from a histogram
    /// of two significant digits; `null` for a second without replies.
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
    pub max_us: Option<f64>,
}

impl SecondReport {
    /// hits / (hits + misses), or `None` when no key was looked up in this second.
    pub fn hit_ratio(&self) -> Option<f64> {
        let looked_up = self.hits + self.misses;
        (looked_up > 0).then(|| self.hits as f64 / looked_up as f64)
    }
}

/// The report's per-second timeline from the merged per-second statistics.
pub fn timeline(seconds: &[crate::stats::SecondStats]) -> Vec<SecondReport> {
    seconds
        .iter()
        .enumerate()
        .map(|(i, s)| SecondReport {
            second: i as u64,
            replies: s.replies,
            errors: s.errors,
            hits: s.hits,
            misses: s.misses,
            late_sends: s.late_sends,
            late_sends_generator: s.late_sends_generator,
            p50_us: s.latency.quantile_us(0.50),
            p99_us: s.latency.quantile_us(0.99),
            max_us: s.latency.max_us(),
        })
        .collect()
}

/// A complete, self-describing run report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunReport {
    pub schema: String,
    pub tool_version: String,
    /// Unix time the run started.
    pub started_unix_secs: u64,
    /// The command line that produced the report.
    pub command: Vec<String>,
    pub machine: Machine,
    pub server_versions: Vec<String>,
    pub config: RunConfigReport,
    pub workload: WorkloadReport,
    pub results: Results,
    /// The servers' CPU time over the measured phase (`--server-pid`); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_cpu: Option<ServerCpuReport>,
}

/// CPU time the processes named by `--server-pid` spent during the measured phase, all
/// together (a ring's cells: the work of the whole ring per reply).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServerCpuReport {
    pub pids: Vec<u32>,
    pub cpu_secs: f64,
    /// All replies of the measured phase per CPU-second of the processes.
    pub replies_per_cpu_sec: f64,
    pub cpu_us_per_reply: f64,
}

impl ServerCpuReport {
    /// The figures for `cpu_secs` spent on `replies`; `None` when either is zero.
    pub fn new(pids: Vec<u32>, cpu_secs: f64, replies: u64) -> Option<Self> {
        (cpu_secs > 0.0 && replies > 0).then(|| ServerCpuReport {
            pids,
            cpu_secs,
            replies_per_cpu_sec: replies as f64 / cpu_secs,
            cpu_us_per_reply: cpu_secs * 1e6 / replies as f64,
        })
    }
}

fn op_report(stats: &crate::stats::OpStats, secs: f64) -> OpReport {
    let looked_up = stats.hits + stats.misses;
    OpReport {
        sent: stats.sent,
        replies: stats.replies,
        errors: stats.errors,
        hits: stats.hits,
        misses: stats.misses,
        not_stored: stats.not_stored,
        throughput_rps: if secs > 0.0 {
            stats.replies as f64 / secs
        } else {
            0.0
        },
        hit_ratio: (looked_up > 0).then(|| stats.hits as f64 / looked_up as f64),
        latency: stats.latency.summary(),
        spectrum: stats.latency.spectrum(),
    }
}

/// Turns the engine's counters into the report's results.
pub fn results(engine: &EngineResult) -> Results {
    let secs = engine.measured_secs;
    let mut total = crate::stats::OpStats::default();
    let mut ops = BTreeMap::new();
    for kind in OpKind::ALL {
        if let Some(stats) = engine.stats.ops.get(&kind) {
            ops.insert(kind.name().to_owned(), op_report(stats, secs));
            total.sent += stats.sent;
            total.replies += stats.replies;
            total.errors += stats.errors;
            total.hits += stats.hits;
            total.misses += stats.misses;
            total.not_stored += stats.not_stored;
        }
    }
    total.latency = engine.stats.all_latency();
    let utilization = engine.generator_busiest_thread_utilization;
    let sent = total.sent;
    Results {
        measured_secs: secs,
        wall_secs: engine.wall_secs,
        all: op_report(&total, secs),
        ops,
        errors_by_kind: engine.stats.errors_by_kind.clone(),
        dropped: engine.stats.dropped,
        late_sends: engine.stats.late_sends,
        late_sends_generator: engine.stats.late_sends_generator,
        warmup_sent: engine.stats.warmup_sent,
        connections_failed: engine.connections_failed,
        measure_started_unix_secs: engine.measure_started_unix_secs,
        timeline_rps: engine.stats.timeline.clone(),
        timeline: timeline(&engine.stats.seconds),
        generator: GeneratorReport {
            cpu_secs: engine.generator_cpu_secs,
            busiest_thread_utilization: utilization,
            may_be_bottleneck: utilization > GENERATOR_SATURATION
                || engine.stats.late_sends_generator as f64 > GENERATOR_LATE_FRACTION * sent as f64,
        },
    }
}

fn fmt_us(us: f64) -> String {
    if us >= 10_000.0 {
        format!("{:.1}ms", us / 1_000.0)
    } else {
        format!("{us:.1}µs")
    }
}

impl RunReport {
    /// The human table printed at the end of a run.
    pub fn table(&self) -> String {
        let r = &self.results;
        let c = &self.config;
        let w = &self.workload;
        let mut s = String::new();
        let mode = match c.mode {
            LoadMode::Closed => format!(
                "closed loop, {} conn × pipeline {}",
                c.connections, c.pipeline
            ),
            LoadMode::Open {
                rate_per_sec,
                arrival,
            } => {
                format!(
                    "open loop, {rate_per_sec} req/s {arrival:?} over {} conn (≤{} in flight each)",
                    c.connections, c.pipeline
                )
            }
        };
        let pop = match w.popularity {
            Popularity::Uniform => "uniform".to_owned(),
            Popularity::Zipf { exponent } => format!("zipf s={exponent}"),
        };
        let _ = writeln!(
            s,
            "servers   {}  ({})",
            c.servers.join(", "),
            self.server_versions.join(", ")
        );
        let _ = writeln!(s, "load      {mode}, {} thread(s)", c.threads);
        let _ = writeln!(
            s,
            "workload  {} keys ({pop}), get ratio {}, multiget {}, value {} B, ttl {}s",
            w.key_count, w.get_ratio, w.multiget, w.value_size, w.ttl_secs
        );
        if let Some(range) = w.key_hash_range {
            let _ = writeln!(s, "keys      hashing into {range}");
        }
        if let Some(g) = w.growth {
            let shrink = g.shrink_at_secs.map_or("never shrinks".to_owned(), |at| {
                format!("shrinks to {} keys from {at}s", g.keep)
            });
            let _ = writeln!(s, "growth    keys written in order once, {shrink}");
        }
        let _ = writeln!(
            s,
            "measured  {:.2}s (wall {:.2}s)",
            r.measured_secs, r.wall_secs
        );
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "{:<5} {:>10} {:>10} {:>7} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
            "op",
            "replies",
            "req/s",
            "errors",
            "hit%",
            "avg",
            "p50",
            "p90",
            "p99",
            "p99.9",
            "max",
            "min"
        );
        let mut rows: Vec<(&str, &OpReport)> = r.ops.iter().map(|(k, v)| (k.as_str(), v)).collect();
        rows.push(("all", &r.all));
        for (name, op) in rows {
            let l = &op.latency;
            let hit = op
                .hit_ratio
                .map_or("-".to_owned(), |h| format!("{:.2}", h * 100.0));
            let _ = writeln!(
                s,
                "{:<5} {:>10} {:>10.0} {:>7} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
                name,
                op.replies,
                op.throughput_rps,
                op.errors,
                hit,
                fmt_us(l.mean_us),
                fmt_us(l.p50_us),
                fmt_us(l.p90_us),
                fmt_us(l.p99_us),
                fmt_us(l.p999_us),
                fmt_us(l.max_us),
                fmt_us(l.min_us),
            );
        }
        let _ = writeln!(s);
        let errors: Vec<String> = r
            .errors_by_kind
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let _ = writeln!(
            s,
            "sent {}  replies {}  errors {}{}  dropped {}  late {} (generator lag {})  warm-up {}  failed conns {}",
            r.all.sent,
            r.all.replies,
            r.all.errors,
            if errors.is_empty() {
                String::new()
            } else {
                format!(" ({})", errors.join(", "))
            },
            r.dropped,
            r.late_sends,
            r.late_sends_generator,
            r.warmup_sent,
            r.connections_failed
        );
        let _ = writeln!(
            s,
            "generator {:.2} CPU-s, busiest thread {:.0}% busy{}",
            r.generator.cpu_secs,
            r.generator.busiest_thread_utilization * 100.0,
            if r.generator.may_be_bottleneck {
                "  WARNING: the generator may be the bottleneck"
            } else {
                ""
            }
        );
        if let Some(c) = &self.server_cpu {
            let _ = writeln!(
                s,
                "servers   {:.2} CPU-s (pids {:?}): {:.0} replies per CPU-s, {:.2} µs CPU per reply",
                c.cpu_secs, c.pids, c.replies_per_cpu_sec, c.cpu_us_per_reply
            );
        }
        s
    }
}

/// A report with nothing measured and a run of `secs` seconds, for tests of what reads
/// reports (the plots).
#[cfg(test)]
pub(crate) fn minimal_report(secs: f64) -> RunReport {
    serde_json::from_value(serde_json::json!({
        "schema": SCHEMA, "tool_version": "test", "started_unix_secs": 0,
        "command": [], "machine": Machine::default(), "server_versions": [],
        "config": {"servers": ["127.0.0.1:1"], "connections": 1, "pipeline": 1,
                   "threads": 1, "mode": {"kind": "closed"},
                   "stop": {"duration": {"secs": secs}}, "warmup_secs": 0.0,
                   "generator_cpus": [], "seed": 1},
        "workload": {"key_count": 1, "key_prefix": "k", "key_len": 2,
                     "popularity": {"kind": "uniform"}, "get_ratio": 1.0, "multiget": 1,
                     "value_size": "1", "ttl_secs": 0, "set_on_miss": false,
                     "preloaded": 0},
        "results": Results::default(),
    }))
    .expect("a minimal report")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::ThreadStats;

    #[test]
    fn timeline_reports_each_second_and_hit_ratio() {
        let mut t = ThreadStats::default();
        t.reply_at(0, 100_000, 3, 1);
        t.error_at(OpKind::Set, "timeout", 1_500_000_000);
        let seconds = timeline(&t.seconds);
        assert_eq!(seconds.len(), 2);
        assert_eq!(
            seconds[0],
            SecondReport {
                second: 0,
                replies: 1,
                errors: 0,
                hits: 3,
                misses: 1,
                late_sends: 0,
                late_sends_generator: 0,
                p50_us: Some(100.0),
                p99_us: Some(100.0),
                max_us: Some(100.0),
            }
        );
        assert_eq!(seconds[0].hit_ratio(), Some(0.75));
        assert_eq!(seconds[1].second, 1);
        assert_eq!(seconds[1].errors, 1);
        assert_eq!((seconds[1].p99_us, seconds[1].hit_ratio()), (None, None));
        let json = serde_json::to_value(&seconds[1]).unwrap();
        assert!(json["p99_us"].is_null(), "{json}");
    }

    #[test]
    fn the_servers_cpu_is_reported_per_reply_and_shown() {
        assert_eq!(ServerCpuReport::new(vec![1], 0.0, 10), None);
        assert_eq!(ServerCpuReport::new(vec![1], 1.0, 0), None);
        let c = ServerCpuReport::new(vec![7, 8], 2.0, 100_000).unwrap();
        assert_eq!(
            (c.replies_per_cpu_sec, c.cpu_us_per_reply),
            (50_000.0, 20.0)
        );
        let mut report = minimal_report(1.0);
        assert!(!report.table().contains("CPU-s (pids"));
        report.server_cpu = Some(c);
        let table = report.table();
        assert!(
            table.contains("servers   2.00 CPU-s (pids [7, 8]): 50000 replies per CPU-s, 20.00 µs CPU per reply"),
            "{table}"
        );
        let back: RunReport =
            serde_json::from_str(&serde_json::to_string(&report).unwrap()).unwrap();
        assert_eq!(back.server_cpu, report.server_cpu);
    }

    #[test]
    fn reports_without_the_timeline_still_parse() {
        let mut results = serde_json::to_value(Results {
            timeline_rps: vec![5, 6],
            ..Results::default()
        })
        .unwrap();
        let obj = results.as_object_mut().unwrap();
        assert!(obj.contains_key("timeline") && obj.contains_key("measure_started_unix_secs"));
        obj.remove("timeline");
        obj.remove("measure_started_unix_secs");
        let old: Results = serde_json::from_value(results).unwrap();
        assert_eq!(old.timeline_rps, vec![5, 6]);
        assert!(old.timeline.is_empty());
        assert_eq!(old.measure_started_unix_secs, 0.0);
    }
}
