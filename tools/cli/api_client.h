// The CLI's client of the REST API (tools/cli/api_commands.cc, resource_commands.cc): calls that
// print the API's error and exit 1 when it refuses, and the commands each group of the CLI runs.
#pragma once

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tools/cli/api_options.h"
#include "tools/http_client.h"
#include "wire/json.h"

namespace pandastack::cli {

using wire::Json;

class Api {
 public:
  explicit Api(const Opts& o)
      : http_(o.flags.count("--url")               ? o.flags.at("--url")
              : std::getenv("PANDASTACK_BASE_URL") ? std::getenv("PANDASTACK_BASE_URL")
                                                   : "http://127.0.0.1:7070",
              o.flags.count("--key")              ? o.flags.at("--key")
              : std::getenv("PANDASTACK_API_KEY") ? std::getenv("PANDASTACK_API_KEY")
                                                  : "",
              // A reply may take as long as the command it waits for (--timeout).
              std::chrono::seconds(o.flags.count("--timeout") ? seconds_flag(o, "--timeout") + 60
                                                              : 300)) {
    bool have_key = o.flags.count("--key") ||
                    (std::getenv("PANDASTACK_API_KEY") && *std::getenv("PANDASTACK_API_KEY"));
    if (!have_key) {
      std::fprintf(stderr,
                   "pandastack: no API key: set PANDASTACK_API_KEY or pass --key (make run prints "
                   "one and keeps it in var/api-key)\n");
      std::exit(2);
    }
  }

  // The response body on 2xx; otherwise prints the error and exits 1.
  std::string call(const std::string& method, const std::string& path, const std::string& body = "",
                   const std::string& type = "application/json") {
    auto r = http_.request(method, path, body, type);
    if (r.status >= 200 && r.status < 300) return r.body;
    fail(r);
  }
  Json json(const std::string& method, const std::string& path, const std::string& body = "") {
    auto text = call(method, path, body);
    auto j = Json::parse(text);
    return j ? *j : Json();
  }
  [[noreturn]] static void fail(const tools::HttpResponse& r) {
    if (r.status == 0) {
      std::fprintf(stderr, "pandastack: connection_error: %s\n", r.error.c_str());
    } else if (auto j = Json::parse(r.body); j && (*j)["error"].is_object()) {
      std::fprintf(stderr, "pandastack: %s: %s\n", (*j)["error"]["code"].as_string().c_str(),
                   (*j)["error"]["message"].as_string().c_str());
    } else {
      std::fprintf(stderr, "pandastack: HTTP %d\n", r.status);
    }
    std::exit(1);
  }
  tools::HttpClient& http() { return http_; }

 private:
  tools::HttpClient http_;
};

// Exits 2 with the usage unless `o` has exactly `n` positional words (`what`: the command).
void need_args(const Opts& o, size_t n, const std::string& what);

// `sandbox exec` (and `db psql`): the command's output streamed live; its exit code.
int exec(Api& api, const Opts& o, const std::string& id);

// `pandastack db|secret|volume VERB ...` (resource_commands.cc).
int db_command(Api& api, const Opts& o, const std::string& verb);
int secret_command(Api& api, const Opts& o, const std::string& verb);
int volume_command(Api& api, const Opts& o, const std::string& verb);

}  // namespace pandastack::cli
