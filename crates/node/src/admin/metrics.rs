//! `GET /metrics` on the admin plane: one cell's figures in Prometheus's exposition format
//! (OpenMetrics text, through the prometheus-client crate), read from the same counters as
//! its `stats cell`.
//!
//! What memcached has keeps memcached_exporter's names and labels, so dashboards and alerts
//! written for memcached read a cell unchanged; a ring is scraped cell by cell, as a
//! memcached pool is, and its sums are the ring's: `memcached_current_items` and
//! `memcached_current_bytes` count the items a cell *masters* (a backup's copies are in
//! `cellcache_stored_items`), so `sum(memcached_current_items)` is the ring's item count.
//! The rest is `cellcache_*`: the ring's own figures, the request service time histogram
//! (`crate::latency`, read from the same `stats cellcache` lines), and what is read from the
//! replicator at scrape time — each replication target's lag and each snapshot stream's
//! progress ([`Ring`]).

use std::collections::HashMap;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use crate::cell::Cell;
use crate::cluster::Slot;
use crate::cluster::repl::TargetLag;
use crate::latency::{BUCKETS, bound_us};

/// `(metric, stats field, help)`: counters (exposed with `_total`).
const COUNTERS: &[(&str, &str, &str)] = &[
    (
        "memcached_read_bytes",
        "bytes_read",
        "Bytes clients sent (before TLS decryption).",
    ),
    (
        "memcached_written_bytes",
        "bytes_written",
        "Bytes sent to clients (before TLS encryption).",
    ),
    (
        "memcached_connections",
        "total_connections",
        "Client connections accepted.",
    ),
    (
        "memcached_connections_rejected",
        "rejected_connections",
        "Client connections refused past a connection limit.",
    ),
    (
        "memcached_connections_yielded",
        "conn_yields",
        "Times a connection yielded to others after -R requests.",
    ),
    (
        "memcached_items",
        "total_items",
        "Items stored (a backup's copies not counted).",
    ),
    (
        "memcached_items_evicted",
        "evictions",
        "Items evicted to make room.",
    ),
    (
        "memcached_items_reclaimed",
        "reclaimed",
        "Expired items whose space was reused.",
    ),
    (
        "cellcache_request_timeouts",
        "request_timeouts",
        "Connections closed for holding part of a request past io.request_timeout_secs.",
    ),
    (
        "cellcache_address_refusals",
        "address_refusals",
        "Connections refused past io.connections_per_address_max.",
    ),
    (
        "cellcache_auth_throttled",
        "auth_throttled",
        "Logins refused unchecked: their address failed too often.",
    ),
    (
        "cellcache_ssl_handshake_errors",
        "ssl_handshake_errors",
        "Client connections closed because their TLS failed.",
    ),
    (
        "cellcache_forwarded",
        "cluster_forwarded",
        "Requests this cell forwarded to their key's master.",
    ),
    (
        "cellcache_ghost_hits",
        "ghost_hits",
        "New items S3-FIFO's ghost table remembered (dropped unread, written again soon).",
    ),
    (
        "cellcache_auto_switches",
        "auto_switches",
        "Blocks the automatic policy switched ([switching] auto).",
    ),
    (
        "cellcache_unavailable",
        "cluster_unavailable",
        "Requests answered with the retryable no-master error (no master reachable in time).",
    ),
    (
        "cellcache_stray_writes",
        "cluster_stray_writes",
        "Client writes run after the map moved their key away (0 unless the map gate fails).",
    ),
    (
        "cellcache_replies_held",
        "cluster_replies_held",
        "Write replies held until the backups acknowledged the write (replication sync).",
    ),
    (
        "cellcache_replicate_gaps",
        "cluster_replicate_gaps",
        "Replication frames refused for a gap in their positions.",
    ),
    (
        "cellcache_consensus_refused",
        "cluster_consensus_refused",
        "Consensus frames refused (sender not in the map, or not the node it names).",
    ),
    (
        "cellcache_maps_installed",
        "cluster_maps_installed",
        "Ring maps this cell installed.",
    ),
    (
        "cellcache_replication_acked_bytes",
        "cluster_replication_bytes_sent",
        "Replication bytes (live and snapshot) the targets acknowledged.",
    ),
    (
        "cellcache_stream_sent_items",
        "cluster_stream_items",
        "Items snapshot streams (hand-off, re-replication) read into their targets' queues.",
    ),
    (
        "cellcache_stream_sent_bytes",
        "cluster_stream_bytes",
        "Encoded bytes of the items snapshot streams read into their targets' queues.",
    ),
    (
        "cellcache_tier_writes",
        "tier_writes_recorded",
        "Writes the cache tier recorded.",
    ),
    (
        "cellcache_tier_flushed_ops",
        "tier_flushed_ops",
        "Ops the backing store confirmed.",
    ),
    (
        "cellcache_tier_failed_batches",
        "tier_failed_batches",
        "Backing-store batches failed.",
    ),
    (
        "cellcache_tier_refused_writes",
        "tier_refused_writes",
        "Writes refused: dirty bound.",
    ),
    (
        "cellcache_tier_loads",
        "tier_loads",
        "Read-through loads started.",
    ),
    (
        "cellcache_tier_load_errors",
        "tier_load_errors",
        "Read-through loads that failed.",
    ),
    (
        "cellcache_tier_reinserted",
        "tier_reinserted",
        "Evicted dirty items re-inserted.",
    ),
];

