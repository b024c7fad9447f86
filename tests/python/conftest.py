"""Starts a real server for the Python client tests.

By default the `cellcache` binary built by cargo (target/debug/cellcache, or $CELLCACHE_BIN);
with CELLCACHE_TEST_SERVER=memcached, Debian's memcached — the suites must pass against both.
With CELLCACHE_TEST_RING=N (N >= 2), every test talks to one cell (the second) of a ring of
N cellcache processes: a ring must answer exactly as one memcached does.

A server started with `-Y FILE` wants a login (memcached's text login, `set` with the data
"user password"): the harness's own requests (readiness, ring status) log in with the file's
first entry. A binary-only server (`-B binary`: memcached -S) is ready once it answers a
binary `version`, which needs no SASL authentication.
"""
import glob
import os
import socket
import ssl
import subprocess
import time
import urllib.request

import pytest

# pylibmc's wheel bundles a Cyrus libsasl2 that looks for its mechanism plugins where CentOS
# keeps them (/usr/lib64/sasl2); Debian's are in the multiarch directory (libsasl2-modules).
# libsasl2 reads SASL_PATH when pylibmc initialises it, so this must precede any import of
# pylibmc (test_auth.py authenticates with SASL PLAIN through it).
for _plugins in glob.glob("/usr/lib/*/sasl2") + ["/usr/lib64/sasl2", "/usr/lib/sasl2"]:
    if glob.glob(os.path.join(_plugins, "libplain.so*")):
        os.environ.setdefault("SASL_PATH", _plugins)
        break

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
READY_TIMEOUT_S = 20
FORM_TIMEOUT_S = 60


def ring_size():
    if os.environ.get("CELLCACHE_TEST_SERVER") == "memcached":
        return 1
    return max(1, int(os.environ.get("CELLCACHE_TEST_RING", "1")))


def server_env(extra_env=None):
    env = dict(os.environ)
    # Test cells keep no membership file (a later test on the same port must not rejoin).
    env["CELLCACHE_CLUSTER__STATE_DIR"] = "off"
    env.update(extra_env or {})
    return env


def login_line(user, password):
    """memcached's text login: a set whose data is "user password"."""
    token = f"{user} {password}".encode()
    return b"set auth 0 0 %d\r\n%s\r\n" % (len(token), token)


def login_of(extra):
    """The login of the first entry of the auth file `extra` names with -Y, or b""."""
    if "-Y" not in extra:
        return b""
    with open(extra[extra.index("-Y") + 1]) as f:
        user, password = f.readline().rstrip("\r\n").split(":", 1)
    return login_line(user, password)


def free_port(host="127.0.0.1"):
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def server_command(host, port, extra):
    if os.environ.get("CELLCACHE_TEST_SERVER") == "memcached":
        cmd = ["memcached", "-U", "0", "-l", host, "-p", str(port)]
        if os.geteuid() == 0:
            cmd += ["-u", "root"]
        return cmd + extra
    binary = os.environ.get("CELLCACHE_BIN", os.path.join(ROOT, "target", "debug", "cellcache"))
    if not os.path.exists(binary):
        pytest.fail(f"{binary} not built: run `cargo build` first (scripts/test does)")
    engine = os.environ.get("CELLCACHE_TEST_IO_ENGINE")
    engine_args = ["--io-engine", engine] if engine else []
    return [binary, "serve", "-l", host, "-p", str(port)] + engine_args + extra


def request(host, port, line, login=b"", tls=False):
    """Sends one line (after `login`, if any) and reads the reply up to END (bounded). With
    `tls` (a server started with -Z) over TLS, trusting whatever certificate it shows: the
    harness only asks whether the server is up, the tests check certificates."""
    with socket.create_connection((host, port), timeout=5) as raw:
        s = raw
        if tls:
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
            s = context.wrap_socket(raw)
        s.sendall(login + line)
        data = b""
        while not data.endswith(b"END\r\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        if login:
            if not data.startswith(b"STORED\r\n"):
                return ""
            data = data[len(b"STORED\r\n"):]
        return data.decode()


def admin_get(host, port, path):
    """GET `path` from a cell's admin plane (HTTP on its admin port); the body."""
    with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=5) as reply:
        return reply.read().decode()


def ring_formed(host, admin_ports, n):
    """Every cell reports the same epoch and n Active cells."""
    views = []
    for port in admin_ports:
        lines = admin_get(host, port, "/cluster/status").split("\r\n")
        cells = [l for l in lines if l.startswith("CELL ")]
        if len(cells) != n or not all(" active " in l for l in cells):
            return False
        views.append(lines[0].split(" ")[1])
    return len(set(views)) == 1


def answering_pid(host, port, login=b"", tls=False):
    """The pid `stats` reports on host:port, or None."""
    for line in request(host, port, b"stats\r\n", login, tls).split("\r\n"):
        if line.startswith("STAT pid "):
            return int(line.split(" ")[2])
    return None


