// The bodies and headers of requests forwarded between hosts (gateway/peers.cc): a body the owner
// pulls from the forwarding host part by part (SourceInput, BodySourceImpl), one already read
// (BytesInput), and headers without the hop-by-hop ones. Internal to gateway/.
#pragma once

#include <kj/async-io.h>
#include <kj/compat/http.h>
#include <strings.h>

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "gateway/peers.h"
#include "wire/cluster.capnp.h"

namespace pandastack::gateway {

namespace wc = pandastack::wire::cluster;

class BytesInput final : public kj::AsyncInputStream {
 public:
  explicit BytesInput(kj::Array<kj::byte> b) : bytes_(kj::mv(b)) {}
  kj::Promise<size_t> tryRead(void* buffer, size_t, size_t max) override {
    size_t n = std::min(max, bytes_.size() - pos_);
    memcpy(buffer, bytes_.begin() + pos_, n);
    pos_ += n;
    return n;
  }
  kj::Maybe<uint64_t> tryGetLength() override { return uint64_t(bytes_.size() - pos_); }

 private:
  kj::Array<kj::byte> bytes_;
  size_t pos_ = 0;
};

// A forwarded body the owner reads from the forwarding host's BodySource, part by part.
class SourceInput final : public kj::AsyncInputStream {
 public:
  SourceInput(wc::BodySource::Client source, uint64_t length)
      : source_(kj::mv(source)), left_(length) {}
  kj::Promise<size_t> tryRead(void* buffer, size_t min, size_t max) override {
    return read(static_cast<kj::byte*>(buffer), min, max, 0);
  }
  kj::Maybe<uint64_t> tryGetLength() override { return left_ + (pending_.size() - pos_); }

 private:
  kj::Promise<size_t> read(kj::byte* out, size_t min, size_t max, size_t done) {
    if (pending_.size() > pos_) {
      size_t n = std::min(max - done, pending_.size() - pos_);
      memcpy(out + done, pending_.begin() + pos_, n);
      pos_ += n;
      done += n;
    }
    if (done >= min || done == max || ended_) return done;
    auto r = source_.readRequest();
    r.setMax(uint32_t(kPeerPart));
    return r.send().then(
        [this, out, min, max,
         done](capnp::Response<wc::BodySource::ReadResults> got) -> kj::Promise<size_t> {
          auto d = got.getData();
          if (d.size() == 0 || d.size() > kPeerPart || d.size() > left_) {
            if (d.size() > 0) return KJ_EXCEPTION(FAILED, "a forwarded body larger than it said");
            ended_ = true;
            return done;
          }
          left_ -= d.size();
          pending_ = kj::heapArray<kj::byte>(d);
          pos_ = 0;
          return read(out, min, max, done);
        });
  }
  wc::BodySource::Client source_;
  uint64_t left_;  // not yet pulled
  kj::Array<kj::byte> pending_;
  size_t pos_ = 0;
  bool ended_ = false;
};

// The forwarding host's side: the body it read, handed out part by part.
class BodySourceImpl final : public wc::BodySource::Server {
 public:
  explicit BodySourceImpl(kj::Array<kj::byte> body) : body_(kj::mv(body)) {}
  kj::Promise<void> read(ReadContext ctx) override {
    size_t n = std::min<size_t>({ctx.getParams().getMax(), kPeerPart, body_.size() - pos_});
    ctx.getResults(capnp::MessageSize{n / 8 + 8, 0}).setData(body_.slice(pos_, pos_ + n));
    pos_ += n;
    return kj::READY_NOW;
  }

 private:
  kj::Array<kj::byte> body_;
  size_t pos_ = 0;
};

// Headers that belong to one connection, not to the request or response they travel with.
inline bool hop_by_hop(kj::StringPtr name) {
  for (const char* h : {"connection", "keep-alive", "transfer-encoding", "content-length",
                        "upgrade", "te", "trailer", "proxy-connection", "x-pandastack-forwarded"})
    if (strcasecmp(name.cStr(), h) == 0) return true;
  return false;
}

template <typename B>
void copy_headers(const kj::HttpHeaders& from, B&& init) {
  std::vector<std::pair<kj::StringPtr, kj::StringPtr>> kept;
  from.forEach([&](kj::StringPtr n, kj::StringPtr v) {
    if (!hop_by_hop(n)) kept.emplace_back(n, v);
  });
  auto list = init(kept.size());
  for (size_t i = 0; i < kept.size(); ++i) {
    list[i].setName(kept[i].first);
    list[i].setValue(kept[i].second);
  }
}

// Headers received from a peer, owning their strings (kj::HttpHeaders only points at them).
struct OwnedHeaders {
  kj::Vector<kj::String> strings;
  kj::HttpHeaders headers;
  explicit OwnedHeaders(const kj::HttpHeaderTable& t) : headers(t) {}
  void add(kj::StringPtr n, kj::StringPtr v) {
    if (hop_by_hop(n)) return;
    add_raw(n, v);
  }
  void add_raw(kj::StringPtr n, kj::StringPtr v) {
    strings.add(kj::str(n));
    strings.add(kj::str(v));
    headers.add(strings[strings.size() - 2], strings[strings.size() - 1]);
  }
};

}  // namespace pandastack::gateway
