// Whether a string is an id as this host's runtime makes them (`prefix`, then lower-case letters
// and digits, at most 64 characters in all): what the detached workers that turn ids into folder
// names (the snapshot persister, the snapshot uploader) accept and nothing else.
#pragma once

#include <algorithm>
#include <string>

namespace pandastack::actors {

inline bool runtime_id(const std::string& id, const std::string& prefix) {
  if (id.size() <= prefix.size() || id.size() > 64 || id.rfind(prefix, 0) != 0) return false;
  return std::all_of(id.begin() + long(prefix.size()), id.end(),
                     [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); });
}

}  // namespace pandastack::actors
