#!/usr/bin/env bash
# cellcache beside memcached: every run behind docs/benchmarks/cellcache/ and the
# measurement sections of docs/io-engines.md. Raw JSON goes to results/, tables.py turns it
# into tables.md.
#
#   bash docs/benchmarks/cellcache/run.sh headline   # 1. side by side + A/A noise floor (~8 min)
#   bash docs/benchmarks/cellcache/run.sh aa         # only the A/A noise floor (~3 min)
#   bash docs/benchmarks/cellcache/run.sh capacity   # 2. items in 64 MiB, hit ratio at equal memory (~6 min)
#   bash docs/benchmarks/cellcache/run.sh hitratio   # 2. only the hit ratio at equal memory (~5 min)
#   bash docs/benchmarks/cellcache/run.sh grid       # 3. GET-ratio x value-size grid, both servers (~10 min)
#   bash docs/benchmarks/cellcache/run.sh engines    # 4. threads/epoll/uring/memcached (~15 min)
#   bash docs/benchmarks/cellcache/run.sh strace     # 4. syscalls per request (strace -c -f) (~2 min)
#   bash docs/benchmarks/cellcache/run.sh headline-epoll  # 5. the headline's GET 0.9 with epoll (~3 min)
#   BEFORE=... AFTER=... bash docs/benchmarks/cellcache/run.sh epoll-fix
#                       # 5. epoll engine before/after commit c7b757f, beside memcached (~8 min)
#   bash docs/benchmarks/cellcache/run.sh uring-buffers  # 4. uring with 8192 provided buffers (~3 min)
#   bash docs/benchmarks/cellcache/run.sh mget50     # 4. multi-get at 50 connections, every server (~2 min)
#   bash docs/benchmarks/cellcache/run.sh grid-engines  # 4. the grid's 25-connection 1 KB GET 0.9 point, every engine (~3 min)
#   BEFORE=... AFTER=... bash docs/benchmarks/cellcache/run.sh recheck  # 5. side-by-side rechecks (~4 min)
#   bash docs/benchmarks/cellcache/run.sh cpusplit   # 4. user vs system CPU per server (~1 min)
#   bash docs/benchmarks/cellcache/run.sh tables     # only regenerate tables.md and the plots
#
# Placement everywhere: the server under `taskset -c <last core>`, the generator pinned to the
# other cores (`--cpus`, or `bench compare`'s own placement, which is the same). Both servers
# run one worker thread (-t 1) and 64 MiB (-m 64). Repetitions are interleaved.
# CELLCACHE=path/to/cellcache overrides the binary (default target/release/cellcache, built
# with `cargo build --release -p cellcache`).
set -euo pipefail
cd "$(dirname "$0")/../../.."
here=docs/benchmarks/cellcache
out=$here/results
mkdir -p "$out"
cc="${CELLCACHE:-target/release/cellcache}"
[ -x "$cc" ] || cargo build --release -p cellcache
bench=("$cc" bench)
# 5000 connections need 5000 descriptors in the generator and in the server.
ulimit -n 20000

ncpu=$(nproc)
server_cpu=$((ncpu - 1))
gen_cpus=$([ "$ncpu" -ge 2 ] && echo "0-$((ncpu - 2))" || echo 0)
root_flag=$([ "$(id -u)" -eq 0 ] && echo "-u root" || true)
# Both servers allow 6000 connections (memcached's default is 1024, cellcache's too).
mc_cmd="memcached -p {port} -t {threads} -m {memory_mb} -l 127.0.0.1 -U 0 -c 6000 $root_flag"
cc_cmd() { echo "${CC:-$cc} serve -p {port} -t {threads} -m {memory_mb} -l 127.0.0.1 -c 6000 --io-engine $1"; }
what="${1:-all}"
want() { [ "$what" = all ] || [ "$what" = "$1" ]; }

# [A_CMD=.. A_NAME=.. B_CMD=.. B_NAME=..] compare NAME [options...]: memcached (A) against
# cellcache with the io_uring engine (B) unless the variables replace a side.
compare() {
  local name=$1; shift
  echo "== $name" >&2
  "${bench[@]}" compare --a-cmd "${A_CMD:-$mc_cmd}" --a-name "${A_NAME:-memcached}" \
    --b-cmd "${B_CMD:-$(cc_cmd uring)}" --b-name "${B_NAME:-cellcache-uring}" \
    --server-threads 1 --memory-mb 64 "$@" --output "$out/$name.json" > "$out/$name.txt"
}

