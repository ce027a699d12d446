#include "storage/etcd.h"

#include <cstdlib>

#include "tools/http_client.h"
#include "wire/base64.h"
#include "wire/json.h"

namespace pandastack::storage {

using wire::Json;

namespace {

// etcd's gateway writes 64-bit integers as strings ("revision":"12"); absent means 0.
int64_t as_i64(const Json& j) {
  if (j.is_string()) return std::strtoll(j.as_string().c_str(), nullptr, 10);
  if (j.is_number()) return j.as_int();
  return 0;
}

Result<Json> parse(const std::string& body) {
  auto j = Json::parse(body);
  if (!j || !j->is_object())
    return make_error(ErrorCode::corrupt, "etcd answered something that is not a JSON object");
  return *j;
}

EtcdKv read_kv(const Json& kv) {
  EtcdKv out;
  out.key = wire::base64_decode(kv["key"].as_string()).value_or("");
  out.value = wire::base64_decode(kv["value"].as_string()).value_or("");
  out.create_revision = as_i64(kv["create_revision"]);
  out.mod_revision = as_i64(kv["mod_revision"]);
  out.lease = as_i64(kv["lease"]);
  return out;
}

Json put_request(const std::string& key, const std::string& value, int64_t lease) {
  Json p = Json::object();
  p.set("key", wire::base64_encode(key));
  p.set("value", wire::base64_encode(value));
  if (lease != 0) p.set("lease", std::to_string(lease));
  return p;
}

}  // namespace

std::string etcd_prefix_end(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    if (static_cast<unsigned char>(end.back()) < 0xff) {
      end.back() = char(static_cast<unsigned char>(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

Etcd::Etcd(const std::string& endpoint, std::chrono::milliseconds timeout)
    : endpoint_(endpoint), http_(std::make_unique<tools::HttpClient>(endpoint, "", timeout)) {}

Etcd::~Etcd() = default;

bool Etcd::valid() const { return http_->valid_url(); }

Result<std::string> Etcd::call(const std::string& path, const std::string& body) {
  std::lock_guard l(mu_);
  auto r = http_->request("POST", path, body);
  if (r.status == 0)
    return make_error(ErrorCode::io_error, "etcd at " + endpoint_ + ": " + r.error);
  if (r.status != 200) {
    auto j = Json::parse(r.body);
    std::string msg = j && j->is_object() && (*j)["message"].is_string()
                          ? (*j)["message"].as_string()
                          : r.body.substr(0, 200);
    return make_error(r.status == 404 ? ErrorCode::not_found : ErrorCode::io_error,
                      "etcd " + path + ": HTTP " + std::to_string(r.status) + ": " + msg);
  }
  return std::move(r.body);
}

Result<int64_t> Etcd::grant(std::chrono::seconds ttl) {
  Json p = Json::object();
  p.set("TTL", std::to_string(ttl.count()));
  auto r = call("/v3/lease/grant", p.dump());
  if (!r) return r.error();
  auto j = parse(*r);
  if (!j) return j.error();
  int64_t id = as_i64((*j)["ID"]);
  if (id == 0) return make_error(ErrorCode::corrupt, "etcd granted no lease id");
  return id;
}

Result<int64_t> Etcd::keepalive(int64_t lease) {
  Json p = Json::object();
  p.set("ID", std::to_string(lease));
  auto r = call("/v3/lease/keepalive", p.dump());
  if (!r) return r.error();
  // The gateway streams keepalive answers: the first line is ours.
  auto line = r->substr(0, r->find('\n'));
  auto j = parse(line);
  if (!j) return j.error();
  const Json& res = (*j)["result"].is_object() ? (*j)["result"] : *j;
  return as_i64(res["TTL"]);
}

Status Etcd::revoke(int64_t lease) {
  Json p = Json::object();
  p.set("ID", std::to_string(lease));
  auto r = call("/v3/lease/revoke", p.dump());
  if (!r) return r.error();
  return Ok{};
}

Status Etcd::put(const std::string& key, const std::string& value, int64_t lease) {
  auto r = call("/v3/kv/put", put_request(key, value, lease).dump());
  if (!r) return r.error();
  return Ok{};
}

Result<std::optional<EtcdKv>> Etcd::get(const std::string& key) {
  Json p = Json::object();
  p.set("key", wire::base64_encode(key));
  auto r = call("/v3/kv/range", p.dump());
  if (!r) return r.error();
  auto j = parse(*r);
  if (!j) return j.error();
  const Json& kvs = (*j)["kvs"];
  if (!kvs.is_array() || kvs.size() == 0) return std::optional<EtcdKv>();
  return std::optional<EtcdKv>(read_kv(kvs.as_array()[0]));
}

Result<std::vector<EtcdKv>> Etcd::list(const std::string& prefix, int64_t limit) {
  Json p = Json::object();
  p.set("key", wire::base64_encode(prefix));
  p.set("range_end", wire::base64_encode(etcd_prefix_end(prefix)));
  if (limit > 0) p.set("limit", std::to_string(limit));
  auto r = call("/v3/kv/range", p.dump());
  if (!r) return r.error();
  auto j = parse(*r);
  if (!j) return j.error();
  std::vector<EtcdKv> out;
  if ((*j)["kvs"].is_array())
    for (auto& kv : (*j)["kvs"].as_array()) out.push_back(read_kv(kv));
  return out;
}

Status Etcd::erase(const std::string& key) {
  Json p = Json::object();
  p.set("key", wire::base64_encode(key));
  auto r = call("/v3/kv/deleterange", p.dump());
  if (!r) return r.error();
  return Ok{};
}

Result<bool> Etcd::create(const std::string& key, const std::string& value, int64_t lease,
                          std::optional<EtcdKv>* current) {
  Json cmp = Json::object();
  cmp.set("key", wire::base64_encode(key));
  cmp.set("target", "CREATE");
  cmp.set("result", "EQUAL");
  cmp.set("create_revision", "0");
  Json put = Json::object();
  put.set("request_put", put_request(key, value, lease));
  Json range = Json::object();
  Json get = Json::object();
  get.set("key", wire::base64_encode(key));
  range.set("request_range", get);
  Json t = Json::object();
  t.set("compare", Json(Json::Array{cmp}));
  t.set("success", Json(Json::Array{put}));
  t.set("failure", Json(Json::Array{range}));
  auto r = call("/v3/kv/txn", t.dump());
  if (!r) return r.error();
  auto j = parse(*r);
  if (!j) return j.error();
  bool ok = (*j)["succeeded"].is_bool() && (*j)["succeeded"].as_bool();
  if (!ok && current != nullptr) {
    current->reset();
    const Json& resp = (*j)["responses"];
    if (resp.is_array() && resp.size() > 0) {
      const Json& kvs = resp.as_array()[0]["response_range"]["kvs"];
      if (kvs.is_array() && kvs.size() > 0) *current = read_kv(kvs.as_array()[0]);
    }
  }
  return ok;
}

Result<bool> Etcd::replace(const std::string& key, const std::string& value, int64_t mod_revision) {
  Json cmp = Json::object();
  cmp.set("key", wire::base64_encode(key));
  cmp.set("target", "MOD");
  cmp.set("result", "EQUAL");
  cmp.set("mod_revision", std::to_string(mod_revision));
  Json put = Json::object();
  put.set("request_put", put_request(key, value, 0));
  Json t = Json::object();
  t.set("compare", Json(Json::Array{cmp}));
  t.set("success", Json(Json::Array{put}));
  auto r = call("/v3/kv/txn", t.dump());
  if (!r) return r.error();
  auto j = parse(*r);
  if (!j) return j.error();
  return (*j)["succeeded"].is_bool() && (*j)["succeeded"].as_bool();
}

}  // namespace pandastack::storage
