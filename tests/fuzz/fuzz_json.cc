// JSON parsing (wire/json.cc): every REST body and QMP line goes through it. Whatever the bytes,
// parse() returns or refuses without crashing; what it accepts prints back to text that parses
// to the same printed text (a fixed point).
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "wire/json.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using pandastack::wire::Json;
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto j = Json::parse(text);
  if (!j) return 0;
  auto printed = j->dump();
  auto again = Json::parse(printed);
  if (!again || again->dump() != printed) std::abort();
  return 0;
}
