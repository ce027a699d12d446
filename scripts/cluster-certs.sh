#!/usr/bin/env bash
# The cluster's credentials, made with Debian's openssl (EC P-256):
#
#   cluster-certs.sh init DIR            the cluster CA (DIR/ca.pem, DIR/ca.key: keep the key
#                                        offline) and the two cluster keys: records.key (MACs
#                                        the key records hosts share through etcd, a key etcd
#                                        never holds) and e2b-tokens.key (E2B access tokens)
#   cluster-certs.sh host DIR ID         host ID's folder DIR/hosts/ID: host.pem (CN and DNS SAN
#                                        = ID, server and client use), host.key, ca.pem and the
#                                        two cluster keys: what `pandastackd --cluster-tls` takes
#   cluster-certs.sh etcd DIR [SAN...]   etcd's server certificate DIR/etcd/server.{pem,key}
#                                        (SANs default to IP:127.0.0.1,DNS:localhost)
#   cluster-certs.sh client DIR NAME     a client certificate for an operator's etcdctl
#                                        (DIR/clients/NAME.{pem,key})
#
# Rotation: a new host certificate is `host DIR ID` again and a daemon restart; a new CA means
# every host's folder again (both CAs in ca.pem during the change: it may hold several).
set -euo pipefail

usage() {
  sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

[[ $# -ge 2 ]] || usage
cmd=$1
dir=$2
days=${PANDASTACK_CERT_DAYS:-825}

newkey() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; chmod 600 "$1"; }

# sign NAME CN SAN EKU OUT_PREFIX: a certificate for OUT_PREFIX.key signed by the cluster CA.
sign() {
  local cn=$1 san=$2 eku=$3 out=$4
  [[ -f $dir/ca.pem && -f $dir/ca.key ]] || { echo "no CA in $dir: run init first" >&2; exit 1; }
  newkey "$out.key"
  local ext
  ext=$(mktemp)
  printf 'basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=%s\nsubjectAltName=%s\n' \
    "$eku" "$san" >"$ext"
  openssl req -new -key "$out.key" -subj "/O=pandastack/CN=$cn" -out "$out.csr" 2>/dev/null
  openssl x509 -req -in "$out.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" -CAcreateserial \
    -days "$days" -sha256 -extfile "$ext" -out "$out.pem" 2>/dev/null
  rm -f "$out.csr" "$ext"
}

case $cmd in
  init)
    mkdir -p "$dir"
    chmod 700 "$dir"
    if [[ -f $dir/ca.pem ]]; then echo "$dir already holds a CA" >&2; exit 1; fi
    newkey "$dir/ca.key"
    openssl req -new -x509 -key "$dir/ca.key" -subj "/O=pandastack/CN=pandastack cluster CA" \
      -days 3650 -sha256 -addext "basicConstraints=critical,CA:TRUE" \
      -addext "keyUsage=critical,keyCertSign,cRLSign" -out "$dir/ca.pem" 2>/dev/null
    for k in records.key e2b-tokens.key; do
      (umask 077 && openssl rand -hex 32 >"$dir/$k")
    done
    echo "$dir: cluster CA and keys"
    ;;
  host)
    [[ $# -eq 3 ]] || usage
    id=$3
    [[ $id =~ ^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$ ]] || { echo "host id: 1-64 of A-Z a-z 0-9 . _ -" >&2; exit 2; }
    h=$dir/hosts/$id
    mkdir -p "$h"
    chmod 700 "$h"
    sign "$id" "DNS:$id" "serverAuth,clientAuth" "$h/host"
    cp "$dir/ca.pem" "$dir/records.key" "$dir/e2b-tokens.key" "$h/"
    chmod 600 "$h/records.key" "$h/e2b-tokens.key"
    echo "$h: host $id"
    ;;
  etcd)
    shift 2
    san=$(IFS=,; echo "${*:-IP:127.0.0.1,DNS:localhost}")
    mkdir -p "$dir/etcd"
    sign etcd "$san" "serverAuth,clientAuth" "$dir/etcd/server"
    cp "$dir/ca.pem" "$dir/etcd/"
    echo "$dir/etcd: etcd server ($san)"
    ;;
  client)
    [[ $# -eq 3 ]] || usage
    mkdir -p "$dir/clients"
    sign "$3" "DNS:$3" "clientAuth" "$dir/clients/$3"
    echo "$dir/clients/$3.pem: client $3"
    ;;
  *) usage ;;
esac
