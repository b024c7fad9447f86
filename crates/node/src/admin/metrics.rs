//! `GET /metrics` on the admin plane: one cell's figures in Prometheus's exposition format
//! (OpenMetrics text, through the prometheus-client crate), read from the same counters as
//! its `stats cell`.
//!
//! What memcached has keeps memcached_exporter's names and labels, so dashboards and alerts
//! written for memcached read a cell unchanged; a ring is scraped cell by cell, as a
//! memcached pool is, and its sums are the ring's: `memcached_current_items` and
//! `memcached_current_bytes` count the items a cell *masters* (a backup's copies are in
//! `cellcache_stored_items`), so `sum(memcached_current_items)` is the ring's item count.
//! The rest is `cellcache_*`.

use std::collections::HashMap;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use crate::cell::Cell;
use crate::cluster::Slot;

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
        "cellcache_epoch",
        "cluster_epoch",
        "The ring map's epoch this cell serves.",
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
}

impl Figures {
    fn number(&self, field: &str) -> Option<f64> {
        self.stats.get(field)?.parse().ok()
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

/// The body of `GET /metrics` for `cell` (OpenMetrics text).
pub fn render(cell: &Cell, ring: &Slot) -> Result<String, std::fmt::Error> {
    let mut raw = Vec::new();
    let mut range_share = 1.0;
    let mut autoscale = None;
    match ring.cluster.get() {
        Some(cl) => {
            crate::cluster::stats::local_cell_stats(cl, &mut raw);
            range_share = cl.master_range_share();
            autoscale = cl.autoscale.get().map(|a| a.counts());
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
        }
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
}
