// The guest's free memory: made clean before a template is baked, and reported to the host (or
// not) by the balloon.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace pandastack::agent {

// A /proc/meminfo field in KiB ("MemFree"), or -1 when `meminfo` has none.
int64_t meminfo_kib(std::string_view meminfo, std::string_view field);

// Takes freshly zeroed pages from the kernel (anonymous memory, faulted in 4 MiB at a time) until
// its free memory is down to `reserve_bytes`, then gives them back: pages the guest freed with
// old contents in them (the initramfs, boot-time buffers) are zero again, so a snapshot's RAM
// file holds only what the guest uses (the host stores and copies no zero page). Stops early if
// the kernel refuses memory. Prints what it took; returns the process's exit status.
int zero_free_memory(uint64_t reserve_bytes);

// Binds (`on`) or unbinds the virtio_balloon driver from the machine's balloon (the virtio device
// of type 5 under `sys`/bus/virtio), so that the guest reports its free memory to the host only
// when the host can take it back: a VM whose RAM is its own file can, one mapping a shared
// memory base copy-on-write cannot (QEMU 7.2 would only log each report). Nothing to do on a
// machine without a balloon or when the driver is already so. Returns 0 or an errno.
int set_free_page_reporting(bool on, const std::string& sys = "/sys");

}  // namespace pandastack::agent
