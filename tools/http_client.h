// A small blocking HTTP/1.1 client over one keep-alive TCP connection (the CLI, the API benchmark,
// and etcd). Handles Content-Length and chunked bodies; no redirects. https:// URLs speak TLS
// (OpenSSL, TLS 1.2+) against the given CA only, with an optional client certificate.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>

struct ssl_ctx_st;
struct ssl_st;

namespace pandastack::tools {

struct HttpResponse {
  int status = 0;
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
  std::string error;  // transport failure (status 0)
  // Server-Timing "total;dur=X" in ms, when the server sent it.
  std::optional<double> server_ms() const;
};

// Percent-encodes `s` for a URL path or query value ('/' is kept).
std::string url_encode(const std::string& s);
// Standard base64 (with padding).
std::string base64(std::string_view data);

// What an https:// client trusts and presents (PEM files).
struct TlsFiles {
  std::string ca;    // the only CA(s) a server's certificate may chain to
  std::string cert;  // the client certificate ("" = none)
  std::string key;   // its private key
};

class HttpClient {
 public:
  // `base_url`: http://HOST:PORT, or https://HOST:PORT with `tls` (a path prefix is not
  // supported). The server's certificate must name HOST (DNS or IP SAN).
  HttpClient(const std::string& base_url, std::string bearer_token,
             std::chrono::milliseconds timeout = std::chrono::seconds(300),
             std::optional<TlsFiles> tls = std::nullopt);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  bool valid_url() const { return port_ > 0 && setup_error_.empty(); }
  // Why the client cannot be used (a bad URL, unreadable TLS files), or "".
  const std::string& setup_error() const { return setup_error_; }
  // Sends one request (reconnecting once if the kept-alive connection was closed).
  HttpResponse request(const std::string& method, const std::string& path,
                       const std::string& body = "",
                       const std::string& content_type = "application/json");
  // For streams: calls `on_data` with body bytes as they arrive (chunked or not).
  template <typename F>
  HttpResponse stream(const std::string& method, const std::string& path, const std::string& body,
                      F&& on_data) {
    return request_impl(method, path, body, "application/json", on_data);
  }
  // Which responses stream to `on_data`: given the status and headers (names lower-cased).
  using Accept = std::function<bool(int status, const std::map<std::string, std::string>&)>;
  // One request with extra header lines (each "Name: value\r\n"): an accepted response's body
  // goes to `on_data` as it arrives (in parts of at most 1 MiB, never held whole), any other
  // into the answer's body (at most `max_body` bytes: more fails the request).
  HttpResponse exchange(const std::string& method, const std::string& path,
                        const std::string& extra_headers, const Accept& accept,
                        const std::function<void(const std::string&)>& on_data,
                        size_t max_body = 4 << 20);
  // One request with a body and extra header lines (each "Name: value\r\n"), its answer's body
  // held whole (at most `max_body` bytes). HEAD answers carry no body. (The object store.)
  HttpResponse send(const std::string& method, const std::string& path, const std::string& body,
                    const std::string& content_type, const std::string& extra_headers,
                    size_t max_body);
  // The Host header's value this client sends (what a request signature covers).
  const std::string& host() const { return host_; }
  // A WebSocket upgrade of GET `path` on a fresh connection. On 101 the socket is the caller's
  // (returned; blocking, no receive timeout) and `leftover` holds the bytes read past the
  // response's head; otherwise -1, and `refused` is the reply (or a transport error).
  int upgrade(const std::string& path, std::string& leftover, HttpResponse& refused);

 private:
  HttpResponse request_impl(const std::string& method, const std::string& path,
                            const std::string& body, const std::string& content_type,
                            const std::function<void(const std::string&)>& on_data,
                            const std::string& extra_headers = "", const Accept& accept = nullptr,
                            size_t max_body = SIZE_MAX);
  bool connect_socket(std::string& error);
  void close_socket();
  bool read_more(std::string& error);
  bool read_line(std::string& line, std::string& error);
  bool read_exact(size_t n, std::string& out, std::string& error);
  bool send_all(const std::string& msg);

  std::string host_, token_, setup_error_;
  ssl_ctx_st* tls_ = nullptr;  // https: the context every connection's session comes from
  ssl_st* ssl_ = nullptr;      // the connection's session
  int port_ = 0;
  std::chrono::milliseconds timeout_;
  int fd_ = -1;
  std::string buf_;
};

}  // namespace pandastack::tools
