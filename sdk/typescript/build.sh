#!/usr/bin/env bash
# Builds the TypeScript SDK: dev tools from npm (package-lock.json), src/*.ts compiled by tsc to
# dist/ (ESM + .d.ts). Does nothing when dist/ is newer than every source (tests share it).
set -euo pipefail
cd "$(dirname "$0")"
[[ -x node_modules/.bin/tsc ]] || npm ci --no-audit --no-fund --loglevel=error
if [[ -f dist/.built && -z "$(find src tsconfig.build.json package.json -newer dist/.built -print -quit)" ]]; then
  exit 0
fi
rm -rf dist
node_modules/.bin/tsc -p tsconfig.build.json
touch dist/.built
