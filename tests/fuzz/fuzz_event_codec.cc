// Decoding persisted events and state (actors/event_codec.h, volume_codec.h, database_codec.h,
// custom_template_codec.h):
// recovery reads whatever the store holds. Undecodable bytes are refused, never a crash; what
// decodes encodes and decodes again to the same JSON rendering.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "actors/custom_template_codec.h"
#include "actors/database_codec.h"
#include "actors/event_codec.h"
#include "actors/volume_codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pandastack::actors;
  std::string bytes(reinterpret_cast<const char*>(data), size);
  if (auto e = decode_event(bytes)) {
    auto again = decode_event(encode_event(*e));
    if (!again || event_to_json(*again) != event_to_json(*e)) std::abort();
  }
  if (auto v = decode_volume_event(bytes)) {
    auto again = decode_volume_event(encode_volume_event(*v));
    if (!again || volume_event_to_json(*again) != volume_event_to_json(*v)) std::abort();
  }
  if (auto d = decode_database_event(bytes)) {
    auto again = decode_database_event(encode_database_event(*d));
    if (!again || database_event_to_json(*again) != database_event_to_json(*d)) std::abort();
  }
  if (auto t = decode_template_event(bytes)) {
    auto again = decode_template_event(encode_template_event(*t));
    if (!again || template_event_to_json(*again) != template_event_to_json(*t)) std::abort();
  }
  if (auto s = decode_state(bytes)) (void)encode_state(*s);
  return 0;
}
