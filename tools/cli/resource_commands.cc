// `pandastack db|secret|volume ...`: a tenant's managed databases, secrets and volumes from the
// shell (the API's JSON with --json, else a table or plain text).
#include <cstdio>
#include <sstream>
#include <string>

#include "tools/cli/api_client.h"
#include "tools/cli/api_output.h"

namespace pandastack::cli {

int db_command(Api& api, const Opts& o, const std::string& verb) {
  auto need = [&](size_t n) { need_args(o, n, "db " + verb); };
  auto uri = [&](const Json& d) {
    if (o.json) return std::printf("%s\n", d.dump().c_str()), 0;
    return std::printf("%s\n", d["connection_uri"].as_string().c_str()), 0;
  };
  if (verb == "create") {
    need(1);
    Json body = Json::object();
    body.set("name", o.pos[0]);
    if (!o.metadata.empty()) {
      Json m = Json::object();
      for (auto& [k, v] : pairs(o.metadata, "--metadata")) m.set(k, v);
      body.set("metadata", m);
    }
    return uri(api.json("POST", "/v1/databases", body.dump()));
  }
  if (verb == "restore") {
    need(2);
    Json body = Json::object();
    body.set("from_backup", o.pos[0]);
    body.set("name", o.pos[1]);
    return uri(api.json("POST", "/v1/databases", body.dump()));
  }
  if (verb == "list") {
    need(0);
    auto r = api.json("GET", "/v1/databases");
    if (o.json) return std::printf("%s\n", r["databases"].dump().c_str()), 0;
    std::printf("%-20s %-16s %-11s %s\n", "DATABASE", "NAME", "STATUS", "URI (no password)");
    for (auto& d : r["databases"].as_array())
      std::printf("%-20s %-16s %-11s %s\n", d["id"].as_string().c_str(),
                  d["name"].as_string().c_str(), d["status"].as_string().c_str(),
                  d["connection_uri"].as_string().c_str());
    return 0;
  }
  need(verb == "backup-delete" ? 2 : 1);
  auto path = "/v1/databases/" + tools::url_encode(o.pos[0]);
  if (verb == "get") {
    auto d = api.json("GET", path);
    if (o.json) return std::printf("%s\n", d.dump().c_str()), 0;
    std::printf(
        "id:        %s\nname:      %s\nstatus:    %s\nuri:       %s\nsandbox:   %s\n"
        "volume:    %s\ncreated:   %s\nbackups:   %zu\n",
        d["id"].as_string().c_str(), d["name"].as_string().c_str(), d["status"].as_string().c_str(),
        d["connection_uri"].as_string().c_str(), d["sandbox"].as_string().c_str(),
        d["volume"].as_string().c_str(), when(d["created_at_ms"].as_int()).c_str(),
        d["backups"].as_array().size());
    if (d["failure_reason"].is_string())
      std::printf("failure:   %s\n", d["failure_reason"].as_string().c_str());
    return 0;
  }
  if (verb == "delete") return api.json("DELETE", path), 0;
  if (verb == "hibernate" || verb == "wake") return api.json("POST", path + "/" + verb, "{}"), 0;
  if (verb == "rotate-password") return uri(api.json("POST", path + "/rotate-password", "{}"));
  if (verb == "backup") {
    auto r = api.json("POST", path + "/backups", "{}");
    if (o.json) return std::printf("%s\n", r.dump().c_str()), 0;
    return std::printf("%s\n", r["id"].as_string().c_str()), 0;
  }
  if (verb == "backups") {
    auto r = api.json("GET", path + "/backups");
    if (o.json) return std::printf("%s\n", r["backups"].dump().c_str()), 0;
    std::printf("%-20s %12s %s\n", "BACKUP", "BYTES", "CREATED");
    for (auto& b : r["backups"].as_array())
      std::printf("%-20s %12lld %s\n", b["id"].as_string().c_str(), (long long)b["bytes"].as_int(),
                  when(b["created_at_ms"].as_int()).c_str());
    return 0;
  }
  if (verb == "backup-delete") {
    return api.json("DELETE", path + "/backups/" + tools::url_encode(o.pos[1])), 0;
  }
  if (verb == "psql") {
    auto d = api.json("GET", path);
    Opts p = o;
    p.cmd = {"runuser", "-u", "postgres", "--", "psql", "-d", d["database"].as_string()};
    for (auto& a : o.cmd) p.cmd.push_back(a);
    return exec(api, p, d["sandbox"].as_string());
  }
  if (verb == "logs") {
    std::string lines = o.flags.count("--lines") ? o.flags.at("--lines") : "200";
    auto r = api.json("GET", path + "/logs?lines=" + tools::url_encode(lines));
    return std::fputs(r["log"].as_string().c_str(), stdout), 0;
  }
  usage("unknown db command " + verb);
}

int secret_command(Api& api, const Opts& o, const std::string& verb) {
  auto need = [&](size_t n) { need_args(o, n, "secret " + verb); };
  auto show = [&](const Json& v) {
    if (o.json) return std::printf("%s\n", v.dump().c_str()), 0;
    return std::printf("%s version %lld\n", v["name"].as_string().c_str(),
                       (long long)v["version"].as_int()),
           0;
  };
  // The value from stdin (a pipe or a prompt), never argv: it would show in `ps`.
  auto value = [&] {
    std::string v;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, stdin)) > 0 && v.size() <= 16384) v.append(buf, n);
    while (!v.empty() && (v.back() == '\n' || v.back() == '\r')) v.pop_back();
    if (v.empty()) usage("secret " + verb + ": give the value on stdin");
    return v;
  };
  if (verb == "list") {
    need(0);
    auto r = api.json("GET", "/v1/secrets");
    if (o.json) return std::printf("%s\n", r["secrets"].dump().c_str()), 0;
    std::printf("%-24s %-8s %s\n", "NAME", "VERSION", "HOSTS");
    for (auto& v : r["secrets"].as_array()) {
      std::string hosts;
      for (auto& h : v["hosts"].as_array()) hosts += (hosts.empty() ? "" : ", ") + h.as_string();
      std::printf("%-24s %-8lld %s\n", v["name"].as_string().c_str(),
                  (long long)v["version"].as_int(), hosts.c_str());
    }
    return 0;
  }
  need(1);
  std::string path = "/v1/secrets/" + tools::url_encode(o.pos[0]);
  if (verb == "create") {
    if (o.hosts.empty()) usage("secret create needs --host (where the value may be sent)");
    Json body = Json::object();
    body.set("name", o.pos[0]);
    body.set("value", value());
    Json hosts = Json::array();
    for (auto& h : o.hosts) hosts.push(h);
    body.set("hosts", hosts);
    if (o.flags.count("--ttl")) body.set("ttl_seconds", seconds_flag(o, "--ttl"));
    if (o.flags.count("--inject-into")) {
      Json into = Json::array();
      std::string item;
      std::istringstream in(o.flags.at("--inject-into"));
      while (std::getline(in, item, ','))
        if (!item.empty()) into.push(Json(item));
      body.set("inject_into", into);
    }
    if (o.flags.count("--allow-plain-http")) body.set("allow_plain_http", true);
    return show(api.json("POST", "/v1/secrets", body.dump()));
  }
  if (verb == "rotate") {
    Json body = Json::object();
    body.set("value", value());
    return show(api.json("PATCH", path, body.dump()));
  }
  if (verb == "get") return show(api.json("GET", path));
  if (verb == "delete") return api.json("DELETE", path), 0;
  usage("unknown secret command " + verb);
}

