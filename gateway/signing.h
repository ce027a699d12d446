// What the gateway's signed tokens share (E2B access tokens, preview URLs): a secret kept in a
// file of the data folder, HMAC-SHA256 and URL-safe base64.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace pandastack::gateway {

// The 32-byte secret in `path`, or a new random one written there (0600, synced) when the file
// is missing or malformed. nullopt (with `error`) when it can be neither read nor written.
std::optional<std::string> load_or_make_secret(const std::string& path, std::string* error);
// HMAC-SHA256 of `msg` under `key` (32 raw bytes).
std::string hmac_sha256(std::string_view key, std::string_view msg);
// A secret for one use derived from a master secret: HMAC(master, label).
inline std::string derive_secret(std::string_view master, std::string_view label) {
  return hmac_sha256(master, label);
}
// Equal, in time that does not depend on where they differ.
bool equal_secret(std::string_view a, std::string_view b);
// Base64url without padding (RFC 4648 §5), and back (nullopt: malformed, or over 512 chars).
std::string b64url(std::string_view raw);
std::optional<std::string> unb64url(std::string_view s);

}  // namespace pandastack::gateway
