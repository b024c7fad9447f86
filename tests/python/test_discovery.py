"""ElastiCache's auto discovery (`config get cluster` on the memcached port) with a
published client library that implements it (elasticache-auto-discovery, from PyPI): any
cell lists every Active cell of its ring, and the answer's version follows the ring's map as
cells join. memcached has no such command (it answers ERROR): cellcache only.
"""
import os
import socket

import pytest
from elasticache_auto_discovery import discover

from conftest import CellRing

MEMCACHED = os.environ.get("CELLCACHE_TEST_SERVER") == "memcached"
pytestmark = pytest.mark.skipif(MEMCACHED, reason="memcached has no `config get cluster`")


def raw_config(port):
    """The whole reply to `config get cluster`, read up to its END (bounded)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"config get cluster\r\n")
        data = b""
        while not data.endswith(b"END\r\n"):
            chunk = s.recv(4096)
            assert chunk, data
            data += chunk
    return data


def version_and_cells(port):
    data = raw_config(port)
    header, rest = data.split(b"\r\n", 1)
    word, name, flags, length = header.split(b" ")
    assert (word, name, flags) == (b"CONFIG", b"cluster", b"0")
    body = rest[: int(length)]
    assert rest[int(length):] == b"\r\nEND\r\n", data
    version, nodes, tail = body.split(b"\n")
    assert tail == b""
    return int(version), sorted(nodes.split(b" "))


def test_a_single_server_lists_itself(server_factory):
    s = server_factory(["-m", "64"])
    found = discover(f"127.0.0.1:{s.port}", time_to_timeout=10)
    ports = sorted(int(p) for _, _, p in found)
    assert str(s.port).encode() in {p for _, _, p in found}
    # Through a ring (CELLCACHE_TEST_RING=N) every cell is listed.
    assert len(ports) == len(s.cells)
    assert ports == sorted(c.port for c in s.cells)
    for host, ip, _ in found:
        assert host == ip == b"127.0.0.1"


def test_the_list_follows_the_ring_as_cells_join():
    ring = CellRing()
    try:
        versions = []
        for _ in range(3):
            ring.add()
            cells = ring.cells
            # Any cell answers for the whole ring.
            for c in cells:
                version, nodes = version_and_cells(c.port)
                assert nodes == sorted(f"127.0.0.1|127.0.0.1|{x.port}".encode() for x in cells)
            versions.append(version)
            found = discover(f"127.0.0.1:{cells[0].port}", time_to_timeout=10)
            assert sorted(int(p) for _, _, p in found) == sorted(c.port for c in cells)
        assert versions == sorted(set(versions)), f"the version grows with the map: {versions}"
    finally:
        ring.stop()
