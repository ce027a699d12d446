// The REST gateway's pure parsing (gateway/http_util.h): guest paths, base64 bodies, API key
// shapes, route matching and gzip upload bodies, on arbitrary text. A path it accepts is
// absolute, within its bound, without NUL; base64 round-trips; gunzip never passes its limit.
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "gateway/http_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pandastack::gateway;
  std::string text(reinterpret_cast<const char*>(data), size);
  if (!check_guest_path(text, 4096)) {  // accepted
    if (text.empty() || text[0] != '/' || text.size() > 4096 ||
        text.find('\0') != std::string::npos)
      std::abort();
  }
  if (auto d = base64_decode(text)) {
    if (base64_decode(base64_encode(*d)) != d) std::abort();
  }
  if (base64_decode(base64_encode(text)) != text) std::abort();
  (void)well_formed_key(text);
  if (auto plain = gunzip(text, 1 << 16); plain && plain->size() > (1 << 16)) std::abort();
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t i = 0; i <= text.size(); ++i)
    if (i == text.size() || text[i] == '/') {
      parts.push_back(text.substr(start, i - start));
      start = i + 1;
    }
  static const RoutePattern patterns[] = {
      RoutePattern("/v1/sandboxes/{id}/files"),
      RoutePattern("/v1/volumes/{volume_id}/snapshots/{snapshot_id}"),
      RoutePattern("/v1/sandboxes/{id}")};
  std::map<std::string, std::string> params;
  for (auto& p : patterns) (void)p.match(parts, params);
  return 0;
}
