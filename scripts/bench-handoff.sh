#!/usr/bin/env bash
# Time and bytes of one division (docs/benchmarks/cluster.md): a ring of one cell holding
# MB megabytes of 1000-byte values, a --standby cell brought in with `ctl split`, and a load
# generator running against the parent throughout (its report gives client latency during
# the hand-off). Usage: scripts/bench-handoff.sh [BIN] [OUT_DIR] [MB]
set -euo pipefail
BIN=${1:-target/release/cellcache}
OUT=${2:-docs/benchmarks/data/cluster/handoff}
MB=${3:-256}
mkdir -p "$OUT"
P=${CELLCACHE_BENCH_BASE_PORT:-15211}
MEM=$((MB * 2 + 64))
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true' EXIT
wait_ready() { for _ in $(seq 1 200); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.05; done; return 1; }
"$BIN" serve -l 127.0.0.1 -p "$P" -t 1 -m "$MEM" --peer-port $((P + 100)) 2>>"$OUT/serve.log" & pids+=($!)
"$BIN" serve -l 127.0.0.1 -p $((P + 1)) -t 1 -m "$MEM" --peer-port $((P + 101)) --standby 2>>"$OUT/serve.log" & pids+=($!)
wait_ready "$P"; wait_ready $((P + 1)); sleep 1
KEYS=$((MB * 1024 * 1024 / 1000))
# Fill: 3 x KEYS sets of uniformly random keys (about 95 % of the keys end up present).
"$BIN" bench -s "127.0.0.1:$P" -c 8 --pipeline 16 --get-ratio 0 -k "$KEYS" --value-size 1000 \
  -n $((KEYS * 3)) --key-prefix fill: --progress never > "$OUT/fill.txt"
bytes_sent() { # the parent's cluster_replication_bytes_sent
  local v=0 line
  exec 5<>"/dev/tcp/127.0.0.1/$P"; printf 'stats cell\r\n' >&5
  while read -r -t 5 line <&5; do
    line=${line%$'\r'}
    case $line in "STAT cluster_replication_bytes_sent "*) v=${line##* } ;; END) break ;; esac
  done
  exec 5>&-; echo "$v"
}
items() { "$BIN" ctl status -s "127.0.0.1:$P" | grep -o 'items=[0-9]*' | head -1 | cut -d= -f2; }
echo "filled: $(items) items"
# Load during the hand-off: 90 % gets on the filled keys, 15 s.
"$BIN" bench -s "127.0.0.1:$P" -c 4 --pipeline 1 --get-ratio 0.9 -k "$KEYS" --value-size 1000 \
  --key-prefix fill: -d 15s --progress never -o "$OUT/load.json" > "$OUT/load.txt" & load=$!
sleep 3
sent_before=$(bytes_sent)
t0=$(date +%s.%N)
"$BIN" ctl split 1 --new "127.0.0.1:$((P + 1))" -s "127.0.0.1:$P" > /dev/null
until "$BIN" ctl status -s "127.0.0.1:$P" | grep -q '^CELL 2 active\|^CELL 1.5 active'; do sleep 0.05; done
t1=$(date +%s.%N)
sent_after=$(bytes_sent)
wait "$load"
echo "hand-off of $MB MB ($KEYS keys): $(echo "$t1 - $t0" | bc) s from ctl split to the child active; $(( (sent_after - sent_before) / 1048576 )) MiB of records sent"
grep -E '^(op|get|set|all) ' "$OUT/load.txt"
"$BIN" ctl status -s "127.0.0.1:$P"