/// `(kind label, stats field)`: `cellcache_streams_started_total{kind}`.
const STREAMS_STARTED: &[(&str, &str)] = &[
    ("handoff", "cluster_handoff_streams"),
    ("resync", "cluster_resync_streams"),
];

/// `(metric, stats field, help)`: gauges.
const GAUGES: &[(&str, &str, &str)] = &[
    (
        "memcached_uptime_seconds",
        "uptime",
        "Seconds since the cell started.",
    ),
    (
        "memcached_current_connections",
        "curr_connections",
        "Client connections open.",
    ),
    (
        "memcached_max_connections",
        "max_connections",
        "Client connections allowed (-c).",
    ),
    (
        "memcached_limit_bytes",
        "limit_maxbytes",
        "Memory for items (-m).",
    ),
    (
        "cellcache_stored_items",
        "curr_items",
        "Items held, a backup's copies included.",
    ),
    (
        "cellcache_stored_bytes",
        "bytes",
        "Bytes of items held, a backup's copies included.",
    ),
    (
        "cellcache_auto_switch_enabled",
        "auto_switch",
        "1 when the automatic policy switches blocks by itself ([switching] auto).",
    ),
    (
        "cellcache_epoch",
        "cluster_epoch",
        "The ring map's epoch this cell serves.",
    ),
    (
        "cellcache_tier_dirty_bytes",
        "tier_dirty_bytes",
        "Bytes not yet in the backing store.",
    ),
    (
        "cellcache_tier_dirty_keys",
        "tier_dirty_keys",
        "Keys not yet in the backing store.",
    ),
];

/// memcached_exporter's `memcached_commands_total{command,status}`: `(command, status, stats field)`.
const COMMANDS: &[(&str, &str, &str)] = &[
    ("get", "hit", "get_hits"),
    ("get", "miss", "get_misses"),
    ("get", "expired", "get_expired"),
    ("get", "flushed", "get_flushed"),
    ("set", "hit", "cmd_set"),
    ("delete", "hit", "delete_hits"),
    ("delete", "miss", "delete_misses"),
    ("incr", "hit", "incr_hits"),
    ("incr", "miss", "incr_misses"),
    ("decr", "hit", "decr_hits"),
    ("decr", "miss", "decr_misses"),
    ("cas", "hit", "cas_hits"),
    ("cas", "miss", "cas_misses"),
    ("cas", "badval", "cas_badval"),
    ("touch", "hit", "touch_hits"),
    ("touch", "miss", "touch_misses"),
    ("flush", "hit", "cmd_flush"),
];

