#!/usr/bin/env bash
# deploy/compose.yaml, end to end: a ring of three authenticated cells and Prometheus.
#
#   deploy/compose.sh up       images (the cellcache scratch image, Prometheus in a scratch
#                              image from Debian's binary), the ring's secret and the admin
#                              token (target/compose/, mode 0600), then `compose up` and a
#                              bounded wait until the ring has formed and Prometheus scrapes
#                              every cell
#   deploy/compose.sh check    a write and a read through cell 1, the dashboard page, and
#                              `count(up == 1)` from Prometheus (3)
#   deploy/compose.sh down     removes the containers and the network
#
# The cellcache image is CELLCACHE_IMAGE (cellcache:dev), built by `deploy/ring.sh build` (a
# static release build) if missing. With CELLCACHE_COMPOSE_BINARY=PATH it is built from that
# binary instead, dynamically linked, with the libraries `ldd` lists
# (deploy/dynamic.Dockerfile): scripts/compose-check uses the release binary readme-check
# built. Uses `docker compose` when the engine has it, else `docker-compose`.
set -euo pipefail
cd "$(dirname "$0")/.."
. deploy/lib.sh

dir=${CELLCACHE_COMPOSE_DIR:-$PWD/target/compose}
export CELLCACHE_COMPOSE_DIR=$dir
prom_image=${CELLCACHE_PROMETHEUS_IMAGE:-cellcache-prometheus:dev}
if docker compose version >/dev/null 2>&1; then compose=(docker compose); else compose=(docker-compose); fi
compose+=(-f deploy/compose.yaml -p cellcache)

prometheus_image() {
  local context
  context=$(mktemp -d)
  cp /usr/bin/prometheus deploy/prometheus/Dockerfile "$context/"
  cp /lib/x86_64-linux-gnu/libc.so.6 /lib64/ld-linux-x86-64.so.2 "$context/"
  docker build -q -t "$prom_image" "$context" >/dev/null
  rm -rf "$context"
}

# The cellcache image from a dynamically linked binary and the libraries it loads.
binary_image() {
  local binary=$1 context lib
  context=$(mktemp -d)
  mkdir -p "$context/rootfs"
  cp deploy/dynamic.Dockerfile "$context/Dockerfile"
  cp "$binary" "$context/rootfs/cellcache"
  if command -v strip >/dev/null 2>&1; then strip --strip-debug "$context/rootfs/cellcache"; fi
  # Lines `name => /path (addr)` and the loader's `/path (addr)`; vdso has no file.
  for lib in $(ldd "$binary" | grep -o '/[^ ]*'); do
    mkdir -p "$context/rootfs$(dirname "$lib")"
    cp -L "$lib" "$context/rootfs$lib"
  done
  docker build -q -t "$image" "$context" >/dev/null
  rm -rf "$context"
}

secrets() {
  mkdir -p "$dir"
  for f in cluster-secret admin-token; do
    [ -f "$dir/$f" ] || docker run --rm -v "$dir:/out" "$image" ctl secret new "/out/$f" >/dev/null
  done
  # The cells and Prometheus run as root in their scratch images; the files stay 0600.
}

# admin PATH: GET PATH from cell 1's published admin port with the token.
admin() {
  curl -fsS --max-time 5 -H "Authorization: Bearer $(cat "$dir/admin-token")" "http://127.0.0.1:31211$1"
}

wait_for() {
  local what=$1 deadline=$((SECONDS + wait_secs))
  shift
  until "$@" >/dev/null 2>&1; do
    if [ $SECONDS -ge $deadline ]; then
      echo "error: $what within ${wait_secs}s" >&2
      "${compose[@]}" ps >&2 || true
      exit 1
    fi
    sleep 1
  done
}

formed() { [ "$(admin /cluster/status | grep -c ' active ')" -eq 3 ]; }
scraped() {
  local reply
  reply=$(curl -fsS --max-time 5 'http://127.0.0.1:9090/api/v1/query?query=count(up%3D%3D1)')
  grep -q '"value":\[[0-9.]*,"3"\]' <<< "$reply"
}

up() {
  if [ -n "${CELLCACHE_COMPOSE_BINARY:-}" ]; then
    binary_image "$CELLCACHE_COMPOSE_BINARY"
  else
    docker image inspect "$image" >/dev/null 2>&1 || deploy/ring.sh build
  fi
  prometheus_image
  secrets
  "${compose[@]}" up -d
  wait_for "the ring of three formed" formed
  wait_for "Prometheus scraped every cell" scraped
  echo "ring of three up: memcached on 127.0.0.1:11211, dashboard" \
    "http://127.0.0.1:31211/?token=\$(cat $dir/admin-token), Prometheus http://127.0.0.1:9090"
}

check() {
  local reply
  reply=$(printf 'set compose-check 0 0 2\r\nok\r\nget compose-check\r\nquit\r\n' |
    timeout 5 bash -c 'exec 3<>/dev/tcp/127.0.0.1/11211; cat >&3; cat <&3' | tr -d '\r')
  [ "$reply" = "$(printf 'STORED\nVALUE compose-check 0 2\nok\nEND')" ] || {
    echo "error: set/get through cell 1 answered: $reply" >&2
    exit 1
  }
  echo "set/get through cell 1: ok"
  # The whole page first: `curl | grep -q` fails under pipefail when grep stops reading
  # before curl has written the rest (curl: (23) Failed writing body).
  local page
  page=$(curl -fsS --max-time 5 http://127.0.0.1:31211/)
  grep -q '<title>cellcache ring</title>' <<< "$page"
  echo "dashboard page: ok"
  scraped
  echo "Prometheus: count(up == 1) = 3"
}

down() { "${compose[@]}" down -v --remove-orphans; }

case ${1:-} in
  up) up ;;
  check) check ;;
  down) down ;;
  *) sed -n '2,19p' "$0"; exit 2 ;;
esac
