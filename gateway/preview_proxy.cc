// The preview reverse proxy (previews.h): a request addressed to a preview is checked (the
// preview exists and has not expired; a public one, or its token in the URL or its cookie; the
// tenant's request rate), then passed to the guest port over a TCP connection made inside the
// sandbox's network namespace: HTTP/1.1 with streamed bodies both ways, WebSocket upgrades, the
// client's Host and X-Forwarded-* headers. One connection to the guest per request (the client's
// connection keeps alive); the access check runs again for every request, so closing a preview,
// killing or hibernating its sandbox takes effect at the next request.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/rand.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <ctime>

#include "gateway/e2b.h"
#include "gateway/server.h"

namespace pandastack::gateway {

namespace {

// Frame masks and handshake keys of the proxy's WebSockets to the guest (kj asks for entropy).
class RandomBytes final : public kj::EntropySource {
 public:
  void generate(kj::ArrayPtr<kj::byte> buffer) override {
    RAND_bytes(buffer.begin(), int(buffer.size()));
  }
};
RandomBytes g_random;

// A request body cut off past `limit` bytes (a chunked upload has no length to check up front).
class LimitedInput final : public kj::AsyncInputStream {
 public:
  LimitedInput(kj::AsyncInputStream& in, uint64_t limit) : in_(in), left_(limit) {}
  kj::Promise<size_t> tryRead(void* buffer, size_t min, size_t max) override {
    return in_.tryRead(buffer, min, max).then([this](size_t n) {
      KJ_REQUIRE(n <= left_, "body_too_large: the preview's request body is over its limit");
      left_ -= n;
      return n;
    });
  }
  kj::Maybe<uint64_t> tryGetLength() override { return in_.tryGetLength(); }

