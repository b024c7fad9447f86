#!/usr/bin/env python3
"""Turns the JSON reports under results/ into the markdown tables of tables.md.

    python3 docs/benchmarks/cellcache/tables.py docs/benchmarks/cellcache > tables.md
    python3 docs/benchmarks/cellcache/tables.py docs/benchmarks/cellcache --plot-inputs DIR

Reads only what `cellcache bench` / `bench compare` wrote (and strace's -c summaries);
computes nothing the reports do not hold except unit conversions, medians over repetitions
and ratios of paired repetitions (repetition i of one server against repetition i of the
other, exactly as `bench compare` pairs them).

--plot-inputs DIR writes, for the headline plot, the run of each side whose throughput is
the median of its repetitions, as plain `bench` reports that `bench plot` can draw.
"""
import glob
import json
import os
import re
import shlex
import statistics
import sys

here = sys.argv[1]
res = os.path.join(here, "results")


def load(path):
    with open(path) as f:
        return json.load(f)


def cmdline(argv):
    argv = list(argv)
    argv[0] = "target/release/cellcache"
    out = []
    for a in argv:
        out.append(shlex.quote(a))
    return " ".join(out)


def spread(values):
    v = sorted(x for x in values if x is not None)
    if not v:
        return None
    return (v[0], statistics.median(v), v[-1])


def fmt_spread(s, digits=2):
    if s is None:
        return "-"
    return f"{s[1]:.{digits}f} ({s[0]:.{digits}f} – {s[2]:.{digits}f})"


def fmt_ratio(s):
    if s is None:
        return "-"
    return f"**×{s[1]:.2f}** ({s[0]:.2f} – {s[2]:.2f})"


def machine(m):
    return f'{m["nproc"]} cores, "{m["cpu_model"]}", Linux {m["kernel"]}'


def loads(paths):
    return ", ".join(load(p)["machine"].get("load_average", "?").split()[0] for p in paths)


def metric(report, name):
    for m in report["metrics"]:
        if m["metric"] == name:
            return m
    return None


def side_runs(report, side):
    return [r["result"] for r in sorted(report["runs"], key=lambda r: r["repetition"]) if r["side"] == side]


# ---------------------------------------------------------------- headline (compare reports)
HEADLINE_METRICS = [
    ("throughput_rps", "throughput (req/s)", 0),
    ("all.latency_p50_us", "p50 (µs)", 1),
    ("all.latency_p99_us", "p99 (µs)", 1),
    ("all.latency_avg_us", "mean (µs)", 1),
    ("all.latency_p99.9_us", "p99.9 (µs)", 1),
]


def compare_table(path, metrics=HEADLINE_METRICS):
    r = load(path)
    lines = [f"| metric | {r['a_name']} median (min – max) | {r['b_name']} median (min – max) | ratio {r['b_name']}/{r['a_name']} median (min – max) |",
             "|---|---|---|---|"]
    for key, label, digits in metrics:
        m = metric(r, key)
        if m is None:
            continue
        a, b, q = m["a"], m["b"], m["ratio_b_over_a"]
        lines.append(f"| {label} | {a['median']:.{digits}f} ({a['min']:.{digits}f} – {a['max']:.{digits}f}) | "
                     f"{b['median']:.{digits}f} ({b['min']:.{digits}f} – {b['max']:.{digits}f}) | "
                     f"**×{q['median']:.3f}** ({q['min']:.3f} – {q['max']:.3f}) |")
    return "\n".join(lines)


def compare_header(path):
    r = load(path)
    runs = r["runs"]
    loadavg = [x["result"]["machine"].get("load_average", "?").split()[0] for x in runs if "machine" in x["result"]]
    return (f"{r['repetitions']} repetitions per side, interleaved; A = `{r['a_command']}`, "
            f"B = `{r['b_command']}`; placement: server cpus {r['placement']['server_cpus']} "
            f"(kernel: {r['placement']['server_cpus_observed']}), generator cpus "
            f"{r['placement']['generator_cpus']}; 1-minute load average at the start of each run: "
            f"{', '.join(loadavg)}.")