if want headline || want aa; then
  common=(-c 50 --keys 10000 --preload --popularity zipf --zipf-exponent 0.99 --value-size 100
          --warmup 1s --duration 3s --repetitions 5)
fi
if want headline; then
  # Headline: 50 connections, 10 000 keys preloaded, Zipf 0.99, 100-byte values, 5
  # interleaved repetitions of 1 s warm-up + 3 s measured (`common`, above).
  compare headline-get0.9-p1 "${common[@]}" --get-ratio 0.9
  compare headline-get0.1-p1 "${common[@]}" --get-ratio 0.1
  compare headline-get0.9-p16 "${common[@]}" --get-ratio 0.9 --pipeline 16
  compare headline-get0.1-p16 "${common[@]}" --get-ratio 0.1 --pipeline 16
  compare headline-get0.9-mget10 "${common[@]}" --get-ratio 0.9 --multiget 10
fi
if want headline || want aa; then
  # A/A noise floor: the same server on both sides.
  for p in 1 16; do
    B_CMD="$mc_cmd" A_NAME=memcached-a B_NAME=memcached-b \
      compare aa-memcached-get0.9-p$p "${common[@]}" --get-ratio 0.9 --pipeline $p
    A_CMD="$(cc_cmd uring)" A_NAME=cellcache-uring-a B_NAME=cellcache-uring-b \
      compare aa-cellcache-get0.9-p$p "${common[@]}" --get-ratio 0.9 --pipeline $p
  done
fi

if want capacity; then
  # (a) 14-byte keys, 100-byte values, 64 MiB: most items held before evictions start.
  compare capacity-64m --experiment capacity --item-key-len 14 --item-value-len 100 --repetitions 2
fi

if want capacity || want hitratio; then
  # (b) Hit ratio at equal memory: Zipf 0.99 over 10 x 64 MiB of raw key+value bytes
  # (10 * 67108864 / 114 = 5886742 keys), read-through; the 60 s warm-up fills the cache and
  # turns it over several times (as in memcached-baseline/run.sh).
  compare hitratio-64m-zipf0.99-10x -c 16 --pipeline 32 --keys 5886742 --key-len 14 --value-size 100 \
    --popularity zipf --zipf-exponent 0.99 --get-ratio 1.0 --set-on-miss \
    --warmup 60s --duration 10s --repetitions 2
fi

if want grid; then
  # The GET-ratio x value-size grid (docs/benchmarks/ratio-size-grid/): 1000 keys, Zipf
  # 1.345675, 25 connections, preloaded.
  for size in 100 1k 8k; do
    for ratio in 0.1 0.5 0.9; do
      common=(-c 25 --keys 1000 --popularity zipf --zipf-exponent 1.345675 --preload
              --get-ratio "$ratio" --value-size "$size")
      # The grid's low fixed rate: 50 req/s, uniform arrivals (open loop), 8 s = 400 requests.
      compare "grid-rate50-r$ratio-v$size" "${common[@]}" --rate 50 --arrival uniform \
        --warmup 1s --duration 8s --repetitions 2
      # Saturation: closed loop, 25 connections x 1 in flight.
      compare "grid-sat-r$ratio-v$size" "${common[@]}" --warmup 1s --duration 3s --repetitions 3
    done
  done
fi

