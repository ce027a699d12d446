// Secrets: create, list, get, rotate (PATCH), delete. A secret's value goes in and is never
// answered, logged or recorded as an event (actors/secrets.h, storage/secrets.h).
#include "actors/secrets.h"
#include "gateway/server.h"

namespace pandastack::gateway {

namespace {

using M = kj::HttpMethod;

Json secret_json(const storage::SecretInfo& s) {
  Json j = Json::object();
  j.set("name", s.name);
  Json hosts = Json::array();
  for (auto& h : s.hosts) hosts.push(Json(h));
  j.set("hosts", hosts);
  j.set("version", int64_t(s.version));
  j.set("created_at_ms", s.created_ms);
  j.set("updated_at_ms", s.updated_ms);
  j.set("expires_at_ms", s.expires_ms ? Json(s.expires_ms) : Json());
  Json into = Json::array();
  for (auto& p : s.use.places()) into.push(Json(p));
  j.set("inject_into", into);
  j.set("allow_plain_http", s.use.allow_plain_http);
  return j;
}

actors::SecretRequest request(Call& c, const Fields& f) {
  actors::SecretRequest r;
  r.tenant = c.tenant();
  if (f.has("value")) r.value = f.str("value");
  if (f.has("hosts")) r.hosts = f.string_list("hosts");
  if (f.has("ttl_seconds"))
    r.ttl_seconds = uint32_t(f.integer("ttl_seconds", 0, 1, actors::Secrets::kMaxTtlSeconds));
  // Headers always; query strings and bodies when asked; plain HTTP when allowed.
  if (f.has("inject_into")) {
    bool headers = false, query = false, body = false;
    for (auto& w : f.string_list("inject_into")) {
      if (w == "headers")
        headers = true;
      else if (w == "query")
        query = true;
      else if (w == "body")
        body = true;
      else
        throw ApiError{Code::invalid_argument,
                       "inject_into: \"" + w + "\" is not one of headers, query, body"};
    }
    if (!headers)
      throw ApiError{Code::invalid_argument,
                     "inject_into names \"headers\" (a value always goes into headers), and "
                     "optionally \"query\" and \"body\""};
    r.inject_into = std::make_pair(query, body);
  }
  if (f.has("allow_plain_http")) r.allow_plain_http = f.boolean("allow_plain_http");
  return r;
}

HttpReply create(Call& c) {
  Fields f(c.r.json(),
           {"name", "value", "hosts", "ttl_seconds", "inject_into", "allow_plain_http"});
  auto r = request(c, f);
  r.name = f.str("name");
  return json_reply(201, secret_json(unwrap(c.gw.rt.secrets().create(r))));
}

HttpReply change(Call& c) {
  Fields f(c.r.json(), {"value", "hosts", "ttl_seconds", "inject_into", "allow_plain_http"});
  auto r = request(c, f);
  r.name = c.r.param("name");
  return json_reply(200, secret_json(unwrap(c.gw.rt.secrets().update(r))));
}

}  // namespace

std::vector<Route> secret_routes() {
  return {
      route(M::POST, "/v1/secrets",
            "Store a secret {name, value, hosts, ttl_seconds?} (its value is never answered)",
            create),
      route(M::GET, "/v1/secrets", "This tenant's secrets: names, hosts, expiry (never values)",
            [](Call& c) {
              return list_reply("secrets", unwrap(c.gw.rt.secrets().list(c.tenant())), secret_json);
            }),
      route(M::GET, "/v1/secrets/{name}", "One secret (never its value)",
            [](Call& c) {
              return json_reply(
                  200, secret_json(unwrap(c.gw.rt.secrets().get(c.tenant(), c.r.param("name")))));
            }),
      route(M::PATCH, "/v1/secrets/{name}",
            "Rotate a secret's value (version + 1) and/or replace its hosts or ttl_seconds",
            change),
      route(M::DELETE, "/v1/secrets/{name}", "Delete a secret",
            [](Call& c) {
              unwrap(c.gw.rt.secrets().remove(c.tenant(), c.r.param("name")));
              return no_content();
            }),
  };
}

}  // namespace pandastack::gateway
