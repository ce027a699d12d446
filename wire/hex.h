// Lowercase hexadecimal: digests and random names in files and ids, and E2B-form API keys.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace pandastack::wire {

// Two lowercase hex digits per byte.
std::string hex_encode(std::string_view data);
// The bytes of `hex` (an even count of lowercase hex digits); nullopt for anything else.
std::optional<std::string> hex_decode(std::string_view hex);

}  // namespace pandastack::wire
