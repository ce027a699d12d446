#!/usr/bin/env bash
# The real, unmodified E2B SDK (npm `e2b`, pinned by package-lock.json) against pandastackd.
set -euo pipefail
cd "$(dirname "$0")"
[[ -d node_modules/e2b ]] || npm ci --no-audit --no-fund --loglevel=error
export PANDASTACK_IMAGES="${PANDASTACK_IMAGES:-$(cd ../.. && pwd)/var/images}"
# The usual report on stdout, the per-case watchdog (tests/support/watchdog-reporter.mjs) on stderr.
exec node --test --test-reporter=spec --test-reporter-destination=stdout \
  --test-reporter=../support/watchdog-reporter.mjs --test-reporter-destination=stderr --test-concurrency=1 e2b_test.mjs
