#pragma once

#include <cstddef>
#include <cstring>

namespace pandastack::vmm {

// A page of RAM (the host's and the guest's): the unit RAM files are copied, saved and punched in.
inline constexpr size_t kPage = 4096;

// Whether the `len` bytes at `p` (len >= 1) are all zero: how RAM files stay sparse (a page of
// zeros is a hole, never written).
inline bool all_zero(const char* p, size_t len) {
  return p[0] == 0 && std::memcmp(p, p + 1, len - 1) == 0;
}

}  // namespace pandastack::vmm
