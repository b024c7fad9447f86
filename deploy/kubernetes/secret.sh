#!/usr/bin/env bash
# Prints the Secret `cellcache` for deploy/kubernetes/cellcache.yaml: a fresh ring secret and
# admin token, made by `cellcache ctl secret new` (256 random bits each). Apply it once:
#   deploy/kubernetes/secret.sh | kubectl apply -f -
# Uses the cellcache on PATH, else target/release or target/debug.
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=$(command -v cellcache || true)
for built in target/release/cellcache target/debug/cellcache; do
  [ -n "$bin" ] || [ ! -x "$built" ] || bin=$built
done
[ -n "$bin" ] || { echo "secret.sh: build cellcache first (cargo build)" >&2; exit 1; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$bin" ctl secret new "$dir/cluster-secret" >/dev/null
"$bin" ctl secret new "$dir/admin-token" >/dev/null
cat <<YAML
apiVersion: v1
kind: Secret
metadata:
  name: cellcache
type: Opaque
data:
  cluster-secret: $(base64 -w0 "$dir/cluster-secret")
  admin-token: $(base64 -w0 "$dir/admin-token")
YAML
