#!/usr/bin/env bash
# The TypeScript SDK's checks: the package builds (build.sh: tsc to dist/), its emitted
# declarations type-check a usage file under --strict (test/usage.ts), and the runtime tests pass
# against a daemon (PANDASTACKD). Dev tools come from npm (package-lock.json).
set -euo pipefail
cd "$(dirname "$0")"
./build.sh
node_modules/.bin/tsc -p tsconfig.json
# The usual report on stdout, the per-case watchdog (tests/support/watchdog-reporter.mjs) on stderr.
exec node --test --test-reporter=spec --test-reporter-destination=stdout \
  --test-reporter=../../tests/support/watchdog-reporter.mjs --test-reporter-destination=stderr test/
