#!/usr/bin/env bash
# Throughput ratios of a ring (docs/benchmarks/cluster.md): a standalone cell, a ring of one,
# and rings of three (sync and async replication), with the load generator pointed at one
# cell (two thirds of the keys forwarded) or at all three. Usage:
#   scripts/bench-cluster.sh [BIN] [OUT_DIR]      (BIN defaults to target/release/cellcache)
# Closed loop, 8 connections x pipeline 4, 90 % gets, 10,000 keys of 100 bytes, preloaded,
# 2 s warm-up and 8 s measured per configuration. Cells run with 1 worker thread each.
set -euo pipefail
BIN=${1:-target/release/cellcache}
OUT=${2:-docs/benchmarks/data/cluster}
mkdir -p "$OUT"
BASE=${CELLCACHE_BENCH_BASE_PORT:-14211}
pids=()
stop() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done; pids=(); }
trap stop EXIT
wait_ready() { for _ in $(seq 1 200); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.05; done; return 1; }
wait_ring() { # port, cells
  for _ in $(seq 1 300); do
    n=$("$BIN" ctl status -s "127.0.0.1:$1" 2>/dev/null | grep -c ' active ' || true)
    [ "$n" = "$2" ] && return 0; sleep 0.1
  done; echo "ring did not form" >&2; return 1
}
start() { # name, cells, extra serve flags...
  local cells=$2; shift 2
  local standalone=no
  [ "${1:-}" = "--standalone" ] && standalone=yes
  for i in $(seq 0 $((cells - 1))); do
    local port=$((BASE + i)) join=()
    [ "$i" -gt 0 ] && join=(--join "127.0.0.1:$BASE")
    "$BIN" serve -l 127.0.0.1 -p "$port" -t 1 -m 256 --peer-port $((port + 100)) "${join[@]}" "$@" \
      2>>"$OUT/serve.log" &
    pids+=($!)
    wait_ready "$port"
    [ "$standalone" = yes ] || wait_ring "$BASE" $((i + 1))
  done
}
run() { # name, servers...
  local name=$1; shift
  local targets=()
  for s in "$@"; do targets+=(-s "$s"); done
  "$BIN" bench "${targets[@]}" -c 8 --pipeline 4 --get-ratio 0.9 -k 10000 --value-size 100 \
    --preload --warmup 2s -d 8s --progress never -o "$OUT/$name.json" > "$OUT/$name.txt"
  printf '%-28s %s\n' "$name" "$(grep -E '^(all|op) ' "$OUT/$name.txt" | tail -1)"
}
S0=127.0.0.1:$BASE S1=127.0.0.1:$((BASE + 1)) S2=127.0.0.1:$((BASE + 2))
start standalone 1 --standalone; run standalone "$S0"; stop
start ring1 1; run ring-of-1 "$S0"; stop
start ring3 3; run ring-of-3-sync-one-cell "$S0"; run ring-of-3-sync-all-cells "$S0" "$S1" "$S2"; stop
export CELLCACHE_CLUSTER__REPLICATION=async
start ring3a 3
unset CELLCACHE_CLUSTER__REPLICATION
run ring-of-3-async-one-cell "$S0"; run ring-of-3-async-all-cells "$S0" "$S1" "$S2"; stop
