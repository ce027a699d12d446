#include "storage/sigv4.h"

#include <algorithm>
#include <ctime>

#include "wire/hex.h"
#include "wire/sha256.h"

namespace pandastack::storage {

namespace {
std::string trim(const std::string& v) {
  size_t b = v.find_first_not_of(" \t"), e = v.find_last_not_of(" \t");
  if (b == std::string::npos) return "";
  // (inner runs of spaces become one, as AWS asks)
  std::string out;
  bool space = false;
  for (size_t i = b; i <= e; ++i) {
    if (v[i] == ' ' || v[i] == '\t') {
      space = true;
      continue;
    }
    if (space) out += ' ';
    space = false;
    out += v[i];
  }
  return out;
}

std::string signed_headers(const SigV4Request& r) {
  std::string out;
  for (auto& [name, value] : r.headers) {  // (a map: sorted by name)
    if (!out.empty()) out += ';';
    out += name;
  }
  return out;
}

std::string scope(const std::string& amz_date, const std::string& region,
                  const std::string& service) {
  return amz_date.substr(0, 8) + "/" + region + "/" + service + "/aws4_request";
}
}  // namespace

std::string aws_uri_encode(const std::string& s, bool encode_slash) {
  static const char* digits = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    bool keep = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                c == '-' || c == '_' || c == '.' || c == '~' || (c == '/' && !encode_slash);
    if (keep) {
      out += char(c);
    } else {
      out += '%';
      out += digits[c >> 4];
      out += digits[c & 15];
    }
  }
  return out;
}

std::string canonical_query(const std::vector<std::pair<std::string, std::string>>& query) {
  std::vector<std::pair<std::string, std::string>> encoded;
  for (auto& [k, v] : query) encoded.emplace_back(aws_uri_encode(k, true), aws_uri_encode(v, true));
  std::sort(encoded.begin(), encoded.end());
  std::string out;
  for (auto& [k, v] : encoded) {
    if (!out.empty()) out += '&';
    out += k + "=" + v;
  }
  return out;
}

std::string amz_date(std::chrono::system_clock::time_point t) {
  std::time_t secs = std::chrono::system_clock::to_time_t(t);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%dT%H%M%SZ", &tm);
  return buf;
}

std::string sigv4_canonical_request(const SigV4Request& r) {
  std::string headers;
  for (auto& [name, value] : r.headers) headers += name + ":" + trim(value) + "\n";
  return r.method + "\n" + (r.path.empty() ? "/" : r.path) + "\n" + canonical_query(r.query) +
         "\n" + headers + "\n" + signed_headers(r) + "\n" + r.payload_sha256;
}

std::string sigv4_string_to_sign(const SigV4Request& r, const std::string& amz_date,
                                 const std::string& region, const std::string& service) {
  return "AWS4-HMAC-SHA256\n" + amz_date + "\n" + scope(amz_date, region, service) + "\n" +
         wire::sha256_hex(sigv4_canonical_request(r));
}

std::string sigv4_signature(const SigV4Request& r, const AwsCredentials& c,
                            const std::string& amz_date, const std::string& region,
                            const std::string& service) {
  using wire::hmac_sha256;
  std::string key = hmac_sha256("AWS4" + c.secret_access_key, amz_date.substr(0, 8));
  key = hmac_sha256(key, region);
  key = hmac_sha256(key, service);
  key = hmac_sha256(key, "aws4_request");
  return wire::hex_encode(hmac_sha256(key, sigv4_string_to_sign(r, amz_date, region, service)));
}

std::string sigv4_authorization(const SigV4Request& r, const AwsCredentials& c,
                                const std::string& amz_date, const std::string& region,
                                const std::string& service) {
  return "AWS4-HMAC-SHA256 Credential=" + c.access_key_id + "/" + scope(amz_date, region, service) +
         ", SignedHeaders=" + signed_headers(r) +
         ", Signature=" + sigv4_signature(r, c, amz_date, region, service);
}

}  // namespace pandastack::storage
