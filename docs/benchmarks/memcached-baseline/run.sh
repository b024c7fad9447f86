#!/usr/bin/env bash
# Reproduces every table in this folder against Debian's memcached.
#   bash docs/benchmarks/memcached-baseline/run.sh            # everything (~6 minutes)
#   bash docs/benchmarks/memcached-baseline/run.sh grid       # only the GET-ratio x value-size grid (~4 minutes)
#   bash docs/benchmarks/memcached-baseline/run.sh capacity   # only capacity + hit ratio
# Another server: SERVER_CMD='path/to/server -p {port} -m {memory_mb} ...' OUT=some/dir run.sh grid
# Placement: the server on the last core (taskset), the generator on the others (--cpus).
# Results: $OUT/results/*.json (raw reports), then tables.py writes $OUT/tables.md.
set -euo pipefail
cd "$(dirname "$0")/../../.."
what="${1:-all}"
OUT="${OUT:-docs/benchmarks/memcached-baseline}"
out="$OUT/results"
mkdir -p "$out"
cargo build --release -p cellcache-bench --example bench
bench=target/release/examples/bench

ncpu=$(nproc)
server_cpu=$((ncpu - 1))
gen_cpus=$([ "$ncpu" -ge 2 ] && echo "0-$((ncpu - 2))" || echo 0)
user_flag=$([ "$(id -u)" -eq 0 ] && echo "-u root" || true)
default_cmd="memcached -p {port} -l 127.0.0.1 -t 1 -m {memory_mb} -U 0 $user_flag"
SERVER_CMD="${SERVER_CMD:-$default_cmd}"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

start_server() { # $1 = memory MiB
  port=$(free_port)
  local cmd="${SERVER_CMD//\{port\}/$port}"
  cmd="${cmd//\{memory_mb\}/$1}"
  # shellcheck disable=SC2086 # the command line is split on purpose
  taskset -c "$server_cpu" $cmd &
  server_pid=$!
  # Readiness: poll-connect, bounded (2 s); the bench then checks `version` itself.
  for _ in $(seq 1 200); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then return 0; fi
    sleep 0.01
  done
  echo "server did not start on $port: $cmd" >&2; exit 1
}
stop_server() { kill "$server_pid"; wait "$server_pid" 2>/dev/null || true; }

if [ "$what" = all ] || [ "$what" = grid ]; then
  # The GET-ratio x value-size grid (docs/benchmarks/ratio-size-grid/): 1000 keys,
  # Zipf s=1.345675, 25 connections, preloaded.
  for size in 100 1k 8k; do
    for ratio in 0.1 0.5 0.9; do
      start_server 64
      common=(--server "127.0.0.1:$port" -c 25 --keys 1000 --popularity zipf --zipf-exponent 1.345675
              --get-ratio "$ratio" --value-size "$size" --preload --cpus "$gen_cpus" --progress never)
      # Low fixed arrival rate (the grid's 50 req/s, uniform arrivals), 20 s = 1000 requests.
      "$bench" "${common[@]}" --rate 50 --arrival uniform --warmup 1s --duration 20s \
        --output "$out/grid-rate50-r${ratio}-v${size}.json" > /dev/null
      # Saturation: closed loop, 25 connections x 1 request in flight.
      "$bench" "${common[@]}" --warmup 1s --duration 4s \
        --output "$out/grid-sat-r${ratio}-v${size}.json" > /dev/null
      stop_server
    done
  done
fi

if [ "$what" = all ] || [ "$what" = capacity ]; then
  # (a) 100-byte values, 14-byte keys, 64 MiB: items held when evictions start. Three fresh servers.
  for rep in 1 2 3; do
    start_server 64
    "$bench" capacity --server "127.0.0.1:$port" --item-key-len 14 --item-value-len 100 \
      --output "$out/capacity-64m-rep$rep.json"
    stop_server
  done
  # (b) Hit ratio at equal memory: Zipf s=0.99 over 10 x 64 MiB of raw key+value bytes
  # (10 * 67108864 / 114 = 5886742 keys), read-through (a miss is followed by a set).
  # The warm-up must fill the cache and turn it over several times before measuring: at
  # ~100k req/s and >25 % misses, 60 s make >1.5 M fills, over 4x the ~350k items that fit.
  start_server 64
  "$bench" --server "127.0.0.1:$port" -c 16 --pipeline 32 --keys 5886742 --key-len 14 --value-size 100 \
    --popularity zipf --zipf-exponent 0.99 --get-ratio 1.0 --set-on-miss --cpus "$gen_cpus" \
    --warmup 60s --duration 20s --progress never --output "$out/hitratio-64m-zipf0.99-10x.json" > /dev/null
  stop_server
fi

python3 docs/benchmarks/memcached-baseline/tables.py "$out" "$SERVER_CMD" > "$OUT/tables.md"
echo "wrote $OUT/tables.md"
