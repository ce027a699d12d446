#!/usr/bin/env bash
# What the daemon adds on the reply path, measured in one run with pandastack-bench: the VMM
# driver alone (exec, create from a warm pool, fork into a spare), then the same through a daemon's
# REST API (network-less sandboxes, as the driver's are). Prints each scenario's JSON line and a
# table of the differences against the targets of the first-run issue. Needs root (the jail).
#
#   scripts/bench-overhead.sh [N]      (N samples per scenario, default 30)
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-30}
BUILD=${BUILD:-build}
IMAGES=${IMAGES:-$PWD/var/images}
BENCH=$BUILD/bin/pandastack-bench
tmp=$(mktemp -d /var/tmp/pandastack-bench.XXXXXX)
daemon=""
cleanup() {
  if [[ -n "$daemon" ]]; then kill -TERM "$daemon" 2>/dev/null; wait "$daemon" 2>/dev/null || true; fi
  [[ -f "$tmp/state" ]] && rm -rf "$(cat "$tmp/state")"
  rm -rf "$tmp"
}
trap cleanup EXIT

run() { echo "+ pandastack-bench $*" >&2; "$BENCH" "$@" --n "$N" --json | tail -1 | tee -a "$tmp/results"; }

run driver exec --images "$IMAGES"
run driver create-pool --images "$IMAGES"
run driver fork-pool --images "$IMAGES"

"$BUILD/bin/pandastackd" --data "$tmp/data" --images "$IMAGES" --listen 127.0.0.1:0 \
  --rpc-listen 127.0.0.1:0 --accel tcg --network-prefix pbo --subnet-pool 10.251.0.0/22 \
  --dns-upstream off > "$tmp/out" 2> "$tmp/daemon.log" &
daemon=$!
for _ in $(seq 600); do grep -q "key file" "$tmp/out" 2>/dev/null && break; sleep 0.1; done
url=$(awk '/URL:/{print $2}' "$tmp/out")
awk '/State:/{print $2}' "$tmp/out" > "$tmp/state"
key=$(cat "$tmp/data/api-key")
[[ -n "$url" ]] || { cat "$tmp/daemon.log" >&2; exit 1; }
body='{"network":false}'
run api exec --url "$url" --key "$key" --create-body "$body"
run api create --url "$url" --key "$key" --create-body "$body"
run api fork --url "$url" --key "$key" --create-body "$body"

python3 - "$tmp/results" <<'PY'
import json, sys
r = {j["scenario"]: j for j in map(json.loads, open(sys.argv[1]))}
rows = [("exec", "exec", "api-exec", 3), ("create", "create-pool", "api-create", 10),
        ("fork", "fork-pool", "api-fork", 20)]
print("| what | driver p50 | REST p50 | REST - driver | target |")
print("|---|---|---|---|---|")
for name, d, a, target in rows:
    dp, ap = r[d]["p50_ms"], r[a]["p50_ms"]
    ok = "met" if ap - dp <= target else "missed"
    print(f"| {name} | {dp:.1f} ms | {ap:.1f} ms | {ap - dp:+.1f} ms | <= +{target} ms ({ok}) |")
PY