/// One scrape's figures: the `stats cell` fields by name.
#[derive(Debug)]
struct Figures {
    stats: HashMap<String, String>,
    /// The share of the key-hash space this cell masters (0 outside a ring's Active cells;
    /// 1 for a cell that is not a ring member).
    range_share: f64,
    /// Autoscale decisions this cell made as the ring's decider, by action (ring members).
    autoscale: Option<[(&'static str, u64); 4]>,
    /// The I/O engine running (`cellcache_request_duration_seconds`' `engine` label).
    engine: &'static str,
    /// What a ring member reads from its replicator at scrape time.
    ring: Option<Ring>,
}

/// A ring member's replication, read at scrape time.
#[derive(Debug, Default)]
struct Ring {
    targets: Vec<TargetLag>,
    /// Running snapshot streams: `(to, kind, items, bytes, seconds running)`.
    streams: Vec<(String, &'static str, u64, u64, f64)>,
    autoscale_enabled: Option<bool>,
}

/// A histogram read from counts (prometheus-client's own `Histogram` is one to observe into).
struct ConstHistogram {
    sum: f64,
    count: u64,
    /// `(upper bound, count in that bucket alone)`, the last bound `f64::MAX` (+Inf).
    buckets: Vec<(f64, u64)>,
}

impl EncodeMetric for ConstHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_histogram::<NoLabelSet>(self.sum, self.count, &self.buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

impl Figures {
    fn number(&self, field: &str) -> Option<f64> {
        self.stats.get(field)?.parse().ok()
    }

    /// The request service time histogram from `stats cellcache`'s `request_duration_*`
    /// lines (cumulative counts per bound), if they are all there.
    fn latency(&self) -> Option<ConstHistogram> {
        let count = self.number("request_duration_count")?;
        let sum_us = self.number("request_duration_sum_us")?;
        let mut buckets = Vec::with_capacity(BUCKETS + 1);
        let mut below = 0.0;
        for i in 0..BUCKETS {
            let bound = bound_us(i);
            let cumulative = self.number(&format!("request_duration_us_le_{bound}"))?;
            buckets.push((bound as f64 / 1e6, (cumulative - below).max(0.0) as u64));
            below = cumulative;
        }
        buckets.push((f64::MAX, (count - below).max(0.0) as u64));
        Some(ConstHistogram {
            sum: sum_us / 1e6,
            count: count as u64,
            buckets,
        })
    }

    /// The items (bytes) a cell masters: a ring member's master share, else everything.
    fn mastered(&self) -> (f64, f64) {
        let items = self.number("curr_items").unwrap_or(0.0);
        let bytes = self.number("bytes").unwrap_or(0.0);
        match self.number("cluster_master_items") {
            Some(mine) if items > 0.0 => (mine, bytes * mine / items),
            Some(mine) => (mine, 0.0),
            None => (items, bytes),
        }
    }
}

impl Collector for Figures {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let up = ConstGauge::new(1i64);
        up.encode(encoder.encode_descriptor(
            "memcached_up",
            "Whether the cell answered (always 1 when scraped).",
            None,
            up.metric_type(),
        )?)?;
        let commands = ConstCounter::new(0u64);
        let mut family = encoder.encode_descriptor(
            "memcached_commands",
            "Commands executed by this cell, by command and outcome.",
            None,
            commands.metric_type(),
        )?;
        for (command, status, field) in COMMANDS {
            if let Some(v) = self.number(field) {
                let labels = [("command", *command), ("status", *status)];
                ConstCounter::new(v as u64).encode(family.encode_family(&labels)?)?;
            }
        }
        for (name, field, help) in COUNTERS {
            if let Some(v) = self.number(field) {
                let c = ConstCounter::new(v as u64);
                c.encode(encoder.encode_descriptor(name, help, None, c.metric_type())?)?;
            }
        }
        for (name, field, help) in GAUGES {
            if let Some(v) = self.number(field) {
                let g = ConstGauge::new(v as i64);
                g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)?;
            }
        }
        let (items, bytes) = self.mastered();
        for (name, value, help) in [
            (
                "memcached_current_items",
                items,
                "Items this cell masters (the ring's sum is its item count).",
            ),
            (
                "memcached_current_bytes",
                bytes,
                "Bytes of the items this cell masters.",
            ),
        ] {
            let g = ConstGauge::new(value as i64);
            g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)?;
        }
        if let Some(counts) = self.autoscale {
            let c = ConstCounter::new(0u64);
            let mut family = encoder.encode_descriptor(
                "cellcache_autoscale_decisions",
                "Autoscale decisions this cell made while it led the ring, by action (divide, \
                 absorb, failed).",
                None,
                c.metric_type(),
            )?;
            for (action, n) in counts {
                ConstCounter::new(n).encode(family.encode_family(&[("action", action)])?)?;
            }
        }
        if let Some(h) = self.latency() {
            let mut family = encoder.encode_descriptor(
                "cellcache_request_duration_seconds",
                "Request service time: from the start of the batch of input holding the \
                 request to its reply being ready to write (a forwarded or held request's \
                 when its reply arrived), by I/O engine.",
                None,
                h.metric_type(),
            )?;
            h.encode(family.encode_family(&[("engine", self.engine)])?)?;
        }
        if let Some(ring) = &self.ring {
            ring.encode(&mut encoder, self)?;
        }
        let share = ConstGauge::new(self.range_share);
        share.encode(encoder.encode_descriptor(
            "cellcache_range_share",
            "Share of the key-hash space this cell masters.",
            None,
            share.metric_type(),
        )?)?;
        Ok(())
    }
}

/// Labels of one series.
type Labels = Vec<(&'static str, String)>;

/// One gauge family, a series per row.
fn gauges(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: impl IntoIterator<Item = (Labels, f64)>,
) -> Result<(), std::fmt::Error> {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, value) in rows {
        ConstGauge::new(value).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

impl Ring {
    fn encode(
        &self,
        encoder: &mut DescriptorEncoder,
        figures: &Figures,
    ) -> Result<(), std::fmt::Error> {
        let per_lane = |f: fn(&TargetLag) -> (u64, u64)| {
            self.targets.iter().flat_map(move |t| {
                let (live, snapshot) = f(t);
                [("live", live), ("snapshot", snapshot)].map(|(lane, v)| {
                    (
                        vec![("to", t.to.to_string()), ("lane", lane.to_string())],
                        v as f64,
                    )
                })
            })
        };
        gauges(
            encoder,
            "cellcache_replication_lag_records",
            "Records queued for a replication target and not yet acknowledged, by lane (live: \
             client writes; snapshot: hand-off and re-replication).",
            per_lane(|t| (t.live_records, t.snapshot_records)),
        )?;
        gauges(
            encoder,
            "cellcache_replication_queue_bytes",
            "Bytes of the records queued for a replication target and not yet acknowledged, \
             by lane.",
            per_lane(|t| (t.live_bytes, t.snapshot_bytes)),
        )?;
        let target = |t: &TargetLag| vec![("to", t.to.to_string())];
        gauges(
            encoder,
            "cellcache_replication_stall_seconds",
            "How long records have waited for a replication target without an \
             acknowledgement (0: none waiting, or it keeps up).",
            self.targets
                .iter()
                .map(|t| (target(t), t.stalled.as_secs_f64())),
        )?;
        gauges(
            encoder,
            "cellcache_replication_target_unreachable",
            "1 if the last attempt to reach a replication target failed.",
            self.targets
                .iter()
                .map(|t| (target(t), f64::from(u8::from(t.unreachable)))),
        )?;
        gauges(
            encoder,
            "cellcache_streams_active",
            "Snapshot streams of this cell's range running, by kind (handoff: to a division's \
             child; resync: re-replication to a backup).",
            ["handoff", "resync"].map(|kind| {
                let n = self.streams.iter().filter(|s| s.1 == kind).count();
                (vec![("kind", kind.to_string())], n as f64)
            }),
        )?;
        let stream = |s: &(String, &'static str, u64, u64, f64)| {
            vec![("to", s.0.clone()), ("kind", s.1.to_string())]
        };
        gauges(
            encoder,
            "cellcache_stream_progress_items",
            "Items a running snapshot stream has read into its target's queue so far.",
            self.streams.iter().map(|s| (stream(s), s.2 as f64)),
        )?;
        gauges(
            encoder,
            "cellcache_stream_progress_bytes",
            "Encoded bytes a running snapshot stream has read into its target's queue so far.",
            self.streams.iter().map(|s| (stream(s), s.3 as f64)),
        )?;
        gauges(
            encoder,
            "cellcache_stream_elapsed_seconds",
            "How long a running snapshot stream has been running.",
            self.streams.iter().map(|s| (stream(s), s.4)),
        )?;
        let started = ConstCounter::new(0u64);
        let mut family = encoder.encode_descriptor(
            "cellcache_streams_started",
            "Snapshot streams this cell started, by kind (a restarted stream counts again).",
            None,
            started.metric_type(),
        )?;
        for (kind, field) in STREAMS_STARTED {
            if let Some(v) = figures.number(field) {
                ConstCounter::new(v as u64).encode(family.encode_family(&[("kind", *kind)])?)?;
            }
        }
        if let Some(on) = self.autoscale_enabled {
            let g = ConstGauge::new(i64::from(on));
            g.encode(encoder.encode_descriptor(
                "cellcache_autoscale_enabled",
                "1 if autoscaling is switched on in this cell (it decides only while it leads \
                 the ring).",
                None,
                g.metric_type(),
            )?)?;
        }
        Ok(())
    }
}

/// The body of `GET /metrics` for `cell` (OpenMetrics text).
pub fn render(cell: &Cell, ring: &Slot) -> Result<String, std::fmt::Error> {
    let mut raw = Vec::new();
    let mut range_share = 1.0;
    let mut autoscale = None;
    let mut replication = None;
    match ring.cluster.get() {
        Some(cl) => {
            crate::cluster::stats::local_cell_stats(cl, &mut raw);
            range_share = cl.master_range_share();
            autoscale = cl.autoscale.get().map(|a| a.counts());
            let streams = cl
                .streams_running()
                .into_iter()
                .map(|s| {
                    let p = &s.progress;
                    (
                        s.to.to_string(),
                        if p.handoff { "handoff" } else { "resync" },
                        p.items.load(std::sync::atomic::Ordering::Relaxed),
                        p.bytes.load(std::sync::atomic::Ordering::Relaxed),
                        p.started.elapsed().as_secs_f64(),
                    )
                })
                .collect();
            replication = Some(Ring {
                targets: cl.replication_lag(),
                streams,
                autoscale_enabled: cl.autoscale.get().map(|a| a.enabled()),
            });
        }
        None => crate::stats::reply(
            cell,
            &cellcache_proto::StatsGroup::Other(b"cell"),
            cell.now(),
            &mut raw,
        ),
    }
    let stats = crate::cluster::stats::parse(&raw)
        .unwrap_or_default()
        .into_iter()
        .collect();
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Figures {
        stats,
        range_share,
        autoscale,
        engine: cell.engine.get().map_or("none", |e| e.as_str()),
        ring: replication,
    }));
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &registry)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figures(pairs: &[(&str, &str)]) -> Figures {
        Figures {
            stats: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            range_share: 0.25,
            autoscale: Some([("divide", 3), ("absorb", 1), ("failed", 0), ("balance", 2)]),
            engine: "epoll",
            ring: None,
        }
    }

