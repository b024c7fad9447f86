"""TLS for clients (memcached's -Z, -o ssl_*) with a real client library: pymemcache over
Python's ssl module (`tls_context`), certificates made with openssl for the test. Runs on
every engine, through a ring (CELLCACHE_TEST_RING) and against memcached -Z
(CELLCACHE_TEST_SERVER=memcached), which proves the expectations.
"""
import os
import shutil
import socket
import ssl
import subprocess
import tempfile

import pytest
from pymemcache.client.base import Client


@pytest.fixture(scope="module")
def pki():
    """A CA and a server certificate it signed, for localhost and 127.0.0.1."""
    d = tempfile.mkdtemp(prefix="cellcache-tls-")

    def openssl(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)

    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", f"{d}/ca.key", "-out", f"{d}/ca.crt", "-days", "2",
            "-subj", "/CN=cellcache test CA")
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", f"{d}/server.key", "-out", f"{d}/server.csr", "-subj", "/CN=localhost")
    with open(f"{d}/san.ext", "w") as f:
        f.write("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", f"{d}/server.csr", "-CA", f"{d}/ca.crt",
            "-CAkey", f"{d}/ca.key", "-CAcreateserial", "-out", f"{d}/server.crt",
            "-days", "2", "-extfile", f"{d}/san.ext")
    os.chmod(f"{d}/server.key", 0o600)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def tls_server(server_factory, pki):
    return server_factory(["-m", "64", "-t", "2", "-Z", "-o",
                           f"ssl_chain_cert={pki}/server.crt,ssl_key={pki}/server.key"])


def tls_client(server, pki):
    context = ssl.create_default_context(cafile=f"{pki}/ca.crt")
    return Client(server.addr, connect_timeout=5, timeout=10, tls_context=context)


def test_pymemcache_over_tls(tls_server, pki):
    c = tls_client(tls_server, pki)
    assert c.set("tls-key", b"secret value")
    assert c.get("tls-key") == b"secret value"
    values = {f"k{i}": f"v{i}".encode() * 100 for i in range(200)}
    assert c.set_many(values) == []
    assert c.get_many(list(values)) == values
    assert c.incr("n", 1) is None
    c.set("n", b"41")
    assert c.incr("n", 1) == 42
    big = os.urandom(512 * 1024)
    assert c.set("big", big)
    assert c.get("big") == big
    assert c.delete("tls-key")
    assert c.get("tls-key") is None
    stats = c.stats()
    assert stats[b"ssl_handshake_errors"] == 0
    c.close()


def test_a_client_that_does_not_trust_the_certificate_is_not_served(tls_server):
    # Python's default trust store does not hold the test's CA.
    context = ssl.create_default_context()
    c = Client(tls_server.addr, connect_timeout=5, timeout=10, tls_context=context)
    with pytest.raises(ssl.SSLError):
        c.get("anything")


def test_a_plain_text_client_is_refused(tls_server, pki):
    with socket.create_connection(tls_server.addr, timeout=10) as s:
        s.sendall(b"set plain 0 0 1\r\nv\r\nversion\r\n")
        got = b""
        while True:
            try:
                chunk = s.recv(4096)
            except ConnectionResetError:
                break
            if not chunk:
                break
            got += chunk
    assert b"STORED" not in got and b"VERSION" not in got, got
    c = tls_client(tls_server, pki)
    assert c.get("plain") is None
    assert c.stats()[b"ssl_handshake_errors"] >= 1
