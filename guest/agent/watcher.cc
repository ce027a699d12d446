#include "guest/agent/watcher.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "guest/agent/util.h"

namespace pandastack::agent {

namespace {

constexpr uint32_t kMask = IN_CREATE | IN_MODIFY | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO |
                           IN_ATTRIB | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR | IN_DONT_FOLLOW |
                           IN_EXCL_UNLINK;

std::string join(const std::string& dir, const std::string& name) {
  return dir.empty() ? name : dir + "/" + name;
}

// Sends ready(), then reads and reports until the root goes. A loop of independent tasks, not a
// chain of promises (see PumpLoop in processes.cc): a long watch never nests continuations.
class WatchLoop final : public kj::TaskSet::ErrorHandler {
 public:
  WatchLoop(w::WatchSink::Client sink, kj::Function<kj::Promise<bool>()> step,
            kj::Own<kj::PromiseFulfiller<void>> done)
      : sink_(kj::mv(sink)), step_(kj::mv(step)), done_(kj::mv(done)) {}
  void start() {
    tasks_.add(sink_.readyRequest().send().ignoreResult().then([this]() { next(); }));
  }
  void taskFailed(kj::Exception&& e) override {
    if (done_->isWaiting()) done_->reject(kj::mv(e));  // the host's sink went away
  }

 private:
  void next() {
    tasks_.add(step_().then([this](bool more) {
      if (more)
        next();
      else if (done_->isWaiting())
        done_->fulfill();
    }));
  }
  w::WatchSink::Client sink_;
  kj::Function<kj::Promise<bool>()> step_;
  kj::Own<kj::PromiseFulfiller<void>> done_;
  kj::TaskSet tasks_{*this};  // last: destroyed first, cancelling the read in flight
};

}  // namespace

kj::Own<Watcher> Watcher::open(kj::AsyncIoContext& io, const std::string& root, bool recursive,
                               int& error) {
  std::string r = root;
  while (r.size() > 1 && r.back() == '/') r.pop_back();
  int fd = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  if (fd < 0) {
    error = errno;
    return kj::Own<Watcher>();
  }
  auto watcher =
      kj::Own<Watcher>(new Watcher(io, fd, r, recursive), kj::_::HeapDisposer<Watcher>::instance);
  int wd = ::inotify_add_watch(fd, r.c_str(), kMask);
  if (wd < 0) {
    error = errno;
    return kj::Own<Watcher>();
  }
  watcher->dirs_[wd] = "";
  if (recursive && !watcher->add_children("")) {
    error = E2BIG;
    return kj::Own<Watcher>();
  }
  watcher->pending_.clear();
  return watcher;
}

Watcher::Watcher(kj::AsyncIoContext& io, int fd, std::string root, bool recursive)
    : fd_(fd),
      in_(io.lowLevelProvider->wrapInputFd(fd, kj::LowLevelAsyncIoProvider::TAKE_OWNERSHIP |
                                                   kj::LowLevelAsyncIoProvider::ALREADY_CLOEXEC |
                                                   kj::LowLevelAsyncIoProvider::ALREADY_NONBLOCK)),
      root_(kj::mv(root)),
      recursive_(recursive),
      buf_(kj::heapArray<kj::byte>(64u << 10)) {}

Watcher::~Watcher() = default;

bool Watcher::add_children(const std::string& rel, bool report) {
  std::string abs = rel.empty() ? root_ : root_ + "/" + rel;
  DIR* d = ::opendir(abs.c_str());
  if (d == nullptr) return true;  // gone meanwhile: its parent reports that
  bool ok = true;
  while (auto* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    std::string child = join(rel, name);
    bool is_dir = e->d_type == DT_DIR;
    if (e->d_type == DT_UNKNOWN) {
      struct stat st {};
      is_dir = ::fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode);
    }
    if (report) push(w::WatchEventKind::CREATE, child, is_dir);
    if (is_dir && !add(child, report)) {
      ok = false;
      break;
    }
  }
  ::closedir(d);
  return ok;
}

bool Watcher::add(const std::string& rel, bool report) {
  if (dirs_.size() >= kMaxWatchedDirs) {
    if (!overflowed_) push(w::WatchEventKind::OVERFLOW, "", false);
    overflowed_ = true;
    return false;
  }
  int wd = ::inotify_add_watch(fd_, (root_ + "/" + rel).c_str(), kMask);
  if (wd < 0) return true;  // gone meanwhile (or not a directory any more)
  dirs_[wd] = rel;
  return add_children(rel, report);
}

