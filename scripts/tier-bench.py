#!/usr/bin/env python3
"""The cache tier's evaluation (docs/benchmarks/tier.md): seed 000's bandwidth and latency by
value ("block") size and parallel requests, writes under write-through and write-back, reads
hot (in memory) and cold (just restarted: loaded from the store), on redb and PostgreSQL;
then the flush throughput and coalescing ratio under a Zipf write load.

    python3 scripts/tier-bench.py --bin target/release/cellcache \
        --postgres postgres://cellcache@127.0.0.1:5432/postgres [--secs 3] > rows.md

Each run starts its own cell (`serve --standalone --backing-store …`) on a free port, runs
`cellcache bench` against it, reads the tier's figures from `stats cellcache`, and stops the
cell. Prints Markdown tables on stdout."""

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stats(port):
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"stats cellcache\r\n")
        data = b""
        while not data.endswith(b"END\r\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    out = {}
    for line in data.decode().split("\r\n"):
        parts = line.split(" ")
        if len(parts) == 3 and parts[0] == "STAT":
            out[parts[1]] = parts[2]
    return out


class Cell:
    def __init__(self, binary, store, policy, window_ms=1000):
        self.port = free_port()
        self.args = [binary, "serve", "--standalone", "-l", "127.0.0.1", "-p", str(self.port),
                     "--admin-port", str(free_port()), "-m", "1024", "-I", "1m",
                     "--backing-store", store, "--write-policy", policy,
                     "--write-back-window", str(window_ms),
                     "--write-back-max-dirty", str(512 << 20)]
        self.start()

    def start(self):
        self.proc = subprocess.Popen(self.args, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL,
                                     env=dict(os.environ, CELLCACHE_LOG__LEVEL="warn"))
        for _ in range(500):
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.02)
        sys.exit("the cell did not start: " + " ".join(self.args))

    def drained(self):
        for _ in range(6000):
            if stats(self.port)["tier_dirty_keys"] == "0":
                return True
            time.sleep(0.01)
        return False

    def restart(self):
        self.stop()
        self.start()

    def stop(self):
        self.proc.terminate()  # a graceful stop drains the dirty keys first
        self.proc.wait(timeout=60)


def bench(binary, port, conns, size, get_ratio, secs=None, requests=None, keys=2000,
          popularity="uniform", preload=False):
    cmd = [binary, "bench", "-s", f"127.0.0.1:{port}", "-c", str(conns), "-t", "2",
           "--get-ratio", str(get_ratio), "-k", str(keys), "--value-size", size,
           "--popularity", popularity, "--json"]
    cmd += ["-n", str(requests)] if requests else ["-d", f"{secs}s"]
    if preload:
        cmd.append("--preload")
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return json.loads(out)["results"]["all"]


def size_bytes(size):
    return int(size[:-1]) * 1024 if size.endswith("k") else int(size)


def row(name, r, size):
    lat = r["latency"]
    mb = r["throughput_rps"] * size_bytes(size) / 1e6
    return (f"| {name} | {r['throughput_rps']:.0f} | {mb:.1f} | {lat['p50_us']:.0f} | "
            f"{lat['p99_us']:.0f} | {r['errors']} |")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", default="target/release/cellcache")
    p.add_argument("--postgres", required=True)
    p.add_argument("--secs", type=int, default=3)
    a = p.parse_args()
    tmp = tempfile.mkdtemp(prefix="tier-bench-")
    stores = {"redb": lambda n: f"redb:{tmp}/{n}.redb", "postgres": lambda n: a.postgres}
    print("| backend · policy · size · parallel | ops/s | MB/s | p50 µs | p99 µs | errors |")
    print("|---|---|---|---|---|---|")
    for backend, store in stores.items():
        for policy in ["through", "back"]:
            for size in ["4k", "64k"]:
                for conns in [4, 16]:
                    name = f"{backend}-{policy}-{size}-{conns}"
                    cell = Cell(a.bin, store(name), policy)
                    r = bench(a.bin, cell.port, conns, size, 0.0, secs=a.secs)
                    cell.drained()
                    cell.stop()
                    print(row(f"{backend} · write-{policy} · set {size} · {conns}", r, size),
                          flush=True)
    print()
    print("| backend · reads · size · parallel | ops/s | MB/s | p50 µs | p99 µs | errors |")
    print("|---|---|---|---|---|---|")
    for backend, store in stores.items():
        for size in ["4k", "64k"]:
            for conns in [4, 16]:
                name = f"{backend}-read-{size}-{conns}"
                keys = 2000
                cell = Cell(a.bin, store(name), "back")
                bench(a.bin, cell.port, 4, size, 0.0, requests=1, keys=keys, preload=True)
                cell.drained()
                hot = bench(a.bin, cell.port, conns, size, 1.0, secs=a.secs, keys=keys)
                cell.restart()
                cold = bench(a.bin, cell.port, conns, size, 1.0, requests=keys, keys=keys)
                loads = stats(cell.port)["tier_loads"]
                cell.stop()
                print(row(f"{backend} · hot (in memory) · get {size} · {conns}", hot, size))
                print(row(f"{backend} · cold (after restart; {loads} loads) · get {size} · "
                          f"{conns}", cold, size), flush=True)
    print()
    print("| backend · Zipf sets, 1 KB, 10000 keys, 8 parallel, window 1 s | sets/s | "
          "store writes | coalescing (sets per store write) | store writes/s | batches |")
    print("|---|---|---|---|---|---|")
    for backend, store in stores.items():
        cell = Cell(a.bin, store(f"{backend}-zipf"), "back", window_ms=1000)
        started = time.time()
        r = bench(a.bin, cell.port, 8, "1k", 0.0, secs=a.secs * 3, keys=10000,
                  popularity="zipf")
        cell.drained()
        took = time.time() - started
        s = stats(cell.port)
        cell.stop()
        recorded, flushed = int(s["tier_writes_recorded"]), int(s["tier_flushed_ops"])
        print(f"| {backend} | {r['throughput_rps']:.0f} | {flushed} | "
              f"{recorded / max(flushed, 1):.1f} | {flushed / took:.0f} | "
              f"{s['tier_flushed_batches']} |", flush=True)


if __name__ == "__main__":
    main()