 private:
  kj::AsyncInputStream& in_;
  uint64_t left_;
};

// What the check decided: an answer of the proxy's own, a redirect that trades the URL's token
// for a cookie, or a connection to the guest.
struct Admission {
  std::optional<HttpReply> reply;
  int fd = -1;
  std::string set_cookie;  // a Set-Cookie value to add to the guest's answer (or the redirect's)
  bool redirect = false;
  ~Admission() {
    if (fd >= 0) ::close(fd);
  }
  Admission() = default;
  Admission(Admission&& o) noexcept
      : reply(std::move(o.reply)),
        fd(o.fd),
        set_cookie(std::move(o.set_cookie)),
        redirect(o.redirect) {
    o.fd = -1;
  }
  Admission& operator=(Admission&& o) noexcept {
    if (this != &o) {
      if (fd >= 0) ::close(fd);
      reply = std::move(o.reply);
      fd = o.fd;
      o.fd = -1;
      set_cookie = std::move(o.set_cookie);
      redirect = o.redirect;
    }
    return *this;
  }
};

}  // namespace

void Server::count_preview(const std::string& outcome) {
  std::lock_guard l(metrics_mu);
  ++preview_requests[outcome];
}

kj::Promise<void> Server::proxy_preview(PreviewAddress a, int fd, kj::HttpMethod method,
                                        const kj::HttpHeaders& headers, kj::AsyncInputStream& body,
                                        kj::HttpService::Response& response, Clock::time_point t0) {
  auto refuse = [this, &response, t0](HttpReply r) {
    count_preview("refused");
    return send(response, std::move(r), t0);
  };
  if (!preview_tokens || !lowlevel)
    return refuse(error_reply(Code::not_implemented, "this server does not serve preview URLs"));
  KJ_IF_MAYBE (len, body.tryGetLength()) {
    if (*len > preview.max_upload_bytes)
      return refuse(error_reply(Code::body_too_large, "a preview's request body is at most " +
                                                          std::to_string(preview.max_upload_bytes) +
                                                          " bytes"));
  }
  std::vector<std::string> cookies;
  KJ_IF_MAYBE (c, headers.get(h_cookie)) {
    cookies = cookie_values(c->cStr(), kPreviewCookie);
  }
  std::string traffic_token;
  KJ_IF_MAYBE (t, headers.get(h_traffic_token)) {
    if (t->size() <= 1024) traffic_token = t->cStr();
  }
  bool safe = method == kj::HttpMethod::GET || method == kj::HttpMethod::HEAD;
  bool upgrade = headers.isWebSocket();
  auto check = [this, a, cookies = std::move(cookies), traffic_token, safe,
                upgrade]() -> Admission {
    Admission out;
    auto refuse = [&](Code code, const std::string& message) {
      out.reply = error_reply(code, message);
      return std::move(out);
    };
    // Admitted: the tenant's request rate, then the connection to the guest.
    auto connect = [&](const std::string& tenant) {
      if (!limiter.take("preview:" + tenant, rt.quota_limits(tenant).requests_per_second))
        return refuse(Code::too_many_requests, "the tenant's request rate is exhausted");
      auto conn = rt.connect_guest(tenant, a.id, a.port, preview.connect_timeout);
      if (!conn) return refuse(conn.error().code, conn.error().message);
      out.fd = *conn;
      return std::move(out);
    };
    auto info = rt.preview_target(a.id);
    if (info && !info->previews.count(a.port) && a.host_based) {
      // A sandbox made through E2B's API: its ports are served as E2B serves them (getHost).
      auto e2b_traffic = info->metadata.find(e2b::kPublicTrafficKey);
      if (e2b_traffic != info->metadata.end()) {
        bool open = e2b_traffic->second == "1";
        if (!open && !traffic_token.empty()) {
          auto claims = e2b::tokens().verify(traffic_token, a.id, int64_t(std::time(nullptr)));
          open = claims && claims->tenant == info->tenant;
        }
        if (!open)
          return refuse(Code::unauthorized,
                        "this sandbox's ports need its traffic access token "
                        "(E2B-Traffic-Access-Token)");
        return connect(info->tenant);
      }
    }
    if (!info || !info->previews.count(a.port))
      return refuse(Code::preview_not_found, "port " + std::to_string(a.port) + " of sandbox " +
                                                 a.id + " has no preview URL");
    const actors::Preview& p = info->previews.at(a.port);
    if (now_ms() >= p.expires_at_ms)
      return refuse(Code::preview_not_found, "the preview URL of port " + std::to_string(a.port) +
                                                 " of sandbox " + a.id + " expired");
    bool by_token = !a.token.empty() && preview_tokens->verify(a.token, a.id, p);
    bool by_cookie = false;
    for (auto& c : cookies) by_cookie = by_cookie || preview_tokens->verify(c, a.id, p);
    if (!p.is_public && !by_token && !by_cookie)
      return refuse(Code::unauthorized,
                    a.token.empty() && cookies.empty()
                        ? "this preview URL needs its token (the `token` query parameter)"
                        : "wrong, expired or revoked preview token");
    if (by_token) {
      auto max_age = std::max<int64_t>(1, (p.expires_at_ms - now_ms()) / 1000);
      out.set_cookie = std::string(kPreviewCookie) + "=" + a.token + "; Path=" + a.cookie_path +
                       "; Max-Age=" + std::to_string(max_age) + "; HttpOnly; SameSite=Lax";
      // A page load trades the token in its URL for the cookie (the token leaves the address
      // bar and Referer headers); other requests carry the cookie home with their answer.
      if (safe && !upgrade) {
        out.redirect = true;
        return out;
      }
    }
    return connect(info->tenant);
  };
  Admission busy;
  busy.reply = busy_reply();
  return pool->offload<Admission>(check, std::move(busy))
      .then([this, a = std::move(a), fd, method, &headers, &body, &response, t0,
             upgrade](Admission admitted) mutable -> kj::Promise<void> {
        auto* ad = &admitted;
        if (ad->reply) {
          count_preview("refused");
          return send(response, std::move(*ad->reply), t0);
        }
        if (ad->redirect) {
          count_preview("redirected");
          kj::HttpHeaders h(*table);
          std::string location = a.host_based ? a.target : a.prefix + a.target;
          h.set(kj::HttpHeaderId::LOCATION, kj::str(location.c_str()));
          h.add("Set-Cookie", kj::str(ad->set_cookie.c_str()));
          h.set(h_cache_control, "no-store");
          response.send(302, "Found", h, uint64_t(0));
          return kj::READY_NOW;
        }
        // The guest's connection, and the request as the guest sees it. (Attachments go in
        // reverse order: what uses the stream is attached after it, so it goes first.)
        auto stream = lowlevel->wrapSocketFd(ad->fd, kj::LowLevelAsyncIoProvider::TAKE_OWNERSHIP);
        ad->fd = -1;
        kj::HttpClientSettings settings;
        settings.entropySource = g_random;
        auto client = kj::newHttpClient(*table, *stream, settings);
        auto h = kj::heap<kj::HttpHeaders>(headers.clone());
        KJ_IF_MAYBE (c, headers.get(h_cookie)) {
          auto rest = without_cookie(c->cStr(), kPreviewCookie);
          if (rest.empty())
            h->unset(h_cookie);
          else
            h->set(h_cookie, kj::str(rest.c_str()));
        }
        h->unset(h_x_forwarded_for);  // (a client's own says nothing the guest may trust)
        if (!a.client_address.empty()) h->set(h_x_forwarded_for, kj::str(a.client_address.c_str()));
        KJ_IF_MAYBE (host, headers.get(kj::HttpHeaderId::HOST)) {
          h->set(h_x_forwarded_host, kj::str(*host));
        }
        h->set(h_x_forwarded_proto, kj::str(preview.scheme.c_str()));
        if (!a.host_based) h->set(h_x_forwarded_prefix, kj::str(a.prefix.c_str()));
        auto target = kj::str(a.target.c_str());
        // The answer's headers as the client gets them: the cookie, and (path-based: the page
        // shares the API's origin) a sandboxed origin for anything the app serves.
        auto finish_headers = [this, set_cookie = ad->set_cookie,
                               path_based = !a.host_based](const kj::HttpHeaders& in) {
          auto out = in.clone();
          if (!set_cookie.empty()) out.add("Set-Cookie", kj::str(set_cookie.c_str()));
          if (path_based)
            out.set(h_csp,
                    "sandbox allow-scripts allow-forms allow-popups allow-modals "
                    "allow-downloads");
          return out;
        };
        auto timeout = preview.response_timeout.count() * kj::MILLISECONDS;
        if (upgrade) {
          count_preview("websocket");
          auto opened = client->openWebSocket(target, *h);
          return timer.timeoutAfter(timeout, kj::mv(opened))
              .then([this, &response, finish_headers](
                        kj::HttpClient::WebSocketResponse r) mutable -> kj::Promise<void> {
                auto out_headers = finish_headers(*r.headers);
                KJ_SWITCH_ONEOF(r.webSocketOrBody) {
                  KJ_CASE_ONEOF(ws, kj::Own<kj::WebSocket>) {
                    auto down = response.acceptWebSocket(out_headers);
                    auto& up = *ws;
                    auto& d = *down;
                    return d.pumpTo(up)
                        .exclusiveJoin(up.pumpTo(d))
                        .attach(kj::mv(ws), kj::mv(down));
                  }
                  KJ_CASE_ONEOF(b, kj::Own<kj::AsyncInputStream>) {
                    auto out =
                        response.send(r.statusCode, r.statusText, out_headers, b->tryGetLength());
                    auto& in = *b;
                    return in.pumpTo(*out).ignoreResult().attach(kj::mv(b), kj::mv(out));
                  }
                }
                KJ_UNREACHABLE;
              })
              .attach(kj::mv(stream), kj::mv(client), kj::mv(h), kj::mv(target));
        }
        count_preview("proxied");
        auto limited = kj::heap<LimitedInput>(body, preview.max_upload_bytes);
        auto req = client->request(method, target, *h, body.tryGetLength());
        auto& lim = *limited;
        auto& req_body = *req.body;
        auto upload =
            lim.pumpTo(req_body)
                .ignoreResult()
                .attach(kj::mv(req.body), kj::mv(limited))
                .eagerlyEvaluate([](kj::Exception&& e) {
                  spdlog::debug("preview: upload ended early: {}", e.getDescription().cStr());
                });
        auto answered = std::make_shared<bool>(false);
        // (A client that hangs up before the answer cancels the request to the guest.)
        return until_hangup(
            fd,
            timer.timeoutAfter(timeout, kj::mv(req.response))
                .then([&response, finish_headers,
                       answered](kj::HttpClient::Response r) mutable -> kj::Promise<void> {
                  *answered = true;
                  auto out = response.send(r.statusCode, r.statusText, finish_headers(*r.headers),
                                           r.body->tryGetLength());
                  auto& in = *r.body;
                  return in.pumpTo(*out).ignoreResult().attach(kj::mv(r.body), kj::mv(out));
                })
                .catch_([this, &response, t0, answered, a](kj::Exception&& e) -> kj::Promise<void> {
                  if (*answered) return kj::mv(e);  // mid-answer: the connection closes
                  auto why = std::string(e.getDescription().cStr());
                  bool slow = e.getType() == kj::Exception::Type::OVERLOADED ||
                              why.find("timed out") != std::string::npos;
                  return send(
                      response,
                      error_reply(Code::upstream_unreachable,
                                  std::string(slow ? "no answer in time" : "no valid answer") +
                                      " from port " + std::to_string(a.port) + " of sandbox " +
                                      a.id),
                      t0);
                })
                .attach(kj::mv(stream), kj::mv(client), kj::mv(h), kj::mv(target), kj::mv(upload)));
      });
}

}  // namespace pandastack::gateway