def headline():
    files = sorted(glob.glob(os.path.join(res, "headline-*.json")))
    if not files:
        return
    first = load(files[0])
    print("## 1. Headline: cellcache (io_uring engine) beside memcached\n")
    print(f"Machine: {machine(first['machine'])}. Both servers `-t 1 -m 64`; cellcache runs with "
          f"`--io-engine uring` (what `auto` selects on this kernel). 50 connections, 10 000 keys "
          f"preloaded, Zipf s = 0.99, 100-byte values, 1 s warm-up + 3 s measured per repetition. "
          f"Ratio = cellcache / memcached of repetition i against repetition i: above 1 is better "
          f"for throughput, below 1 is better for latency.\n")
    # Summary table first.
    print("| workload | throughput ratio | p50 ratio | p99 ratio | memcached req/s | cellcache req/s |")
    print("|---|---|---|---|---|---|")
    order = ["get0.9-p1", "get0.1-p1", "get0.9-p16", "get0.1-p16", "get0.9-mget10"]
    names = {"get0.9-p1": "GET 0.9, pipeline 1", "get0.1-p1": "GET 0.1, pipeline 1",
             "get0.9-p16": "GET 0.9, pipeline 16", "get0.1-p16": "GET 0.1, pipeline 16",
             "get0.9-mget10": "GET 0.9, multi-get of 10 keys, pipeline 1"}
    for w in order:
        p = os.path.join(res, f"headline-{w}.json")
        if not os.path.exists(p):
            continue
        r = load(p)
        t, p50, p99 = (metric(r, k) for k in ("throughput_rps", "all.latency_p50_us", "all.latency_p99_us"))
        q = lambda m: f"×{m['ratio_b_over_a']['median']:.2f} ({m['ratio_b_over_a']['min']:.2f} – {m['ratio_b_over_a']['max']:.2f})"
        print(f"| {names[w]} | {q(t)} | {q(p50)} | {q(p99)} | {t['a']['median']:.0f} | {t['b']['median']:.0f} |")
    print()
    aa = sorted(glob.glob(os.path.join(res, "aa-*.json")))
    if aa:
        print("Noise floor, the same server on both sides (A/A), same workload:\n")
        print("| A/A run | throughput ratio | p50 ratio | p99 ratio |")
        print("|---|---|---|---|")
        for p in aa:
            r = load(p)
            t, p50, p99 = (metric(r, k) for k in ("throughput_rps", "all.latency_p50_us", "all.latency_p99_us"))
            q = lambda m: f"×{m['ratio_b_over_a']['median']:.2f} ({m['ratio_b_over_a']['min']:.2f} – {m['ratio_b_over_a']['max']:.2f})"
            print(f"| {os.path.basename(p)[:-5]} | {q(t)} | {q(p50)} | {q(p99)} |")
        print()
    for w in order:
        p = os.path.join(res, f"headline-{w}.json")
        if not os.path.exists(p):
            continue
        r = load(p)
        print(f"### {names[w]}\n")
        print(f"```\n{cmdline(r['command'])}\n```\n")
        print(compare_header(p) + "\n")
        print(compare_table(p) + "\n")
    for p in aa:
        r = load(p)
        print(f"### A/A: {os.path.basename(p)[:-5]}\n")
        print(f"```\n{cmdline(r['command'])}\n```\n")
        print(compare_header(p) + "\n")
        print(compare_table(p) + "\n")


