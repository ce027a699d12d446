// The REST gateway: HTTP/1.1 on kj-http, JSON under /v1. It turns each request into a call of the
// actor runtime's facade (actors/runtime.h) and never touches a VMM, a VM's socket or the
// database itself. Runtime calls block, so they run on a pool of threads; the KJ event loop only
// parses, routes and writes. Streams (SSE) are fed across threads through a small channel.
#pragma once

#include <kj/async-io.h>
#include <kj/compat/http.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "actors/runtime.h"
#include "gateway/peer_transport.h"
#include "gateway/previews.h"

namespace pandastack::gateway {

// Every limit of the API; documented in docs/api.md (Limits), enforced here and tested.
struct Limits {
  size_t max_body_bytes = 1 << 20;                 // JSON request bodies: 413 body_too_large
  size_t max_file_bytes = 64 << 20;                // file uploads and downloads: 413
  uint64_t max_upload_bytes = uint64_t(4) << 30;   // bodies spooled to disk (image archives): 413
  uint64_t max_context_bytes = uint64_t(1) << 30;  // build context archives (spooled too): 413
  size_t max_command_bytes = 64 << 10;             // cmd / argv / stdin of one command: 413
  size_t max_path_bytes = 4096;                    // guest paths: 400 invalid_path
  uint32_t default_exec_timeout_s = 60;            // when a command names none
  uint32_t max_exec_timeout_s = 3600;              // longer: 400
  uint32_t max_exec_output_bytes = 16 << 20;  // per stream of a non-streamed command (truncated)
  size_t max_stream_buffer_bytes = 16 << 20;  // a slow SSE client: the command is cancelled
  std::chrono::milliseconds sse_keepalive{1000};          // comment frames; also detect hang-ups
  std::chrono::milliseconds events_idle_timeout{300000};  // ?follow=1 ends after this idle
  unsigned worker_threads = 64;                           // concurrent runtime calls
  unsigned stream_threads = 64;                           // streams open at once (then 429)
  size_t max_queued_requests = 4096;                      // beyond: 429 too_many_requests
  size_t max_connections = 4096;  // open at once per API (REST, RPC): more are closed at once
  std::chrono::milliseconds body_timeout{60000};  // a request body must arrive within this: 408
  std::chrono::milliseconds tls_handshake_timeout{10000};  // (--tls-cert) then the socket closes
};

// The checks every gateway (REST, RPC) applies to a command before it runs: exactly one of argv or
// shell, the size limit on command + stdin, a valid cwd; sets the output cap. The refusal, if any.
// `user` too: an account name of the guest's (valid_user_name).
std::optional<actors::Rejection> check_exec(vmm::ExecRequest& e, const Limits& limits);
// 1..32 of a-z 0-9 _ -, starting with a letter or _ (what Debian's adduser takes by default).
bool valid_user_name(std::string_view name);

class RpcServer;

class Gateway {
 public:
  Gateway(actors::Runtime& runtime, kj::Timer& timer, Limits limits = {});
  ~Gateway();

  // HTTPS instead of HTTP on listen(): this certificate (then any intermediates) and key, PEM.
  // Throws (kj) when they do not load or do not match. Call before listen().
  void serve_tls(const std::string& cert_pem, const std::string& key_pem);
  // Serves HTTP on `listener` until the returned promise is cancelled.
  kj::Promise<void> listen(kj::ConnectionReceiver& listener);
  // Serves preview URLs (gateway/previews.h): host-based under `settings.domain` and path-based
  // under /v1/sandboxes/{id}/previews/{port}/; without this call both answer 501. `io`: the
  // loop's own (connections to guests). Their token key is DATA/preview-token-secret, replaced
  // in a cluster by one derived from the cluster's token key (serve_peers, called after this).
  void serve_previews(kj::LowLevelAsyncIoProvider& io, PreviewSettings settings);
  // Cluster mode: serves peers (wire/cluster.capnp) on `listener` and forwards requests for ids
  // other hosts own to them. `secret`: the cluster secret; `self`: this host's id. Call once,
  // before listen() serves requests.
  kj::Promise<void> serve_peers(kj::AsyncIoProvider& io, kj::ConnectionReceiver& listener,
                                PeerAuth auth);
  // Cluster mode: peers reach `rpc` (Peer.platform), and `rpc` reaches the sandboxes other hosts
  // own through the peers (after serve_peers). nullptr before `rpc` goes.
  void connect_rpc(RpcServer* rpc);
  // The OpenAPI 3 document of the routes this gateway serves.
  std::string openapi() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace pandastack::gateway