void Watcher::forget(const std::string& rel) {
  for (auto it = dirs_.begin(); it != dirs_.end();) {
    const std::string& d = it->second;
    if (!d.empty() && (d == rel || d.rfind(rel + "/", 0) == 0)) {
      ::inotify_rm_watch(fd_, it->first);
      it = dirs_.erase(it);
    } else {
      ++it;
    }
  }
}

void Watcher::push(w::WatchEventKind kind, std::string path, bool is_dir) {
  // Repeats of the last event (a writer's many writes) are one event.
  if (!pending_.empty() && pending_.back().kind == kind && pending_.back().path == path) return;
  pending_.push_back({kind, kj::mv(path), is_dir});
}

bool Watcher::parse(const kj::byte* data, size_t n) {
  size_t off = 0;
  while (off + sizeof(inotify_event) <= n) {
    auto* ev = reinterpret_cast<const inotify_event*>(data + off);
    off += sizeof(inotify_event) + ev->len;
    if (ev->mask & IN_Q_OVERFLOW) {
      push(w::WatchEventKind::OVERFLOW, "", false);
      continue;
    }
    auto it = dirs_.find(ev->wd);
    if (it == dirs_.end()) continue;  // a watch we dropped
    const std::string dir = it->second;
    if (ev->mask & IN_IGNORED) {
      dirs_.erase(it);
      if (dir.empty()) root_gone_ = true;
      continue;
    }
    if (ev->len == 0) {  // about the watched directory itself: its parent reports it
      if (dir.empty() && (ev->mask & (IN_DELETE_SELF | IN_MOVE_SELF))) {
        push(w::WatchEventKind::REMOVE, "", true);
        root_gone_ = true;
      }
      continue;
    }
    std::string path = join(dir, ev->name);
    bool is_dir = (ev->mask & IN_ISDIR) != 0;
    if (ev->mask & (IN_CREATE | IN_MOVED_TO)) {
      push(w::WatchEventKind::CREATE, path, is_dir);
      if (is_dir && recursive_) add(path, true);
    }
    if (ev->mask & IN_MODIFY) push(w::WatchEventKind::WRITE, path, is_dir);
    if (ev->mask & IN_ATTRIB) push(w::WatchEventKind::CHMOD, path, is_dir);
    if (ev->mask & IN_MOVED_FROM) {
      push(w::WatchEventKind::RENAME, path, is_dir);
      if (is_dir) forget(path);
    }
    if (ev->mask & IN_DELETE) push(w::WatchEventKind::REMOVE, path, is_dir);
  }
  return !root_gone_;
}

kj::Promise<void> Watcher::send(w::WatchSink::Client& sink) {
  kj::Promise<void> sent = kj::READY_NOW;
  for (size_t at = 0; at < pending_.size(); at += kMaxWatchBatch) {
    size_t count = std::min(kMaxWatchBatch, pending_.size() - at);
    auto req = sink.eventsRequest();
    auto list = req.initEvents(count);
    Names names;
    for (size_t i = 0; i < count; ++i) {
      auto& p = pending_[at + i];
      list[i].setKind(p.kind);
      list[i].setPath(p.path);
      list[i].setIsDir(p.is_dir);
      if (!include_entry_ || p.kind == w::WatchEventKind::OVERFLOW) continue;
      std::string full = p.path.empty() ? root_ : root_ + "/" + p.path;
      struct stat st {};
      if (::lstat(full.c_str(), &st) != 0) continue;  // gone (a remove, a rename away)
      list[i].setHasEntry(true);
      fill_stat(list[i].initEntry(), full.substr(full.find_last_of('/') + 1), full, st, names);
    }
    sent = sent.then([req = kj::mv(req)]() mutable { return req.send(); });
  }
  pending_.clear();
  return sent;
}

kj::Promise<void> Watcher::run(w::WatchSink::Client sink) {
  auto paf = kj::newPromiseAndFulfiller<void>();
  auto loop = kj::heap<WatchLoop>(
      sink,
      [this, sink]() mutable -> kj::Promise<bool> {
        return in_->tryRead(buf_.begin(), 1, buf_.size()).then([this, &sink](size_t n) {
          bool alive = n > 0 && parse(buf_.begin(), n);
          return send(sink).then([alive]() { return alive; });
        });
      },
      kj::mv(paf.fulfiller));
  loop->start();
  return paf.promise.attach(kj::mv(loop));
}

}  // namespace pandastack::agent
