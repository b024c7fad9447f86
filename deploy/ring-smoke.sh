#!/usr/bin/env bash
# A ring of three in docker, through a crash and a partition, with checks. Exits non-zero
# at the first failed check; every wait is bounded. Needs dockerd and the Rust toolchain
# (the image is built first). Not part of CI: docker is optional there.
#
#   deploy/ring-smoke.sh            build, run, remove the ring at the end
#   KEEP=1 deploy/ring-smoke.sh     leave the ring running for a look (deploy/ring.sh down)
#
# Steps (cell N is container cellcache-net-cellN at 172.31.77.(10+N):11211):
#  1. build the image, start cells 1-3 (2 and 3 `serve --join` cell 1), print ctl status;
#  2. set a key through one cell, get it through each of the others;
#  3. find the key's master (the cell whose master range holds it: its admin plane's `/cluster/ranges`),
#     `docker kill` it, get the key through a survivor until the value comes back
#     (takeover), noting every reply clients saw meanwhile;
#  4. restore three cells: cell 4 joins as a new cell (a killed cell's id is fenced);
#  5. set a second key, `docker network disconnect` its master: the cut cell is
#     unreachable, the key comes back through a survivor; overwrite it there;
#  6. `docker network connect` the cell again: it must never return the old value or
#     accept a write the ring does not see; print ctl status.
set -euo pipefail
cd "$(dirname "$0")/.."
. deploy/lib.sh
ring=deploy/ring.sh

step() { printf '\n== %s\n' "$*"; }
fail() {
  echo "FAIL: $*" >&2
  exit 1
}
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }

finish() {
  local rc=$?
  if [ "$rc" -ne 0 ]; then
    for n in $(docker ps -a --filter "name=${net}-cell" --format '{{.Names}}'); do
      echo "--- last log lines of $n" >&2
      docker logs --tail 15 "$n" 2>&1 | sed 's/^/  /' >&2 || true
    done
  fi
  if [ "${KEEP:-0}" = 1 ]; then
    echo "KEEP=1: ring left running; remove it with deploy/ring.sh down"
  else
    "$ring" down >/dev/null 2>&1 || true
  fi
  [ "$rc" -eq 0 ] && echo "ring-smoke: PASS" || echo "ring-smoke: FAIL" >&2
}
trap finish EXIT

# set_key N KEY VALUE: sets through cell N; a reply other than STORED is retried for at most
# 10 s (the ring may still be confirming leases right after it settled).
set_key() {
  local reply
  for _ in $(seq 1 20); do
    reply=$(mc "$1" "set $2 0 0 ${#3}\r\n$3" || true)
    [ "$reply" = STORED ] && return 0
    sleep 0.5
  done
  fail "set $2 through cell $1: last reply '${reply}'"
}

