#!/usr/bin/env bash
# Runs the MCP test: installs the MCP client from npm (pinned by package-lock.json) if missing.
set -euo pipefail
cd "$(dirname "$0")"
[[ -d node_modules/@modelcontextprotocol/sdk ]] || npm ci --no-audit --no-fund --loglevel=error
export PANDASTACK_IMAGES="${PANDASTACK_IMAGES:-$(cd ../.. && pwd)/var/images}"
exec node --test mcp_test.mjs
