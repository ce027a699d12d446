#include "tools/cli/api_output.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <vector>

namespace pandastack::cli {

using wire::Json;

std::string when(int64_t ms) {
  std::time_t t = ms / 1000;
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%SZ", &tm);
  return buf;
}

std::string expiry_text(const Json& ms) { return ms.is_integer() ? when(ms.as_int()) : "never"; }

std::string meta_text(const Json& m) {
  std::string out;
  if (m.is_object())
    for (auto& [k, v] : m.as_object()) out += (out.empty() ? "" : ",") + k + "=" + v.as_string();
  return out;
}

bool ended(const Json& s) {
  return s["state"].as_string() == "stopped" || s["state"].as_string() == "failed";
}

// Oldest first; an ended sandbox expires at nothing ("-").
void print_table(const Json& sandboxes) {
  std::vector<const Json*> rows;
  for (auto& s : sandboxes.as_array()) rows.push_back(&s);
  std::stable_sort(rows.begin(), rows.end(), [](const Json* a, const Json* b) {
    return (*a)["created_at_ms"].as_int() < (*b)["created_at_ms"].as_int();
  });
  std::printf("%-22s %-12s %-18s %-21s %-21s %s\n", "ID", "STATE", "TEMPLATE", "CREATED", "EXPIRES",
              "METADATA");
  for (auto* s : rows)
    std::printf("%-22s %-12s %-18s %-21s %-21s %s\n", (*s)["id"].as_string().c_str(),
                (*s)["state"].as_string().c_str(), (*s)["template"].as_string().c_str(),
                when((*s)["created_at_ms"].as_int()).c_str(),
                ended(*s) ? "-" : expiry_text((*s)["expires_at_ms"]).c_str(),
                meta_text((*s)["metadata"]).c_str());
}

void print_sandbox(const Json& s, bool json) {
  if (json) {
    std::printf("%s\n", s.dump().c_str());
    return;
  }
  std::printf(
      "id:        %s\nstate:     %s\ntemplate:  %s\nshape:     %lld MiB, %lld vCPUs\n"
      "created:   %s\nexpires:   %s\n",
      s["id"].as_string().c_str(), s["state"].as_string().c_str(),
      s["template"].as_string().c_str(), (long long)s["memory_mib"].as_int(),
      (long long)s["vcpus"].as_int(), when(s["created_at_ms"].as_int()).c_str(),
      expiry_text(s["expires_at_ms"]).c_str());
  if (!meta_text(s["metadata"]).empty())
    std::printf("metadata:  %s\n", meta_text(s["metadata"]).c_str());
}

void write_all(int fd, const std::string& data) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::write(fd, data.data() + off, data.size() - off);
    if (n <= 0) return;
    off += size_t(n);
  }
}

}  // namespace pandastack::cli
