#!/usr/bin/env bash
# Runs every libFuzzer target (tests/fuzz) for FUZZ_SECONDS each (default 30) from its seed corpus
# and prints one JSON line per target: executions, corpus growth, and whether it found a crash.
# A crash input is kept in build-fuzz/findings/<target>/ (put it in tests/fuzz/corpus/<target>/
# with the fix). Exits non-zero when any target found one.
set -euo pipefail
BUILD=${BUILD_FUZZ:-build-fuzz}
SECONDS_EACH=${FUZZ_SECONDS:-30}
TARGETS=(fuzz_json fuzz_dns fuzz_event_codec fuzz_http fuzz_qmp fuzz_qcow2 fuzz_snapshot_meta fuzz_vm_record
         fuzz_agent_client)
CC=clang CXX=clang++ cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPANDASTACK_FUZZ=ON >/dev/null
cmake --build "$BUILD" -j"$(nproc)" --target "${TARGETS[@]}" >/dev/null
failed=0
for t in "${TARGETS[@]}"; do
  work=$(mktemp -d); findings="$BUILD/findings/$t"; mkdir -p "$findings"
  log="$BUILD/findings/$t.log"
  set +e
  "$BUILD/bin/$t" -max_total_time="$SECONDS_EACH" -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$findings/" "$work" "tests/fuzz/corpus/$t" >"$log" 2>&1
  code=$?
  set -e
  execs=$(awk '/stat::number_of_executed_units/{print $2}' "$log" | tail -1)
  corpus=$(ls "$work" | wc -l)
  rm -rf "$work"
  found=false; [[ $code -ne 0 ]] && found=true && failed=1
  echo "{\"target\":\"$t\",\"seconds\":$SECONDS_EACH,\"execs\":${execs:-0},\"new_corpus_inputs\":$corpus,\"crash\":$found}"
  if $found; then tail -40 "$log" >&2; fi
done
exit $failed