# One engines run: start server $1 (memcached|threads|epoll|uring) pinned to the server core,
# run `bench` with the remaining arguments, stop it. Output: $out/engines/$name-$server-rep$rep.json
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
start_server() { # $1 = server; optional STRACE_OUT to run it under strace -c -f
  port=$(free_port)
  local cmd
  case "$1" in
    memcached) cmd=$mc_cmd ;;
    # The epoll engine before and after its EAGAIN-read change (section epoll-fix).
    epoll-before) cmd=$(CC="$BEFORE" cc_cmd epoll) ;;
    epoll-after) cmd=$(CC="$AFTER" cc_cmd epoll) ;;
    # io_uring with a provided-buffer ring that covers 5000 receiving connections.
    uring-8192bufs) cmd="env CELLCACHE_IO__URING_PROVIDED_BUFFERS=8192 $(cc_cmd uring)" ;;
    *) cmd=$(cc_cmd "$1") ;;
  esac
  cmd="${cmd//\{port\}/$port}"; cmd="${cmd//\{threads\}/1}"; cmd="${cmd//\{memory_mb\}/64}"
  if [ -n "${STRACE_OUT:-}" ]; then
    # shellcheck disable=SC2086 # the command line is split on purpose
    taskset -c "$server_cpu" strace -c -f -o "$STRACE_OUT" $cmd 2>/dev/null &
  else
    # shellcheck disable=SC2086
    taskset -c "$server_cpu" $cmd 2>/dev/null &
  fi
  server_pid=$!
  for _ in $(seq 1 500); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then return 0; fi
    sleep 0.01
  done
  echo "server did not start on $port: $cmd" >&2; exit 1
}
stop_server() {
  # Under strace, signal the traced server (strace's child) so strace writes its summary.
  local target=$server_pid
  if [ -n "${STRACE_OUT:-}" ]; then target=$(pgrep -P "$server_pid" | head -1); fi
  kill -INT "$target"; wait "$server_pid" 2>/dev/null || true
}
# CPU time (user + system, clock ticks, all threads) of process $1.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
engine_run() { # name rep server bench-args...
  local name=$1 rep=$2 server=$3; shift 3
  start_server "$server"
  local before; before=$(cpu_ticks "$server_pid")
  "${bench[@]}" --server "127.0.0.1:$port" --cpus "$gen_cpus" --progress never "$@" \
    --output "$out/engines/$name-$server-rep$rep.json" > /dev/null
  # The server's CPU over the whole bench run (preload, warm-up, measured phase): with one
  # generator core, depth-1 runs are generator-bound, and CPU per request is the server's cost.
  echo "$(( $(cpu_ticks "$server_pid") - before )) $(getconf CLK_TCK)" \
    > "$out/engines/$name-$server-rep$rep.cpu"
  stop_server
}
servers=(memcached epoll uring threads)