# expect_value N KEY VALUE: a get through cell N returns exactly VALUE.
expect_value() {
  local reply
  reply=$(mc "$1" "get $2") || fail "get $2 through cell $1: no complete reply"
  [ "$reply" = "$(printf 'VALUE %s 0 %s\n%s\nEND' "$2" "${#3}" "$3")" ] ||
    fail "get $2 through cell $1: expected '$3', got '$reply'"
  echo "cell $1: get $2 -> $3"
}

# master_of KEY CELLS...: the cell (of CELLS) whose master range holds KEY, read from each
# cell's `/cluster/ranges` (items per range). KEY must be the only key in the ring that
# was written since the last master_of, hence the counting of items before and after.
declare -A held
count_masters() {
  local n
  for n in "$@"; do
    held[$n]=$(admin "$n" /cluster/ranges | awk '$1 == "RANGE" && $2 == "master" { print $5 }')
  done
}
master_of() {
  local key=$1 n found="" count
  shift
  for n in "$@"; do
    count=$(admin "$n" /cluster/ranges | awk '$1 == "RANGE" && $2 == "master" { print $5 }')
    if [ "${count:-0}" -gt "${held[$n]:-0}" ]; then
      [ -z "$found" ] || fail "$key: both cell $found and cell $n master new items"
      found=$n
    fi
  done
  [ -n "$found" ] || fail "$key: no cell masters it"
  echo "$found"
}

# until_value N KEY VALUE: gets KEY through cell N until it returns VALUE (for at most 40 s;
# each get may take up to 10 s, since a cell gives up on a silent master after 6 s),
# printing each distinct reply seen on the way and the time it took.
until_value() {
  local start reply last="" want
  start=$(now)
  want=$(printf 'VALUE %s 0 %s\n%s\nEND' "$2" "${#3}" "$3")
  local deadline=$((SECONDS + 40))
  while [ "$SECONDS" -lt "$deadline" ]; do
    reply=$(mc "$1" "get $2" 10 2>&1) || reply="(no complete reply within 10 s: ${reply:-nothing})"
    if [ "$reply" != "$last" ]; then
      echo "  +$(since "$start")s cell $1: get $2 -> $(tr '\n' ' ' <<<"$reply")"
      last=$reply
    fi
    case $reply in
      "(no complete reply"*) echo "  known problem: a request forwarded to a partitioned master is" \
        "not answered, even after the takeover (docs/testing.md section 8)" ;;
    esac
    if [ "$reply" = "$want" ]; then
      echo "  readable through cell $1 after $(since "$start")s"
      return 0
    fi
    sleep 0.2
  done
  fail "$2 not readable through cell $1 within 40 s"
}

step "1. image and a ring of three"
"$ring" down >/dev/null
"$ring" build
"$ring" up 3
"$ring" status

step "2. set through cell 1, get through cells 2 and 3"
count_masters 1 2 3
set_key 1 greeting hello
expect_value 2 greeting hello
expect_value 3 greeting hello

step "3. docker kill the key's master, get it through a survivor"
master=$(master_of greeting 1 2 3)
survivors=()
for n in 1 2 3; do [ "$n" = "$master" ] || survivors+=("$n"); done
echo "greeting is mastered by cell $master; survivors: ${survivors[*]}"
docker kill "$(cell_name "$master")" >/dev/null
echo "killed $(cell_name "$master") at $(date +%T.%N | cut -c1-12)"
until_value "${survivors[0]}" greeting hello
expect_value "${survivors[1]}" greeting hello
wait_cells "${survivors[0]}" 2
"$ring" status "${survivors[0]}"

step "4. cell 4 joins as a new cell: three cells again"
"$ring" join 4
wait_cells 4 3
live=("${survivors[@]}" 4)
expect_value 4 greeting hello

step "5. partition: docker network disconnect the master of a second key"
count_masters "${live[@]}"
set_key "${live[0]}" motto before
cut=$(master_of motto "${live[@]}")
others=()
for n in "${live[@]}"; do [ "$n" = "$cut" ] || others+=("$n"); done
echo "motto is mastered by cell $cut; the others: ${others[*]}"
"$ring" disconnect "$cut"
echo "disconnected $(cell_name "$cut") at $(date +%T.%N | cut -c1-12)"
until_value "${others[0]}" motto before
probe=$(now)
if reply=$(mc "$cut" "get motto" 3 2>&1); then
  fail "cell $cut answered through the partition: $reply"
fi
echo "cell $cut from the host: no reply after $(since "$probe")s (${reply:-the connect never completed})"
expect_value "${others[1]}" motto before
set_key "${others[0]}" motto after
expect_value "${others[1]}" motto after
expect_value "${others[0]}" greeting hello
wait_cells "${others[0]}" 2
"$ring" status "${others[0]}"

step "6. docker network connect the cut cell again"
"$ring" connect "$cut"
echo "connected $(cell_name "$cut") at $(date +%T.%N | cut -c1-12)"
for i in $(seq 1 10); do
  get=$(mc "$cut" "get motto" 10 2>&1) || get="(no complete reply within 10 s: ${get:-nothing})"
  echo "  cell $cut: get motto -> $(tr '\n' ' ' <<<"$get")"
  case $get in
    *"VALUE motto 0 6"*before*) fail "cell $cut returned the value overwritten during the partition" ;;
  esac
  set=$(mc "$cut" "set probe$i 0 0 3\r\nnew" 10 2>&1) || set="(no complete reply within 10 s: ${set:-nothing})"
  echo "  cell $cut: set probe$i -> $(tr '\n' ' ' <<<"$set")"
  if [ "$set" = STORED ]; then
    # a write the old master accepted must be in the ring
    expect_value "${others[0]}" "probe$i" new
  fi
  sleep 0.5
done
expect_value "${others[0]}" motto after
expect_value "${others[1]}" motto after
"$ring" status "${others[0]}"
echo "log of cell $cut after the partition:"
docker logs --since 30s "$(cell_name "$cut")" 2>&1 | grep -Ei 'fenc|removed|stop' | tail -5 | sed 's/^/  /' || true
