// The agent's file operations (vmm::AgentClient): read (whole, or a range), write, list, stat,
// remove, rename, mkdir, and watches. Every answer of the guest's is checked against its limits.
#include <kj/debug.h>

#include <algorithm>
#include <utility>

#include "vmm-driver/agent_client.h"
#include "vmm-driver/agent_internal.h"

namespace pandastack::vmm {

using namespace agent_detail;
using namespace std::chrono;

namespace {

// The host's end of a watch: like SinkImpl, revoked when the call ends. A batch is checked before
// it reaches the callback: at most kMaxWatchBatch events, paths at most kMaxWatchPathBytes.
struct WatchSinkState {
  std::function<void()> on_ready;
  WatchCallback on_events;  // null once revoked
};

class WatchSinkImpl final : public w::WatchSink::Server {
 public:
  explicit WatchSinkImpl(std::shared_ptr<WatchSinkState> st) : st_(kj::mv(st)) {}
  kj::Promise<void> ready(ReadyContext) override {
    if (!st_->on_events) return KJ_EXCEPTION(DISCONNECTED, "the watch has ended");
    if (auto f = std::exchange(st_->on_ready, nullptr)) f();
    return kj::READY_NOW;
  }
  kj::Promise<void> events(EventsContext ctx) override {
    if (!st_->on_events) return KJ_EXCEPTION(DISCONNECTED, "the watch has ended");
    auto list = ctx.getParams().getEvents();
    if (list.size() > kMaxWatchBatch)
      return KJ_EXCEPTION(FAILED, "the guest sent more watch events in a batch than allowed");
    std::vector<WatchEvent> out;
    out.reserve(list.size());
    for (auto e : list) {
      if (e.getPath().size() > kMaxWatchPathBytes)
        return KJ_EXCEPTION(FAILED, "the guest sent a watch path longer than allowed");
      WatchEvent ev;
      switch (e.getKind()) {
        case w::WatchEventKind::CREATE:
          ev.kind = WatchEvent::Kind::create;
          break;
        case w::WatchEventKind::WRITE:
          ev.kind = WatchEvent::Kind::write;
          break;
        case w::WatchEventKind::REMOVE:
          ev.kind = WatchEvent::Kind::remove;
          break;
        case w::WatchEventKind::RENAME:
          ev.kind = WatchEvent::Kind::rename;
          break;
        case w::WatchEventKind::CHMOD:
          ev.kind = WatchEvent::Kind::chmod;
          break;
        default:
          ev.kind = WatchEvent::Kind::overflow;
      }
      ev.path = e.getPath().cStr();
      ev.is_dir = e.getIsDir();
      if (e.getHasEntry()) ev.entry = read_stat(e.getEntry());
      out.push_back(std::move(ev));
    }
    st_->on_events(out);
    return kj::READY_NOW;
  }

