"""Starts a real server for the Python client tests.

By default the `cellcache` binary built by cargo (target/debug/cellcache, or $CELLCACHE_BIN);
with CELLCACHE_TEST_SERVER=memcached, Debian's memcached — the suites must pass against both.
"""
import os
import socket
import subprocess
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
READY_TIMEOUT_S = 20


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_command(port, extra):
    if os.environ.get("CELLCACHE_TEST_SERVER") == "memcached":
        cmd = ["memcached", "-U", "0", "-l", "127.0.0.1", "-p", str(port)]
        if os.geteuid() == 0:
            cmd += ["-u", "root"]
        return cmd + extra
    binary = os.environ.get("CELLCACHE_BIN", os.path.join(ROOT, "target", "debug", "cellcache"))
    if not os.path.exists(binary):
        pytest.fail(f"{binary} not built: run `cargo build` first (scripts/test does)")
    engine = os.environ.get("CELLCACHE_TEST_IO_ENGINE")
    engine_args = ["--io-engine", engine] if engine else []
    return [binary, "serve", "-l", "127.0.0.1", "-p", str(port)] + engine_args + extra


def wait_ready(proc, port):
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(b"version\r\n")
                if s.recv(64).startswith(b"VERSION "):
                    return True
        except OSError:
            time.sleep(0.02)
    return False


class RunningServer:
    def __init__(self, extra):
        for _ in range(5):
            self.port = free_port()
            self.proc = subprocess.Popen(server_command(self.port, extra),
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if wait_ready(self.proc, self.port):
                return
            self.stop()
        raise RuntimeError("server did not start")

    @property
    def addr(self):
        return ("127.0.0.1", self.port)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


@pytest.fixture
def server():
    s = RunningServer(["-m", "64", "-t", "2"])
    yield s
    s.stop()


@pytest.fixture
def server_factory():
    started = []

    def start(extra):
        s = RunningServer(extra)
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()