# ---------------------------------------------------------------- capacity and hit ratio
def capacity():
    p = os.path.join(res, "capacity-64m.json")
    if os.path.exists(p):
        r = load(p)
        print("## 2a. Capacity: 14-byte keys, 100-byte values, 64 MiB\n")
        print(f"```\n{cmdline(r['command'])}\n```\n")
        print(compare_header(p) + "\n")
        print("| server | repetition | limit (bytes) | keys written | items held at first eviction | bytes / item | overhead bytes / item |")
        print("|---|---|---|---|---|---|---|")
        for run in sorted(r["runs"], key=lambda x: (x["side"], x["repetition"])):
            c = run["result"]
            print(f"| {run['side']} | {run['repetition']} | {c['limit_bytes']} | {c['keys_written']} | {c['items_held']} | "
                  f"{c['bytes_per_item']:.1f} | {c['overhead_bytes_per_item']:.1f} |")
        print()
        for key in ("items_held", "bytes_per_item", "overhead_bytes_per_item"):
            m = metric(r, key)
            if m:
                print(f"- `{key}`: ratio {r['b_name']}/{r['a_name']} median ×{m['ratio_b_over_a']['median']:.3f} "
                      f"(min {m['ratio_b_over_a']['min']:.3f}, max {m['ratio_b_over_a']['max']:.3f})")
        print()
    p = os.path.join(res, "hitratio-64m-zipf0.99-10x.json")
    if os.path.exists(p):
        r = load(p)
        print("## 2b. Hit ratio at equal memory (64 MiB, key space 10× the cache, Zipf 0.99, read-through)\n")
        print(f"```\n{cmdline(r['command'])}\n```\n")
        print(compare_header(p) + "\n")
        print("| server | repetition | get hit ratio | throughput (req/s) | warm-up requests |")
        print("|---|---|---|---|---|")
        for run in sorted(r["runs"], key=lambda x: (x["side"], x["repetition"])):
            x = run["result"]["results"]
            g = x["ops"].get("get", x["all"])
            print(f"| {run['side']} | {run['repetition']} | {g['hit_ratio']:.4f} | {x['all']['throughput_rps']:.0f} | "
                  f"{x['warmup_sent']} |")
        print()
        m = metric(r, "hit_ratio")
        if m:
            print(f"Hit ratio {r['b_name']}/{r['a_name']}: median ×{m['ratio_b_over_a']['median']:.3f} "
                  f"(min {m['ratio_b_over_a']['min']:.3f}, max {m['ratio_b_over_a']['max']:.3f}).\n")


# ---------------------------------------------------------------- GET-ratio × value-size grid
def ratio_size_grid():
    files = sorted(glob.glob(os.path.join(res, "grid-*.json")))
    if not files:
        return
    first = load(files[0])
    print("## 3. GET-ratio × value-size grid, cellcache (io_uring) beside memcached\n")
    print(f"Machine: {machine(first['machine'])}. 1000 keys preloaded, Zipf s = 1.345675, 25 "
          f"connections, both servers `-t 1 -m 64`, server on core 1 and generator on core 0. "
          f"Each cell: medians over the repetitions of each side (2 per side at 50 req/s, 3 at "
          f"saturation, interleaved), and the median ratio cellcache/memcached of paired "
          f"repetitions. Response times in ms, measured from each request's intended send time.\n")
    for mode, title, reps in [("rate50", "Fixed arrival rate, 50 req/s (uniform arrivals, open loop), 8 s measured", 2),
                              ("sat", "Saturation: closed loop, 25 connections × 1 in flight, 3 s measured", 3)]:
        print(f"### {title}\n")
        example = None
        for size, label in [("100", "100 B"), ("1k", "1 KB"), ("8k", "8 KB")]:
            print(f"**Value size {label}**\n")
            print("| GET ratio | server | throughput (req/s) | avg (ms) | median (ms) | p95 (ms) | p99 (ms) | errors |")
            print("|---|---|---|---|---|---|---|---|")
            for ratio in ["0.1", "0.5", "0.9"]:
                p = os.path.join(res, f"grid-{mode}-r{ratio}-v{size}.json")
                if not os.path.exists(p):
                    continue
                r = load(p)
                example = example or r
                for side in (r["a_name"], r["b_name"]):
                    runs = side_runs(r, side)
                    med = lambda f: statistics.median(f(x["results"]["all"]) for x in runs)
                    print(f"| {ratio} | {side} | {med(lambda a: a['throughput_rps']):.1f} | "
                          f"{med(lambda a: a['latency']['mean_us'])/1000:.3f} | {med(lambda a: a['latency']['p50_us'])/1000:.3f} | "
                          f"{med(lambda a: a['latency']['p95_us'])/1000:.3f} | {med(lambda a: a['latency']['p99_us'])/1000:.3f} | "
                          f"{sum(x['results']['all']['errors'] for x in runs)} |")
                q = {k: metric(r, k)["ratio_b_over_a"]["median"] for k in
                     ("throughput_rps", "all.latency_avg_us", "all.latency_p50_us", "all.latency_p95_us", "all.latency_p99_us")}
                print(f"| {ratio} | *ratio* | ×{q['throughput_rps']:.2f} | ×{q['all.latency_avg_us']:.2f} | "
                      f"×{q['all.latency_p50_us']:.2f} | ×{q['all.latency_p95_us']:.2f} | ×{q['all.latency_p99_us']:.2f} | |")
            print()
        if example:
            print("Command of one cell (the others differ in `--get-ratio`, `--value-size`, `--output`):\n")
            print(f"```\n{cmdline(example['command'])}\n```\n")


