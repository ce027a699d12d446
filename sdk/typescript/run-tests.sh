#!/usr/bin/env bash
# The TypeScript SDK's checks: the declarations type-check under tsc --strict (test/usage.ts), and
# the runtime tests pass against a daemon (PANDASTACKD). Dev tools come from npm (package-lock.json).
set -euo pipefail
cd "$(dirname "$0")"
[[ -x node_modules/.bin/tsc ]] || npm ci --no-audit --no-fund --loglevel=error
node_modules/.bin/tsc -p tsconfig.json
# The usual report on stdout, the per-case watchdog (tests/support/watchdog-reporter.mjs) on stderr.
exec node --test --test-reporter=spec --test-reporter-destination=stdout \
  --test-reporter=../../tests/support/watchdog-reporter.mjs --test-reporter-destination=stderr test/
