#!/usr/bin/env bash
# Builds the guest image pieces. Every piece is cached under var/images and rebuilt only when the
# inputs it is keyed by change.
#
#   build-image.sh kernel    OUT_DIR                 Debian's kernel: uncompressed vmlinux + modules
#   build-image.sh initramfs OUT_DIR KERNEL_DIR AGENT busybox + virtio/ext4 modules + init + agent
#   build-image.sh rootfs    OUT_DIR RECIPE          debootstrap minbase + recipe -> ext4 -> qcow2
#
# Needs root (debootstrap), apt-get, dpkg, xz, cpio, busybox-static, e2fsprogs, qemu-utils.
# PANDASTACK_DEBOOTSTRAP_CACHE: a folder debootstrap keeps packages in; PANDASTACK_BUILD_VERBOSE:
# debootstrap's output as it runs (the daemon's template builds stream it).
#
# The kernel and the shipped root file systems are also kept outside the checkout, in
# PANDASTACK_IMAGE_CACHE (default /var/cache/pandastack/images as root, else
# ~/.cache/pandastack/images; "off" for none), one entry per piece under the same key as above
# with the sha256 of each of its files: a fresh clone on the same machine copies them (a copy
# whose hash differs is thrown away and built anew), a fresh machine builds them. Only the newest
# entry of each piece is kept.
set -euo pipefail

log() { echo "[guest] $*" >&2; }
die() { echo "[guest] error: $*" >&2; exit 1; }

# Bump when the way a piece is produced changes, so caches keyed by it are rebuilt.
readonly KERNEL_FORMAT=2
readonly INITRAMFS_FORMAT=2
readonly ROOTFS_FORMAT=3

# Modules the initramfs loads, in dependency order (see shared/notes/platform.md).
readonly MODULES="virtio_ring virtio virtio_mmio virtio_pci_legacy_dev virtio_pci_modern_dev virtio_pci \
virtio_console virtio_balloon virtio_blk failover net_failover virtio_net crc16 mbcache jbd2 crc32c_generic \
crc32c-intel ext4"

sha() { sha256sum | cut -c1-16; }

image_cache() {
  local c=${PANDASTACK_IMAGE_CACHE:-}
  if [[ -z "$c" ]]; then
    if [[ $(id -u) -eq 0 ]]; then c=/var/cache/pandastack/images; else c=${XDG_CACHE_HOME:-$HOME/.cache}/pandastack/images; fi
  fi
  [[ "$c" == off ]] || echo "$c"
}

# cache_fetch PIECE KEY OUT FILE...: copies the cached FILEs (paths relative to the entry) of PIECE
# under KEY into OUT, each checked against the entry's SHA256SUMS. False (OUT untouched) when
# there is no such entry or a copy does not match (the entry is then removed).
cache_fetch() {
  local piece=$1 key=$2 out=$3; shift 3
  local cache; cache=$(image_cache); [[ -n "$cache" ]] || return 1
  local entry="$cache/$piece/$key"
  [[ -f "$entry/SHA256SUMS" ]] || return 1
  local tmp; tmp=$(mktemp -d "$out.cache.XXXXXX")
  local f
  for f in "$@"; do
    mkdir -p "$tmp/$(dirname "$f")"
    cp -a "$entry/$f" "$tmp/$f" 2>/dev/null || { rm -rf "$tmp"; return 1; }
  done
  if ! (cd "$tmp" && sha256sum --quiet --strict -c "$entry/SHA256SUMS" >/dev/null 2>&1); then
    log "cached $piece $key does not match its hashes: dropped, building it"
    rm -rf "$tmp" "$entry"; return 1
  fi
  for f in "$@"; do mkdir -p "$out/$(dirname "$f")"; mv -f "$tmp/$f" "$out/$f"; done
  rm -rf "$tmp"
}

# cache_store PIECE KEY OUT FILE...: keeps OUT's FILEs as PIECE's entry under KEY (replacing the
# piece's older entries). A failure to write the cache is not a build failure.
cache_store() {
  local piece=$1 key=$2 out=$3; shift 3
  local cache; cache=$(image_cache); [[ -n "$cache" ]] || return 0
  mkdir -p "$cache/$piece" 2>/dev/null || return 0
  local tmp; tmp=$(mktemp -d "$cache/$piece/.new.XXXXXX") || return 0
  if (cd "$out" && cp -a --parents "$@" "$tmp/" && sha256sum "$@" > "$tmp/SHA256SUMS"); then
    rm -rf "${cache:?}/$piece"/[!.]*
    mv "$tmp" "$cache/$piece/$key" && log "kept $piece in $cache/$piece/$key"
  fi
  rm -rf "$tmp"
}