# ---------------------------------------------------------------- engines
ENGINE_ORDER = ["memcached", "epoll", "uring", "threads"]


def engine_runs():
    runs = {}
    for p in glob.glob(os.path.join(res, "engines", "*.json")):
        m = re.match(r"(.+)-(memcached|epoll-before|epoll-after|epoll|uring-8192bufs|uring|threads)-rep(\d+)\.json$", os.path.basename(p))
        if not m:
            continue
        r = load(p)
        cpu = p[:-5] + ".cpu"
        if os.path.exists(cpu):
            ticks, hz = open(cpu).read().split()
            x = r["results"]
            w = r["workload"]
            requests = x["all"]["sent"] + x["warmup_sent"] + (w["key_count"] if w["preloaded"] else 0)
            r["server_cpu_us_per_request"] = int(ticks) / int(hz) * 1e6 / requests
            r["server_cpu_ticks"] = int(ticks)
        runs.setdefault(m.group(1), {}).setdefault(m.group(2), {})[int(m.group(3))] = r
    return runs


def paired_ratio(runs, a, b, f):
    reps = sorted(set(runs.get(a, {})) & set(runs.get(b, {})))
    return spread([f(runs[a][i]) / f(runs[b][i]) for i in reps if f(runs[b][i])])


def engines():
    runs = {k: v for k, v in engine_runs().items() if k.startswith("conns")}
    if not runs:
        return
    def key(name):
        m = re.match(r"conns(\d+)-v(\w+)-r([\d.]+)(.*)", name)
        size = {"100": 0, "1k": 1, "8k": 2}[m.group(2)]
        return (m.group(4), int(m.group(1)), size, float(m.group(3)))
    any_run = next(iter(next(iter(runs.values())).values()))[1]
    print("## 4. I/O engines: threads / epoll / uring, and memcached, in the same run\n")
    print(f"Machine: {machine(any_run['machine'])}. Every server `-t 1 -m 64 -c 6000` pinned to core 1 "
          f"(cellcache `--io-engine threads|epoll|uring`; the threads engine has one thread per "
          f"connection whatever `-t` says), the generator (`cellcache bench`, one thread) on core 0. "
          f"10 000 keys preloaded, Zipf 0.99, 1 s warm-up + 3 s measured; 3 repetitions, in each the four "
          f"servers run one after another in a rotating order. Cells: median (min – max) over the "
          f"repetitions; ratios: repetition i against repetition i, median (min – max).\n")
    tput = lambda r: r["results"]["all"]["throughput_rps"]
    p50 = lambda r: r["results"]["all"]["latency"]["p50_us"]
    p99 = lambda r: r["results"]["all"]["latency"]["p99_us"]
    cpu = lambda r: r.get("server_cpu_us_per_request")
    gen = lambda r: r["results"]["generator"]["busiest_thread_utilization"] * 100
    for name in sorted(runs, key=key):
        w = runs[name]
        print(f"### {name}\n")
        print("| server | throughput (req/s) | p50 (µs) | p99 (µs) | server CPU µs / request | generator busy % | "
              "throughput vs epoll | p99 vs epoll | CPU/request vs epoll | "
              "throughput vs memcached | p50 vs memcached | p99 vs memcached | CPU/request vs memcached | errors |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for s in ENGINE_ORDER:
            if s not in w:
                continue
            rs = list(w[s].values())
            errs = sum(r["results"]["all"]["errors"] for r in rs) + sum(r["results"]["connections_failed"] for r in rs)
            vs = lambda other, f: "" if s == other else fmt_ratio(paired_ratio(w, s, other, f))
            has_cpu = all(cpu(r) is not None for r in rs)
            print(f"| {s} | {fmt_spread(spread([tput(r) for r in rs]), 0)} | {fmt_spread(spread([p50(r) for r in rs]), 0)} | "
                  f"{fmt_spread(spread([p99(r) for r in rs]), 0)} | "
                  f"{fmt_spread(spread([cpu(r) for r in rs]), 2) if has_cpu else '-'} | "
                  f"{fmt_spread(spread([gen(r) for r in rs]), 0)} | "
                  f"{vs('epoll', tput)} | {vs('epoll', p99)} | {vs('epoll', cpu) if has_cpu else '-'} | "
                  f"{vs('memcached', tput)} | {vs('memcached', p50)} | {vs('memcached', p99)} | "
                  f"{vs('memcached', cpu) if has_cpu else '-'} | {errs} |")
        print()
        example = w.get("epoll", {}).get(1)
        if example:
            print(f"```\n{cmdline(example['command'])}\n```\n(the same for every server but `--server`/`--output`)\n")


def epoll_fix():
    runs = {k: v for k, v in engine_runs().items() if k.startswith("fix-")}
    if not runs:
        return
    print("## 5. The epoll engine before and after commit c7b757f (no EAGAIN read, reply before read)\n")
    print("Same harness as section 4 (server on core 1, generator on core 0, `-t 1 -m 64`, 10 000 keys "
          "preloaded, Zipf 0.99, 100 B, GET 0.9, 1 s warm-up + 3 s), 5 repetitions, the three servers "
          "interleaved in a rotating order. `epoll-before` = cellcache built at 3a25f27, `epoll-after` = "
          "with the change; both `--io-engine epoll`.\n")
    tput = lambda r: r["results"]["all"]["throughput_rps"]
    p50 = lambda r: r["results"]["all"]["latency"]["p50_us"]
    p99 = lambda r: r["results"]["all"]["latency"]["p99_us"]
    cpu = lambda r: r["server_cpu_us_per_request"]
    for name in sorted(runs):
        w = runs[name]
        print(f"### {name[4:]}\n")
        print("| server | throughput (req/s) | p50 (µs) | p99 (µs) | server CPU µs / request | "
              "after/before: throughput | p50 | p99 | CPU/request | vs memcached: throughput | p50 | p99 | CPU/request |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for s in ("memcached", "epoll-before", "epoll-after"):
            if s not in w:
                continue
            rs = list(w[s].values())
            ab = lambda f: fmt_ratio(paired_ratio(w, "epoll-after", "epoll-before", f)) if s == "epoll-after" else ""
            vm = lambda f: "" if s == "memcached" else fmt_ratio(paired_ratio(w, s, "memcached", f))
            print(f"| {s} | {fmt_spread(spread([tput(r) for r in rs]), 0)} | {fmt_spread(spread([p50(r) for r in rs]), 0)} | "
                  f"{fmt_spread(spread([p99(r) for r in rs]), 0)} | {fmt_spread(spread([cpu(r) for r in rs]), 2)} | "
                  f"{ab(tput)} | {ab(p50)} | {ab(p99)} | {ab(cpu)} | {vm(tput)} | {vm(p50)} | {vm(p99)} | {vm(cpu)} |")
        print()
        ex = w.get("epoll-after", {}).get(1)
        if ex:
            print(f"```\n{cmdline(ex['command'])}\n```\n")


def ratio_size_grid_engines():
    runs = {k: v for k, v in engine_runs().items() if k.startswith("grid-")}
    if not runs:
        return
    print("## 4d. The GET-ratio × value-size grid's operating point, every engine\n")
    print("25 connections, 1000 keys preloaded, Zipf s = 1.345675, 1 KB values, GET 0.9; at the grid's "
          "50 req/s (open loop, uniform arrivals, 8 s, latency from intended send times) and at "
          "saturation (closed loop, 3 s). Same placement as section 4; 3 repetitions, rotating order. "
          "At 50 req/s the server is idle most of the time, so CPU per request there is mostly the cost "
          "of waking up.\n")
    tput = lambda r: r["results"]["all"]["throughput_rps"]
    p50 = lambda r: r["results"]["all"]["latency"]["p50_us"]
    p95 = lambda r: r["results"]["all"]["latency"]["p95_us"]
    p99 = lambda r: r["results"]["all"]["latency"]["p99_us"]
    mean = lambda r: r["results"]["all"]["latency"]["mean_us"]
    for name in sorted(runs):
        w = runs[name]
        # CPU time is read in clock ticks (10 ms): a run with fewer than 100 has no usable figure.
        cpu_ok = all(r["server_cpu_ticks"] >= 100 for rs in w.values() for r in rs.values())
        cpu = (lambda r: r["server_cpu_us_per_request"]) if cpu_ok else (lambda r: None)
        print(f"### {name}\n")
        if not cpu_ok:
            print("(Server CPU not shown: under 100 clock ticks per run at this rate, too coarse to divide.)\n")
        print("| server | throughput (req/s) | avg (µs) | p50 (µs) | p95 (µs) | p99 (µs) | server CPU µs / request | "
              "p50 vs epoll | p99 vs epoll | CPU vs epoll | p50 vs memcached | p99 vs memcached |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for s in ENGINE_ORDER:
            if s not in w:
                continue
            rs = list(w[s].values())
            vs = lambda other, f: "" if s == other else fmt_ratio(paired_ratio(w, s, other, f))
            print(f"| {s} | {fmt_spread(spread([tput(r) for r in rs]), 1)} | {fmt_spread(spread([mean(r) for r in rs]), 0)} | "
                  f"{fmt_spread(spread([p50(r) for r in rs]), 0)} | {fmt_spread(spread([p95(r) for r in rs]), 0)} | "
                  f"{fmt_spread(spread([p99(r) for r in rs]), 0)} | {fmt_spread(spread([cpu(r) for r in rs]), 1)} | "
                  f"{vs('epoll', p50)} | {vs('epoll', p99)} | {vs('epoll', cpu) if cpu_ok else '-'} | "
                  f"{vs('memcached', p50)} | {vs('memcached', p99)} |")
        print()
        ex = w.get("epoll", {}).get(1)
        if ex:
            print(f"```\n{cmdline(ex['command'])}\n```\n")


def uring_buffers():
    runs = {k: v for k, v in engine_runs().items() if k.startswith("bufs-")}
    if not runs:
        return
    print("## 4c. io_uring's provided-buffer ring at 1000 and 5000 connections\n")
    print("Same harness as section 4 (100 B, GET 0.9, depth 1), 3 repetitions, rotating order. "
          "`uring` = default `uring_provided_buffers = 256`; `uring-8192bufs` = the same binary with "
          "`CELLCACHE_IO__URING_PROVIDED_BUFFERS=8192` (8192 × 16 KiB = 128 MiB of receive buffers).\n")
    tput = lambda r: r["results"]["all"]["throughput_rps"]
    p99 = lambda r: r["results"]["all"]["latency"]["p99_us"]
    cpu = lambda r: r["server_cpu_us_per_request"]
    for name in sorted(runs, key=lambda n: int(n.split("conns")[1])):
        w = runs[name]
        print(f"### {name[5:]}\n")
        print("| server | throughput (req/s) | p99 (µs) | server CPU µs / request | vs epoll: throughput | p99 | CPU/request |")
        print("|---|---|---|---|---|---|---|")
        for s in ("epoll", "uring", "uring-8192bufs"):
            if s not in w:
                continue
            rs = list(w[s].values())
            ve = lambda f: "" if s == "epoll" else fmt_ratio(paired_ratio(w, s, "epoll", f))
            print(f"| {s} | {fmt_spread(spread([tput(r) for r in rs]), 0)} | {fmt_spread(spread([p99(r) for r in rs]), 0)} | "
                  f"{fmt_spread(spread([cpu(r) for r in rs]), 2)} | {ve(tput)} | {ve(p99)} | {ve(cpu)} |")
        print()


def cpusplit():
    files = sorted(glob.glob(os.path.join(res, "cpusplit", "*.cpu")))
    if not files:
        return
    print("## 4e. Where the server's CPU goes: user vs system time\n")
    print("100 connections, 100 B, GET 0.9, 10 000 keys preloaded, Zipf 0.99, 1 s warm-up + 3 s; "
          "2 repetitions per server in a rotating order; utime and stime of the server process "
          "(`/proc/<pid>/stat` fields 14 and 15, all threads) across the bench run, per request "
          "answered (preload + warm-up + measured).\n")
    print("| depth | server | user µs / request | system µs / request | system share |")
    print("|---:|---|---|---|---|")
    for d in (1, 16):
        for srv in ENGINE_ORDER:
            us, ss, shares = [], [], []
            for c in sorted(glob.glob(os.path.join(res, "cpusplit", f"d{d}-{srv}-rep*.cpu"))):
                u, st, hz = (int(x) for x in open(c).read().split())
                r = load(c[:-4] + ".json")
                x = r["results"]
                req = x["all"]["sent"] + x["warmup_sent"] + r["workload"]["key_count"]
                us.append(u / hz * 1e6 / req)
                ss.append(st / hz * 1e6 / req)
                shares.append(st / (u + st) if u + st else None)
            if us:
                print(f"| {d} | {srv} | {fmt_spread(spread(us), 2)} | {fmt_spread(spread(ss), 2)} | "
                      f"{fmt_spread(spread([x * 100 for x in shares if x is not None]), 0)} % |")
    ex = load(sorted(glob.glob(os.path.join(res, "cpusplit", "*.json")))[0])
    print(f"\n```\n{cmdline(ex['command'])}\n```\n")


def strace_summary(path):
    """Parses `strace -c -f` output: {syscall: (calls, errors)} and the total."""
    calls = {}
    total = None
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) < 5 or not parts[0][0].isdigit():
                continue
            name = parts[-1]
            # columns: %time seconds usecs/call calls [errors] syscall
            nums = parts[:-1]
            n_calls = int(nums[3])
            n_err = int(nums[4]) if len(nums) > 4 else 0
            if name == "total":
                total = n_calls
            else:
                calls[name] = (n_calls, n_err)
    return calls, total


def strace():
    files = sorted(glob.glob(os.path.join(res, "strace", "*.json")))
    if not files:
        return
    print("## 4b. Syscalls per request (`strace -c -f`, server only)\n")
    print("Each server alone under `strace -c -f` (which slows it, so only the counts matter), "
          "100 connections, 100 B values, GET 0.9, no preload or warm-up so that every request "
          "the server answered is in the report's `sent`; the server is stopped with SIGINT after "
          "the run, so start-up and shutdown (a few hundred calls) are included.\n")
    print("| server | depth | requests | syscalls | per request | main calls (errors) |")
    print("|---|---:|---:|---:|---:|---|")
    for d in (1, 16):
        for s in ENGINE_ORDER + ["epoll-before", "epoll-after"]:
            j = os.path.join(res, "strace", f"{s}-d{d}.json")
            t = os.path.join(res, "strace", f"{s}-d{d}.txt")
            if not (os.path.exists(j) and os.path.exists(t)):
                continue
            sent = load(j)["results"]["all"]["sent"]
            calls, total = strace_summary(t)
            top = sorted(calls.items(), key=lambda kv: -kv[1][0])[:5]
            desc = ", ".join(f"{n} `{k}`" + (f" ({e})" if e else "") for k, (n, e) in top)
            print(f"| {s} | {d} | {sent} | {total} | {total / sent:.2f} | {desc} |")
    print()
    ex = load(files[0])
    print(f"```\ntaskset -c 1 strace -c -f -o results/strace/SERVER-dD.txt SERVER_COMMAND &\n{cmdline(ex['command'])}\n```\n")


def recheck():
    files = sorted(glob.glob(os.path.join(res, "recheck-*.json"))) + \
        sorted(glob.glob(os.path.join(res, "headline-epoll-*.json")))
    if not files:
        return
    print("## 6. Side-by-side rechecks for issue 5 (bench compare, headline shape)\n")
    print("50 connections, 10 000 keys preloaded, Zipf 0.99, 100 B, GET 0.9, 5 interleaved repetitions "
          "per side. `epoll-3a25f27` / `epoll-c7b757f` = the epoll engine before / after the change; "
          "`headline-epoll-*` ran earlier with the epoll engine at 3a25f27.\n")
    for p in files:
        r = load(p)
        print(f"### {os.path.basename(p)[:-5]}\n")
        print(f"```\n{cmdline(r['command'])}\n```\n")
        print(compare_header(p) + "\n")
        print(compare_table(p) + "\n")


def plot_inputs(outdir):
    os.makedirs(outdir, exist_ok=True)
    for w in ("get0.9-p1", "get0.9-p16"):
        p = os.path.join(res, f"headline-{w}.json")
        if not os.path.exists(p):
            continue
        r = load(p)
        for side in (r["a_name"], r["b_name"]):
            runs = side_runs(r, side)
            runs.sort(key=lambda x: x["results"]["all"]["throughput_rps"])
            run = dict(runs[len(runs) // 2])
            run.pop("experiment", None)
            with open(os.path.join(outdir, f"{w}-{side}.json"), "w") as f:
                json.dump(run, f)
    # Engines: the repetition of each server whose throughput is the median of its three.
    runs = engine_runs()
    for name in ("conns100-v100-r0.9", "conns100-v100-r0.9-p16"):
        for srv, reps in runs.get(name, {}).items():
            ordered = sorted(reps.values(), key=lambda r: r["results"]["all"]["throughput_rps"])
            run = dict(ordered[len(ordered) // 2])
            run.pop("server_cpu_us_per_request", None)
            run.pop("server_cpu_ticks", None)
            with open(os.path.join(outdir, f"engines-{name}-{srv}.json"), "w") as f:
                json.dump(run, f)


if len(sys.argv) > 3 and sys.argv[2] == "--plot-inputs":
    plot_inputs(sys.argv[3])
    sys.exit(0)

print("<!-- generated by tables.py from results/; rerun run.sh (or `run.sh tables`) to refresh -->\n")
headline()
capacity()
ratio_size_grid()
engines()
ratio_size_grid_engines()
uring_buffers()
cpusplit()
strace()
epoll_fix()
recheck()
