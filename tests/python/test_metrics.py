"""`/metrics` on the admin plane, scraped by a real Prometheus server (Debian's package):
three cells of a ring, one scrape target each, as a memcached pool is scraped; PromQL over
memcached_exporter's metric names gives the ring's figures, and over cellcache's own the
request service time histogram, each backup's replication lag and a division's hand-off
stream. cellcache only: memcached has no /metrics (memcached_exporter makes one for it).
"""
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request

import pytest
from pymemcache.client.base import Client

from conftest import CellRing, cell_ring, free_port

MEMCACHED = os.environ.get("CELLCACHE_TEST_SERVER") == "memcached"
KEYS = 300
WAIT_S = 90


@pytest.fixture
def ring():
    if MEMCACHED:
        pytest.skip("memcached has no /metrics (memcached_exporter provides one)")
    r = cell_ring(3)
    yield r.cells
    r.stop()


@pytest.fixture
def prometheus(ring):
    base, stop = start_prometheus(ring)
    yield base
    stop()


def start_prometheus(cells):
    """A Prometheus scraping every cell's /metrics each second: its URL and its stop."""
    binary = shutil.which("prometheus")
    assert binary, "Debian's prometheus package is installed (.ci/run installs it)"
    d = tempfile.mkdtemp(prefix="cellcache-prometheus-")
    targets = ", ".join(f'"127.0.0.1:{c.admin_port}"' for c in cells)
    with open(f"{d}/prometheus.yml", "w") as f:
        f.write("global:\n  scrape_interval: 1s\n"
                "scrape_configs:\n  - job_name: cellcache\n"
                f"    static_configs:\n      - targets: [{targets}]\n")
    port = free_port()
    proc = subprocess.Popen([binary, f"--config.file={d}/prometheus.yml",
                             f"--storage.tsdb.path={d}/data",
                             f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop():
        proc.kill()
        proc.wait(timeout=10)
        shutil.rmtree(d, ignore_errors=True)

    return f"http://127.0.0.1:{port}", stop


def query(base, promql):
    """The value of an instant PromQL query with one result, or None."""
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            body = json.load(r)
    except OSError:
        return None
    result = body.get("data", {}).get("result", [])
    return float(result[0]["value"][1]) if len(result) == 1 else None


def eventually(base, promql, want):
    eventually_that(base, promql, lambda got: got == want, f"{want}")


def eventually_that(base, promql, ok, what):
    """Waits (bounded) until the query's one value satisfies `ok`; returns it."""
    deadline = time.monotonic() + WAIT_S
    got = None
    while time.monotonic() < deadline:
        got = query(base, promql)
        if got is not None and ok(got):
            return got
        time.sleep(0.5)
    pytest.fail(f"{promql} = {got}, not {what}, after {WAIT_S}s")


def test_prometheus_scrapes_a_ring_with_memcached_exporters_names(ring, prometheus):
    c = Client(("127.0.0.1", ring[1].port), connect_timeout=5, timeout=10, default_noreply=False)
    for i in range(KEYS):
        assert c.set(f"metric-{i}", b"v")
    for i in range(KEYS):
        assert c.get(f"metric-{i}") == b"v"
    assert c.get("no-such-key") is None
    eventually(prometheus, 'count(up{job="cellcache"} == 1)', 3)
    # Every item once, though each is also on a backup.
    eventually(prometheus, "sum(memcached_current_items)", KEYS)
    eventually(prometheus, 'sum(memcached_commands_total{command="set",status="hit"})', KEYS)
    eventually(prometheus, 'sum(memcached_commands_total{command="get",status="hit"})', KEYS)
    eventually(prometheus, 'sum(memcached_commands_total{command="get",status="miss"})', 1)
    # The cells' ranges cover the ring once.
    eventually(prometheus, "sum(cellcache_range_share)", 1)
    c.close()


def test_cells_is_the_ring_as_json(ring):
    c = Client(("127.0.0.1", ring[0].port), connect_timeout=5, timeout=10, default_noreply=False)
    for i in range(100):
        assert c.set(f"cells-{i}", b"v")
    c.close()
    with urllib.request.urlopen(f"http://127.0.0.1:{ring[2].admin_port}/cells",
                                timeout=5) as r:
        assert r.headers["Content-Type"].startswith("application/json")
        view = json.load(r)
    assert view["self"] in {c["id"] for c in view["cells"]}
    assert view["peers"] in ("open", "secret", "tls", "secret+tls")
    assert len(view["cells"]) == 3
    covered = 0
    for cell in view["cells"]:
        assert cell["state"] == "active" and cell["role"] == "voter", cell
        start, end = (int(x, 16) for x in cell["range"])
        covered += end - start + 1
        # Replication factor 2 (the default): each cell backs up one other's range.
        assert [b["master"] for b in cell["backups"]] != [cell["id"]]
        assert len(cell["backups"]) == view["replication_factor"] - 1
        assert cell["memory"]["limit"] == 64 << 20
    assert covered == 1 << 64, "the masters' ranges cover the hash space once"
    # Every item is held twice (master and backup).
    assert sum(cell["memory"]["items"] for cell in view["cells"]) == 100 * view["replication_factor"], json.dumps(view)
    assert view["migrations"] == []


def test_events_tell_how_the_ring_formed(ring):
    with urllib.request.urlopen(f"http://127.0.0.1:{ring[0].admin_port}/events",
                                timeout=5) as r:
        events = json.load(r)
    kinds = [(e["kind"], e["reason"]) for e in events]
    # Each of the two cells that joined the first divided a range off: started, finished.
    assert kinds.count(("division_started", "scale-out")) == 2, events
    assert kinds.count(("division_finished", "scale-out")) == 2, events
    epochs = [e["epoch"] for e in events]
    assert epochs == sorted(epochs), "oldest first"
    children = {e["cell"] for e in events}
    with urllib.request.urlopen(f"http://127.0.0.1:{ring[0].admin_port}/cells",
                                timeout=5) as r:
        ids = {c["id"] for c in json.load(r)["cells"]}
    assert children < ids and len(children) == 2


REQUESTS = "sum(cellcache_request_duration_seconds_count)"


def test_service_times_and_replication_lag_through_prometheus(ring, prometheus):
    eventually(prometheus, 'count(up{job="cellcache"} == 1)', 3)
    before = eventually_that(prometheus, REQUESTS, lambda v: v >= 0, "a number")
    c = Client(("127.0.0.1", ring[1].port), connect_timeout=5, timeout=10, default_noreply=False)
    for i in range(KEYS):
        assert c.set(f"lag-{i}", b"v" * 100)
    c.close()
    # Every set was measured once, where it entered the ring (forwarded ones included).
    eventually_that(prometheus, REQUESTS, lambda v: v >= before + KEYS, f">= {before} + {KEYS}")
    # Each cell's requests were measured by the engine it runs.
    eventually(prometheus, 'count(cellcache_request_duration_seconds_count{engine=~"epoll|uring|threads"})', 3)
    # A histogram Prometheus can take a percentile of: finite (under the last bound) and
    # positive. Never compared with a duration.
    p99 = eventually_that(
        prometheus,
        "histogram_quantile(0.99, sum by (le) (rate(cellcache_request_duration_seconds_bucket[1m])))",
        lambda v: v > 0 and v != float("inf"), "a finite positive p99")
    assert p99 > 0
    # Replication factor 2: every cell replicates to one backup, so one target per cell.
    eventually(prometheus, 'count(cellcache_replication_queue_bytes{lane="live"})', 3)
    eventually(prometheus, 'count(cellcache_replication_lag_records{lane="live"})', 3)
    eventually(prometheus, "count(cellcache_replication_stall_seconds)", 3)
    # The backups acknowledged everything: nothing is left queued, nothing stalls.
    eventually(prometheus, "sum(cellcache_replication_lag_records)", 0)
    eventually(prometheus, "sum(cellcache_replication_queue_bytes)", 0)
    eventually(prometheus, "max(cellcache_replication_stall_seconds)", 0)
    eventually(prometheus, "sum(cellcache_replication_target_unreachable)", 0)
    # Each set went to its backup once, at least its value's bytes.
    eventually_that(prometheus, "sum(cellcache_replication_acked_bytes_total)",
                    lambda v: v >= KEYS * 100, f">= {KEYS * 100}")
    # The ring formed by two divisions (two hand-off streams), none running now.
    eventually(prometheus, 'sum(cellcache_streams_started_total{kind="handoff"})', 2)
    eventually(prometheus, "sum(cellcache_streams_active)", 0)
    # Autoscale is off by default, on every cell, and decided nothing.
    eventually(prometheus, "count(cellcache_autoscale_enabled == 0)", 3)
    eventually(prometheus, "sum(cellcache_autoscale_decisions_total)", 0)
    # `stats cellcache` through the ring agrees with the metrics' sums.
    stats = ring_stats(ring[0])
    assert stats["cluster_replication_lag_records"] == 0
    assert stats["request_duration_count"] >= KEYS
    assert stats["cluster_handoff_streams"] == 2


def ring_stats(cell):
    """`stats cellcache` through `cell` (the ring's sums), numbers by name."""
    c = Client(("127.0.0.1", cell.port), connect_timeout=5, timeout=10)
    try:
        raw = c.stats("cellcache")
    finally:
        c.close()
    out = {}
    for k, v in raw.items():
        key = k.decode() if isinstance(k, bytes) else k
        try:
            out[key] = int(v)
        except (TypeError, ValueError):
            pass
    return out


def test_a_division_streams_the_items_of_its_half(request):
    if MEMCACHED:
        pytest.skip("memcached has no /metrics")
    r = CellRing()
    request.addfinalizer(r.stop)
    r.add()
    r.add()
    c = Client(("127.0.0.1", r.cells[0].port), connect_timeout=5, timeout=10, default_noreply=False)
    for i in range(KEYS):
        assert c.set(f"stream-{i}", b"v" * 100)
    c.close()
    base, stop = start_prometheus(r.cells[:2])
    request.addfinalizer(stop)
    eventually(base, 'count(up{job="cellcache"} == 1)', 2)
    eventually(base, 'sum(cellcache_streams_started_total{kind="handoff"})', 1)
    # The third cell divides a range: its parent streams the items of the half it gives.
    r.add()
    items = eventually_that(base, "sum(cellcache_stream_sent_items_total)",
                            lambda v: v > 0, "> 0")
    assert items <= KEYS, "a hand-off streams at most the parent's items"
    eventually_that(base, "sum(cellcache_stream_sent_bytes_total)",
                    lambda v: v >= items * 100, f">= {items} items of 100 bytes")
    eventually(base, 'sum(cellcache_streams_started_total{kind="handoff"})', 2)
    eventually(base, "sum(cellcache_streams_active)", 0)
