#include "gateway/signing.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <unistd.h>

#include <fstream>
#include <iterator>

#include "wire/base64.h"
#include "wire/sha256.h"

using pandastack::wire::base64_decode;
using pandastack::wire::base64_encode;

namespace pandastack::gateway {

std::optional<std::string> load_or_make_secret(const std::string& path, std::string* error) {
  std::ifstream in(path, std::ios::binary);
  std::string secret((std::istreambuf_iterator<char>(in)), {});
  if (secret.size() == 32) return secret;
  secret.assign(32, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(secret.data()), 32) != 1) {
    *error = "no random bytes for the secret " + path;
    return std::nullopt;
  }
  std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0 || ::write(fd, secret.data(), secret.size()) != ssize_t(secret.size()) ||
      ::fsync(fd) != 0 || ::close(fd) != 0 || ::rename(tmp.c_str(), path.c_str()) != 0) {
    if (fd >= 0) ::close(fd);
    *error = "cannot write " + path;
    return std::nullopt;
  }
  return secret;
}

std::string hmac_sha256(std::string_view key, std::string_view msg) {
  return wire::hmac_sha256(key, msg);
}

bool equal_secret(std::string_view a, std::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string b64url(std::string_view raw) {
  std::string s = base64_encode(raw);
  for (auto& c : s) {
    if (c == '+') c = '-';
    if (c == '/') c = '_';
  }
  while (!s.empty() && s.back() == '=') s.pop_back();
  return s;
}

std::optional<std::string> unb64url(std::string_view s) {
  if (s.size() > 512) return std::nullopt;
  std::string t(s);
  for (auto& c : t) {
    if (c == '-')
      c = '+';
    else if (c == '_')
      c = '/';
  }
  while (t.size() % 4) t += '=';
  return base64_decode(t);
}

}  // namespace pandastack::gateway
