"""pylibmc (libmemcached) in binary-protocol mode — a client no one on this project wrote,
speaking the memcached binary protocol for every call it offers."""
import pylibmc
import pytest


def client(server, **behaviors):
    host, port = server.addr
    b = {"connect_timeout": 5000, "receive_timeout": 10_000_000, "send_timeout": 10_000_000}
    b.update(behaviors)
    return pylibmc.Client([f"{host}:{port}"], binary=True, behaviors=b)


def test_set_get_and_values_of_any_type(server):
    c = client(server)
    assert c.set("k", b"v")
    assert c.get("k") == b"v"
    assert c.get("missing") is None
    assert c.set("bin", bytes(range(256)))
    assert c.get("bin") == bytes(range(256))
    # pylibmc marks types with the client flags: they must round-trip
    assert c.set("s", "text")
    assert c.get("s") == "text"
    assert c.set("i", 42)
    assert c.get("i") == 42
    assert c.set("obj", {"a": [1, 2]})
    assert c.get("obj") == {"a": [1, 2]}
    assert c.set("big", b"x" * 500_000)
    assert c.get("big") == b"x" * 500_000


def test_multi_get_set_delete(server):
    c = client(server)
    # set_multi sends quiet sets, get_multi getkq + noop: misses are silent
    assert c.set_multi({"a": b"1", "b": b"2", "c": b"3"}) == []
    assert c.get_multi(["a", "b", "c", "nope"]) == {"a": b"1", "b": b"2", "c": b"3"}
    assert c.delete_multi(["a", "b"])
    assert c.get_multi(["a", "b", "c"]) == {"c": b"3"}


def test_add_replace_append_prepend_delete(server):
    c = client(server)
    assert c.add("k", b"mid")
    assert not c.add("k", b"again")
    assert c.replace("k", b"mid")
    with pytest.raises(pylibmc.NotFound):  # binary mode: status 0x01, not "not stored"
        c.replace("nope", b"x")
    assert c.append("k", b">")
    assert c.prepend("k", b"<")
    assert c.get("k") == b"<mid>"
    assert not c.append("nope", b"x")
    assert c.delete("k")
    assert not c.delete("k")
    assert c.get("k") is None


def test_cas(server):
    c = client(server, cas=True)
    assert c.set("k", b"v1")
    value, cas = c.gets("k")
    assert value == b"v1"
    assert c.cas("k", b"v2", cas)
    assert not c.cas("k", b"v3", cas)  # stale CAS
    assert c.get("k") == b"v2"


def test_incr_decr(server):
    c = client(server)
    assert c.set("n", 10)
    assert c.incr("n") == 11
    assert c.incr("n", 9) == 20
    assert c.decr("n", 25) == 0
    with pytest.raises(pylibmc.NotFound):
        c.incr("missing")
    assert c.set("t", b"text")
    with pytest.raises(pylibmc.Error):
        c.incr("t")


def test_touch_flush_and_stats(server):
    c = client(server)
    assert c.set("k", b"v")
    # (A touch hit is not exercised here: libmemcached stalls 5 s reading its reply's
    # flags extras, against memcached 1.6 just the same; tests/binary.rs covers it.)
    assert not c.touch("missing", 3600)
    assert c.get("k") == b"v"
    stats = c.get_stats()
    assert len(stats) == 1
    _, values = stats[0]
    assert int(values["pid"]) > 0
    assert int(values["cmd_get"]) >= 1
    assert c.flush_all()
    assert c.get("k") is None


def test_value_over_the_limit(server):
    c = client(server)
    with pytest.raises(pylibmc.Error):  # status 0x03, the value is swallowed
        c.set("huge", b"x" * (2 << 20))
    # the connection (or its reconnect) still works
    assert c.set("after", b"ok")
    assert c.get("after") == b"ok"
