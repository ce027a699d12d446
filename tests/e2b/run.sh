#!/usr/bin/env bash
# The real, unmodified E2B SDK (npm `e2b`, pinned by package-lock.json) against pandastackd.
set -euo pipefail
cd "$(dirname "$0")"
[[ -d node_modules/e2b ]] || npm ci --no-audit --no-fund --loglevel=error
export PANDASTACK_IMAGES="${PANDASTACK_IMAGES:-$(cd ../.. && pwd)/var/images}"
# The HTTPS case's certificate: *.sbx.localhost under a CA of the test's own, which Node trusts
# through NODE_EXTRA_CA_CERTS (read at its start, hence here).
tls=$(mktemp -d /dev/shm/pst-e2b-certs-XXXXXX)
trap 'rm -rf "$tls"' EXIT
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
  -subj /CN=pandastack-e2b-test-ca -keyout "$tls/ca.key" -out "$tls/ca.pem" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=sbx.localhost \
  -keyout "$tls/key.pem" -out "$tls/cert.csr" 2>/dev/null
printf 'subjectAltName=DNS:sbx.localhost,DNS:*.sbx.localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' >"$tls/ext"
openssl x509 -req -in "$tls/cert.csr" -CA "$tls/ca.pem" -CAkey "$tls/ca.key" -CAcreateserial \
  -days 2 -extfile "$tls/ext" -out "$tls/cert.pem" 2>/dev/null
export NODE_EXTRA_CA_CERTS="$tls/ca.pem" E2B_TEST_TLS_DIR="$tls"
# The usual report on stdout, the per-case watchdog (tests/support/watchdog-reporter.mjs) on stderr.
node --test --test-reporter=spec --test-reporter-destination=stdout \
  --test-reporter=../support/watchdog-reporter.mjs --test-reporter-destination=stderr --test-concurrency=1 \
  ${E2B_TEST_ONLY:+--test-name-pattern="$E2B_TEST_ONLY"} e2b_test.mjs