 private:
  std::shared_ptr<WatchSinkState> st_;
};

}  // namespace

Status AgentClient::watch(const std::string& path, bool recursive, std::function<void()> on_ready,
                          WatchCallback on_events, std::stop_token stop, bool include_entry) {
  if (include_entry)
    if (auto ok = require_protocol(3, "watch events with entries"); !ok) return ok.error();
  return call_cancellable<Ok>(stop, [&]() -> kj::Promise<Result<Ok>> {
    auto req = conn_->agent.watchRequest();
    req.setPath(path);
    req.setRecursive(recursive);
    req.setIncludeEntry(include_entry);
    auto st =
        std::make_shared<WatchSinkState>(WatchSinkState{std::move(on_ready), std::move(on_events)});
    auto guard = kj::heap(kj::defer([st]() {
      st->on_ready = nullptr;
      st->on_events = nullptr;
    }));
    req.setSink(kj::heap<WatchSinkImpl>(st));
    return req.send()
        .then([](auto r) -> Result<Ok> {
          if (r.hasError()) return guest_file_error(r.getError());
          return Ok{};
        })
        .attach(kj::mv(guard));
  });
}

namespace {
constexpr uint32_t kChunk = 4u << 20;

kj::Promise<Result<std::string>> read_rest(w::Agent::Client agent, std::string path,
                                           kj::Own<std::string> acc, uint64_t max_bytes) {
  auto req = agent.readFileRequest();
  req.setPath(path);
  req.setOffset(acc->size());
  req.setLength(kChunk);
  return req.send().then([agent, path = kj::mv(path), acc = kj::mv(acc),
                          max_bytes](auto r) mutable -> kj::Promise<Result<std::string>> {
    if (r.hasError()) return Result<std::string>(guest_file_error(r.getError()));
    if (r.getSize() > max_bytes)
      return Result<std::string>(make_error(
          ErrorCode::too_large, path + " is " + std::to_string(r.getSize()) +
                                    " bytes, more than the limit of " + std::to_string(max_bytes)));
    auto d = r.getData();
    // The guest's word is checked, not trusted: a chunk is at most what was asked, and the whole
    // is at most max_bytes however the guest reports the size.
    if (d.size() > kChunk)
      return Result<std::string>(make_error(
          ErrorCode::agent_error, "readFile answered " + std::to_string(d.size()) +
                                      " bytes for a read of at most " + std::to_string(kChunk)));
    if (acc->size() + d.size() > max_bytes)
      return Result<std::string>(
          make_error(ErrorCode::too_large,
                     path + " is more than the limit of " + std::to_string(max_bytes) + " bytes"));
    acc->append(reinterpret_cast<const char*>(d.begin()), d.size());
    // A regular file ends at its size; a special file (size 0: /proc, devices) at end of file.
    if (d.size() == 0 || (r.getSize() > 0 && acc->size() >= r.getSize()))
      return Result<std::string>(kj::mv(*acc));
    return read_rest(kj::mv(agent), kj::mv(path), kj::mv(acc), max_bytes);
  });
}

// Reads up to `want` bytes of `path` from `start` (the bytes read so far are in `acc`).
kj::Promise<Result<FileRange>> range_rest(w::Agent::Client agent, std::string path, uint64_t start,
                                          uint64_t want, kj::Own<FileRange> acc) {
  auto req = agent.readFileRequest();
  req.setPath(path);
  req.setOffset(start + acc->data.size());
  req.setLength(uint32_t(std::min<uint64_t>(kChunk, want - acc->data.size())));
  return req.send().then([agent, path = kj::mv(path), start, want,
                          acc = kj::mv(acc)](auto r) mutable -> kj::Promise<Result<FileRange>> {
    if (r.hasError()) return Result<FileRange>(guest_file_error(r.getError()));
    auto d = r.getData();
    if (d.size() > kChunk || acc->data.size() + d.size() > want)
      return Result<FileRange>(
          make_error(ErrorCode::agent_error, "readFile answered more bytes than were asked"));
    acc->size = r.getSize();
    acc->data.append(reinterpret_cast<const char*>(d.begin()), d.size());
    if (d.size() == 0 || acc->data.size() >= want) return Result<FileRange>(kj::mv(*acc));
    return range_rest(kj::mv(agent), kj::mv(path), start, want, kj::mv(acc));
  });
}

using Metadata = std::optional<std::map<std::string, std::string>>;

// The call's metadata goes with its first part (the one that replaces the file).
kj::Promise<Result<Ok>> write_rest(w::Agent::Client agent, std::string path, std::string_view data,
                                   size_t offset, uint32_t mode, bool parents, bool append,
                                   std::string owner, const Metadata& metadata) {
  auto req = agent.writeFileRequest();
  req.setPath(path);
  req.setOwner(owner);
  if (metadata && offset == 0) {
    req.setSetMetadata(true);
    auto list = req.initMetadata(unsigned(metadata->size()));
    unsigned i = 0;
    for (auto& [k, v] : *metadata) {
      list[i].setName(k);
      list[i++].setValue(v);
    }
  }
  size_t n = std::min<size_t>(kChunk, data.size() - offset);
  req.setData(kj::arrayPtr(reinterpret_cast<const kj::byte*>(data.data() + offset), n));
  req.setMode(mode);
  req.setMakeParents(parents && offset == 0 && !append);
  req.setTruncate(offset == 0 && !append);
  req.setAppend(offset != 0 || append);
  return req.send().then([agent, path = kj::mv(path), data, offset, n, mode, parents, append,
                          owner = kj::mv(owner)](auto r) mutable -> kj::Promise<Result<Ok>> {
    if (r.hasError()) return Result<Ok>(guest_file_error(r.getError()));
    if (offset + n >= data.size()) return Result<Ok>(Ok{});
    return write_rest(kj::mv(agent), kj::mv(path), data, offset + n, mode, parents, append,
                      kj::mv(owner), std::nullopt);
  });
}
}  // namespace

Result<std::string> AgentClient::read_file(const std::string& path, uint64_t max_bytes) {
  return call<std::string>([&]() {
    return with_deadline<std::string>(
        io_, read_rest(conn_->agent, path, kj::heap<std::string>(), max_bytes), kCallTimeout * 4,
        "readFile");
  });
}

Result<FileRange> AgentClient::read_range(const std::string& path, uint64_t offset,
                                          uint64_t length) {
  return call<FileRange>([&]() {
    return with_deadline<FileRange>(
        io_, range_rest(conn_->agent, path, offset, length, kj::heap<FileRange>()),
        kCallTimeout * 4, "readFile");
  });
}

std::optional<std::string> check_file_metadata(const std::map<std::string, std::string>& metadata) {
  auto printable = [](const std::string& s) {
    return std::all_of(s.begin(), s.end(), [](char c) { return c >= 0x20 && c <= 0x7e; });
  };
  size_t total = 0;
  for (auto& [k, v] : metadata) {
    if (k.empty() || k.size() > kMaxMetadataNameBytes)
      return "a metadata key is 1 to " + std::to_string(kMaxMetadataNameBytes) + " bytes";
    if (!printable(k) || !printable(v))
      return "metadata keys and values are printable US-ASCII (bytes 0x20-0x7E)";
    total += std::string_view(kMetadataXattrPrefix).size() + k.size() + v.size();
  }
  if (total > kMaxMetadataBytes)
    return "a file's metadata is at most " + std::to_string(kMaxMetadataBytes) +
           " bytes (keys with the user.e2b. prefix, and values)";
  return std::nullopt;
}

Status AgentClient::write_file(const std::string& path, std::string_view data, uint32_t mode,
                               bool make_parents, bool append, const std::string& owner,
                               const Metadata& metadata) {
  if (!owner.empty())
    if (auto ok = require_protocol(2, "files owned by a user"); !ok) return ok.error();
  Metadata meta = metadata;
  if (meta) {
    if (auto bad = check_file_metadata(*meta)) return make_error(ErrorCode::invalid_argument, *bad);
    if (append) return make_error(ErrorCode::invalid_argument, "metadata is set by a whole write");
    // An older agent sets none: asked for none, it writes the file as it always did.
    if (auto ok = require_protocol(3, "file metadata"); !ok) {
      if (!meta->empty()) return ok.error();
      meta.reset();
    }
  }
  return call<Ok>([&]() {
    return with_deadline<Ok>(
        io_, write_rest(conn_->agent, path, data, 0, mode, make_parents, append, owner, meta),
        kCallTimeout * 4, "writeFile");
  });
}

Result<std::vector<FileStat>> AgentClient::list_dir(const std::string& path) {
  using V = std::vector<FileStat>;
  return call<V>([&]() -> kj::Promise<Result<V>> {
    auto req = conn_->agent.listDirRequest();
    req.setPath(path);
    return with_deadline<V>(io_, req.send().then([](auto r) -> Result<V> {
      if (r.hasError()) return guest_file_error(r.getError());
      V out;
      if (r.getEntries().size() > kMaxListEntries)
        return make_error(ErrorCode::invalid_argument, "the folder has more than " +
                                                           std::to_string(kMaxListEntries) +
                                                           " entries: list a smaller one");
      for (auto e : r.getEntries()) out.push_back(read_stat(e));
      return out;
    }),
                            kCallTimeout, "listDir");
  });
}

Result<FileStat> AgentClient::stat(const std::string& path) {
  return call<FileStat>([&]() -> kj::Promise<Result<FileStat>> {
    auto req = conn_->agent.statRequest();
    req.setPath(path);
    return with_deadline<FileStat>(io_, req.send().then([](auto r) -> Result<FileStat> {
      if (r.hasError()) return guest_file_error(r.getError());
      return read_stat(r.getStat());
    }),
                                   kCallTimeout, "stat");
  });
}

namespace {
template <typename Resp>
Result<Ok> file_status(Resp& r) {
  if (r.hasError()) return guest_file_error(r.getError());
  return Ok{};
}
}  // namespace

Status AgentClient::remove(const std::string& path, bool recursive) {
  return call<Ok>([&]() -> kj::Promise<Result<Ok>> {
    auto req = conn_->agent.removeRequest();
    req.setPath(path);
    req.setRecursive(recursive);
    return with_deadline<Ok>(io_, req.send().then([](auto r) { return file_status(r); }),
                             kCallTimeout, "remove");
  });
}

Status AgentClient::rename(const std::string& from, const std::string& to) {
  return call<Ok>([&]() -> kj::Promise<Result<Ok>> {
    auto req = conn_->agent.renameRequest();
    req.setFrom(from);
    req.setTo(to);
    return with_deadline<Ok>(io_, req.send().then([](auto r) { return file_status(r); }),
                             kCallTimeout, "rename");
  });
}

Status AgentClient::mkdir(const std::string& path, bool parents, uint32_t mode,
                          const std::string& owner) {
  if (!owner.empty())
    if (auto ok = require_protocol(2, "files owned by a user"); !ok) return ok.error();
  return call<Ok>([&]() -> kj::Promise<Result<Ok>> {
    auto req = conn_->agent.mkdirRequest();
    req.setPath(path);
    req.setParents(parents);
    req.setMode(mode);
    req.setOwner(owner);
    return with_deadline<Ok>(io_, req.send().then([](auto r) { return file_status(r); }),
                             kCallTimeout, "mkdir");
  });
}

}  // namespace pandastack::vmm
