// What the persisted-event codecs (event_codec.cc, volume_codec.cc) share: metadata maps as
// KeyValue lists, a message as bytes, and reading bytes back as a message without trusting them.
#pragma once

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/array.h>
#include <kj/exception.h>

#include <cstring>
#include <map>
#include <optional>
#include <string>

namespace pandastack::actors::codec {

template <typename List>
void put_map(List l, const std::map<std::string, std::string>& m) {
  unsigned i = 0;
  for (auto& [k, v] : m) {
    l[i].setKey(k);
    l[i].setValue(v);
    ++i;
  }
}

template <typename List>
std::map<std::string, std::string> get_map(List l) {
  std::map<std::string, std::string> m;
  for (auto kv : l) m[kv.getKey().cStr()] = kv.getValue().cStr();
  return m;
}

inline std::string to_bytes(capnp::MessageBuilder& msg) {
  auto words = capnp::messageToFlatArray(msg);
  auto bytes = words.asBytes();
  return std::string(reinterpret_cast<const char*>(bytes.begin()), bytes.size());
}

// `read(root)` of the message in `bytes` (a Root reader), or nullopt when the bytes are not one
// (or `read` gives nullopt, or throws: a field out of range, a truncated message).
template <typename Root, typename T, typename F>
std::optional<T> from_bytes(const std::string& bytes, F&& read) {
  if (bytes.size() % sizeof(capnp::word) != 0 || bytes.empty()) return std::nullopt;
  auto words = kj::heapArray<capnp::word>(bytes.size() / sizeof(capnp::word));
  memcpy(words.begin(), bytes.data(), bytes.size());
  std::optional<T> out;
  kj::Maybe<kj::Exception> err = kj::runCatchingExceptions([&]() {
    capnp::FlatArrayMessageReader msg(words);
    out = read(msg.getRoot<Root>());
  });
  if (err != nullptr) return std::nullopt;
  return out;
}

}  // namespace pandastack::actors::codec