int volume_command(Api& api, const Opts& o, const std::string& verb) {
  auto need = [&](size_t n) { need_args(o, n, "volume " + verb); };
  auto metadata = [&] {
    Json m = Json::object();
    for (auto& [k, v] : pairs(o.metadata, "--metadata")) m.set(k, v);
    return m;
  };
  auto show = [&](const Json& v) {
    if (o.json) return std::printf("%s\n", v.dump().c_str()), 0;
    return std::printf("%s\n", v["id"].as_string().c_str()), 0;
  };
  if (verb == "create") {
    need(0);
    bool from = o.flags.count("--from-snapshot");
    if (!o.flags.count("--size") && !from) usage("volume create needs --size MIB");
    Json body = Json::object();
    if (from) body.set("from_snapshot", o.flags.at("--from-snapshot"));
    if (o.flags.count("--size")) body.set("size_mib", seconds_flag(o, "--size"));
    if (o.flags.count("--name")) body.set("name", o.flags.at("--name"));
    if (!o.metadata.empty()) body.set("metadata", metadata());
    return show(api.json("POST", "/v1/volumes", body.dump()));
  }
  if (verb == "list") {
    need(0);
    std::string q;
    for (auto& [k, v] : pairs(o.metadata, "--metadata"))
      q += (q.empty() ? "?" : "&") + ("metadata." + tools::url_encode(k)) + "=" +
           tools::url_encode(v);
    auto r = api.json("GET", "/v1/volumes" + q);
    if (o.json) return std::printf("%s\n", r["volumes"].dump().c_str()), 0;
    std::printf("%-22s %-16s %10s  %s\n", "VOLUME", "NAME", "SIZE_MIB", "ATTACHED TO");
    for (auto& v : r["volumes"].as_array()) {
      std::string at;
      for (auto& a : v["attachments"].as_array())
        at += (at.empty() ? "" : ", ") + a["sandbox"].as_string() + ":" + a["mount"].as_string() +
              (a["read_only"].as_bool() ? " (ro)" : "");
      std::printf("%-22s %-16s %10lld  %s\n", v["id"].as_string().c_str(),
                  v["name"].as_string().c_str(), (long long)v["size_mib"].as_int(), at.c_str());
    }
    return 0;
  }
  if (verb == "snapshot" || verb == "snapshots") {
    need(1);
    auto path = "/v1/volumes/" + tools::url_encode(o.pos[0]) + "/snapshots";
    if (verb == "snapshot") return show(api.json("POST", path, "{}"));
    auto r = api.json("GET", path);
    if (o.json) return std::printf("%s\n", r["snapshots"].dump().c_str()), 0;
    std::printf("%-24s %10s  %s\n", "SNAPSHOT", "SIZE_MIB", "CREATED");
    for (auto& s : r["snapshots"].as_array())
      std::printf("%-24s %10lld  %s\n", s["id"].as_string().c_str(),
                  (long long)s["size_mib"].as_int(), when(s["created_at_ms"].as_int()).c_str());
    return 0;
  }
  if (verb == "snapshot-delete") {
    need(2);
    api.json("DELETE", "/v1/volumes/" + tools::url_encode(o.pos[0]) + "/snapshots/" +
                           tools::url_encode(o.pos[1]));
    return 0;
  }
  if (verb == "get" || verb == "delete" || verb == "grow") {
    need(1);
    auto path = "/v1/volumes/" + tools::url_encode(o.pos[0]);
    if (verb == "delete") return api.json("DELETE", path), 0;
    if (verb == "get") {
      auto v = api.json("GET", path);
      if (o.json) return std::printf("%s\n", v.dump().c_str()), 0;
      std::string at;
      for (auto& a : v["attachments"].as_array())
        at += (at.empty() ? "" : ", ") + a["sandbox"].as_string() + ":" + a["mount"].as_string() +
              (a["read_only"].as_bool() ? " (ro)" : "");
      std::printf(
          "id:        %s\nname:      %s\nsize:      %lld MiB\nstatus:    %s\n"
          "attached:  %s\norigin:    %s\ncreated:   %s\nsnapshots: %zu\n",
          v["id"].as_string().c_str(), v["name"].as_string().c_str(),
          (long long)v["size_mib"].as_int(), v["status"].as_string().c_str(),
          at.empty() ? "-" : at.c_str(),
          v["origin"].is_string() ? v["origin"].as_string().c_str() : "-",
          when(v["created_at_ms"].as_int()).c_str(), v["snapshots"].as_array().size());
      return 0;
    }
    if (!o.flags.count("--size")) usage("volume grow needs --size MIB");
    Json body = Json::object();
    body.set("size_mib", seconds_flag(o, "--size"));
    return show(api.json("PATCH", path, body.dump()));
  }
  usage("unknown volume command " + verb);
}

}  // namespace pandastack::cli
