//! `cellcache bench` aimed at a ring the way `scripts/bench-forwarding` aims it: keys picked
//! from one cell's master range (`--key-hash-range`, the range as `ctl status` prints it)
//! and the ring's CPU per reply (`--server-pid` for every cell). Sent to the cell that does
//! not master them, every request is forwarded; sent to their master, none is.

mod common;

use std::process::Command;

use common::{Client, Ring};

fn forwarded(c: &mut Client) -> u64 {
    c.stats("cell")
        .into_iter()
        .find(|(k, _)| k == "cluster_forwarded")
        .map(|(_, v)| v.parse().unwrap())
        .expect("cluster_forwarded in stats cell")
}

/// Runs `bench` against `entry` with the keys of `range` and the ring's pids; its report.
fn bench(ring: &Ring, entry: usize, range: cellcache_cluster::HashRange) -> serde_json::Value {
    let range = format!("{:016x}-{:016x}", range.start, range.end);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cellcache"));
    cmd.args(["bench", "-s", &ring.cells[entry].addr.to_string()])
        .args(["-c", "2", "--keys", "200", "--key-len", "24", "--preload"])
        .args([
            "--get-ratio",
            "0.5",
            "--duration",
            "2s",
            "--progress",
            "never",
        ])
        .args(["--key-hash-range", &range, "--json"]);
    for cell in &ring.cells {
        cmd.args(["--server-pid", &cell.pid().to_string()]);
    }
    let out = cmd.output().expect("running bench");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the JSON report")
}

#[test]
fn keys_of_one_cells_range_are_forwarded_from_the_other_and_the_ring_cpu_is_reported() {
    if common::is_memcached() {
        return;
    }
    let ring = Ring::start(2, &["-m", "32"]);
    let mut entry = ring.cells[0].connect();
    for (master, expect_forwarded) in [(1, true), (0, false)] {
        let range = ring
            .range_of(&format!("client={} ", ring.cells[master].addr))
            .expect("the master's range");
        let before = forwarded(&mut entry);
        let report = bench(&ring, 0, range);
        let replies = report["results"]["all"]["replies"].as_u64().unwrap();
        assert!(replies > 0, "{report}");
        assert_eq!(report["results"]["all"]["errors"], 0, "{report}");
        assert_eq!(
            report["workload"]["key_hash_range"],
            serde_json::json!({"start": range.start, "end": range.end})
        );
        let cpu = &report["server_cpu"];
        assert_eq!(cpu["pids"].as_array().unwrap().len(), 2, "{report}");
        assert!(cpu["cpu_secs"].as_f64().unwrap() > 0.0, "{report}");
        let sent = forwarded(&mut entry) - before;
        if expect_forwarded {
            // Every measured request, and the preload and warm-up besides.
            assert!(sent >= replies, "{sent} forwarded for {replies} replies");
        } else {
            assert_eq!(sent, 0, "keys the entry masters were forwarded");
        }
    }
}
