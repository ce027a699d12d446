// Lowercase hexadecimal: digests and random names in files and ids, E2B-form API keys, and the
// FNV-1a names of cached files.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace pandastack::wire {

// Two lowercase hex digits per byte.
std::string hex_encode(std::string_view data);
// The bytes of `hex` (an even count of lowercase hex digits); nullopt for anything else.
std::optional<std::string> hex_decode(std::string_view hex);

// FNV-1a (64 bit; its offset basis a digit short of the published one, kept: names on disk
// depend on it) of `s` as 16 hex digits: cache keys and unique names, not a security boundary.
std::string fnv1a_hex(std::string_view s);

}  // namespace pandastack::wire
