#!/usr/bin/env bash
# Installs the Debian packages PandaStack needs, only those missing (idempotent; needs root).
set -euo pipefail
PACKAGES=(
  build-essential cmake pkg-config ccache git
  libcaf-dev librocksdb-dev capnproto libcapnp-dev libspdlog-dev libfmt-dev libgtest-dev libgmock-dev
  libssl-dev zlib1g-dev openssl curl
  qemu-system-x86 qemu-utils debootstrap busybox-static e2fsprogs cpio xz-utils kmod
  iproute2 nftables libnftables-dev python3 python3-httpx python3-venv nodejs
  postgresql-client python3-psycopg2 clang libclang-rt-14-dev
  etcd-server etcd-client
  chromium fonts-dejavu-core
  docker-registry skopeo
)
missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [[ ${#missing[@]} -eq 0 ]]; then
  echo "[deps] all ${#PACKAGES[@]} packages present"
  exit 0
fi
echo "[deps] installing: ${missing[*]}"
SUDO=""
[[ $(id -u) -ne 0 ]] && SUDO=sudo
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
# (docker-registry is for the image-pull tests, which run their own on loopback: not the package's
# service, which systemd would otherwise keep running on :5000)
if command -v systemctl >/dev/null && [[ -d /run/systemd/system ]]; then
  $SUDO systemctl disable --now docker-registry >/dev/null 2>&1 || true
fi
