// What agent_client.cc and agent_files.cc (the parts of vmm::AgentClient) share: the connection,
// running a call on the IoThread with a deadline or a stop token, and reading the agent's
// answers. Not part of the driver's API.
#pragma once

#include <capnp/rpc-twoparty.h>
#include <capnp/rpc.h>
#include <kj/async-io.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <stop_token>
#include <string>

#include "vmm-driver/agent_client.h"
#include "vmm-driver/io_thread.h"
#include "wire/agent.capnp.h"

namespace pandastack::vmm {

class SessionStream;

struct AgentClient::Conn {
  kj::Own<kj::AsyncIoStream> stream;
  kj::Own<SessionStream> session;  // over `stream`, one per session
  kj::Own<capnp::TwoPartyVatNetwork> network;
  kj::Own<capnp::RpcSystem<capnp::rpc::twoparty::VatId>> rpc;
  wire::agent::Agent::Client agent = nullptr;
  kj::Maybe<kj::ForkedPromise<Health>> first_health;
  std::atomic<bool> answered{false};  // the agent answered this session's preamble
  std::atomic<uint32_t> protocol{0};  // the agent's protocolVersion, once a health call answered
};

namespace agent_detail {

namespace w = pandastack::wire::agent;
using std::chrono::milliseconds;

inline kj::Duration kj_ms(milliseconds ms) { return ms.count() * kj::MILLISECONDS; }

template <typename T>
kj::Promise<Result<T>> with_deadline(IoThread& io, kj::Promise<Result<T>> p, milliseconds limit,
                                     std::string what) {
  return p.exclusiveJoin(io.timer().afterDelay(kj_ms(limit)).then([what = kj::mv(what), limit]() {
    return Result<T>(make_error(
        ErrorCode::timeout,
        what + ": no answer from the guest agent within " + std::to_string(limit.count()) + " ms"));
  }));
}

// Runs `f` (which returns a Promise<Result<T>>) on the IoThread; KJ exceptions become agent_error.
// A lost connection also sets `*disconnected` (when given).
template <typename T, typename F>
Result<T> on_io(IoThread& io, F&& f, std::atomic<bool>* disconnected = nullptr) {
  try {
    return io.run(std::forward<F>(f));
  } catch (const kj::Exception& e) {
    std::string msg = e.getDescription().cStr();
    if (e.getType() == kj::Exception::Type::DISCONNECTED) {
      msg = "agent disconnected: " + msg;
      if (disconnected != nullptr) *disconnected = true;
    }
    return make_error(ErrorCode::agent_error, msg);
  }
}

inline Error guest_file_error(w::Error::Reader e) {
  std::string code = e.getCode().cStr();
  Error err{code == "not_found" ? ErrorCode::not_found
                                : (code == "invalid_argument" ? ErrorCode::invalid_argument
                                                              : ErrorCode::guest_error),
            e.getMessage().cStr(), code};
  return err;
}

inline std::string to_string(capnp::Data::Reader d) {
  return std::string(reinterpret_cast<const char*>(d.begin()), d.size());
}

inline FileStat read_stat(w::FileStat::Reader s) {
  FileStat f;
  f.name = s.getName().cStr();
  switch (s.getType()) {
    case w::FileType::REGULAR:
      f.type = FileStat::Type::regular;
      break;
    case w::FileType::DIRECTORY:
      f.type = FileStat::Type::directory;
      break;
    case w::FileType::SYMLINK:
      f.type = FileStat::Type::symlink;
      break;
    default:
      f.type = FileStat::Type::other;
  }
  f.size = s.getSize();
  f.mode = s.getMode();
  f.mtime_ms = s.getMtimeMs();
  // (bounded: a guest's names are not trusted to be small)
  f.owner = std::string(s.getOwner().cStr()).substr(0, 256);
  f.group = std::string(s.getGroup().cStr()).substr(0, 256);
  f.symlink_target = std::string(s.getSymlinkTarget().cStr()).substr(0, 4096);
  // At most what a write may set: a guest's answer beyond it is dropped, not kept.
  size_t total = 0;
  for (auto m : s.getMetadata()) {
    std::string k = m.getName().cStr(), v = m.getValue().cStr();
    total += std::string_view(kMetadataXattrPrefix).size() + k.size() + v.size();
    if (total > kMaxMetadataBytes || k.empty() || k.size() > kMaxMetadataNameBytes) break;
    f.metadata.emplace(std::move(k), std::move(v));
  }
  return f;
}

// Lets another thread cancel a call running on the IoThread (std::stop_token -> kj::Canceler).
struct CancelSlot {
  std::mutex mu;
  kj::Canceler* canceler = nullptr;  // set and cleared on the IoThread
};

template <typename T, typename F>
Result<T> cancellable(IoThread& io, std::stop_token stop, F&& make_promise,
                      std::atomic<bool>* disconnected) {
  auto slot = std::make_shared<CancelSlot>();
  std::stop_callback on_stop(stop, [&io, slot] {
    auto cancel = [slot] {
      std::lock_guard lock(slot->mu);
      if (slot->canceler != nullptr) slot->canceler->cancel("cancelled by the host");
    };
    if (io.on_loop_thread())
      cancel();
    else
      io.run(cancel);
  });
  return on_io<T>(
      io,
      [&, slot]() -> kj::Promise<Result<T>> {
        auto canceler = kj::heap<kj::Canceler>();
        {
          std::lock_guard lock(slot->mu);
          slot->canceler = canceler.get();
        }
        if (stop.stop_requested()) canceler->cancel("cancelled by the host");
        auto p = canceler->wrap(make_promise());
        return p
            .then(
                [slot](Result<T> r) {
                  std::lock_guard lock(slot->mu);
                  slot->canceler = nullptr;
                  return r;
                },
                [slot](kj::Exception&& e) -> Result<T> {
                  {
                    std::lock_guard lock(slot->mu);
                    slot->canceler = nullptr;
                  }
                  if (std::string(e.getDescription().cStr()).find("cancelled by the host") !=
                      std::string::npos)
                    return make_error(ErrorCode::cancelled, "cancelled");
                  kj::throwFatalException(kj::mv(e));
                })
            .attach(kj::mv(canceler));
      },
      disconnected);
}

}  // namespace agent_detail

template <typename T, typename F>
Result<T> AgentClient::call(F&& f) {
  ++in_flight_;
  auto r = agent_detail::on_io<T>(io_, std::forward<F>(f), &disconnected_);
  --in_flight_;
  return r;
}

template <typename T, typename F>
Result<T> AgentClient::call_cancellable(std::stop_token stop, F&& f) {
  ++in_flight_;
  auto r = agent_detail::cancellable<T>(io_, stop, std::forward<F>(f), &disconnected_);
  --in_flight_;
  return r;
}

}  // namespace pandastack::vmm
