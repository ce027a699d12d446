#!/usr/bin/env bash
# Runs the MCP test: installs the MCP client from npm (pinned by package-lock.json) if missing.
set -euo pipefail
cd "$(dirname "$0")"
[[ -d node_modules/@modelcontextprotocol/sdk ]] || npm ci --no-audit --no-fund --loglevel=error
export PANDASTACK_IMAGES="${PANDASTACK_IMAGES:-$(cd ../.. && pwd)/var/images}"
# The usual report on stdout, the per-case watchdog (tests/support/watchdog-reporter.mjs) on stderr.
exec node --test --test-reporter=spec --test-reporter-destination=stdout \
  --test-reporter=../support/watchdog-reporter.mjs --test-reporter-destination=stderr mcp_test.mjs
