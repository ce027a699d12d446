// The dashboard (gateway/dashboard/): a single-page app compiled into the daemon, served at `/`
// and `/ui/<file>` without a key (it holds no data; every call it makes carries the key the user
// signs in with, kept in the tab's session storage). A strict Content-Security-Policy: its own
// scripts and styles only, connections to this origin only, never framed.
#include "gateway/dashboard_files.h"
#include "gateway/server.h"

namespace pandastack::gateway {

namespace {

const dashboard::File* find(std::string_view name) {
  for (auto& f : dashboard::kFiles)
    if (f.name == name) return &f;
  return nullptr;
}

HttpReply serve_file(const dashboard::File& f) {
  HttpReply r{200, std::string(f.type), std::string(f.data), std::nullopt, {}};
  r.headers.push_back({"Content-Security-Policy",
                       "default-src 'none'; script-src 'self'; style-src 'self'; "
                       "connect-src 'self'; img-src 'self' data: blob:; base-uri 'none'; "
                       "form-action 'none'; frame-ancestors 'none'"});
  r.headers.push_back({"X-Content-Type-Options", "nosniff"});
  r.headers.push_back({"Referrer-Policy", "no-referrer"});
  r.headers.push_back({"Cache-Control", "no-cache"});
  return r;
}

}  // namespace

std::vector<Route> dashboard_routes() {
  using M = kj::HttpMethod;
  auto index = [](Call&) { return serve_file(*find("index.html")); };
  std::vector<Route> routes = {
      route(M::GET, "/", "The dashboard", index, {}, Route::Kind::json, false),
      route(M::GET, "/ui", "The dashboard", index, {}, Route::Kind::json, false),
      // A file of it, or (any other name: a deep link) the page itself.
      route(
          M::GET, "/ui/{file}", "The dashboard's files",
          [](Call& c) {
            auto* f = find(c.r.param("file"));
            return serve_file(f ? *f : *find("index.html"));
          },
          {}, Route::Kind::json, false),
  };
  for (auto& r : routes) r.on_loop = true;  // (no runtime call: answered on the loop)
  return routes;
}

}  // namespace pandastack::gateway
