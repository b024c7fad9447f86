"""Client authentication with real client libraries: pymemcache logs in with memcached's
text login (-Y: a `set` of any key whose value is "user password"), pylibmc (libmemcached,
built with SASL) authenticates with SASL PLAIN on the binary protocol.

Against CELLCACHE_TEST_SERVER=memcached the text tests run on memcached -Y, the SASL ones
on memcached -S -B binary with a Cyrus SASL database of the same users (saslpasswd2, from
Debian's sasl2-bin); cellcache serves both from its -Y file.
"""
import os
import shutil
import subprocess
import tempfile

import pylibmc
import pytest
from pymemcache.client.base import Client
from pymemcache.exceptions import MemcacheClientError

USERS = {"alice": "secret", "bob": "hunter2"}
MEMCACHED = os.environ.get("CELLCACHE_TEST_SERVER") == "memcached"


@pytest.fixture
def auth_dir():
    d = tempfile.mkdtemp(prefix="cellcache-auth-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def auth_file(directory):
    path = os.path.join(directory, "auth")
    with open(path, "w") as f:
        f.writelines(f"{u}:{p}\n" for u, p in USERS.items())
    os.chmod(path, 0o600)
    return path


@pytest.fixture
def text_server(server_factory, auth_dir):
    return server_factory(["-m", "64", "-t", "2", "-Y", auth_file(auth_dir)])


@pytest.fixture
def sasl_server(server_factory, auth_dir):
    if not MEMCACHED:
        return server_factory(["-m", "64", "-t", "2", "-Y", auth_file(auth_dir)])
    db = os.path.join(auth_dir, "sasldb")
    for user, password in USERS.items():
        # The realm is the host name, as memcached's.
        subprocess.run(["saslpasswd2", "-f", db, "-a", "memcached", "-c", "-p", user],
                       input=password.encode(), check=True)
    with open(os.path.join(auth_dir, "memcached.conf"), "w") as f:
        f.write(f"mech_list: plain\nsasldb_path: {db}\n")
    return server_factory(["-S", "-B", "binary"], env={"SASL_CONF_PATH": auth_dir})


def text_client(server):
    # noreply=False: memcached answers a login STORED even with noreply, and the client
    # must read it.
    return Client(server.addr, connect_timeout=5, timeout=10, default_noreply=False)


def test_pymemcache_logs_in_with_a_set(text_server):
    c = text_client(text_server)
    with pytest.raises(MemcacheClientError, match="unauthenticated"):
        c.get("k")
    with pytest.raises(MemcacheClientError, match="authentication failure"):
        c.set("login", "alice wrong")
    assert c.set("login", "alice secret")
    # Logged in: a set is a set, and the login stored nothing.
    assert c.get("login") is None
    assert c.set("k", b"v")
    assert c.get("k") == b"v"
    assert c.get_many(["k", "nope"]) == {"k": b"v"}
    assert c.incr("n", 1) is None
    assert c.set("n", "1")
    assert c.incr("n", 41) == 42
    assert c.delete("k")
    # Another connection logs in for itself.
    other = text_client(text_server)
    with pytest.raises(MemcacheClientError, match="unauthenticated"):
        other.get("n")
    assert other.set("anything", "bob hunter2")
    assert other.get("n") == b"42"


def test_stats_count_logins(text_server):
    c = text_client(text_server)
    assert c.set("login", "bob hunter2")
    before = c.stats()
    other = text_client(text_server)
    with pytest.raises(MemcacheClientError):
        other.set("login", "bob nope")
    assert other.set("login", "bob hunter2")
    after = c.stats()
    assert after[b"auth_cmds"] - before[b"auth_cmds"] == 2
    assert after[b"auth_errors"] - before[b"auth_errors"] == 1
    settings = c.stats("settings")
    assert settings[b"auth_enabled_ascii"].endswith(b"/auth")


def sasl_client(server, user, password):
    host, port = server.addr
    b = {"connect_timeout": 5000, "receive_timeout": 10_000_000, "send_timeout": 10_000_000}
    return pylibmc.Client([f"{host}:{port}"], binary=True, behaviors=b, username=user,
                          password=password)


def test_pylibmc_has_sasl():
    # Without it the next tests would not test SASL at all.
    assert pylibmc.support_sasl


def test_pylibmc_authenticates_with_sasl_plain(sasl_server):
    c = sasl_client(sasl_server, "alice", "secret")
    assert c.set("k", b"v")
    assert c.get("k") == b"v"
    assert c.set_multi({"a": b"1", "b": b"2"}) == []
    assert c.get_multi(["a", "b", "nope"]) == {"a": b"1", "b": b"2"}
    assert c.set("n", 1)
    assert c.incr("n", 41) == 42
    other = sasl_client(sasl_server, "bob", "hunter2")
    assert other.get("a") == b"1"


def test_pylibmc_with_a_wrong_password_is_refused(sasl_server):
    c = sasl_client(sasl_server, "alice", "wrong")
    with pytest.raises(pylibmc.Error):
        c.set("k", b"v")
    with pytest.raises(pylibmc.Error):
        c.get("k")
