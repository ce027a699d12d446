#include "storage/object_store.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

#include "tools/http_client.h"
#include "wire/sha256.h"

namespace pandastack::storage {

namespace {
std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r"), e = s.find_last_not_of(" \t\r");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

bool loopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host == "[::1]" || host.rfind("127.", 0) == 0;
}

// The text of the first <tag>...</tag> in an S3 XML answer ("" when none), entities decoded.
std::string xml_text(const std::string& xml, const std::string& tag, size_t* from = nullptr) {
  size_t start = from ? *from : 0;
  auto open = xml.find("<" + tag + ">", start);
  if (open == std::string::npos) return "";
  open += tag.size() + 2;
  auto close = xml.find("</" + tag + ">", open);
  if (close == std::string::npos) return "";
  if (from) *from = close + tag.size() + 3;
  std::string raw = xml.substr(open, close - open), out;
  static const std::pair<const char*, char> entities[] = {
      {"&amp;", '&'}, {"&lt;", '<'}, {"&gt;", '>'}, {"&quot;", '"'}, {"&apos;", '\''}};
  for (size_t i = 0; i < raw.size();) {
    bool replaced = false;
    if (raw[i] == '&')
      for (auto& [name, c] : entities)
        if (raw.compare(i, std::strlen(name), name) == 0) {
          out += c;
          i += std::strlen(name);
          replaced = true;
          break;
        }
    if (!replaced) out += raw[i++];
  }
  return out;
}

// A key as the store's path: every segment encoded, '/' kept.
bool valid_key(const std::string& key) {
  if (key.empty() || key.size() > 512 || key.front() == '/') return false;
  for (unsigned char c : key)
    if (c < 0x20 || c == 0x7f) return false;
  return true;
}
}  // namespace

