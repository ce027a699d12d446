// Watching a directory in the guest (inotify): changes as batches of wire WatchEvents.
#pragma once

#include <kj/async-io.h>

#include <map>
#include <string>
#include <vector>

#include "wire/agent.capnp.h"

namespace pandastack::agent {

namespace w = pandastack::wire::agent;

inline constexpr size_t kMaxWatchedDirs = 10000;  // per watch, recursive
inline constexpr size_t kMaxWatchBatch = 256;     // events per WatchSink.events call

class Watcher {
 public:
  // Watches the directory `root` (and, with `recursive`, every directory below it). On failure
  // `error` is an errno (ENOENT, ENOTDIR, ...; ENOSPC when there are too many directories) and
  // nullptr is returned.
  static kj::Own<Watcher> open(kj::AsyncIoContext& io, const std::string& root, bool recursive,
                               int& error);
  ~Watcher();

  // Sends ready(), then batches of events to `sink`, until the watched directory goes (the
  // promise resolves) or the promise is dropped.
  kj::Promise<void> run(w::WatchSink::Client sink);
  // Each event then carries the entry as it is when the event is sent (none when it is gone).
  void include_entries() { include_entry_ = true; }

 private:
  struct Pending {
    w::WatchEventKind kind;
    std::string path;
    bool is_dir;
  };

  Watcher(kj::AsyncIoContext& io, int fd, std::string root, bool recursive);
  // Adds a watch on the directory `rel` (relative to the root) and its subdirectories; with
  // `report`, what is already in them is reported as created (a directory made between its
  // parent's event and our watch may already hold files). False past kMaxWatchedDirs.
  bool add(const std::string& rel, bool report);
  bool add_children(const std::string& rel, bool report = false);
  // Forgets the watches of `rel` and everything below it (it was moved away).
  void forget(const std::string& rel);
  // Turns the bytes of one read into events; false when the root went.
  bool parse(const kj::byte* data, size_t n);
  void push(w::WatchEventKind kind, std::string path, bool is_dir);
  // Sends what is pending, in batches, in order.
  kj::Promise<void> send(w::WatchSink::Client& sink);

  int fd_;
  kj::Own<kj::AsyncInputStream> in_;
  std::string root_;
  bool recursive_;
  bool include_entry_ = false;
  std::map<int, std::string> dirs_;  // watch descriptor -> directory relative to the root
  std::vector<Pending> pending_;
  bool overflowed_ = false;  // past kMaxWatchedDirs: reported once
  bool root_gone_ = false;
  kj::Array<kj::byte> buf_;
};

}  // namespace pandastack::agent
