"""pymemcache — a client no one on this project wrote — exercising every call it offers."""
import socket
import time

import pytest
from conftest import ring_size
from pymemcache.client.base import Client
from pymemcache.exceptions import (MemcacheClientError, MemcacheIllegalInputError,
                                   MemcacheServerError, MemcacheUnknownCommandError)


def client(server, **kw):
    return Client(server.addr, connect_timeout=5, timeout=10, **kw)


def test_set_get_and_flags(server):
    c = client(server)
    assert c.set("k", b"v")
    assert c.get("k") == b"v"
    assert c.get("missing") is None
    assert c.get("missing", default=b"d") == b"d"
    assert c.set("bin", bytes(range(256)))
    assert c.get("bin") == bytes(range(256))
    # pymemcache uses flags to mark serialized values; raw flags must round-trip.
    # raw_command returns what precedes the end token
    assert c.raw_command(b"set fl 12345 0 1\r\nz", b"STORED\r\n") == b""
    assert c.raw_command(b"get fl", b"END\r\n") == b"VALUE fl 12345 1\r\nz\r\n"


def test_noreply_default_and_explicit(server):
    c = Client(server.addr, default_noreply=True, timeout=10)
    assert c.set("n", b"1") is True
    assert c.add("n2", b"2") is True
    # same connection: replies are ordered, so the quiet writes are applied by now
    assert c.get_many(["n", "n2"]) == {"n": b"1", "n2": b"2"}
    assert c.set("n3", b"3", noreply=False) is True


def test_many_and_multi(server):
    c = client(server)
    assert c.set_many({"a": b"1", "b": b"2", "c": b"3"}) == []
    assert c.set_multi({"d": b"4"}) == []
    assert c.get_many(["a", "b", "c", "d", "x"]) == {"a": b"1", "b": b"2", "c": b"3", "d": b"4"}
    assert c.get_multi(["a"]) == {"a": b"1"}
    got = c.gets_many(["a", "b", "x"])
    assert set(got) == {"a", "b"} and all(isinstance(cas, bytes) for _, cas in got.values())
    assert c.delete_many(["a", "b"]) is True
    assert c.delete_multi(["c"]) is True
    assert c.get_many(["a", "b", "c", "d"]) == {"d": b"4"}


def test_add_replace_append_prepend(server):
    c = client(server)
    assert c.add("k", b"1", noreply=False) is True
    assert c.add("k", b"2", noreply=False) is False
    assert c.replace("k", b"3", noreply=False) is True
    assert c.replace("nope", b"3", noreply=False) is False
    assert c.append("k", b"4", noreply=False) is True
    assert c.prepend("k", b"2", noreply=False) is True
    assert c.get("k") == b"234"
    assert c.append("nope", b"x", noreply=False) is False


def test_cas_and_gets(server):
    c = client(server)
    assert c.cas("k", b"v", b"1", noreply=False) is None  # NOT_FOUND
    c.set("k", b"v1")
    value, cas = c.gets("k")
    assert value == b"v1"
    assert c.cas("k", b"v2", cas, noreply=False) is True
    assert c.cas("k", b"v3", cas, noreply=False) is False  # EXISTS
    assert c.get("k") == b"v2"
    assert c.gets("missing") == (None, None)


def test_incr_decr(server):
    c = client(server)
    assert c.incr("n", 1, noreply=False) is None
    c.set("n", b"10")
    assert c.incr("n", 5, noreply=False) == 15
    assert c.decr("n", 100, noreply=False) == 0
    assert c.incr("n", 2**64 - 1, noreply=False) == 2**64 - 1
    assert c.incr("n", 1, noreply=False) == 0
    c.set("s", b"abc")
    with pytest.raises(MemcacheClientError):
        c.incr("s", 1, noreply=False)


def test_delete_touch_and_expiry(server):
    c = client(server)
    c.set("k", b"v")
    assert c.delete("k", noreply=False) is True
    assert c.delete("k", noreply=False) is False
    assert c.touch("k", 10, noreply=False) is False
    c.set("k", b"v", expire=100)
    assert c.touch("k", 1, noreply=False) is True
    deadline = time.monotonic() + 10
    while c.get("k") is not None:
        assert time.monotonic() < deadline, "touched item never expired"
        time.sleep(0.1)


def test_flush_all_version_stats(server):
    c = client(server)
    c.set("k", b"v")
    assert c.flush_all(noreply=False) is True
    assert c.get("k") is None
    assert c.version()
    stats = c.stats()
    for key in (b"curr_items", b"get_hits", b"get_misses", b"limit_maxbytes", b"curr_connections"):
        assert key in stats, key
    # Through a ring: the memory for distinct items, every cell's over the two copies.
    cells = ring_size()
    assert stats[b"limit_maxbytes"] == 64 * 1024 * 1024 * cells // min(cells, 2)
    settings = c.stats("settings")
    assert b"maxbytes" in settings
    assert c.stats("items") is not None
    assert c.stats("slabs") is not None


def test_cache_memlimit(server):
    c = client(server)
    assert c.cache_memlimit(64) is True


def test_key_and_value_limits(server):
    c = client(server)
    with pytest.raises(MemcacheIllegalInputError):
        c.set("k" * 251, b"v")  # refused client-side, as the protocol's key limit says
    assert c.set("k" * 250, b"v")
    assert c.get("k" * 250) == b"v"
    with pytest.raises(MemcacheServerError):
        c.set("big", b"x" * (1024 * 1024 + 1), noreply=False)
    assert c.set("fits", b"y" * (512 * 1024), noreply=False)
    assert c.get("fits") == b"y" * (512 * 1024)


def test_unknown_command(server):
    c = client(server)
    with pytest.raises(MemcacheUnknownCommandError):
        c.raw_command(b"frobnicate", b"\r\n")
    assert c.set("still", b"usable", noreply=False)


def test_quit_and_reconnect(server):
    c = client(server)
    c.set("k", b"v", noreply=False)  # acknowledged before the connection goes away
    c.quit()
    assert c.get("k") == b"v"  # reconnects transparently
    c.close()


def test_shutdown_disabled_by_default_and_enabled_with_A(server, server_factory):
    c = client(server)
    # "ERROR: shutdown not enabled", as memcached without -A
    with pytest.raises(MemcacheUnknownCommandError):
        c.raw_command(b"shutdown", b"\r\n")
    s = server_factory(["-A"])
    c = client(s)
    c.shutdown()
    s.proc.wait(timeout=20)
    assert s.proc.returncode is not None
    with pytest.raises(OSError):
        socket.create_connection(s.addr, timeout=2).sendall(b"version\r\n")
