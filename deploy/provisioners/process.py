#!/usr/bin/env python3
"""A `command` provisioner for cellcache (docs/elasticity.md): cells as processes of this
machine, started detached. A template for your own — replace `start`/`stop`/`alive` with
your cloud's calls (create an instance that runs the same `cellcache serve` line, terminate
it) and keep the contract:

- stdin: one JSON object, {"action": "start"|"alive"|"stop", ...} (see below);
- exit 0 on success, nonzero on failure (the last line of stderr is the reason cellcache
  logs and shows in `ctl autoscale status`);
- start prints the new cell's handle (here its pid) on stdout; alive and stop get it back.

Configuration, from the environment cellcache runs the command in (set it in
`[autoscale.command] args` or around `cellcache serve`):
  CELLCACHE_BIN             the cellcache executable (default: `cellcache` on PATH)
  CELLCACHE_PROVISION_ARGS  extra `serve` flags for every cell, e.g.
                            "-m 1024 --cluster-secret-file /etc/cellcache/secret"
  CELLCACHE_PROVISION_DIR   where logs and the pid list go (default /tmp/cellcache-cells)
  CELLCACHE_PROVISION_HOST  the address cells listen on (default 127.0.0.1)
"""
import json, os, shlex, signal, socket, subprocess, sys, time

DIR = os.environ.get("CELLCACHE_PROVISION_DIR", "/tmp/cellcache-cells")
HOST = os.environ.get("CELLCACHE_PROVISION_HOST", "127.0.0.1")
GRACE_SECS = 10


def free_port():
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def start(req):
    os.makedirs(DIR, exist_ok=True)
    port = free_port()
    cmd = [os.environ.get("CELLCACHE_BIN", "cellcache"), "serve", "-l", HOST, "-p", str(port),
           "--join", req["join"], "--divide", req["divide"], "--provisioned"]
    cmd += shlex.split(os.environ.get("CELLCACHE_PROVISION_ARGS", ""))
    log = open(os.path.join(DIR, f"cell-{port}.log"), "ab")
    p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                         start_new_session=True)
    with open(os.path.join(DIR, "cells"), "a") as f:
        f.write(f"{p.pid} {HOST}:{port}\n")
    print(p.pid)


def running(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A child of ours that exited is a zombie until reaped; ours are detached, so check
    # the state too.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


def pid_of(req):
    if req.get("handle"):
        return int(req["handle"])
    try:
        with open(os.path.join(DIR, "cells")) as f:
            for line in f:
                pid, addr = line.split()
                if addr == req.get("client"):
                    return int(pid)
    except FileNotFoundError:
        pass
    return None


def stop(req):
    pid = pid_of(req)
    if pid is None:
        return  # not one of ours: it stops by itself once absorbed
    # An absorbed cell stops by itself; one that never joined gets no grace.
    deadline = time.time() + (GRACE_SECS if req.get("cell") else 0)
    while running(pid) and time.time() < deadline:
        time.sleep(0.1)
    if running(pid):
        os.kill(pid, signal.SIGTERM)


def main():
    req = json.load(sys.stdin)
    action = req.get("action")
    if action == "start":
        start(req)
    elif action == "alive":
        if not running(int(req["handle"])):
            print(f"process {req['handle']} is gone", file=sys.stderr)
            sys.exit(1)
    elif action == "stop":
        stop(req)
    else:
        print(f"unknown action {action!r}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
