# Sourced by deploy/ring.sh and deploy/ring-smoke.sh: settings, container names and
# addresses, and a small memcached client that talks to a cell from the host over the
# docker bridge (bash's /dev/tcp; every call bounded by `timeout`).
#
# Settings (environment): CELLCACHE_IMAGE (cellcache:dev), CELLCACHE_NET (cellcache-net),
# CELLCACHE_SUBNET_PREFIX (172.31.77; cell N gets .10+N, containers without a fixed
# address get .128-.255), CELLCACHE_PORT (11211), CELLCACHE_WAIT_SECS (60, the bound on
# every wait for the ring to settle), CELLCACHE_SECRET (target/deploy-ring.secret: the
# ring's secret file, made by `ctl secret new` on first use and mounted read-only into every
# cell; CELLCACHE_SECRET=open runs the ring without one), CELLCACHE_ADMIN_TOKEN
# (target/deploy-ring.admin-token: the token of the cells' admin planes, which listen on the
# containers' addresses and so need one; made the same way). Admin port: CELLCACHE_PORT +
# 20000.

image=${CELLCACHE_IMAGE:-cellcache:dev}
net=${CELLCACHE_NET:-cellcache-net}
prefix=${CELLCACHE_SUBNET_PREFIX:-172.31.77}
port=${CELLCACHE_PORT:-11211}
wait_secs=${CELLCACHE_WAIT_SECS:-60}
secret=${CELLCACHE_SECRET:-$PWD/target/deploy-ring.secret}
admin_token=${CELLCACHE_ADMIN_TOKEN:-$PWD/target/deploy-ring.admin-token}
admin_port=$((port + 20000))

cell_name() { echo "${net}-cell$1"; }
cell_ip() { echo "$prefix.$((10 + $1))"; }

# Numbers of the cells whose containers are running, ascending.
running_cells() {
  docker ps --filter "name=${net}-cell" --format '{{.Names}}' |
    sed -n "s/^${net}-cell\([0-9][0-9]*\)$/\1/p" | sort -n
}

# mc N REQUEST [SECONDS]: sends REQUEST to cell N (printf %b escapes, so "set k 0 0 1\r\nv";
# CRLF appended) and prints the reply's lines, CR removed, up to the line that ends it.
# Succeeds only if a complete reply arrived within SECONDS (default 5, connect included);
# a refused, unreachable or silent cell fails. A cell answers a request for a key whose
# master is being replaced within request_timeout_ms (3 s), so 5 s covers every answer.
mc() {
  timeout "${3:-5}" bash -c '
    exec 3<>"/dev/tcp/$1/$2" || exit 1
    printf "%b\r\n" "$3" >&3
    cr=$(printf "\r")
    while IFS= read -r line <&3; do
      line=${line%"$cr"}
      printf "%s\n" "$line"
      case $line in
        END | STORED | NOT_STORED | EXISTS | NOT_FOUND | DELETED | TOUCHED | OK* | ERROR* | \
          CLIENT_ERROR* | SERVER_ERROR* | VERSION*) exit 0 ;;
      esac
    done
    exit 1' _ "$(cell_ip "$1")" "$port" "$2"
}

# admin N PATH [SECONDS]: GETs PATH from cell N's admin plane (HTTP, with the admin token)
# and prints the body; fails on a refusal or no answer within SECONDS (default 5).
admin() {
  curl -sf --max-time "${3:-5}" -H "Authorization: Bearer $(head -n1 "$admin_token")" \
    "http://$(cell_ip "$1"):$admin_port$2" | tr -d '\r'
}

# The first running cell that answers `version`, or nothing.
any_cell() {
  local n
  for n in $(running_cells); do
    if mc "$n" version 2 >/dev/null 2>&1; then
      echo "$n"
      return 0
    fi
  done
  return 1
}

# wait_member VIA N: waits until the ring's status through cell VIA lists cell N's address as
# active with no migration in flight (a division or absorption finished). Bounded.
wait_member() {
  local via=$1 addr status
  addr="client=$(cell_ip "$2"):$port "
  for _ in $(seq 1 $((wait_secs * 5))); do
    status=$(admin "$via" /cluster/status 2>/dev/null || true)
    if grep -q "active $addr" <<<"$status" && ! grep -q '^MIGRATION' <<<"$status"; then
      return 0
    fi
    sleep 0.2
  done
  echo "error: cell $2 ($addr) not active in cell $via's map within ${wait_secs}s:" >&2
  echo "$status" >&2
  return 1
}

# wait_cells VIA COUNT: waits until cell VIA's map holds exactly COUNT cells, all active, with
# no migration in flight. Bounded.
wait_cells() {
  local via=$1 count=$2 status
  for _ in $(seq 1 $((wait_secs * 5))); do
    status=$(admin "$via" /cluster/status 2>/dev/null || true)
    if [ "$(grep -c '^CELL ' <<<"$status")" -eq "$count" ] &&
      [ "$(grep -c '^CELL .* active ' <<<"$status")" -eq "$count" ] &&
      ! grep -q '^MIGRATION' <<<"$status"; then
      return 0
    fi
    sleep 0.2
  done
  echo "error: cell $via's map does not hold $count active cells within ${wait_secs}s:" >&2
  echo "$status" >&2
  return 1
}
