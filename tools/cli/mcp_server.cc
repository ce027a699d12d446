// `pandastack mcp`: a Model Context Protocol server on stdio (JSON-RPC, one message per line)
// whose tools call the REST API: what an agent needs to use sandboxes, and to see what they
// reached.
#include <cstdio>
#include <iostream>
#include <string>
#include <utility>

#include "tools/http_client.h"
#include "wire/json.h"

namespace pandastack::cli {

namespace {

using pandastack::wire::Json;

// ---------------------------------------------------------------------------------------------
// MCP server (stdio): the tools an agent needs, over the REST API.

struct Tool {
  const char* name;
  const char* description;
  const char* schema;  // JSON Schema of the arguments
};

const Tool
    kTools
        [] =
            {
                {"create_sandbox",
                 "Create a new isolated Linux sandbox (a microVM with its own kernel). Returns its "
                 "id, which "
                 "the other tools take as sandbox_id. Sandboxes expire after ttl_seconds (default "
                 "900). With "
                 "idle_timeout_seconds it is hibernated (on_timeout hibernate) or killed after "
                 "that long "
                 "unused; with auto_wake a hibernated sandbox wakes on its next command. volumes "
                 "mounts "
                 "existing volumes (their data outlives the sandbox).",
                 R"J({"type":"object","properties":{"template":{"type":"string","description":"base, agent or code-interpreter (default base)"},"ttl_seconds":{"type":"integer","minimum":1},"idle_timeout_seconds":{"type":"integer","minimum":1},"on_timeout":{"type":"string","enum":["kill","hibernate"]},"auto_wake":{"type":"boolean"},"metadata":{"type":"object","additionalProperties":{"type":"string"}},"volumes":{"type":"array","maxItems":4,"description":"volumes (vol_... ids) to mount before it starts; data on them outlives the sandbox","items":{"type":"object","properties":{"volume":{"type":"string"},"mount":{"type":"string","description":"absolute guest path, e.g. /data"},"read_only":{"type":"boolean"}},"required":["volume","mount"],"additionalProperties":false}}},"additionalProperties":false})J"},
                {"run_command",
                 "Run a shell command in a sandbox and wait for it. Returns exit_code=N and the "
                 "command's "
                 "stdout and stderr (each truncated to 16 KB).",
                 R"J({"type":"object","properties":{"sandbox_id":{"type":"string"},"command":{"type":"string","description":"run with /bin/sh -c"},"timeout_seconds":{"type":"integer","minimum":1,"maximum":3600},"cwd":{"type":"string"}},"required":["sandbox_id","command"],"additionalProperties":false})J"},
                {"run_code",
                 "Run Python in a sandbox's persistent interpreter: variables, imports and the "
                 "working "
                 "folder stay between calls of the same context. Returns the output, the value of "
                 "the last "
                 "expression (result), and an exception's traceback (error). Charts (matplotlib) "
                 "are "
                 "reported as images with their size.",
                 R"J({"type":"object","properties":{"sandbox_id":{"type":"string"},"code":{"type":"string"},"context":{"type":"string","description":"a context id (default: the sandbox's default context)"},"timeout_seconds":{"type":"integer","minimum":1,"maximum":3600}},"required":["sandbox_id","code"],"additionalProperties":false})J"},
                {"read_file",
                 "Read a text file from a sandbox (absolute path; at most 64 KB are shown; a "
                 "binary file is reported as binary with its first 12 KB in base64).",
                 R"J({"type":"object","properties":{"sandbox_id":{"type":"string"},"path":{"type":"string"}},"required":["sandbox_id","path"],"additionalProperties":false})J"},
                {"write_file",
                 "Write a text file in a sandbox (absolute path; parent folders are created; "
                 "replaces the "
                 "file).",
                 R"J({"type":"object","properties":{"sandbox_id":{"type":"string"},"path":{"type":"string"},"content":{"type":"string"}},"required":["sandbox_id","path","content"],"additionalProperties":false})J"},
                {"list_dir",
                 "List a folder in a sandbox: one line per entry (type, size, name).", R"J({"type":"object","properties":{"sandbox_id":{"type":"string"},"path":{"type":"string"}},"required":["sandbox_id","path"],"additionalProperties":false})J"},
                {"fork_sandbox",
                 "Copy a running sandbox (memory, processes and files) into count new sandboxes, "
                 "e.g. to try "
                 "several approaches from the same state. Without count: one copy, returned like "
                 "create_sandbox (sandbox_id=...); with count: one sandbox_id=... line per copy.",
                 R"J({"type":"object","properties":{"sandbox_id":{"type":"string"},"count":{"type":"integer","minimum":1,"maximum":16}},"required":["sandbox_id"],"additionalProperties":false})J"},
                {"create_database",
                 "Create a managed PostgreSQL database (ready in seconds). Returns database_id=... "
                 "and "
                 "connection_uri=postgresql://user:password@host:port/name: the password is shown "
                 "only "
                 "this once.",
                 R"J({"type":"object","properties":{"name":{"type":"string","description":"1-63 of a-z, 0-9 and _, starting with a letter, not pg_* or postgres, template0, template1, public: the database's and its user's name"},"metadata":{"type":"object","additionalProperties":{"type":"string"}}},"required":["name"],"additionalProperties":false})J"},
                {"preview_url",
                 "Serve a web server running in the sandbox (listening on `port`) at a URL a "
                 "person can open in a browser: returns url=... (it carries a token; it expires "
                 "after ttl_seconds, default 3600). Asking again for the port makes a new URL "
                 "and revokes the old one.",
                 R"J({"type":"object","properties":{"sandbox_id":{"type":"string"},"port":{"type":"integer","minimum":1,"maximum":65535},"ttl_seconds":{"type":"integer","minimum":1}},"required":["sandbox_id","port"],"additionalProperties":false})J"},
                {"egress_log",
                 "What a sandbox reached over the network and what was refused: its DNS lookups "
                 "(name, answers), the connections it opened (destination, port, bytes each way) "
                 "and every refusal with its reason (policy, reserved, internal, rate_limit...). "
                 "Newest last; one line each.",
                 R"J({"type":"object","properties":{"sandbox_id":{"type":"string"},"verdict":{"type":"string","enum":["allowed","denied"]},"limit":{"type":"integer","minimum":1,"maximum":1000}},"required":["sandbox_id"],"additionalProperties":false})J"},
                {"list_secrets",
                 "The tenant's secrets by name, with the hosts each may be sent to (a value is "
                 "never shown).",
                 R"J({"type":"object","properties":{},"additionalProperties":false})J"},
                {"kill_sandbox", "Stop a sandbox and release it.",
                 R"J({"type":"object","properties":{"sandbox_id":{"type":"string"}},"required":["sandbox_id"],"additionalProperties":false})J"},
};

// At most `max` bytes of text, never cut inside a UTF-8 sequence.
std::string clip(const std::string& s, size_t max = 16 << 10) {
  if (s.size() <= max) return s;
  size_t cut = max;
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
  return s.substr(0, cut) + "\n[... " + std::to_string(s.size() - cut) + " more bytes]";
}

std::string b64decode(const std::string& in) {
  static const std::string chars =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  int val = 0, bits = -8;
  for (char c : in) {
    auto p = chars.find(c);
    if (p == std::string::npos) continue;
    val = (val << 6) + int(p);
    bits += 6;
    if (bits >= 0) {
      out += char((val >> bits) & 0xFF);
      bits -= 8;
    }
  }
  return out;
}

// Content for a model: text as it is (clipped), binary said to be binary, with its first bytes
// as base64 (a JSON-RPC line must be valid UTF-8, and a model gains nothing from raw bytes).
std::string for_model(const std::string& data, size_t max = 16 << 10) {
  bool text = data.find('\0') == std::string::npos && pandastack::wire::is_valid_utf8(data);
  if (text) return clip(data, max);
  std::string head = data.substr(0, std::min<size_t>(data.size(), 12 << 10));
  return "[binary: " + std::to_string(data.size()) + " bytes; the first " +
         std::to_string(head.size()) + " as base64 follow]\n" + pandastack::tools::base64(head);
}

// Runs one tool; returns (text, is_error).
std::pair<std::string, bool> call_tool(pandastack::tools::HttpClient& http, const std::string& name,
                                       const Json& args) {
  auto str = [&](const char* k) {
    return args[k].is_string() ? args[k].as_string() : std::string();
  };
  auto api_error = [](const pandastack::tools::HttpResponse& r) {
    if (r.status == 0) return "connection_error: " + r.error;
    auto j = Json::parse(r.body);
    if (j && (*j)["error"].is_object())
      return (*j)["error"]["code"].as_string() + ": " + (*j)["error"]["message"].as_string();
    return "HTTP " + std::to_string(r.status);
  };
  if (name == "create_database") {
    Json body = Json::object();
    body.set("name", str("name"));
    if (args["metadata"].is_object()) body.set("metadata", args["metadata"]);
    auto r = http.request("POST", "/v1/databases", body.dump());
    if (r.status != 201) return {api_error(r), true};
    auto j = Json::parse(r.body);
    return {"database_id=" + (*j)["id"].as_string() +
                " connection_uri=" + (*j)["connection_uri"].as_string(),
            false};
  }
  if (name == "list_secrets") {
    auto r = http.request("GET", "/v1/secrets");
    if (r.status != 200) return {api_error(r), true};
    std::string text;
    Json list = *Json::parse(r.body);
    for (auto& v : list["secrets"].as_array()) {
      std::string hosts;
      for (auto& h : v["hosts"].as_array()) hosts += (hosts.empty() ? "" : ",") + h.as_string();
      text += v["name"].as_string() + " hosts=" + hosts + "\n";
    }
    return {text.empty() ? "(no secrets)" : text, false};
  }
  std::string id = str("sandbox_id");
  if (name != "create_sandbox" && id.empty())
    return {"invalid_argument: sandbox_id is required", true};
  std::string base = "/v1/sandboxes/" + pandastack::tools::url_encode(id);
  if (name == "create_sandbox") {
    Json body = Json::object();
    body.set("template", str("template").empty() ? "base" : str("template"));
    if (args["ttl_seconds"].is_integer()) body.set("ttl_seconds", args["ttl_seconds"].as_int());
    if (args["metadata"].is_object()) body.set("metadata", args["metadata"]);
    if (args["idle_timeout_seconds"].is_integer())
      body.set("idle_timeout_seconds", args["idle_timeout_seconds"].as_int());
    if (!str("on_timeout").empty()) body.set("on_timeout", str("on_timeout"));
    if (args["auto_wake"].is_bool()) body.set("auto_wake", args["auto_wake"].as_bool());
    if (args["volumes"].is_array()) body.set("volumes", args["volumes"]);
    auto r = http.request("POST", "/v1/sandboxes", body.dump());
    if (r.status != 201) return {api_error(r), true};
    auto j = Json::parse(r.body);
    return {"sandbox_id=" + (*j)["id"].as_string() + " state=" + (*j)["state"].as_string(), false};
  }
  if (name == "run_command") {
    if (str("command").empty()) return {"invalid_argument: command is required", true};
    Json body = Json::object();
    body.set("cmd", str("command"));
    if (args["timeout_seconds"].is_integer())
      body.set("timeout_seconds", args["timeout_seconds"].as_int());
    if (!str("cwd").empty()) body.set("cwd", str("cwd"));
    auto r = http.request("POST", base + "/exec", body.dump());
    if (r.status != 200) return {api_error(r), true};
    auto j = *Json::parse(r.body);
    std::string text = "exit_code=" + std::to_string(j["exit_code"].as_int());
    if (j["timed_out"].as_bool()) text += " (timed out)";
    // The API sends non-text output as base64 ("*_encoding"): decoded here, then shown as text
    // or labelled binary.
    auto output = [&](const char* name) {
      std::string data = j[name].as_string();
      if (j[std::string(name) + "_encoding"].as_string() == "base64") data = b64decode(data);
      return for_model(data);
    };
    text += "\n--- stdout ---\n" + output("stdout");
    text += "\n--- stderr ---\n" + output("stderr");
    return {text, false};
  }
  if (name == "run_code") {
    if (str("code").empty()) return {"invalid_argument: code is required", true};
    Json body = Json::object();
    body.set("code", str("code"));
    if (!str("context").empty()) body.set("context", str("context"));
    if (args["timeout_seconds"].is_integer())
      body.set("timeout_seconds", args["timeout_seconds"].as_int());
    auto r = http.request("POST", base + "/code", body.dump());
    if (r.status != 200) return {api_error(r), true};
    auto j = *Json::parse(r.body);
    std::string text = "execution_count=" + std::to_string(j["execution_count"].as_int());
    if (j["timed_out"].as_bool()) text += " (timed out: interrupted, the context lives on)";
    for (const char* stream : {"stdout", "stderr"})
      if (!j[stream].as_string().empty())
        text += std::string("\n--- ") + stream + " ---\n" + for_model(j[stream].as_string());
    for (auto& res : j["results"].as_array()) {
      text += res["is_main_result"].as_bool() ? "\n--- result ---\n" : "\n--- display ---\n";
      if (res["png"].is_string())
        text +=
            "[image/png, " + std::to_string(res["png"].as_string().size() * 3 / 4) + " bytes]\n";
      if (res["text"].is_string()) text += for_model(res["text"].as_string());
    }
    if (j["error"].is_object())
      text += "\n--- error ---\n" + j["error"]["name"].as_string() + ": " +
              j["error"]["value"].as_string() + "\n" +
              for_model(j["error"]["traceback"].as_string());
    return {text, false};
  }
  if (name == "read_file") {
    auto r =
        http.request("GET", base + "/files?path=" + pandastack::tools::url_encode(str("path")));
    if (r.status != 200) return {api_error(r), true};
    return {for_model(r.body, 64 << 10), false};
  }
  if (name == "write_file") {
    auto r = http.request("PUT", base + "/files?path=" + pandastack::tools::url_encode(str("path")),
                          str("content"), "application/octet-stream");
    if (r.status != 200) return {api_error(r), true};
    return {"wrote " + std::to_string(str("content").size()) + " bytes to " + str("path"), false};
  }
  if (name == "list_dir") {
    auto r = http.request("GET",
                          base + "/files/list?path=" + pandastack::tools::url_encode(str("path")));
    if (r.status != 200) return {api_error(r), true};
    std::string text;
    Json listing = *Json::parse(r.body);  // (not a temporary: the loop would dangle)
    for (auto& e : listing["entries"].as_array())
      text += e["type"].as_string() + "	" + std::to_string(e["size"].as_int()) + "	" +
              e["name"].as_string() + "\n";
    return {text.empty() ? "(empty)" : text, false};
  }
  if (name == "fork_sandbox") {
    Json body = Json::object();
    body.set("count", args["count"].is_integer() ? args["count"].as_int() : 1);
    auto r = http.request("POST", base + "/fork", body.dump());
    if (r.status != 201) return {api_error(r), true};
    std::string text;
    Json kids = *Json::parse(r.body);
    for (auto& k : kids["sandboxes"].as_array())
      text += std::string(text.empty() ? "" : "\n") + "sandbox_id=" + k["id"].as_string() +
              " state=" + k["state"].as_string();
    return {text, false};
  }
  if (name == "preview_url") {
    Json body = Json::object();
    body.set("port", args["port"].is_integer() ? args["port"].as_int() : 0);
    if (args["ttl_seconds"].is_integer()) body.set("ttl_seconds", args["ttl_seconds"].as_int());
    auto r = http.request("POST", base + "/previews", body.dump());
    if (r.status != 201) return {api_error(r), true};
    Json p = *Json::parse(r.body);
    return {"url=" + p["url"].as_string() + "\npath_url=" + p["path_url"].as_string() +
                "\nexpires_at_ms=" + std::to_string(p["expires_at_ms"].as_int()),
            false};
  }
  if (name == "egress_log") {
    std::string q =
        "?limit=" + std::to_string(args["limit"].is_integer() ? args["limit"].as_int() : 100);
    if (!str("verdict").empty()) q += "&verdict=" + pandastack::tools::url_encode(str("verdict"));
    auto r = http.request("GET", base + "/egress" + q);
    if (r.status != 200) return {api_error(r), true};
    std::string text;
    Json log = *Json::parse(r.body);
    for (auto& e : log["entries"].as_array()) {
      text += e["verdict"].as_string() + " " + e["kind"].as_string() + " ";
      if (e["kind"].as_string() == "dns") {
        text += e["name"].as_string() + " " + e["type"].as_string();
        std::string answers;
        for (auto& a : e["answers"].as_array())
          answers += (answers.empty() ? "" : ",") + a.as_string();
        if (!answers.empty()) text += " -> " + answers;
      } else {
        text += e["protocol"].as_string() + " " + e["destination"].as_string();
        if (e["port"].is_integer()) text += ":" + std::to_string(e["port"].as_int());
        if (e["name"].is_string()) text += " (" + e["name"].as_string() + ")";
        if (e["bytes_out"].is_integer())
          text += " out=" + std::to_string(e["bytes_out"].as_int()) +
                  " in=" + std::to_string(e["bytes_in"].as_int());
      }
      if (e["reason"].is_string()) text += " reason=" + e["reason"].as_string();
      text += "\n";
    }
    if (log["dropped"].as_int() > 0)
      text += "(" + std::to_string(log["dropped"].as_int()) + " older entries dropped)\n";
    return {text.empty() ? "(nothing reached or refused yet)" : clip(text), false};
  }
  if (name == "kill_sandbox") {
    auto r = http.request("DELETE", base);
    if (r.status != 200) return {api_error(r), true};
    return {"killed " + id, false};
  }
  return {"unknown tool " + name, true};
}

}  // namespace

int mcp_main(const std::string& url, const std::string& key) {
  pandastack::tools::HttpClient http(url, key);
  std::string line;
  auto reply = [](const Json& id, const char* field, Json value) {
    Json j = Json::object();
    j.set("jsonrpc", "2.0");
    j.set("id", id);
    j.set(field, std::move(value));
    std::printf("%s\n", j.dump().c_str());
    std::fflush(stdout);
  };
  auto error = [&](const Json& id, int code, const std::string& message) {
    Json e = Json::object();
    e.set("code", code);
    e.set("message", message);
    reply(id, "error", e);
  };
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    auto msg = Json::parse(line);
    if (!msg || !msg->is_object()) {
      error(Json(), -32700, "parse error");
      continue;
    }
    const Json& m = *msg;
    std::string method = m["method"].is_string() ? m["method"].as_string() : "";
    if (!m.has("id")) continue;  // notifications (initialized, cancelled) need no answer
    const Json& id = m["id"];
    if (method == "initialize") {
      Json caps = Json::object();
      caps.set("tools", Json::object());
      Json server = Json::object();
      server.set("name", "pandastack");
      server.set("version", "0.1.0");
      Json r = Json::object();
      std::string version = m["params"]["protocolVersion"].is_string()
                                ? m["params"]["protocolVersion"].as_string()
                                : "2024-11-05";
      r.set("protocolVersion", version);
      r.set("capabilities", caps);
      r.set("serverInfo", server);
      r.set("instructions",
            "Sandboxes are isolated Linux microVMs: create one, run commands and edit files in "
            "it, fork it to explore alternatives, kill it when done.");
      reply(id, "result", r);
    } else if (method == "ping") {
      reply(id, "result", Json::object());
    } else if (method == "tools/list") {
      Json tools = Json::array();
      for (auto& t : kTools) {
        Json j = Json::object();
        j.set("name", t.name);
        j.set("description", t.description);
        j.set("inputSchema", *Json::parse(t.schema));
        tools.push(j);
      }
      Json r = Json::object();
      r.set("tools", tools);
      reply(id, "result", r);
    } else if (method == "tools/call") {
      std::string name = m["params"]["name"].is_string() ? m["params"]["name"].as_string() : "";
      bool known = false;
      for (auto& t : kTools) known |= name == t.name;
      if (!known) {
        error(id, -32602, "unknown tool '" + name + "'");
        continue;
      }
      auto [text, is_error] = call_tool(http, name, m["params"]["arguments"]);
      Json content = Json::object();
      content.set("type", "text");
      content.set("text", text);
      Json list = Json::array();
      list.push(content);
      Json r = Json::object();
      r.set("content", list);
      r.set("isError", is_error);
      reply(id, "result", r);
    } else {
      error(id, -32601, "method not found: " + method);
    }
  }
  return 0;
}

}  // namespace pandastack::cli
