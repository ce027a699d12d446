#!/usr/bin/env bash
# Runs every libFuzzer target (tests/fuzz) for FUZZ_SECONDS each (default 30) from its seed corpus,
# FUZZ_JOBS targets at a time (default: one per core),
# and prints one JSON line per target: executions, corpus growth, and whether it found a crash.
# A crash input is kept in build-fuzz/findings/<target>/ (put it in tests/fuzz/corpus/<target>/
# with the fix). Exits non-zero when any target found one.
set -euo pipefail
BUILD=${BUILD_FUZZ:-build-fuzz}
SECONDS_EACH=${FUZZ_SECONDS:-30}
TARGETS=(fuzz_json fuzz_dns fuzz_event_codec fuzz_http fuzz_qmp fuzz_qcow2 fuzz_snapshot_meta fuzz_vm_record
         fuzz_agent_client fuzz_dockerfile fuzz_manifest)
CC=clang CXX=clang++ cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPANDASTACK_FUZZ=ON >/dev/null
cmake --build "$BUILD" -j"$(nproc)" --target "${TARGETS[@]}" >/dev/null
# One target: its JSON line goes to findings/<target>.json, its crash (if any) to stderr.
run_one() {
  local t=$1 work findings log code execs corpus found
  work=$(mktemp -d); findings="$BUILD/findings/$t"; mkdir -p "$findings"
  log="$BUILD/findings/$t.log"
  "$BUILD/bin/$t" -max_total_time="$SECONDS_EACH" -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$findings/" "$work" "tests/fuzz/corpus/$t" >"$log" 2>&1
  code=$?
  execs=$(awk '/stat::number_of_executed_units/{print $2}' "$log" | tail -1)
  corpus=$(ls "$work" | wc -l)
  rm -rf "$work"
  found=false; [[ $code -ne 0 ]] && found=true
  echo "{\"target\":\"$t\",\"seconds\":$SECONDS_EACH,\"execs\":${execs:-0},\"new_corpus_inputs\":$corpus,\"crash\":$found}" \
    > "$BUILD/findings/$t.json"
  if $found; then tail -40 "$log" >&2; fi
  return 0
}
export -f run_one
export BUILD SECONDS_EACH
# As many targets at a time as there are cores (each fuzzer is one process on one core).
rm -f "$BUILD"/findings/*.json
printf '%s\n' "${TARGETS[@]}" | xargs -P "${FUZZ_JOBS:-$(nproc)}" -I{} bash -c 'run_one "$1"' _ {}
failed=0
for t in "${TARGETS[@]}"; do
  if [[ -f "$BUILD/findings/$t.json" ]]; then cat "$BUILD/findings/$t.json"; else echo "{\"target\":\"$t\",\"crash\":\"did not run\"}"; failed=1; fi
  grep -q '"crash":true' "$BUILD/findings/$t.json" 2>/dev/null && failed=1
done
exit $failed