def answers_binary_version(host, port):
    """A binary `version` (allowed before SASL authentication) is answered."""
    with socket.create_connection((host, port), timeout=5) as s:
        s.sendall(b"\x80\x0b" + bytes(22))
        return s.recv(2) == b"\x81\x0b"


def wait_ready(proc, host, port, login=b"", binary=False, tls=False):
    """Our child answers on host:port. A free port found earlier may have been taken by
    another process meanwhile (our child then fails to bind and exits): the server that
    answers must be ours, which its `stats` pid tells (a binary-only server is taken at its
    word while our child runs)."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            if binary:
                if answers_binary_version(host, port):
                    return proc.poll() is None
            elif answering_pid(host, port, login, tls) == proc.pid:
                return True
        except (OSError, ValueError):
            pass
        time.sleep(0.02)
    return False


class OneServer:
    """One process on host; on `port` if given (one try), else on a free port (five tries)."""

    def __init__(self, extra, host="127.0.0.1", port=None, env=None):
        self.host = host
        login, binary = login_of(extra), "binary" in extra
        for _ in range(1 if port else 5):
            self.port = port or free_port(host)
            # cellcache's admin plane (HTTP) on a port of its own: the ring's status
            self.admin_port = None
            args = list(extra)
            if os.environ.get("CELLCACHE_TEST_SERVER") != "memcached":
                self.admin_port = free_port(host)
                args += ["--admin-listen", host, "--admin-port", str(self.admin_port)]
            self.proc = subprocess.Popen(server_command(host, self.port, args),
                                         env=server_env(env), stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL)
            if wait_ready(self.proc, host, self.port, login, binary, "-Z" in extra):
                return
            self.stop()
        raise RuntimeError(f"server did not start on {host}:{port or 'a free port'}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


class CellRing:
    """Cells of one ring on 127.0.0.1, started one by one (`add`), each waited for until
    every cell reports the ring formed; `first_extra` goes to the first cell only."""

    def __init__(self, first_extra=()):
        self.first_peer = free_port()
        self.first_extra = list(first_extra)
        self.cells = []

    def add(self, extra=()):
        i = len(self.cells)
        args = ["-m", "64", "--peer-port", str(self.first_peer if i == 0 else free_port())]
        args += self.first_extra if i == 0 else ["--join", f"127.0.0.1:{self.first_peer}"]
        self.cells.append(OneServer(args + list(extra)))
        self.wait_formed()
        return self.cells[-1]

    def wait_formed(self):
        deadline = time.monotonic() + FORM_TIMEOUT_S
        ports = [c.admin_port for c in self.cells]
        while not ring_formed("127.0.0.1", ports, len(ports)):
            if time.monotonic() > deadline:
                raise RuntimeError(f"ring of {len(ports)} did not form")
            time.sleep(0.1)

    def stop(self):
        for c in self.cells:
            c.stop()


def cell_ring(n, first_extra=()):
    """A CellRing of n cells (stop it when done)."""
    ring = CellRing(first_extra)
    try:
        for _ in range(n):
            ring.add()
    except BaseException:
        ring.stop()
        raise
    return ring


class RunningServer:
    """One server, or under CELLCACHE_TEST_RING one cell of a ring (the others run too).

    Clients talk to `entry` (the ring's second cell), on `entry_port` if given.
    """

    def __init__(self, extra, host="127.0.0.1", entry_port=None, env=None):
        n = ring_size()
        if n < 2 or "binary" in extra:
            self.cells = [OneServer(extra, host, entry_port, env)]
            self.entry = self.cells[0]
            return
        self.cells = []
        try:
            first_peer = free_port(host)
            for i in range(n):
                if i == 0:
                    args = extra + ["--peer-port", str(first_peer)]
                else:
                    args = extra + ["--peer-port", str(free_port(host)),
                                    "--join", f"{host}:{first_peer}"]
                self.cells.append(OneServer(args, host, entry_port if i == 1 else None, env))
                ports = [c.admin_port for c in self.cells]
                deadline = time.monotonic() + FORM_TIMEOUT_S
                while not ring_formed(host, ports, i + 1):
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"ring of {i + 1} did not form")
                    time.sleep(0.1)
        except BaseException:
            self.stop()
            raise
        self.entry = self.cells[1]

    @property
    def port(self):
        return self.entry.port

    @property
    def proc(self):
        return self.entry.proc

    @property
    def addr(self):
        return (self.entry.host, self.port)

    def stop(self):
        for c in self.cells:
            c.stop()


@pytest.fixture
def server():
    s = RunningServer(["-m", "64", "-t", "2"])
    yield s
    s.stop()


@pytest.fixture
def server_factory():
    started = []

    def start(extra, env=None):
        s = RunningServer(extra, env=env)
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()
