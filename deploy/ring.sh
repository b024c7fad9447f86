#!/usr/bin/env bash
# Builds the scratch image of cellcache and runs a ring of cells on a private docker
# network, one container per cell, addressed by fixed IPs (the image has no resolver
# configuration, so cells are given addresses, not names). Each cell listens on its
# container's address, which is also the address it advertises to the ring.
#
#   deploy/ring.sh build              static release binary + image cellcache:dev
#   deploy/ring.sh up [CELLS]         network + CELLS cells (default 3); cell 1 bootstraps,
#                                     the others `serve --join` it, one at a time
#   deploy/ring.sh join N             one more cell, N, joining through any running cell
#                                     (e.g. after a `docker kill`: a lost cell comes back
#                                     only as a new cell)
#   deploy/ring.sh status [N]         containers, and `cellcache ctl status` (run in a
#                                     container on the network) through cell N or the
#                                     first running cell that answers
#   deploy/ring.sh disconnect N       cut cell N off the network (a partition)
#   deploy/ring.sh connect N          put it back (same address)
#   deploy/ring.sh logs N             the cell's log
#   deploy/ring.sh down               remove the cells and the network
#
# Cell N is container cellcache-net-cellN at 172.31.77.(10+N):11211 (peer port 21211).
# The ring has a secret (deploy/lib.sh: CELLCACHE_SECRET) that every cell proves to the
# others; a container without it can neither join nor act as a cell.
# Settings: see deploy/lib.sh. deploy/ring-smoke.sh runs a ring through a kill and a
# partition with checks.
set -euo pipefail
cd "$(dirname "$0")/.."
. deploy/lib.sh

target=x86_64-unknown-linux-gnu
binary=target/$target/release/cellcache

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

network() {
  # Addresses .128-.255 are for containers without a fixed one (`status`), so they never
  # take the address of a stopped cell that is started or connected again.
  docker network inspect "$net" >/dev/null 2>&1 ||
    docker network create --subnet "$prefix.0/24" --ip-range "$prefix.128/25" "$net" >/dev/null
}

# new_secret PATH: makes a secret file (mode 0600) with the image's own `ctl secret new`.
new_secret() {
  mkdir -p "$(dirname "$1")"
  docker run --rm -v "$(dirname "$1"):/out" "$image" ctl secret new "/out/$(basename "$1")" >/dev/null
}

# ensure_secret: makes the ring's secret file unless it exists or the ring runs open, and
# the admin token file unless it exists.
ensure_secret() {
  if [ "$secret" != open ] && [ ! -f "$secret" ]; then
    new_secret "$secret"
    echo "cluster secret: $secret"
  fi
  if [ ! -f "$admin_token" ]; then
    new_secret "$admin_token"
    echo "admin token: $admin_token"
  fi
}

# The `docker run` and `serve` arguments that give a cell the ring's secret.
secret_mount() { [ "$secret" = open ] || echo "-v $secret:/run/cellcache.secret:ro"; }
secret_flag() { [ "$secret" = open ] || echo "--cluster-secret-file /run/cellcache.secret"; }

# start N [JOIN_CELL]: runs cell N's container, bootstrapping or joining JOIN_CELL (through
# its peer port, the client port + 10000). The admin plane listens on the container's address
# with the admin token (mounted read-only).
start() {
  local n=$1 args=(serve -l "$(cell_ip "$1")" -p "$port")
  [ -n "${2:-}" ] && args+=(--join "$(cell_ip "$2"):$((port + 10000))")
  args+=(--admin-listen "$(cell_ip "$1")" --admin-token-file /run/cellcache.admin-token)
  ensure_secret
  # shellcheck disable=SC2046 # the secret's arguments are words by design
  docker run -d -e NO_COLOR=1 --name "$(cell_name "$n")" --network "$net" --ip "$(cell_ip "$n")" \
    -v "$admin_token:/run/cellcache.admin-token:ro" \
    $(secret_mount) "$image" "${args[@]}" $(secret_flag) >/dev/null
  echo "cell $n: $(cell_name "$n") $(cell_ip "$n"):$port${2:+ (joined through cell $2)}"
}

up() {
  local cells=${1:-3}
  if ! docker image inspect "$image" >/dev/null 2>&1; then
    build
  fi
  if [ "$cells" -gt 1 ] && ! docker run --rm "$image" serve --help | grep -q -- '--join'; then
    echo "error: image $image has no 'serve --join'; rebuild it: deploy/ring.sh build" >&2
    exit 2
  fi
  network
  for n in $(seq 1 "$cells"); do
    if [ "$n" -eq 1 ]; then start 1; else start "$n" 1; fi
    wait_member 1 "$n"
  done
  wait_cells 1 "$cells"
  echo "ring of $cells up"
}

join() {
  local n=$1 via
  via=$(any_cell) || {
    echo "error: no running cell answers; start a ring with deploy/ring.sh up" >&2
    exit 1
  }
  start "$n" "$via"
  wait_member "$via" "$n"
}

status() {
  local via=${1:-}
  docker ps -a --filter "name=${net}-cell" --format '{{.Names}}\t{{.Status}}' | sort -V
  if [ -z "$via" ]; then
    via=$(any_cell) || {
      echo "no running cell answers"
      return 0
    }
  fi
  echo "ctl status through cell $via:"
  docker run --rm --network "$net" -v "$admin_token:/run/cellcache.admin-token:ro" "$image" \
    ctl status -s "$(cell_ip "$via"):$admin_port" --admin-token-file /run/cellcache.admin-token
}

down() {
  docker ps -aq --filter "name=${net}-cell" | xargs -r docker rm -f >/dev/null
  docker network rm "$net" >/dev/null 2>&1 || true
  echo "removed cells and network $net"
}

case "${1:-}" in
  build) build ;;
  up) up "${2:-3}" ;;
  join) join "$2" ;;
  status) status "${2:-}" ;;
  disconnect) docker network disconnect "$net" "$(cell_name "$2")" ;;
  connect) docker network connect --ip "$(cell_ip "$2")" "$net" "$(cell_name "$2")" ;;
  logs) docker logs "$(cell_name "$2")" ;;
  down) down ;;
  *) sed -n '2,22p' "$0"; exit 2 ;;
esac
