#!/usr/bin/env bash
# Builds the scratch image of cellcache and runs a ring of cells on a private docker
# network, one container per cell, addressed by fixed IPs (the image has no resolver
# configuration, so cells are given addresses, not names).
#
#   deploy/ring.sh build              static release binary + image cellcache:dev
#   deploy/ring.sh up [CELLS]         network + CELLS cells (default 3); the first
#                                     bootstraps, the others `serve --join` it
#   deploy/ring.sh status             containers, and `cellcache ctl status` if the binary has it
#   deploy/ring.sh disconnect N       cut cell N off the network (a partition)
#   deploy/ring.sh connect N          put it back (same address)
#   deploy/ring.sh down               remove the cells and the network
#
# Settings (environment): CELLCACHE_IMAGE (cellcache:dev), CELLCACHE_NET (cellcache-net),
# CELLCACHE_SUBNET_PREFIX (172.31.77; cell N gets .10+N), CELLCACHE_PORT (11211).
# More than one cell needs `serve --join`, which arrives with the ring (issue 6); until then
# `up` refuses more than one cell with a message saying so.
set -euo pipefail
cd "$(dirname "$0")/.."

image=${CELLCACHE_IMAGE:-cellcache:dev}
net=${CELLCACHE_NET:-cellcache-net}
prefix=${CELLCACHE_SUBNET_PREFIX:-172.31.77}
port=${CELLCACHE_PORT:-11211}
target=x86_64-unknown-linux-gnu
binary=target/$target/release/cellcache

cell_name() { echo "${net}-cell$1"; }
cell_ip() { echo "$prefix.$((10 + $1))"; }

build() {
  RUSTFLAGS='-C target-feature=+crt-static' cargo build --release --locked --target "$target" -p cellcache
  if ! ldd "$binary" 2>&1 | grep -Eq 'statically linked|not a dynamic executable'; then
    echo "error: $binary is dynamically linked; a scratch image cannot run it" >&2
    exit 1
  fi
  context=$(mktemp -d)
  trap 'rm -rf "$context"' RETURN
  cp "$binary" deploy/Dockerfile "$context/"
  # the release profile keeps line tables for profiling; the image does not need them
  if command -v strip >/dev/null 2>&1; then strip --strip-debug "$context/cellcache"; fi
  docker build -q -t "$image" "$context"
  docker image ls "$image"
}

# Waits (bounded) until the cell answers `version` on its address, from the host.
wait_ready() {
  local ip=$1
  for _ in $(seq 1 100); do
    if exec 3<>"/dev/tcp/$ip/$port" 2>/dev/null; then
      printf 'version\r\n' >&3
      local line=""
      read -r -t 2 line <&3 || true
      exec 3>&- 3<&-
      if [[ $line == VERSION* ]]; then
        echo "  $ip:$port answers: ${line%$'\r'}"
        return 0
      fi
    fi
    sleep 0.1
  done
  echo "error: no answer from $ip:$port" >&2
  return 1
}

up() {
  local cells=${1:-3}
  if ! docker image inspect "$image" >/dev/null 2>&1; then
    build
  fi
  if [ "$cells" -gt 1 ] && ! docker run --rm "$image" serve --help | grep -q -- '--join'; then
    echo "error: this cellcache has no 'serve --join' yet (the ring, issue 6); only 'up 1' works" >&2
    exit 2
  fi
  docker network inspect "$net" >/dev/null 2>&1 ||
    docker network create --subnet "$prefix.0/24" "$net" >/dev/null
  for n in $(seq 1 "$cells"); do
    local args=(serve -l "$(cell_ip "$n")" -p "$port")
    [ "$n" -gt 1 ] && args+=(--join "$(cell_ip 1):$port")
    docker run -d -e NO_COLOR=1 --name "$(cell_name "$n")" --network "$net" --ip "$(cell_ip "$n")" \
      "$image" "${args[@]}" >/dev/null
    echo "cell $n: $(cell_name "$n") $(cell_ip "$n"):$port"
    wait_ready "$(cell_ip "$n")"
  done
}

status() {
  docker ps --filter "name=${net}-cell" --format '{{.Names}}\t{{.Status}}'
  if docker run --rm "$image" ctl --help >/dev/null 2>&1; then
    docker run --rm --network "$net" "$image" ctl status -s "$(cell_ip 1):$port"
  fi
}

down() {
  docker ps -aq --filter "name=${net}-cell" | xargs -r docker rm -f >/dev/null
  docker network rm "$net" >/dev/null 2>&1 || true
  echo "removed cells and network $net"
}

case "${1:-}" in
  build) build ;;
  up) up "${2:-3}" ;;
  status) status ;;
  disconnect) docker network disconnect "$net" "$(cell_name "$2")" ;;
  connect) docker network connect --ip "$(cell_ip "$2")" "$net" "$(cell_name "$2")" ;;
  down) down ;;
  *) sed -n '2,20p' "$0"; exit 2 ;;
esac
