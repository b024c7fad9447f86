"""The DNS entry point (`--dns-port`, `--cluster-name`): `dig` and a client that finds the
ring through it (dnspython's resolver, then pymemcache to each SRV target) and keeps working
while cells join and leave. cellcache only: memcached has no DNS.
"""
import os
import subprocess
import time
import urllib.request

import dns.resolver
import pytest
from pymemcache.client.base import Client

from conftest import CellRing, free_port

MEMCACHED = os.environ.get("CELLCACHE_TEST_SERVER") == "memcached"
pytestmark = pytest.mark.skipif(MEMCACHED, reason="memcached has no DNS entry point")
NAME = "cache.cellcache.test"
# Longer than the records' TTL (5 s): a changed ring shows in DNS within it.
WAIT_S = 30


@pytest.fixture
def ring():
    dns_port = free_port()
    r = CellRing(["--dns-port", str(dns_port), "--cluster-name", NAME])
    r.dns_port = dns_port
    try:
        yield r
    finally:
        r.stop()


def dig(port, *query):
    out = subprocess.run(["dig", "@127.0.0.1", "-p", str(port), *query],
                         capture_output=True, text=True, timeout=30, check=True)
    return out.stdout


def srv_ports(port):
    """The client ports of the cells the ring's SRV records name (dnspython, no cache)."""
    resolver = dns.resolver.Resolver(configure=False)
    resolver.nameservers = ["127.0.0.1"]
    resolver.port = port
    resolver.cache = None
    answer = resolver.resolve(f"_memcache._tcp.{NAME}", "SRV")
    return sorted(r.port for r in answer)


def wait_srv(port, want):
    deadline = time.monotonic() + WAIT_S
    got = None
    while time.monotonic() < deadline:
        got = srv_ports(port)
        if got == want:
            return
        time.sleep(0.5)
    pytest.fail(f"SRV lists {got}, not {want}")


def test_dig_sees_the_ring(ring):
    ring.add()
    ring.add()
    out = dig(ring.dns_port, f"_memcache._tcp.{NAME}", "SRV", "+short")
    lines = sorted(out.split("\n")[:-1])
    want = sorted(f"0 1 {c.port} cell-{i + 1}.{NAME}." for i, c in enumerate(ring.cells))
    assert lines == want, out
    assert dig(ring.dns_port, NAME, "A", "+short").split() == ["127.0.0.1"]
    # TCP too, and the short TTL.
    out = dig(ring.dns_port, "+tcp", "+noall", "+answer", NAME, "A")
    assert out.split()[1] == "5", out
    assert "status: NXDOMAIN" in dig(ring.dns_port, "example.com", "A")
    assert "status: NXDOMAIN" in dig(ring.dns_port, f"other.{NAME}", "A")


def test_a_client_follows_the_ring_through_dns_as_cells_come_and_go(ring):
    ring.add()
    ring.add()
    wait_srv(ring.dns_port, sorted(c.port for c in ring.cells))

    def use_every_cell(tag):
        for p in srv_ports(ring.dns_port):
            c = Client(("127.0.0.1", p), connect_timeout=5, timeout=10, default_noreply=False)
            assert c.set(f"{tag}-{p}", b"v")
            for q in srv_ports(ring.dns_port):
                assert c.get(f"{tag}-{q}") in (b"v", None)
            c.close()

    use_every_cell("two")
    ring.add()
    wait_srv(ring.dns_port, sorted(c.port for c in ring.cells))
    use_every_cell("three")
    # The last cell leaves (its successor absorbs its range): DNS stops naming it.
    leaving = ring.cells[-1]
    status = urllib.request.urlopen(
        f"http://127.0.0.1:{leaving.admin_port}/cluster/status", timeout=5).read().decode()
    me = status.split(" SELF ")[1].split(" ")[0]
    request = urllib.request.Request(
        f"http://127.0.0.1:{ring.cells[0].admin_port}/cluster/leave/{me}", method="POST")
    assert urllib.request.urlopen(request, timeout=30).read().startswith(b"OK")
    wait_srv(ring.dns_port, sorted(c.port for c in ring.cells[:-1]))
    use_every_cell("after")
    # Everything written through the names DNS gave is still there.
    c = Client(("127.0.0.1", ring.cells[0].port), connect_timeout=5, timeout=10)
    for tag, ports in (("two", ring.cells[:2]), ("three", ring.cells)):
        for cell in ports:
            assert c.get(f"{tag}-{cell.port}") == b"v", (tag, cell.port)
