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

// {"key": base64(key)}: the start of every key-addressed request.
Json key_request(const std::string& key) {
  Json p = Json::object();
  p.set("key", wire::base64_encode(key));
  return p;
}

Json lease_request(int64_t lease) {
  Json p = Json::object();
  p.set("ID", std::to_string(lease));
  return p;
}

// The first of a range answer's key-values, if any.
std::optional<EtcdKv> first_kv(const Json& kvs) {
  if (!kvs.is_array() || kvs.size() == 0) return std::nullopt;
  return read_kv(kvs.as_array()[0]);
}

bool succeeded(const Json& txn) { return txn["succeeded"].is_bool() && txn["succeeded"].as_bool(); }

Json put_request(const std::string& key, const std::string& value, int64_t lease) {
  Json p = key_request(key);
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

Etcd::Etcd(const std::string& endpoint, std::optional<tools::TlsFiles> tls,
           std::chrono::milliseconds timeout)
    : endpoint_(endpoint),
      http_(std::make_unique<tools::HttpClient>(endpoint, "", timeout, std::move(tls))) {}

const std::string& Etcd::setup_error() const { return http_->setup_error(); }

Etcd::~Etcd() = default;

bool Etcd::valid() const { return http_->valid_url(); }

Result<Json> Etcd::call(const std::string& path, const Json& request, bool first_line) {
  tools::HttpResponse r;
  {
    std::lock_guard l(mu_);
    r = http_->request("POST", path, request.dump());
  }
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
  return parse(first_line ? r.body.substr(0, r.body.find('\n')) : r.body);
}

Result<Json> Etcd::txn(Json::Array compare, Json::Array success,
                       std::optional<Json::Array> failure) {
  Json t = Json::object();
  t.set("compare", Json(std::move(compare)));
  t.set("success", Json(std::move(success)));
  if (failure) t.set("failure", Json(std::move(*failure)));
  return call("/v3/kv/txn", t);
}

Result<int64_t> Etcd::grant(std::chrono::seconds ttl) {
  Json p = Json::object();
  p.set("TTL", std::to_string(ttl.count()));
  auto j = call("/v3/lease/grant", p);
  if (!j) return j.error();
  int64_t id = as_i64((*j)["ID"]);
  if (id == 0) return make_error(ErrorCode::corrupt, "etcd granted no lease id");
  return id;
}

Result<int64_t> Etcd::keepalive(int64_t lease) {
  // The gateway streams keepalive answers: the first line is ours.
  auto j = call("/v3/lease/keepalive", lease_request(lease), true);
  if (!j) return j.error();
  const Json& res = (*j)["result"].is_object() ? (*j)["result"] : *j;
  return as_i64(res["TTL"]);
}

Status Etcd::revoke(int64_t lease) {
  auto j = call("/v3/lease/revoke", lease_request(lease));
  if (!j) return j.error();
  return Ok{};
}

Status Etcd::put(const std::string& key, const std::string& value, int64_t lease) {
  auto j = call("/v3/kv/put", put_request(key, value, lease));
  if (!j) return j.error();
  return Ok{};
}

Result<std::optional<EtcdKv>> Etcd::get(const std::string& key) {
  auto j = call("/v3/kv/range", key_request(key));
  if (!j) return j.error();
  return first_kv((*j)["kvs"]);
}

Result<std::vector<EtcdKv>> Etcd::list(const std::string& prefix, int64_t limit) {
  Json p = key_request(prefix);
  p.set("range_end", wire::base64_encode(etcd_prefix_end(prefix)));
  if (limit > 0) p.set("limit", std::to_string(limit));
  auto j = call("/v3/kv/range", p);
  if (!j) return j.error();
  std::vector<EtcdKv> out;
  if ((*j)["kvs"].is_array())
    for (auto& kv : (*j)["kvs"].as_array()) out.push_back(read_kv(kv));
  return out;
}

Status Etcd::erase(const std::string& key) {
  auto j = call("/v3/kv/deleterange", key_request(key));
  if (!j) return j.error();
  return Ok{};
}

Result<bool> Etcd::create(const std::string& key, const std::string& value, int64_t lease,
                          std::optional<EtcdKv>* current) {
  Json cmp = key_request(key);
  cmp.set("target", "CREATE");
  cmp.set("result", "EQUAL");
  cmp.set("create_revision", "0");
  Json put = Json::object();
  put.set("request_put", put_request(key, value, lease));
  Json range = Json::object();
  range.set("request_range", key_request(key));
  auto j = txn({std::move(cmp)}, {std::move(put)}, Json::Array{std::move(range)});
  if (!j) return j.error();
  bool ok = succeeded(*j);
  if (!ok && current != nullptr) {
    const Json& resp = (*j)["responses"];
    *current = resp.is_array() && resp.size() > 0
                   ? first_kv(resp.as_array()[0]["response_range"]["kvs"])
                   : std::nullopt;
  }
  return ok;
}

Result<bool> Etcd::replace(const std::string& key, const std::string& value, int64_t mod_revision) {
  return replace({{key, value, mod_revision}});
}

Result<bool> Etcd::replace(const std::vector<Replacement>& all) {
  Json::Array cmps, puts;
  for (auto& r : all) {
    Json cmp = key_request(r.key);
    cmp.set("target", "MOD");
    cmp.set("result", "EQUAL");
    cmp.set("mod_revision", std::to_string(r.mod_revision));
    cmps.push_back(std::move(cmp));
    if (r.op == Replacement::Op::check) continue;
    Json op = Json::object();
    if (r.op == Replacement::Op::erase)
      op.set("request_delete_range", key_request(r.key));
    else
      op.set("request_put", put_request(r.key, r.value, 0));
    puts.push_back(std::move(op));
  }
  auto j = txn(std::move(cmps), std::move(puts), std::nullopt);
  if (!j) return j.error();
  return succeeded(*j);
}

}  // namespace pandastack::storage
