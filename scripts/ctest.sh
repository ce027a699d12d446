#!/usr/bin/env bash
# Runs ctest (arguments passed on) in the current build folder. On a failure it ends its output
# with what failed: CI shows a long log's head and tail only, and the failing test's own lines sit
# in the middle. Also names every test case that took a minute or more and every case a watchdog
# reported (tests/support/watchdog.h, tests/api/watchdog.py): a hang shows as one.
set -uo pipefail
ctest "$@"
rc=$?
log=Testing/Temporary/LastTest.log
if [[ -f $log ]]; then
  slow=$(grep -a -E '^\[ +(OK|FAILED) +\] .*\(([6-9][0-9]{4}|[0-9]{6,}) ms\)$|^SLOW: |^WATCHDOG: ' "$log" || true)
  if [[ -n $slow ]]; then
    echo "== test cases that took a minute or more, or that a watchdog named =="
    echo "$slow"
  fi
  if [[ $rc -ne 0 ]]; then
    echo "== what failed (from $PWD/$log) =="
    grep -a -E '^WATCHDOG|^\[  FAILED  \] [A-Za-z]|Failure$|^FAIL:|^ERROR:|^[A-Za-z]+Error:|^AssertionError|ERROR: AddressSanitizer|runtime error:|\*\*\*Timeout|Test Failed' "$log" |
      grep -a -v 'listed below' | head -60
  fi
fi
exit $rc