Result<ObjectStoreConfig> parse_object_store(const std::string& url,
                                             const std::string& credentials_file) {
  auto bad = [&](const std::string& why) -> Result<ObjectStoreConfig> {
    return make_error(ErrorCode::invalid_argument, "--object-store " + url + ": " + why);
  };
  ObjectStoreConfig c;
  bool https = url.rfind("https://", 0) == 0;
  if (!https && url.rfind("http://", 0) != 0) return bad("not an http(s):// URL");
  std::string rest = url.substr(https ? 8 : 7);
  auto q = rest.find('?');
  std::string query = q == std::string::npos ? "" : rest.substr(q + 1);
  rest = rest.substr(0, q);
  auto slash = rest.find('/');
  if (slash == std::string::npos || slash == 0) return bad("no bucket (http(s)://HOST/BUCKET)");
  std::string host = rest.substr(0, slash);
  c.endpoint = (https ? "https://" : "http://") + host;
  std::string path = rest.substr(slash + 1);
  while (!path.empty() && path.back() == '/') path.pop_back();
  auto bucket_end = path.find('/');
  c.bucket = path.substr(0, bucket_end);
  if (bucket_end != std::string::npos) c.prefix = path.substr(bucket_end + 1) + "/";
  if (c.bucket.size() < 3 || c.bucket.size() > 63) return bad("a bucket name is 3-63 characters");
  for (char ch : c.bucket)
    if (!((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '-' || ch == '.'))
      return bad("a bucket name is lower-case letters, digits, '-' and '.'");
  if (!valid_key_prefix(c.prefix))
    return bad(
        "a key prefix is at most 256 characters: segments of letters, digits, '-', '_' and '.' "
        "(none empty, '.' or '..') separated by '/'");
  std::string hostname =
      host.substr(0, host.rfind(':') == std::string::npos || host.back() == ']' ? host.size()
                                                                                : host.rfind(':'));
  if (!https && !loopback(hostname)) return bad("plain http:// only to a loopback host");
  std::istringstream qs(query);
  for (std::string kv; std::getline(qs, kv, '&');) {
    auto eq = kv.find('=');
    std::string k = kv.substr(0, eq), v = eq == std::string::npos ? "" : kv.substr(eq + 1);
    if (k == "region" && !v.empty() && v.size() <= 32)
      c.region = v;
    else
      return bad("unknown or empty parameter '" + k + "' (only region=)");
  }
  if (credentials_file.empty())
    return bad("needs --object-store-credentials FILE (access_key_id, secret_access_key)");
  std::ifstream in(credentials_file);
  if (!in) return bad("cannot read the credentials file " + credentials_file);
  for (std::string line; std::getline(in, line);) {
    line = trim(line);
    if (line.empty() || line[0] == '#' || line[0] == '[') continue;
    auto eq = line.find('=');
    if (eq == std::string::npos) continue;
    std::string k = trim(line.substr(0, eq)), v = trim(line.substr(eq + 1));
    if (k.rfind("aws_", 0) == 0) k = k.substr(4);
    if (k == "access_key_id") c.credentials.access_key_id = v;
    if (k == "secret_access_key") c.credentials.secret_access_key = v;
  }
  if (c.credentials.access_key_id.empty() || c.credentials.secret_access_key.empty())
    return bad(credentials_file + " has no access_key_id and secret_access_key");
  return c;
}

bool valid_key_prefix(const std::string& prefix) {
  if (prefix.empty()) return true;
  if (prefix.size() > 256 || prefix.back() != '/') return false;
  size_t start = 0;
  while (start < prefix.size()) {
    size_t end = prefix.find('/', start);
    std::string seg = prefix.substr(start, end - start);
    if (seg.empty() || seg == "." || seg == "..") return false;
    for (char ch : seg)
      if (!(std::isalnum((unsigned char)ch) || ch == '-' || ch == '_' || ch == '.')) return false;
    start = end + 1;
  }
  return true;
}

struct S3Store::Answer {
  int status = 0;
  std::string body, error;  // error: transport, or the store's <Code>: <Message>
};

S3Store::S3Store(ObjectStoreConfig config) : config_(std::move(config)) {
  std::optional<tools::TlsFiles> tls;
  if (config_.endpoint.rfind("https://", 0) == 0) tls = tools::TlsFiles{config_.ca_file, "", ""};
  http_ = std::make_unique<tools::HttpClient>(config_.endpoint, "", config_.timeout, tls);
}

S3Store::~S3Store() = default;

std::unique_ptr<ObjectStore> S3Store::under(const std::string& prefix) const {
  if (!valid_key_prefix(prefix)) return nullptr;
  auto c = config_;
  c.prefix = prefix;
  return std::make_unique<S3Store>(std::move(c));
}

std::string S3Store::describe() const {
  return config_.endpoint + "/" + config_.bucket + (config_.prefix.empty() ? "" : "/") +
         config_.prefix;
}

S3Store::Answer S3Store::call(const std::string& method, const std::string& key,
                              const std::vector<std::pair<std::string, std::string>>& query,
                              const std::string& body, uint64_t max_bytes) {
  Answer a;
  if (!http_->valid_url()) {
    a.error = http_->setup_error();
    return a;
  }
  SigV4Request r;
  r.method = method;
  r.path = "/" + config_.bucket + (key.empty() ? "" : "/" + aws_uri_encode(key, false));
  r.query = query;
  r.payload_sha256 = wire::sha256_hex(body);
  std::string date = amz_date(std::chrono::system_clock::now());
  r.headers = {
      {"host", http_->host()}, {"x-amz-content-sha256", r.payload_sha256}, {"x-amz-date", date}};
  std::string headers = "x-amz-content-sha256: " + r.payload_sha256 + "\r\nx-amz-date: " + date +
                        "\r\nAuthorization: " +
                        sigv4_authorization(r, config_.credentials, date, config_.region, "s3") +
                        "\r\n";
  std::string target = r.path;
  if (!query.empty()) target += "?" + canonical_query(query);
  std::lock_guard l(mu_);
  auto resp = http_->send(method, target, body, "application/octet-stream", headers, max_bytes);
  a.status = resp.status;
  a.body = std::move(resp.body);
  if (resp.status == 0) {
    a.error = "the object store at " + config_.endpoint + " is unreachable: " + resp.error;
  } else if (resp.status >= 300) {
    auto code = xml_text(a.body, "Code"), message = xml_text(a.body, "Message");
    a.error = method + " " + key + ": HTTP " + std::to_string(resp.status) +
              (code.empty() ? "" : " " + code) + (message.empty() ? "" : ": " + message);
  }
  return a;
}

Status S3Store::put(const std::string& key, const std::string& bytes) {
  if (!valid_key(key)) return make_error(ErrorCode::invalid_argument, "bad object key " + key);
  auto a = call("PUT", config_.prefix + key, {}, bytes, 1 << 20);
  if (a.status == 200) return Ok{};
  return make_error(ErrorCode::io_error,
                    a.error.empty() ? "PUT answered " + std::to_string(a.status) : a.error);
}

Result<std::string> S3Store::get(const std::string& key, uint64_t max_bytes) {
  if (!valid_key(key)) return make_error(ErrorCode::invalid_argument, "bad object key " + key);
  auto a = call("GET", config_.prefix + key, {}, "", max_bytes);
  if (a.status == 200) return std::move(a.body);
  if (a.status == 404)
    return make_error(ErrorCode::not_found, "no object " + key + " in " + describe());
  if (a.status == 0 && a.error.find("larger than") != std::string::npos)
    return make_error(ErrorCode::invalid_argument,
                      key + " is larger than " + std::to_string(max_bytes) + " bytes");
  return make_error(ErrorCode::io_error, a.error);
}

Result<bool> S3Store::exists(const std::string& key) {
  if (!valid_key(key)) return make_error(ErrorCode::invalid_argument, "bad object key " + key);
  auto a = call("HEAD", config_.prefix + key, {}, "", 0);
  if (a.status == 200) return true;
  if (a.status == 404) return false;
  return make_error(ErrorCode::io_error, a.error);
}

Status S3Store::remove(const std::string& key) {
  if (!valid_key(key)) return make_error(ErrorCode::invalid_argument, "bad object key " + key);
  auto a = call("DELETE", config_.prefix + key, {}, "", 1 << 20);
  if (a.status == 204 || a.status == 200 || a.status == 404) return Ok{};
  return make_error(ErrorCode::io_error, a.error);
}

Result<std::vector<std::string>> S3Store::list(const std::string& prefix) {
  std::vector<std::string> keys;
  std::string token;
  for (int page = 0; page < 100000; ++page) {
    std::vector<std::pair<std::string, std::string>> q = {{"list-type", "2"},
                                                          {"prefix", config_.prefix + prefix}};
    if (!token.empty()) q.emplace_back("continuation-token", token);
    auto a = call("GET", "", q, "", 16 << 20);
    if (a.status != 200) return make_error(ErrorCode::io_error, a.error);
    size_t at = 0;
    for (;;) {
      auto key = xml_text(a.body, "Key", &at);
      if (key.empty()) break;
      if (key.rfind(config_.prefix, 0) == 0) keys.push_back(key.substr(config_.prefix.size()));
    }
    if (xml_text(a.body, "IsTruncated") != "true") break;
    token = xml_text(a.body, "NextContinuationToken");
    if (token.empty()) break;
  }
  std::sort(keys.begin(), keys.end());
  return keys;
}

}  // namespace pandastack::storage
