"""`/metrics` on the admin plane, scraped by a real Prometheus server (Debian's package):
three cells of a ring, one scrape target each, as a memcached pool is scraped; PromQL over
memcached_exporter's metric names gives the ring's figures. cellcache only: memcached has
no /metrics (memcached_exporter makes one for it).
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

from conftest import cell_ring, free_port

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
    binary = shutil.which("prometheus")
    assert binary, "Debian's prometheus package is installed (.ci/run installs it)"
    d = tempfile.mkdtemp(prefix="cellcache-prometheus-")
    targets = ", ".join(f'"127.0.0.1:{c.admin_port}"' for c in ring)
    with open(f"{d}/prometheus.yml", "w") as f:
        f.write("global:\n  scrape_interval: 1s\n"
                "scrape_configs:\n  - job_name: cellcache\n"
                f"    static_configs:\n      - targets: [{targets}]\n")
    port = free_port()
    proc = subprocess.Popen([binary, f"--config.file={d}/prometheus.yml",
                             f"--storage.tsdb.path={d}/data",
                             f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    yield f"http://127.0.0.1:{port}"
    proc.kill()
    proc.wait(timeout=10)
    shutil.rmtree(d, ignore_errors=True)


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
    deadline = time.monotonic() + WAIT_S
    got = None
    while time.monotonic() < deadline:
        got = query(base, promql)
        if got == want:
            return
        time.sleep(0.5)
    pytest.fail(f"{promql} = {got}, not {want}, after {WAIT_S}s")


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
