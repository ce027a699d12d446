// Standard base64 (RFC 4648, with padding): JSON carries bytes this way (REST bodies, the etcd
// v3 gateway's keys and values, WebSocket keys).
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace pandastack::wire {

std::string base64_encode(std::string_view data);
// nullopt when `data` is not standard padded base64.
std::optional<std::string> base64_decode(std::string_view data);

}  // namespace pandastack::wire
