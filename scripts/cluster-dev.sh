#!/usr/bin/env bash
# A secure local cluster on this machine, for trying cluster mode and for the cluster benchmarks:
#
#   scripts/cluster-dev.sh up DIR N     the cluster CA and keys (scripts/cluster-certs.sh), etcd
#                                       with TLS and client-certificate auth on a free loopback
#                                       port, and N hosts h1..hN (each its own certificate, data
#                                       folder, ports, network prefix and subnet pool); a real
#                                       S3 server on loopback (s3rver from npm,
#                                       tests/objectstore/server.cjs; objects under DIR/s3) that
#                                       each host uploads its hibernations to (its own prefix
#                                       hosts/hI); writes DIR/cluster.env (below)
#   scripts/cluster-dev.sh down DIR     stops the hosts (gracefully) and etcd
#
# DIR/cluster.env (shell): ETCD_ENDPOINT (host:port), ETCD_CACERT, ETCD_CERT, ETCD_KEY (an
# operator's client certificate, for etcdctl), HOST_URLS, PEER_ADDRS, HOST_PIDS, HOST_DATA
# (space-separated, host 1 first), ADMIN_KEY, ETCD_PID, S3_ENDPOINT (http://127.0.0.1:port),
# S3_BUCKET, S3_CREDENTIALS (the credentials file), S3_PID. S3=off: no object store.
# Environment: PANDASTACKD (default build/bin/pandastackd), IMAGES (default var/images),
# HOST_FLAGS (more flags for every host, e.g. "--pool-size 0 --spare-pool-size 0").
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
daemon=${PANDASTACKD:-$here/build/bin/pandastackd}
images=${IMAGES:-$here/var/images}
certs=$here/scripts/cluster-certs.sh