if want engines; then
  mkdir -p "$out/engines"
  base=(--keys 10000 --preload --popularity zipf --zipf-exponent 0.99 --warmup 1s --duration 3s)
  # Subset of the cross product (documented in docs/io-engines.md):
  #  - every concurrency level for every engine at 100 B, GET 0.9, depth 1;
  #  - every size x ratio at 100 connections, depth 1;
  #  - pipelined (depth 16) and multi-get (10 keys) at 100 connections, 100 B, GET 0.9.
  # Each workload: 3 repetitions, the four servers interleaved in each (rotating the order).
  workloads=()
  for c in 10 100 1000 5000; do workloads+=("conns$c-v100-r0.9|-c $c --value-size 100 --get-ratio 0.9"); done
  for size in 100 1k 8k; do
    for ratio in 0.1 0.5 0.9; do
      [ "$size/$ratio" = 100/0.9 ] && continue # = conns100-v100-r0.9
      workloads+=("conns100-v$size-r$ratio|-c 100 --value-size $size --get-ratio $ratio")
    done
  done
  workloads+=("conns100-v100-r0.9-p16|-c 100 --value-size 100 --get-ratio 0.9 --pipeline 16")
  workloads+=("conns100-v100-r0.9-mget10|-c 100 --value-size 100 --get-ratio 0.9 --multiget 10")
  for w in "${workloads[@]}"; do
    name=${w%%|*}; read -r -a args <<< "${w#*|}"
    echo "== engines $name" >&2
    for rep in 1 2 3; do
      n=${#servers[@]}
      for i in $(seq 0 $((n - 1))); do
        s=${servers[$(( (i + rep - 1) % n ))]}
        engine_run "$name" "$rep" "$s" "${base[@]}" "${args[@]}"
      done
    done
  done
fi

if want strace; then
  # Syscalls per request: each server alone under strace -c -f (which slows it: only the
  # counts matter), 100 connections, no preload or warm-up so every request is counted in
  # the report's `sent`; 100 B, GET 0.9, depth 1 and 16.
  mkdir -p "$out/strace"
  for d in 1 16; do
    for s in "${servers[@]}"; do
      echo "== strace $s depth $d" >&2
      STRACE_OUT="$out/strace/$s-d$d.txt"
      start_server "$s"
      "${bench[@]}" --server "127.0.0.1:$port" --cpus "$gen_cpus" --progress never -c 100 \
        --pipeline $d --keys 10000 --popularity zipf --value-size 100 --get-ratio 0.9 \
        --duration 3s --output "$out/strace/$s-d$d.json" > /dev/null
      stop_server
      STRACE_OUT=
    done
  done
fi

if want headline-epoll; then
  # Section 5's question (is pipeline 1 slower than memcached?) with the epoll engine too.
  common=(-c 50 --keys 10000 --preload --popularity zipf --zipf-exponent 0.99 --value-size 100
          --warmup 1s --duration 3s --repetitions 5)
  for p in 1 16; do
    B_CMD="$(cc_cmd epoll)" B_NAME=cellcache-epoll \
      compare headline-epoll-get0.9-p$p "${common[@]}" --get-ratio 0.9 --pipeline $p
  done
fi

if want headline || want tables; then
  # The headline plot: for GET 0.9 at pipeline 1 and 16, the repetition of each side whose
  # throughput is the median of its five, drawn by `bench plot`.
  mkdir -p "$out/plot-input"
  python3 "$here/tables.py" "$here" --plot-inputs "$out/plot-input"
  "${bench[@]}" plot --title "cellcache (io_uring) vs memcached, -t 1, 50 connections, GET 0.9" \
    --json "memcached p1=$out/plot-input/get0.9-p1-memcached.json" \
    --json "cellcache p1=$out/plot-input/get0.9-p1-cellcache-uring.json" \
    --json "memcached p16=$out/plot-input/get0.9-p16-memcached.json" \
    --json "cellcache p16=$out/plot-input/get0.9-p16-cellcache-uring.json" \
    --out "$here/plots/headline"
  # Engines at 100 connections, depth 1 and 16: the median repetition of each server.
  for w in conns100-v100-r0.9 conns100-v100-r0.9-p16; do
    args=()
    for s in "${servers[@]}"; do
      f="$out/plot-input/engines-$w-$s.json"
      [ -f "$f" ] && args+=(--json "$s=$f")
    done
    [ ${#args[@]} -gt 0 ] && "${bench[@]}" plot --title "I/O engines and memcached, -t 1, $w" \
      "${args[@]}" --out "$here/plots/engines-$w"
  done
fi

if [ "$what" = recheck ]; then  # only on request: it needs BEFORE and AFTER
  # Section 5's pipeline-1 question again, side by side (bench compare), for the epoll change:
  # memcached vs epoll after it, epoll before vs after, and the multi-get p99 of section 1.
  : "${BEFORE:?set BEFORE to a cellcache binary built at 3a25f27}"
  AFTER="${AFTER:-$cc}"
  common=(-c 50 --keys 10000 --preload --popularity zipf --zipf-exponent 0.99 --value-size 100
          --warmup 1s --duration 3s --repetitions 5 --get-ratio 0.9)
  B_CMD="$(CC="$AFTER" cc_cmd epoll)" B_NAME=cellcache-epoll-c7b757f \
    compare recheck-epollfix-get0.9-p1 "${common[@]}"
  A_CMD="$(CC="$BEFORE" cc_cmd epoll)" A_NAME=epoll-3a25f27 B_CMD="$(CC="$AFTER" cc_cmd epoll)" \
    B_NAME=epoll-c7b757f compare recheck-epoll-before-after-get0.9-p1 "${common[@]}"
  compare recheck-uring-get0.9-mget10 "${common[@]}" --multiget 10
  B_CMD="$(CC="$AFTER" cc_cmd epoll)" B_NAME=cellcache-epoll-c7b757f \
    compare recheck-epollfix-get0.9-mget10 "${common[@]}" --multiget 10
fi

if [ "$what" = epoll-fix ]; then  # only on request: it needs BEFORE
  # BEFORE: a cellcache built at 3a25f27 (the parent of the epoll change), e.g.
  #   git worktree add /tmp/before 3a25f27 && (cd /tmp/before && cargo build --release -p cellcache)
  #   BEFORE=/tmp/before/target/release/cellcache
  # AFTER: a build with the change (default: $cc).
  : "${BEFORE:?set BEFORE to a cellcache binary built at 3a25f27}"
  AFTER="${AFTER:-$cc}"
  mkdir -p "$out/engines"
  base=(--keys 10000 --preload --popularity zipf --zipf-exponent 0.99 --value-size 100
        --get-ratio 0.9 --warmup 1s --duration 3s)
  fix_servers=(memcached epoll-before epoll-after)
  for w in "fix-conns50-p1|-c 50" "fix-conns50-p16|-c 50 --pipeline 16" "fix-conns1000-p1|-c 1000"; do
    name=${w%%|*}; read -r -a args <<< "${w#*|}"
    echo "== epoll-fix $name" >&2
    for rep in 1 2 3 4 5; do
      for i in 0 1 2; do
        s=${fix_servers[$(( (i + rep - 1) % 3 ))]}
        engine_run "$name" "$rep" "$s" "${base[@]}" "${args[@]}"
      done
    done
  done
  mkdir -p "$out/strace"
  for d in 1 16; do
    for s in epoll-before epoll-after; do
      echo "== strace $s depth $d" >&2
      STRACE_OUT="$out/strace/$s-d$d.txt"
      start_server "$s"
      "${bench[@]}" --server "127.0.0.1:$port" --cpus "$gen_cpus" --progress never -c 100 \
        --pipeline $d --keys 10000 --popularity zipf --value-size 100 --get-ratio 0.9 \
        --duration 3s --output "$out/strace/$s-d$d.json" > /dev/null
      stop_server
      STRACE_OUT=
    done
  done
fi

if want mget50; then
  # The headline's multi-get shape (50 connections, 10 keys per get) for every server, with
  # server CPU: is its p99 (worse than memcached's in the headline) an engine matter?
  mkdir -p "$out/engines"
  base=(--keys 10000 --preload --popularity zipf --zipf-exponent 0.99 --value-size 100
        --get-ratio 0.9 --warmup 1s --duration 3s)
  for rep in 1 2 3 4 5; do
    for i in 0 1 2 3; do
      s=${servers[$(( (i + rep - 1) % 4 ))]}
      engine_run "conns50-v100-r0.9-mget10" "$rep" "$s" "${base[@]}" -c 50 --multiget 10
    done
  done
fi

if want grid-engines; then
  # The GET-ratio x value-size grid's own operating point for every engine: 25 connections, 1000 keys, Zipf
  # 1.345675, 1 KB, GET 0.9, 50 req/s open loop, and the same at saturation (closed loop).
  mkdir -p "$out/engines"
  base=(-c 25 --keys 1000 --preload --popularity zipf --zipf-exponent 1.345675 --value-size 1k
        --get-ratio 0.9 --warmup 1s)
  for rep in 1 2 3; do
    for i in 0 1 2 3; do
      s=${servers[$(( (i + rep - 1) % 4 ))]}
      engine_run "grid-rate50-v1k-r0.9" "$rep" "$s" "${base[@]}" --rate 50 --arrival uniform --duration 8s
      engine_run "grid-sat-v1k-r0.9" "$rep" "$s" "${base[@]}" --duration 3s
    done
  done
fi

if want cpusplit; then
  # Where the server's CPU goes: user vs system time (/proc/<pid>/stat fields 14 and 15), every
  # server, 100 connections, 100 B, GET 0.9, depth 1 and 16, 2 repetitions, rotating order.
  mkdir -p "$out/cpusplit"
  for d in 1 16; do
    for rep in 1 2; do
      for i in 0 1 2 3; do
        s=${servers[$(( (i + rep - 1) % 4 ))]}
        start_server "$s"
        read -r u0 s0 < <(awk '{print $14, $15}' "/proc/$server_pid/stat")
        "${bench[@]}" --server "127.0.0.1:$port" --cpus "$gen_cpus" --progress never -c 100 --pipeline $d \
          --keys 10000 --preload --popularity zipf --zipf-exponent 0.99 --value-size 100 --get-ratio 0.9 \
          --warmup 1s --duration 3s --output "$out/cpusplit/d$d-$s-rep$rep.json" > /dev/null
        read -r u1 s1 < <(awk '{print $14, $15}' "/proc/$server_pid/stat")
        echo "$((u1 - u0)) $((s1 - s0)) $(getconf CLK_TCK)" > "$out/cpusplit/d$d-$s-rep$rep.cpu"
        stop_server
      done
    done
  done
fi

if want uring-buffers; then
  # At 1000 and 5000 connections the default ring of 256 provided buffers runs dry (each
  # connection's multishot receive holds one while data waits): the same runs with 8192.
  mkdir -p "$out/engines"
  base=(--keys 10000 --preload --popularity zipf --zipf-exponent 0.99 --value-size 100
        --get-ratio 0.9 --warmup 1s --duration 3s)
  buf_servers=(epoll uring uring-8192bufs)
  for c in 1000 5000; do
    echo "== uring-buffers conns$c" >&2
    for rep in 1 2 3; do
      for i in 0 1 2; do
        s=${buf_servers[$(( (i + rep - 1) % 3 ))]}
        engine_run "bufs-conns$c" "$rep" "$s" "${base[@]}" -c $c
      done
    done
  done
fi

python3 "$here/tables.py" "$here" > "$here/tables.md"
echo "wrote $here/tables.md" >&2
