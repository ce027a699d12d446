#!/bin/sh
# PandaStack initramfs init: load the virtio/ext4 modules, mount the root disk, hand over to the
# agent, which runs as PID 1 of the root filesystem. Anything going wrong powers the VM off with a
# message on the serial console, which the host shows in its boot error.
/bin/busybox --install -s /bin
export PATH=/bin
fail() { echo "pandastack-init: $*"; poweroff -f; }
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in $(cat /modules.order); do insmod "/lib/modules/$m.ko" 2>/dev/null || echo "pandastack-init: insmod $m failed"; done
i=0
while [ ! -b /dev/vda ]; do
  i=$((i + 1)); [ $i -gt 500 ] && fail "no root disk /dev/vda"
  usleep 10000
done
mount -t ext4 -o rw,noatime /dev/vda /newroot || fail "cannot mount /dev/vda"
mount -t tmpfs -o mode=0755,nosuid,nodev run /newroot/run || fail "cannot mount /run"
mkdir -p /newroot/run/pandastack
cp /pandastack-agent /newroot/run/pandastack/agent || fail "cannot install agent"
mount --move /dev /newroot/dev
mount --move /proc /newroot/proc
mount --move /sys /newroot/sys
exec switch_root /newroot /run/pandastack/agent --init