free_port() {
  /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

up() {
  local dir=$1 n=$2
  [[ $n =~ ^[1-9][0-9]?$ ]] || { echo "N: 1-99 hosts" >&2; exit 2; }
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  [[ -f $dir/cluster.env ]] && { echo "$dir holds a cluster already (down it first)" >&2; exit 1; }
  local pki=$dir/pki
  [[ -f $pki/ca.pem ]] || "$certs" init "$pki" >/dev/null
  "$certs" etcd "$pki" >/dev/null
  "$certs" client "$pki" operator >/dev/null

  local client peer
  client=$(free_port)
  peer=$(free_port)
  local e=$pki/etcd
  etcd --name default --data-dir "$dir/etcd" \
    --listen-client-urls "https://127.0.0.1:$client" --advertise-client-urls "https://127.0.0.1:$client" \
    --cert-file "$e/server.pem" --key-file "$e/server.key" --client-cert-auth --trusted-ca-file "$e/ca.pem" \
    --listen-peer-urls "https://127.0.0.1:$peer" --initial-advertise-peer-urls "https://127.0.0.1:$peer" \
    --initial-cluster "default=https://127.0.0.1:$peer" \
    --peer-cert-file "$e/server.pem" --peer-key-file "$e/server.key" --peer-client-cert-auth \
    --peer-trusted-ca-file "$e/ca.pem" >"$dir/etcd.log" 2>&1 &
  local etcd_pid=$!
  local ok=
  for _ in $(seq 300); do
    if curl -sf --cacert "$e/ca.pem" --cert "$pki/clients/operator.pem" --key "$pki/clients/operator.key" \
      "https://127.0.0.1:$client/health" >/dev/null 2>&1; then ok=1; break; fi
    sleep 0.1
  done
  [[ -n $ok ]] || { echo "etcd did not start: $dir/etcd.log" >&2; kill "$etcd_pid"; exit 1; }

  # The object store: s3rver (one node process, up in a second; see tests/objectstore/server.cjs
  # for why it and not Ceph's radosgw, which needs a monitor and an OSD besides the gateway).
  local s3_endpoint= s3_pid= s3_flags=()
  if [[ ${S3:-on} != off ]]; then
    local objects=$here/tests/objectstore
    [[ -d $objects/node_modules/s3rver ]] || (cd "$objects" && npm ci --no-audit --no-fund --loglevel=error)
    mkdir -p "$dir/s3"
    printf 'access_key_id = S3RVER\nsecret_access_key = S3RVER\n' >"$dir/s3-credentials"
    chmod 600 "$dir/s3-credentials"
    node "$objects/server.cjs" "$dir/s3" pandastack >"$dir/s3.port" 2>"$dir/s3.log" &
    s3_pid=$!
    for _ in $(seq 100); do [[ -s $dir/s3.port ]] && break; sleep 0.1; done
    [[ -s $dir/s3.port ]] || { echo "the S3 server did not start: $dir/s3.log" >&2; exit 1; }
    s3_endpoint=http://127.0.0.1:$(sed 's/[^0-9]//g' "$dir/s3.port")
  fi

  local urls=() peers=() pids=() datas=() admin=
  for i in $(seq "$n"); do
    local h=h$i data=$dir/h$i
    "$certs" host "$pki" "$h" >/dev/null
    mkdir -p "$data"
    local pp
    pp=$(free_port)
    s3_flags=()
    [[ -n $s3_endpoint ]] && s3_flags=(--object-store "$s3_endpoint/pandastack/hosts/$h"
                                       --object-store-credentials "$dir/s3-credentials")
    # (each host its own network prefix and subnet pool: sandboxes of two hosts never collide)
    # shellcheck disable=SC2086
    "$daemon" --data "$data" --images "$images" --listen 127.0.0.1:0 --rpc-listen 127.0.0.1:0 \
      --cluster "https://127.0.0.1:$client" --cluster-tls "$pki/hosts/$h" --host-id "$h" \
      --advertise "127.0.0.1:$pp" --network-prefix "pd$(printf '%02d' "$i")" \
      --subnet-pool "10.$((199 + i)).0.0/22" --dns-upstream off "${s3_flags[@]}" ${HOST_FLAGS:-} \
      >"$data/stdout" 2>"$data/daemon.log" &
    pids+=($!)
    local url=
    for _ in $(seq 600); do
      url=$(awk '/^ *URL:/ {print $2; exit}' "$data/stdout")
      [[ -n $url ]] && grep -q "key file" "$data/stdout" && break
      kill -0 "${pids[-1]}" 2>/dev/null || { echo "host $h exited: $data/daemon.log" >&2; exit 1; }
      sleep 0.1
    done
    [[ -n $url ]] || { echo "host $h did not start: $data/daemon.log" >&2; exit 1; }
    [[ -z $admin ]] && admin=$(cat "$data/api-key")
    urls+=("$url")
    peers+=("127.0.0.1:$pp")
    datas+=("$data")
  done
  cat >"$dir/cluster.env" <<EOF
ETCD_ENDPOINT=127.0.0.1:$client
ETCD_CACERT=$e/ca.pem
ETCD_CERT=$pki/clients/operator.pem
ETCD_KEY=$pki/clients/operator.key
ETCD_PID=$etcd_pid
HOST_URLS="${urls[*]}"
PEER_ADDRS="${peers[*]}"
HOST_PIDS="${pids[*]}"
HOST_DATA="${datas[*]}"
ADMIN_KEY=$admin
S3_ENDPOINT=$s3_endpoint
S3_BUCKET=pandastack
S3_CREDENTIALS=$dir/s3-credentials
S3_PID=$s3_pid
EOF
  echo "cluster of $n up: $dir/cluster.env"
}

down() {
  local dir=$1
  [[ -f $dir/cluster.env ]] || { echo "no cluster in $dir" >&2; exit 1; }
  # shellcheck disable=SC1091
  source "$dir/cluster.env"
  for p in $HOST_PIDS; do kill -TERM "$p" 2>/dev/null || true; done
  for p in $HOST_PIDS; do
    for _ in $(seq 600); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
  done
  [[ -n ${S3_PID:-} ]] && kill -TERM "$S3_PID" 2>/dev/null || true
  kill -TERM "$ETCD_PID" 2>/dev/null || true
  for _ in $(seq 100); do kill -0 "$ETCD_PID" 2>/dev/null || break; sleep 0.1; done
  rm -f "$dir/cluster.env"
  echo "cluster in $dir down"
}

case ${1:-} in
  up) [[ $# -eq 3 ]] || { sed -n '2,20p' "$0" >&2; exit 2; }; up "$2" "$3" ;;
  down) [[ $# -eq 2 ]] || { sed -n '2,20p' "$0" >&2; exit 2; }; down "$2" ;;
  *) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
