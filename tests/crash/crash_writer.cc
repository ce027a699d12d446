// storage_crash_writer DIR: appends to the event store under load (4 threads, one stream each:
// c0..c3, as event_store_crash_test expects) and prints "STREAM VERSION" on stdout after each
// append is acknowledged, until killed. Two threads append synced (fsynced before the
// acknowledgement), two only written (in the log, fsynced later): both must survive a SIGKILL of
// this process.
// Payloads are a function of (stream, version), so a reader can check every event.

#include <unistd.h>

#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "storage/event_store.h"

using namespace pandastack::storage;

std::string payload_for(const std::string& stream, uint64_t version) {
  std::string p = stream + ":" + std::to_string(version) + ":";
  while (p.size() < 300) p += char('a' + (p.size() * 7 + version) % 26);
  return p;
}

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  auto store = EventStore::open({argv[1], true, 1024, {}});
  if (!store) {
    std::fprintf(stderr, "open: %s\n", store.error().message.c_str());
    return 1;
  }
  std::mutex out;
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&, t] {
      std::string stream = "c" + std::to_string(t);
      uint64_t v = *(*store)->stream_version(stream);
      for (uint64_t i = 0;; ++i) {
        size_t n = 1 + i % 3;
        std::vector<NewEvent> evs;
        for (size_t k = 1; k <= n; ++k) evs.push_back({"tick", 1, payload_for(stream, v + k)});
        auto r = (*store)->append(stream, v, std::move(evs),
                                  t < 2 ? Durability::synced : Durability::written);
        if (!r) {
          std::fprintf(stderr, "append: %s\n", r.error().message.c_str());
          std::_Exit(1);
        }
        v = r->last_version;
        std::string line = stream + " " + std::to_string(v) + "\n";
        std::lock_guard lock(out);
        if (::write(1, line.data(), line.size()) < 0) std::_Exit(1);
      }
    });
  for (auto& t : ts) t.join();
}
