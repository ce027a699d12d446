#!/usr/bin/env bash
# The dashboard in a real browser: Debian's chromium (make deps installs it), driven by
# playwright-core from npm (pinned by package-lock.json), against pandastackd. Screenshots of each
# page go to $DASHBOARD_ARTIFACTS (default build/test-artifacts/dashboard). An argument: another
# test file of this folder (preview_browser_test.mjs).
set -euo pipefail
cd "$(dirname "$0")"
[[ -d node_modules/playwright-core ]] || npm ci --no-audit --no-fund --loglevel=error
command -v chromium >/dev/null || { echo "dashboard test: Debian's chromium is not installed (make deps)" >&2; exit 1; }
export PANDASTACK_IMAGES="${PANDASTACK_IMAGES:-$(cd ../.. && pwd)/var/images}"
export DASHBOARD_ARTIFACTS="${DASHBOARD_ARTIFACTS:-$(cd ../.. && pwd)/build/test-artifacts/dashboard}"
# The usual report on stdout, the per-case watchdog (tests/support/watchdog-reporter.mjs) on stderr.
exec node --test --test-reporter=spec --test-reporter-destination=stdout \
  --test-reporter=../support/watchdog-reporter.mjs --test-reporter-destination=stderr --test-concurrency=1 "${1:-dashboard_test.mjs}"
