"""The dashboard (`GET /` on a cell's admin port) in a real headless browser: Chromium
(Debian's) driven by Playwright, against a ring of three while a fourth cell divides one of
their ranges — the page shows the new cell without a reload, and every cell's p99 service
time and replication lag. Screenshots go to
target/dashboard/ (`CELLCACHE_DASHBOARD_SHOTS=docs` writes docs/dashboard*.png, as
committed). cellcache only.
"""
import os
import shutil
import urllib.request

import pytest

from conftest import ROOT, OneServer, cell_ring, free_port

MEMCACHED = os.environ.get("CELLCACHE_TEST_SERVER") == "memcached"
pytestmark = pytest.mark.skipif(MEMCACHED, reason="memcached has no dashboard")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
WAIT_MS = 60_000


@pytest.fixture
def ring():
    r = cell_ring(3)
    yield r.cells, r.first_peer
    r.stop()


def shots_dir():
    target = os.environ.get("CELLCACHE_DASHBOARD_SHOTS")
    d = os.path.join(ROOT, "docs") if target == "docs" else os.path.join(ROOT, "target", "dashboard")
    os.makedirs(d, exist_ok=True)
    return d


def test_the_dashboard_shows_a_division_live(ring):
    from pymemcache.client.base import Client
    from playwright.sync_api import sync_playwright

    assert CHROMIUM, "Debian's chromium is installed (.ci/run installs it)"
    cells, first_peer = ring
    c = Client(("127.0.0.1", cells[0].port), connect_timeout=5, timeout=10, default_noreply=False)
    for i in range(200):
        c.set(f"dash-{i}", b"x" * 1000)
    for i in range(300):
        c.get(f"dash-{i}")
    # Every cell serves some requests of its own, so each has service times to show.
    for cell in cells:
        other = Client(("127.0.0.1", cell.port), connect_timeout=5, timeout=10)
        for i in range(20):
            other.get(f"dash-{i}")
        other.close()
    url = f"http://127.0.0.1:{cells[0].admin_port}/"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.goto(url)
        page.wait_for_function("document.querySelectorAll('#circle path[data-cell]').length === 3",
                               timeout=WAIT_MS)
        assert page.locator("#cells tr").count() == 3
        # Each row shows a p99 (a duration, never compared) and its replication lag.
        page.wait_for_function(
            "[...document.querySelectorAll('#cells td[data-p99]')].length === 3 && "
            "[...document.querySelectorAll('#cells td[data-p99]')]"
            ".every((td) => /^(> )?[0-9.]+ (µs|ms|s)$/.test(td.textContent))",
            timeout=WAIT_MS)
        page.wait_for_function(
            "[...document.querySelectorAll('#cells td[data-lag]')].length === 3 && "
            "[...document.querySelectorAll('#cells td[data-lag]')]"
            ".every((td) => /^[0-9]+ rec · [0-9.]+ (B|KiB|MiB)/.test(td.textContent))",
            timeout=WAIT_MS)
        page.screenshot(path=os.path.join(shots_dir(), "dashboard.png"))
        # A fourth cell divides a range off, while the page stays open.
        standby = OneServer(["-m", "64", "--standby", "--peer-port", str(free_port())])
        cells.append(standby)
        status = urllib.request.urlopen(
            f"http://127.0.0.1:{cells[0].admin_port}/cluster/status", timeout=5).read().decode()
        parent = status.split(" SELF ")[1].split(" ")[0]
        invite = urllib.request.Request(
            f"http://127.0.0.1:{standby.admin_port}/cluster/invite"
            f"?via=127.0.0.1:{first_peer}&parent={parent}", method="POST")
        assert urllib.request.urlopen(invite, timeout=60).read().startswith(b"OK")
        page.wait_for_function("document.querySelectorAll('#circle path[data-cell]').length === 4",
                               timeout=WAIT_MS)
        page.wait_for_function(
            "document.querySelector('#events').textContent.includes('division finished')",
            timeout=WAIT_MS)
        assert page.locator("#cells tr").count() == 4
        page.screenshot(path=os.path.join(shots_dir(), "dashboard-division.png"))
        phone = browser.new_page(viewport={"width": 390, "height": 844})
        phone.goto(url)
        phone.wait_for_function("document.querySelectorAll('#circle path[data-cell]').length === 4",
                                timeout=WAIT_MS)
        # On a phone every figure of a cell is on screen, none past its right edge.
        phone.wait_for_function("document.querySelectorAll('#cells td[data-lag]').length === 4",
                                timeout=WAIT_MS)
        for figure in ("td[data-p99]", "td[data-lag]"):
            box = phone.locator(f"#cells {figure}").first.bounding_box()
            assert box and box["width"] > 0 and box["x"] + box["width"] <= 390, (figure, box)
        phone.screenshot(path=os.path.join(shots_dir(), "dashboard-phone.png"), full_page=True)
        browser.close()
    c.close()
