#include "actors/image_pull.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>

#include "tools/http_client.h"
#include "tools/tar_writer.h"
#include "wire/json.h"
#include "wire/sha256.h"

namespace pandastack::actors {

namespace fs = std::filesystem;
using wire::Json;

namespace {

constexpr size_t kMaxManifestBytes = 4 << 20;
constexpr size_t kMaxLayers = 128;
constexpr int kMaxRedirects = 5;

const char* const kManifestTypes =
    "application/vnd.oci.image.index.v1+json, application/vnd.oci.image.manifest.v1+json, "
    "application/vnd.docker.distribution.manifest.list.v2+json, "
    "application/vnd.docker.distribution.manifest.v2+json";

Rejection failed(const std::string& why) { return Rejection{Code::build_failed, "pull: " + why}; }

bool lower_alnum(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); }

bool is_digest(const std::string& d) {
  return d.size() == 71 && d.starts_with("sha256:") &&
         std::all_of(d.begin() + 7, d.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

// An ustar archive written as the blobs arrive (names are short: blobs/sha256/<hex>).
class TarWriter {
 public:
  explicit TarWriter(const fs::path& p) : out_(p, std::ios::binary | std::ios::trunc) {}
  bool ok() const { return bool(out_); }
  void header(const std::string& name, uint64_t size) {
    auto h = tools::ustar_header(name, '0', size, 0644, 0);
    out_.write(h.data(), std::streamsize(h.size()));
    written_ = 0;
  }
  void data(std::string_view d) {
    out_.write(d.data(), std::streamsize(d.size()));
    written_ += d.size();
  }
  void end_file() {
    static const char zeros[512] = {};
    if (written_ % 512 != 0) out_.write(zeros, std::streamsize(512 - written_ % 512));
  }
  void file(const std::string& name, std::string_view d) {
    header(name, d.size());
    data(d);
    end_file();
  }
  bool finish() {
    static const char zeros[1024] = {};
    out_.write(zeros, 1024);
    out_.flush();
    return bool(out_);
  }
  uint64_t bytes() { return uint64_t(out_.tellp()); }

 private:
  std::ofstream out_;
  uint64_t written_ = 0;
};

bool loopback(const std::string& host) {
  return host == "localhost" || host == "127.0.0.1" || host == "::1" || host == "[::1]";
}

struct Url {
  std::string scheme, host, port, path;  // path with its query
};

std::optional<Url> parse_url(const std::string& u) {
  Url out;
  auto sep = u.find("://");
  if (sep == std::string::npos) return std::nullopt;
  out.scheme = u.substr(0, sep);
  if (out.scheme != "https" && out.scheme != "http") return std::nullopt;
  auto rest = u.substr(sep + 3);
  auto slash = rest.find('/');
  auto authority = rest.substr(0, slash);
  out.path = slash == std::string::npos ? "/" : rest.substr(slash);
  if (authority.empty() || authority.find('@') != std::string::npos) return std::nullopt;
  auto colon = authority.rfind(':');
  if (colon != std::string::npos && authority.find(']') == std::string::npos) {
    out.host = authority.substr(0, colon);
    out.port = authority.substr(colon + 1);
  } else {
    out.host = authority;
    out.port = out.scheme == "https" ? "443" : "80";
  }
  return out;
}

// The registry's HTTP API for one pull: authentication, redirects.
class Registry {
 public:
  explicit Registry(const PullJob& job) : job_(job) {
    auto [host, port] = split_host(job.ref.registry);
    bool plain = loopback(host) || std::find(job.insecure.begin(), job.insecure.end(),
                                             job.ref.registry) != job.insecure.end();
    origin_ = std::string(plain ? "http" : "https") + "://" + host + ":" +
              (port.empty() ? (plain ? "80" : "443") : port);
  }

  // GET `path` of the registry: a 200's body to `on_data` when given, else in the answer.
  Reply<tools::HttpResponse> get(const std::string& path, const std::string& accept,
                                 const std::function<void(const std::string&)>& on_data) {
    std::string url = origin_ + path;
    bool ours = true;  // (credentials go to the registry itself only, never to a redirect's host)
    for (int hop = 0; hop <= kMaxRedirects; ++hop) {
      auto r = fetch(url, accept + (ours ? auth_ : ""), on_data);
      if (!r) return r;
      if (r->status == 401 && ours && !retried_auth_) {
        retried_auth_ = true;
        if (auto no = authenticate(r->headers["www-authenticate"])) return *no;
        --hop;
        continue;
      }
      if (r->status == 301 || r->status == 302 || r->status == 303 || r->status == 307 ||
          r->status == 308) {
        auto loc = r->headers["location"];
        if (loc.starts_with("/")) loc = url.substr(0, url.find('/', url.find("://") + 3)) + loc;
        if (!parse_url(loc)) return failed("a redirect to an unusable location");
        ours = loc.rfind(origin_ + "/", 0) == 0;
        url = loc;
        continue;
      }
      return r;
    }
    return failed("more than " + std::to_string(kMaxRedirects) + " redirects");
  }

 private:
  static std::pair<std::string, std::string> split_host(const std::string& hp) {
    auto c = hp.rfind(':');
    if (c == std::string::npos || hp.find(']') != std::string::npos) return {hp, ""};
    return {hp.substr(0, c), hp.substr(c + 1)};
  }

  Reply<tools::HttpResponse> fetch(const std::string& url, const std::string& headers,
                                   const std::function<void(const std::string&)>& on_data) {
    auto u = parse_url(url);
    if (!u) return failed("not a URL: " + url.substr(0, 200));
    bool plain_ok = loopback(u->host) || std::find(job_.insecure.begin(), job_.insecure.end(),
                                                   u->host + ":" + u->port) != job_.insecure.end();
    if (u->scheme == "http" && !plain_ok)
      return failed("plain http to " + u->host + " (only https, or a loopback registry)");
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        job_.deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return Rejection{Code::timeout, "pull: the build's time ran out"};
    std::optional<tools::TlsFiles> tls;
    if (u->scheme == "https") tls = tools::TlsFiles{job_.ca_file.string(), "", ""};
    tools::HttpClient c(u->scheme + "://" + u->host + ":" + u->port, "",
                        std::min<std::chrono::milliseconds>(left, std::chrono::minutes(5)), tls);
    if (!c.valid_url()) return failed(u->host + ": " + c.setup_error());
    auto r = c.exchange(
        "GET", u->path, headers, [](int status, const auto&) { return status == 200; }, on_data);
    if (r.status == 0) return failed(u->host + ": " + r.error);
    return r;
  }

  // Docker's token flow (Bearer: a token from the realm) or Basic, with the job's credentials.
  std::optional<Rejection> authenticate(const std::string& header) {
    auto ch = parse_auth_challenge(header);
    if (!ch) return failed("the registry refused the pull (401) and named no way to sign in");
    std::string basic;
    if (!job_.username.empty() || !job_.password.empty())
      basic = tools::base64(job_.username + ":" + job_.password);
    if (ch->scheme == "basic") {
      if (basic.empty()) return failed("the registry needs credentials (registry_secret)");
      auth_ = "Authorization: Basic " + basic + "\r\n";
      return std::nullopt;
    }
    if (ch->scheme != "bearer" || ch->params["realm"].empty())
      return failed("the registry asks for sign-in by " + ch->scheme + " (not served)");
    if (job_.username.empty() && !job_.password.empty()) {  // a registry token as the secret
      auth_ = "Authorization: Bearer " + job_.password + "\r\n";
      return std::nullopt;
    }
    std::string url = ch->params["realm"];
    std::string q;
    for (auto k : {"service", "scope"})
      if (!ch->params[k].empty())
        q += (q.empty() ? "?" : "&") + std::string(k) + "=" + tools::url_encode(ch->params[k]);
    auto realm = parse_url(url);
    if (!realm || (realm->scheme != "https" && !loopback(realm->host)))
      return failed("the registry's token service is not https: " + url.substr(0, 200));
    auto r = fetch(url + q, basic.empty() ? "" : "Authorization: Basic " + basic + "\r\n", {});
    if (!r) return r.error();
    if (r->status != 200)
      return failed("the registry's token service answered " + std::to_string(r->status) +
                    (basic.empty() ? " (anonymous)" : " (with the secret's credentials)"));
    auto j = Json::parse(r->body);
    std::string token;
    if (j && j->is_object()) {
      if ((*j)["token"].is_string()) token = (*j)["token"].as_string();
      if (token.empty() && (*j)["access_token"].is_string())
        token = (*j)["access_token"].as_string();
    }
    if (token.empty() || token.size() > 16384 || token.find_first_of("\r\n") != std::string::npos)
      return failed("the registry's token service gave no token");
    auth_ = "Authorization: Bearer " + token + "\r\n";
    return std::nullopt;
  }

  const PullJob& job_;
  std::string origin_, auth_;
  bool retried_auth_ = false;
};

std::string status_reason(int status) {
  if (status == 401 || status == 403) return "not allowed (" + std::to_string(status) + ")";
  if (status == 404) return "not found (404)";
  if (status == 429) return "the registry's rate limit (429)";
  return "the registry answered " + std::to_string(status);
}

bool platform_ok(const Json& p) {
  return p.is_object() && p["os"].is_string() && p["os"].as_string() == "linux" &&
         p["architecture"].is_string() && p["architecture"].as_string() == "amd64";
}

}  // namespace

std::string ImageRef::text() const {
  return registry + "/" + repository + (reference.starts_with("sha256:") ? "@" : ":") + reference;
}

Reply<ImageRef> parse_image_ref(const std::string& text) {
  auto bad = [&](const std::string& why) -> Reply<ImageRef> {
    return Rejection{Code::invalid_argument,
                     "image: " + why +
                         " (a reference like python:3.12, ghcr.io/org/app:1 or "
                         "registry.example.com:5000/team/app@sha256:...)"};
  };
  if (text.empty() || text.size() > 512) return bad("1..512 bytes");
  for (unsigned char c : text)
    if (c <= ' ' || c >= 0x7f) return bad("no spaces or control characters");
  ImageRef r;
  std::string rest = text;
  if (auto at = rest.find('@'); at != std::string::npos) {
    r.reference = rest.substr(at + 1);
    rest.resize(at);
    if (!is_digest(r.reference)) return bad("a digest is sha256: and 64 hex digits");
  }
  auto slash = rest.find('/');
  if (slash != std::string::npos) {
    auto first = rest.substr(0, slash);
    if (first.find_first_of(".:") != std::string::npos || first == "localhost") {
      // host[:port]: a name or an address, a port of digits
      auto colon = first.rfind(':');
      auto host = colon == std::string::npos ? first : first.substr(0, colon);
      auto port = colon == std::string::npos ? std::string("1") : first.substr(colon + 1);
      if (host.empty() || port.empty() || port.size() > 5 ||
          !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
          !std::all_of(host.begin(), host.end(), [](char c) {
            return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-';
          }))
        return bad("a registry is HOST[:PORT]");
      r.registry = first;
      rest = rest.substr(slash + 1);
    }
  }
  auto last_slash = rest.rfind('/');
  auto colon = rest.rfind(':');
  if (colon != std::string::npos && (last_slash == std::string::npos || colon > last_slash)) {
    auto tag = rest.substr(colon + 1);
    rest.resize(colon);
    if (tag.empty() || tag.size() > 128 || !std::all_of(tag.begin(), tag.end(), [](char c) {
          return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-';
        }))
      return bad("a tag is 1..128 of [A-Za-z0-9_.-]");
    if (r.reference.empty()) r.reference = tag;
  }
  if (r.reference.empty()) r.reference = "latest";
  if (rest.empty()) return bad("no repository");
  for (size_t i = 0; i < rest.size(); ++i) {
    char c = rest[i];
    if (!(lower_alnum(c) || c == '.' || c == '_' || c == '-' || c == '/'))
      return bad("a repository is lower-case letters, digits, . _ - and /");
  }
  if (rest.front() == '/' || rest.back() == '/' || rest.find("//") != std::string::npos ||
      rest.find("..") != std::string::npos)
    return bad("a malformed repository");
  if (r.registry.empty() || r.registry == "docker.io" || r.registry == "index.docker.io") {
    r.registry = "registry-1.docker.io";
    if (rest.find('/') == std::string::npos) rest = "library/" + rest;
  }
  r.repository = rest;
  return r;
}

std::optional<AuthChallenge> parse_auth_challenge(const std::string& h) {
  AuthChallenge c;
  size_t i = 0;
  while (i < h.size() && h[i] != ' ')
    c.scheme += char(std::tolower(static_cast<unsigned char>(h[i++])));
  if (c.scheme.empty()) return std::nullopt;
  while (i < h.size()) {
    while (i < h.size() && (h[i] == ' ' || h[i] == ',')) ++i;
    std::string k;
    while (i < h.size() && h[i] != '=' && h[i] != ' ' && h[i] != ',')
      k += char(std::tolower(static_cast<unsigned char>(h[i++])));
    if (i >= h.size() || h[i] != '=') break;
    ++i;
    std::string v;
    if (i < h.size() && h[i] == '"') {
      for (++i; i < h.size() && h[i] != '"'; ++i) {
        if (h[i] == '\\' && i + 1 < h.size()) ++i;
        v += h[i];
      }
      ++i;
    } else {
      while (i < h.size() && h[i] != ',') v += h[i++];
    }
    if (!k.empty()) c.params[k] = v;
  }
  return c;
}

Reply<PulledImage> pull_image(const PullJob& job) {
  auto log = [&](const std::string& l) {
    if (job.log) job.log(l);
  };
  std::error_code ec;
  fs::remove(job.out, ec);
  auto fail = [&](Rejection r) -> Reply<PulledImage> {
    fs::remove(job.out, ec);
    return r;
  };
  Registry reg(job);
  const auto& ref = job.ref;
  std::string base = "/v2/" + ref.repository;
  // The manifest: an index names the linux/amd64 one.
  auto manifest_of = [&](const std::string& reference,
                         const std::string& want_digest) -> Reply<std::pair<std::string, Json>> {
    auto r = reg.get(base + "/manifests/" + reference,
                     std::string("Accept: ") + kManifestTypes + "\r\n", {});
    if (!r) return r.error();
    if (r->status != 200) return failed(ref.text() + ": the manifest: " + status_reason(r->status));
    if (r->body.size() > kMaxManifestBytes) return failed("a manifest over 4 MiB");
    auto digest = "sha256:" + wire::sha256_hex(r->body);
    if (!want_digest.empty() && digest != want_digest)
      return failed("the manifest does not match its digest " + want_digest);
    auto j = Json::parse(r->body);
    if (!j || !j->is_object()) return failed("the manifest is not JSON");
    return std::pair{r->body, *j};
  };
  auto got = manifest_of(ref.reference, is_digest(ref.reference) ? ref.reference : "");
  if (!got) return fail(got.error());
  for (int depth = 0; got->second["manifests"].is_array(); ++depth) {
    if (depth > 2) return fail(failed("indexes nested too deep"));
    std::string pick;
    for (auto& m : got->second["manifests"].as_array())
      if (m.is_object() && platform_ok(m["platform"]) && m["digest"].is_string()) {
        pick = m["digest"].as_string();
        break;
      }
    if (pick.empty() && got->second["manifests"].as_array().size() == 1 &&
        got->second["manifests"].as_array().at(0)["digest"].is_string())
      pick = got->second["manifests"].as_array().at(0)["digest"].as_string();
    if (!is_digest(pick)) return fail(failed(ref.text() + " has no linux/amd64 image"));
    got = manifest_of(pick, pick);
    if (!got) return fail(got.error());
  }
  auto& [manifest_text, manifest] = *got;
  if (manifest["schemaVersion"].is_integer() && manifest["schemaVersion"].as_int() == 1)
    return fail(failed("a schema 1 manifest (too old: not served)"));
  auto& config = manifest["config"];
  auto& layers = manifest["layers"];
  if (!config.is_object() || !layers.is_array() || layers.as_array().size() > kMaxLayers)
    return fail(failed("the manifest has no config or more than 128 layers"));
  struct Blob {
    std::string digest;
    uint64_t size;
  };
  std::vector<Blob> blobs;
  uint64_t total = manifest_text.size();
  auto blob_of = [&](const Json& d) -> std::optional<Blob> {
    if (!d.is_object() || !d["digest"].is_string() || !is_digest(d["digest"].as_string()) ||
        !d["size"].is_integer() || d["size"].as_int() < 0)
      return std::nullopt;
    if (d["mediaType"].is_string() && d["mediaType"].as_string().find("zstd") != std::string::npos)
      return std::nullopt;
    if (d.has("urls")) return std::nullopt;  // (a foreign layer, fetched from elsewhere)
    return Blob{d["digest"].as_string(), uint64_t(d["size"].as_int())};
  };
  auto cfg = blob_of(config);
  if (!cfg || cfg->size > kMaxManifestBytes)
    return fail(failed("the manifest's config is malformed"));
  blobs.push_back(*cfg);
  for (auto& l : layers.as_array()) {
    auto b = blob_of(l);
    if (!b) return fail(failed("a layer the import does not take (zstd, foreign, malformed)"));
    blobs.push_back(*b);
  }
  for (auto& b : blobs) total += b.size;
  if (total > job.max_bytes)
    return fail(failed("the image is " + std::to_string(total >> 20) + " MiB, more than the " +
                       std::to_string(job.max_bytes >> 20) + " MiB an import takes"));
  auto manifest_digest = "sha256:" + wire::sha256_hex(manifest_text);
  log("pull: " + ref.text() + ": manifest " + manifest_digest.substr(0, 19) + ", " +
      std::to_string(layers.as_array().size()) + " layers, " + std::to_string(total >> 20) +
      " MiB");

  fs::create_directories(job.out.parent_path(), ec);
  TarWriter tar(job.out);
  if (!tar.ok()) return fail(Rejection{Code::storage_error, "pull: cannot write the archive"});
  tar.file("oci-layout", R"({"imageLayoutVersion":"1.0.0"})");
  tar.file("blobs/sha256/" + manifest_digest.substr(7), manifest_text);
  for (size_t i = 0; i < blobs.size(); ++i) {
    if (job.stop.stop_requested()) return fail(Rejection{Code::unavailable, "pull: stopped"});
    auto& b = blobs[i];
    tar.header("blobs/sha256/" + b.digest.substr(7), b.size);
    wire::Sha256 h;
    uint64_t got_bytes = 0;
    bool over = false;
    auto r = reg.get(base + "/blobs/" + b.digest, "", [&](const std::string& part) {
      if (over || got_bytes + part.size() > b.size) {
        over = true;  // (the rest is read and dropped: the archive's entry stays its size)
        return;
      }
      h.add(part);
      tar.data(part);
      got_bytes += part.size();
    });
    if (!r) return fail(r.error());
    if (r->status != 200)
      return fail(failed("blob " + b.digest.substr(0, 19) + ": " + status_reason(r->status)));
    if (over || got_bytes != b.size)
      return fail(failed("blob " + b.digest.substr(0, 19) + " is not the size its manifest says"));
    if ("sha256:" + h.hex() != b.digest)
      return fail(failed("blob " + b.digest.substr(0, 19) + " does not match its digest"));
    tar.end_file();
    if (!tar.ok()) return fail(Rejection{Code::storage_error, "pull: writing the archive failed"});
    if (i > 0)
      log("pull: layer " + std::to_string(i) + "/" + std::to_string(blobs.size() - 1) + " (" +
          std::to_string(b.size >> 20) + " MiB) verified");
  }
  Json md = Json::object();
  md.set("mediaType", manifest["mediaType"].is_string()
                          ? manifest["mediaType"].as_string()
                          : std::string("application/vnd.oci.image.manifest.v1+json"));
  md.set("digest", manifest_digest);
  md.set("size", int64_t(manifest_text.size()));
  Json ann = Json::object();
  ann.set("org.opencontainers.image.ref.name", ref.text());
  md.set("annotations", ann);
  Json index = Json::object();
  index.set("schemaVersion", int64_t(2));
  Json ms = Json::array();
  ms.push(md);
  index.set("manifests", ms);
  tar.file("index.json", index.dump());
  if (!tar.finish())
    return fail(Rejection{Code::storage_error, "pull: writing the archive failed"});
  return PulledImage{manifest_digest, tar.bytes(), blobs.size() - 1};
}

}  // namespace pandastack::actors
