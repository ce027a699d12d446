// E2B's Secret API (`Secret.create/update/getInfo/list/exists/destroy` of the `e2b` SDK) on our
// secrets (actors/secrets.h): a secret made here has an E2B name (lower-cased, as E2B stores them)
// and no hosts of its own, since E2B's secrets go where a sandbox's network rules send them
// (`${e2b.secrets.NAME}` in a rule's headers: gateway/e2b_api.cc, actors/header_rules.h); a
// native create's `secrets` (an environment variable's placeholder) refuses it (400).
//
// E2B's shape: {secretID, name, currentVersion, metadata, createdAt, updatedAt}; the id is
// "sec_" + the name, and both name a secret in a path. Metadata is not kept (501 when given).
#include <algorithm>
#include <cstring>

#include "actors/secrets.h"
#include "gateway/e2b.h"
#include "gateway/http_util.h"
#include "gateway/server.h"

namespace pandastack::gateway {

namespace {

using M = kj::HttpMethod;
using namespace e2b;

constexpr const char* kIdPrefix = actors::Secrets::kE2bIdPrefix;

Json secret_obj(const storage::SecretInfo& s) {
  Json j = Json::object();
  j.set("secretID", kIdPrefix + s.name);
  j.set("name", s.name);
  j.set("currentVersion", int64_t(s.version));
  j.set("metadata", Json::object());
  j.set("createdAt", rfc3339(s.created_ms));
  j.set("updatedAt", rfc3339(s.updated_ms));
  return j;
}

// The secret a path names: by its name, or by its id ("sec_" + name).
storage::SecretInfo find(Call& c) {
  const std::string& ref = c.r.param("secret");
  auto& secrets = c.gw.rt.secrets();
  auto by_name = secrets.get(c.tenant(), ascii_lower(ref));
  if (by_name) return *by_name;
  if (ref.rfind(kIdPrefix, 0) == 0)
    if (auto by_id = secrets.get(c.tenant(), ref.substr(std::strlen(kIdPrefix)))) return *by_id;
  throw ApiError{Code::secret_not_found, "no secret " + ref.substr(0, 64)};
}

void no_metadata(const Json& b) {
  if (b["metadata"].is_object() && !b["metadata"].as_object().empty())
    throw ApiError{Code::not_implemented, "a secret's metadata is not kept here"};
}

std::string value_of(const Json& b) {
  if (!b["value"].is_string()) throw ApiError{Code::invalid_argument, "value is required"};
  return b["value"].as_string();
}

HttpReply create(Call& c) {
  Json b = c.r.json();
  no_metadata(b);
  if (!b["name"].is_string()) throw ApiError{Code::invalid_argument, "name is required"};
  actors::SecretRequest r;
  r.tenant = c.tenant();
  r.name = ascii_lower(b["name"].as_string());
  r.value = value_of(b);
  r.e2b = true;
  return json_reply(201, secret_obj(unwrap(c.gw.rt.secrets().create(r))));
}

HttpReply update(Call& c) {
  Json b = c.r.json();
  no_metadata(b);
  actors::SecretRequest r;
  r.tenant = c.tenant();
  r.name = find(c).name;
  r.value = value_of(b);
  return json_reply(200, secret_obj(unwrap(c.gw.rt.secrets().update(r))));
}

// Pages by name: `nextToken` is the last name of the previous page.
HttpReply list(Call& c) {
  auto all = unwrap(c.gw.rt.secrets().list(c.tenant()));
  std::sort(all.begin(), all.end(), [](auto& a, auto& b) { return a.name < b.name; });
  size_t limit = size_t(query_int(c.r, "limit", 100, 100));
  if (limit == 0) throw ApiError{Code::invalid_argument, "limit is 1..100"};
  std::string after = c.r.q("nextToken").value_or("");
  Json out = Json::array();
  std::string last;
  bool more = false;
  for (auto& s : all) {
    if (!after.empty() && s.name <= after) continue;
    if (out.size() == limit) {
      more = true;
      break;
    }
    out.push(secret_obj(s));
    last = s.name;
  }
  auto reply = json_reply(200, out);
  if (more) reply.headers.emplace_back("X-Next-Token", last);
  return reply;
}

}  // namespace

std::vector<Route> e2b_secret_routes() {
  return {
      api_route(M::POST, "/secrets", "E2B: create a secret (Secret.create)", create),
      api_route(M::GET, "/secrets", "E2B: the secrets (Secret.list), by name", list,
                {"limit", "nextToken"}),
      api_route(M::GET, "/secrets/{secret}", "E2B: one secret by id or name (Secret.getInfo)",
                [](Call& c) { return json_reply(200, secret_obj(find(c))); }),
      api_route(M::POST, "/secrets/{secret}", "E2B: a secret's new value (Secret.update)", update),
      api_route(M::DELETE, "/secrets/{secret}", "E2B: delete a secret (Secret.destroy)",
                [](Call& c) {
                  unwrap(c.gw.rt.secrets().remove(c.tenant(), find(c).name));
                  return no_content();
                }),
  };
}

}  // namespace pandastack::gateway