# The Debian mirror apt is configured with (never hard-coded: the machine's apt config decides).
apt_mirror() {
  local uri=""
  if [[ -f /etc/apt/sources.list.d/debian.sources ]]; then
    uri=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources)
  fi
  if [[ -z "$uri" && -f /etc/apt/sources.list ]]; then
    uri=$(awk '$1=="deb" && $0 !~ /security/ {print $2; exit}' /etc/apt/sources.list)
  fi
  [[ -n "$uri" ]] || die "no Debian mirror found in the apt configuration"
  echo "$uri"
}

build_kernel() {
  local out; out=$(realpath -m "$1")
  local pkg
  pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
  if [[ -z "$pkg" ]]; then
    # A machine whose package lists were never fetched: fetch them once.
    apt-get update -qq >/dev/null 2>&1 || true
    pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
  fi
  [[ -n "$pkg" ]] || die "cannot resolve linux-image-amd64 (apt-get update failed?)"
  local key="${KERNEL_FORMAT}-${pkg}"
  if [[ -f "$out/key" && "$(cat "$out/key")" == "$key" && -f "$out/vmlinux" ]]; then
    log "kernel $pkg cached"; return 0
  fi
  local m kept=(vmlinux version)
  for m in $MODULES; do kept+=("modules/$m.ko"); done
  rm -rf "$out"; mkdir -p "$out"
  if cache_fetch kernel "$key" "$out" "${kept[@]}"; then
    echo "$key" > "$out/key"; log "kernel $pkg from the image cache"; return 0
  fi
  log "fetching kernel $pkg"
  local tmp; tmp=$(mktemp -d); trap 'if [[ -n "${tmp:-}" ]]; then rm -rf "$tmp"; fi' RETURN EXIT
  (cd "$tmp" && chmod 0755 . && apt-get download -q "$pkg" >/dev/null 2>&1) || die "apt-get download $pkg failed"
  dpkg -x "$tmp"/*.deb "$tmp/x"
  local version=${pkg#linux-image-}
  local vmlinuz="$tmp/x/boot/vmlinuz-$version"
  [[ -f "$vmlinuz" ]] || die "no vmlinuz in $pkg"
  # The bzImage payload is xz: decompress from the xz magic to get the ELF with a PVH note,
  # which QEMU microvm boots directly (2.4 s faster per cold boot under TCG).
  local off
  off=$(LC_ALL=C grep -aobUP '\xfd7zXZ\x00' "$vmlinuz" | head -1 | cut -d: -f1)
  [[ -n "$off" ]] || die "no xz payload in $vmlinuz"
  tail -c +$((off + 1)) "$vmlinuz" | xz -dc -q > "$tmp/vmlinux" 2>/dev/null || true
  head -c 4 "$tmp/vmlinux" | grep -q 'ELF' || die "extracted kernel is not an ELF file"
  rm -rf "$out"; mkdir -p "$out/modules"
  mv "$tmp/vmlinux" "$out/vmlinux"
  local f
  for m in $MODULES; do
    f=$(find "$tmp/x/lib/modules/$version" \( -name "$m.ko" -o -name "$m.ko.xz" \
        -o -name "${m//_/-}.ko" -o -name "${m//-/_}.ko" \) | head -1)
    [[ -n "$f" ]] || die "module $m not found in $pkg"
    if [[ "$f" == *.xz ]]; then xz -dc "$f" > "$out/modules/$m.ko"; else cp "$f" "$out/modules/$m.ko"; fi
  done
  echo "$version" > "$out/version"
  echo "$key" > "$out/key"
  cache_store kernel "$key" "$out" "${kept[@]}"
  log "kernel $version ready in $out"
}

build_initramfs() {
  local out kdir=$2 agent=$3; out=$(realpath -m "$1")
  [[ -x "$agent" ]] || die "agent binary $agent missing (build it first)"
  local here; here=$(cd "$(dirname "$0")" && pwd)
  local key
  key=$( { echo "$INITRAMFS_FORMAT"; cat "$kdir/key" "$here/init.sh" "$agent" /bin/busybox; } | sha)
  if [[ -f "$out/key" && "$(cat "$out/key")" == "$key" && -f "$out/initramfs.cpio" ]]; then
    log "initramfs cached"; return 0
  fi
  local tmp; tmp=$(mktemp -d); trap 'if [[ -n "${tmp:-}" ]]; then rm -rf "$tmp"; fi' RETURN EXIT
  mkdir -p "$tmp"/{bin,dev,proc,sys,newroot,lib/modules}
  cp /bin/busybox "$tmp/bin/busybox"
  ln -s busybox "$tmp/bin/sh"
  cp "$here/init.sh" "$tmp/init"; chmod 0755 "$tmp/init"
  cp "$agent" "$tmp/pandastack-agent"; chmod 0755 "$tmp/pandastack-agent"
  local m
  for m in $MODULES; do cp "$kdir/modules/$m.ko" "$tmp/lib/modules/"; echo "$m" >> "$tmp/modules.order"; done
  mkdir -p "$out"
  # Uncompressed: the kernel unpacks it faster than it would inflate it under TCG.
  (cd "$tmp" && find . | LC_ALL=C sort | cpio -o -H newc --quiet > "$out/initramfs.cpio.tmp")
  mv "$out/initramfs.cpio.tmp" "$out/initramfs.cpio"
  echo "$key" > "$out/key"
  log "initramfs ready in $out"
}

recipe_get() { awk -F= -v k="$2" '$0 !~ /^#/ && $1==k {sub(/^[^=]*=/, ""); print; exit}' "$1"; }

build_rootfs() {
  local out recipe=$2; out=$(realpath -m "$1")
  [[ -f "$recipe" ]] || die "recipe $recipe not found"
  local suite packages size files bake_script
  suite=$(recipe_get "$recipe" suite); packages=$(recipe_get "$recipe" packages)
  size=$(recipe_get "$recipe" size_mb); files=$(recipe_get "$recipe" files)
  bake_script=$(recipe_get "$recipe" bake_script)
  [[ -n "$suite" && -n "$size" ]] || die "recipe $recipe needs suite= and size_mb="
  local key
  key=$( { echo "$ROOTFS_FORMAT"; cat "$recipe";
           if [[ -n "$bake_script" ]]; then cat "$(dirname "$recipe")/$bake_script"; fi
           if [[ -n "$files" ]]; then tar -C "$(dirname "$recipe")/$files" -c . --sort=name --mtime=@0; fi; } | sha)
  # Whether the template's sandboxes get a network unless a create says otherwise (recipe key
  # network=on|off, default on): read by the runtime, not part of the image.
  local network; network=$(recipe_get "$recipe" network); network=${network:-on}
  [[ "$network" == on || "$network" == off ]] || die "recipe $recipe: network must be on or off"
  mkdir -p "$out"; echo "$network" > "$out/network"
  # A data volume baked with the template (recipe keys data_volume_mib, data_volume_mount,
  # bake_script): read by the driver at bake time, not part of the image.
  local dv_mib dv_mount; dv_mib=$(recipe_get "$recipe" data_volume_mib)
  dv_mount=$(recipe_get "$recipe" data_volume_mount)
  rm -f "$out/data_volume" "$out/bake.sh"
  if [[ -n "$dv_mib" ]]; then
    [[ "$dv_mib" =~ ^[0-9]+$ && "$dv_mount" == /* ]] || die "recipe $recipe: data_volume_mib needs a number and data_volume_mount an absolute path"
    echo "$dv_mib $dv_mount" > "$out/data_volume"
  fi
  if [[ -n "$bake_script" ]]; then install -m 0755 "$(dirname "$recipe")/$bake_script" "$out/bake.sh"; fi
  if [[ -f "$out/key" && "$(cat "$out/key")" == "$key" && -f "$out/rootfs.qcow2" ]]; then
    log "rootfs $(basename "$recipe" .recipe) cached ($key)"; return 0
  fi
  local piece; piece="rootfs-$(basename "$recipe" .recipe)"
  if cache_fetch "$piece" "$key" "$out" rootfs.qcow2; then
    echo "$key" > "$out/key"; log "rootfs $(basename "$recipe" .recipe) from the image cache ($key)"; return 0
  fi
  local mirror; mirror=$(apt_mirror)
  # (EXIT too: a failure dies inside this function; what debootstrap mounted goes first)
  local tmp; tmp=$(mktemp -d /var/tmp/pandastack-rootfs.XXXXXX)
  trap 'if [[ -n "${tmp:-}" ]]; then umount -R "$tmp/root/proc" "$tmp/root/sys" 2>/dev/null || true; rm -rf "$tmp"; fi' RETURN EXIT
  log "debootstrap $suite (+ $packages) — about a minute"
  # sudo in every image: the `user` account may become root (as E2B's user may).
  local inc=(--include="sudo${packages:+,$packages}")
  # The daemon's template builds keep downloaded packages between builds.
  if [[ -n "${PANDASTACK_DEBOOTSTRAP_CACHE:-}" ]]; then
    mkdir -p "$PANDASTACK_DEBOOTSTRAP_CACHE"; inc+=(--cache-dir="$(realpath "$PANDASTACK_DEBOOTSTRAP_CACHE")")
  fi
  if [[ -n "${PANDASTACK_BUILD_VERBOSE:-}" ]]; then
    # (pipefail: the pipeline fails when debootstrap does)
    if ! debootstrap --variant=minbase "${inc[@]}" "$suite" "$tmp/root" "$mirror" 2>&1 | tee "$tmp/debootstrap.log" >&2; then
      die "debootstrap failed"
    fi
  elif ! debootstrap --variant=minbase "${inc[@]}" "$suite" "$tmp/root" "$mirror" > "$tmp/debootstrap.log" 2>&1; then
    tail -30 "$tmp/debootstrap.log" >&2; die "debootstrap failed"
  fi
  local r="$tmp/root"
  rm -rf "$r"/var/cache/apt/archives/*.deb "$r"/var/lib/apt/lists/* "$r"/var/log/*.log
  # What a baked data volume is mounted over is never seen: not shipped in the image.
  local dvm; dvm=$(recipe_get "$recipe" data_volume_mount)
  if [[ -n "$dvm" ]]; then rm -rf "${r:?}${dvm:?}"/*; fi
  echo sandbox > "$r/etc/hostname"
  printf '127.0.0.1 localhost\n127.0.1.1 sandbox\n' > "$r/etc/hosts"
  mkdir -p "$r/workspace"
  # An unprivileged account, `user` (uid 1000, home /home/user): what E2B's SDKs run commands as,
  # and what any caller may name (exec `user`). Written as text: nothing of the image runs here.
  grep -q '^user:' "$r/etc/passwd" || {
    echo 'user:x:1000:1000:user:/home/user:/bin/bash' >> "$r/etc/passwd"
    echo 'user:x:1000:' >> "$r/etc/group"
    echo 'user:*:19000:0:99999:7:::' >> "$r/etc/shadow"
    echo 'user:!::' >> "$r/etc/gshadow"
  }
  # Passwordless sudo for `user` (what E2B's user has; the sandbox is the boundary, not the uid).
  printf 'user ALL=(ALL:ALL) NOPASSWD: ALL\n' > "$r/etc/sudoers.d/user"
  chmod 0440 "$r/etc/sudoers.d/user"
  mkdir -p "$r/home/user"
  if [[ -d "$r/etc/skel" ]]; then cp -a "$r/etc/skel/." "$r/home/user/"; fi
  chown -R 1000:1000 "$r/home/user"
  if [[ -n "$files" ]]; then cp -a "$(dirname "$recipe")/$files/." "$r/"; fi
  mkdir -p "$out"
  truncate -s "${size}M" "$tmp/rootfs.ext4"
  mkfs.ext4 -q -F -L pandastack-root -E lazy_itable_init=0,lazy_journal_init=0 -d "$r" "$tmp/rootfs.ext4"
  qemu-img convert -q -f raw -O qcow2 "$tmp/rootfs.ext4" "$out/rootfs.qcow2.tmp"
  mv "$out/rootfs.qcow2.tmp" "$out/rootfs.qcow2"
  echo "$key" > "$out/key"
  cache_store "$piece" "$key" "$out" rootfs.qcow2
  log "rootfs ready: $out/rootfs.qcow2 ($(du -h "$out/rootfs.qcow2" | cut -f1))"
}

case "${1:-}" in
  kernel) build_kernel "$2" ;;
  initramfs) build_initramfs "$2" "$3" "$4" ;;
  rootfs) build_rootfs "$2" "$3" ;;
  *) die "usage: $0 kernel OUT | initramfs OUT KERNEL_DIR AGENT | rootfs OUT RECIPE" ;;
esac