    /// The `stats cellcache` lines of a cell whose histogram saw `durations`.
    fn latency_stats(durations: &[std::time::Duration]) -> Vec<(String, String)> {
        let cell = crate::latency::Latency::default();
        let mut local = crate::latency::LocalLatency::default();
        for d in durations {
            local.record(*d, 1);
        }
        cell.absorb(&mut local);
        let mut raw = Vec::new();
        cell.write_stats(&mut raw);
        raw.extend_from_slice(b"END\r\n");
        crate::cluster::stats::parse(&raw).unwrap()
    }

    fn text(f: Figures) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(f));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        out
    }

    #[test]
    fn memcached_names_and_labels() {
        let out = text(figures(&[
            ("get_hits", "7"),
            ("get_misses", "3"),
            ("cmd_set", "10"),
            ("curr_connections", "2"),
            ("bytes_read", "100"),
            ("limit_maxbytes", "67108864"),
        ]));
        for line in [
            "memcached_commands_total{command=\"get\",status=\"hit\"} 7",
            "memcached_commands_total{command=\"get\",status=\"miss\"} 3",
            "memcached_commands_total{command=\"set\",status=\"hit\"} 10",
            "memcached_current_connections 2",
            "memcached_read_bytes_total 100",
            "memcached_limit_bytes 67108864",
            "memcached_up 1",
            "cellcache_range_share 0.25",
            "cellcache_autoscale_decisions_total{action=\"divide\"} 3",
            "cellcache_autoscale_decisions_total{action=\"absorb\"} 1",
        ] {
            assert!(out.lines().any(|l| l == line), "no {line:?} in\n{out}");
        }
        assert!(
            !out.contains("cellcache_epoch"),
            "absent fields are not made up"
        );
    }

    #[test]
    fn a_cell_with_a_tier_exports_its_figures() {
        let out = text(figures(&[
            ("tier_dirty_bytes", "512"),
            ("tier_flushed_ops", "9"),
        ]));
        assert!(
            out.lines().any(|l| l == "cellcache_tier_dirty_bytes 512"),
            "{out}"
        );
        assert!(
            out.lines()
                .any(|l| l == "cellcache_tier_flushed_ops_total 9"),
            "{out}"
        );
        assert!(
            !out.contains("cellcache_tier_loads"),
            "no tier, no made-up figures"
        );
    }

    #[test]
    fn a_ring_member_counts_what_it_masters() {
        let out = text(figures(&[
            ("curr_items", "30"),
            ("bytes", "3000"),
            ("cluster_master_items", "10"),
        ]));
        assert!(
            out.lines().any(|l| l == "memcached_current_items 10"),
            "{out}"
        );
        assert!(
            out.lines().any(|l| l == "memcached_current_bytes 1000"),
            "{out}"
        );
        assert!(
            out.lines().any(|l| l == "cellcache_stored_items 30"),
            "{out}"
        );
    }

    #[test]
    fn the_request_histogram_is_the_stats_lines_cumulated_by_prometheus() {
        let us = std::time::Duration::from_micros;
        let mut f = figures(&[]);
        f.stats = latency_stats(&[us(3), us(3), us(100), std::time::Duration::from_secs(9)])
            .into_iter()
            .collect();
        let out = text(f);
        for line in [
            "# TYPE cellcache_request_duration_seconds histogram",
            "cellcache_request_duration_seconds_count{engine=\"epoll\"} 4",
            "cellcache_request_duration_seconds_sum{engine=\"epoll\"} 9.000106",
            "cellcache_request_duration_seconds_bucket{le=\"0.000002\",engine=\"epoll\"} 0",
            "cellcache_request_duration_seconds_bucket{le=\"0.000004\",engine=\"epoll\"} 2",
            "cellcache_request_duration_seconds_bucket{le=\"0.000128\",engine=\"epoll\"} 3",
            "cellcache_request_duration_seconds_bucket{le=\"4.194304\",engine=\"epoll\"} 3",
            "cellcache_request_duration_seconds_bucket{le=\"+Inf\",engine=\"epoll\"} 4",
        ] {
            assert!(out.lines().any(|l| l == line), "no {line:?} in\n{out}");
        }
        // A cell without the lines (an older cell's stats) exposes no histogram.
        assert!(!text(figures(&[])).contains("cellcache_request_duration"));
    }

    #[test]
    fn replication_targets_and_streams_are_labelled() {
        let to: crate::cluster::repl::TargetLag = TargetLag {
            to: "7".parse().unwrap(),
            live_records: 5,
            live_bytes: 500,
            snapshot_records: 2,
            snapshot_bytes: 2048,
            stalled: std::time::Duration::from_millis(1500),
            unreachable: true,
        };
        let mut f = figures(&[
            ("cluster_handoff_streams", "2"),
            ("cluster_resync_streams", "1"),
        ]);
        f.ring = Some(Ring {
            targets: vec![to],
            streams: vec![("9".into(), "handoff", 40, 4000, 2.5)],
            autoscale_enabled: Some(true),
        });
        let out = text(f);
        for line in [
            "cellcache_replication_lag_records{to=\"7\",lane=\"live\"} 5.0",
            "cellcache_replication_lag_records{to=\"7\",lane=\"snapshot\"} 2.0",
            "cellcache_replication_queue_bytes{to=\"7\",lane=\"live\"} 500.0",
            "cellcache_replication_queue_bytes{to=\"7\",lane=\"snapshot\"} 2048.0",
            "cellcache_replication_stall_seconds{to=\"7\"} 1.5",
            "cellcache_replication_target_unreachable{to=\"7\"} 1.0",
            "cellcache_streams_active{kind=\"handoff\"} 1.0",
            "cellcache_streams_active{kind=\"resync\"} 0.0",
            "cellcache_stream_progress_items{to=\"9\",kind=\"handoff\"} 40.0",
            "cellcache_stream_progress_bytes{to=\"9\",kind=\"handoff\"} 4000.0",
            "cellcache_stream_elapsed_seconds{to=\"9\",kind=\"handoff\"} 2.5",
            "cellcache_streams_started_total{kind=\"handoff\"} 2",
            "cellcache_streams_started_total{kind=\"resync\"} 1",
            "cellcache_autoscale_enabled 1",
        ] {
            assert!(out.lines().any(|l| l == line), "no {line:?} in\n{out}");
        }
        // Not a ring member: none of them.
        assert!(!text(figures(&[])).contains("cellcache_replication_"));
    }
}
