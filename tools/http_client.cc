#include "tools/http_client.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>

#include "wire/base64.h"

namespace pandastack::tools {

std::string base64(std::string_view data) { return wire::base64_encode(data); }

std::string url_encode(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '/' || c == '-' || c == '_' || c == '.' || c == '~') {
      out += char(c);
    } else {
      char b[4];
      std::snprintf(b, sizeof b, "%%%02X", c);
      out += b;
    }
  }
  return out;
}

std::optional<double> HttpResponse::server_ms() const {
  auto it = headers.find("server-timing");
  if (it == headers.end()) return std::nullopt;
  auto p = it->second.find("dur=");
  if (p == std::string::npos) return std::nullopt;
  return std::strtod(it->second.c_str() + p + 4, nullptr);
}

namespace {

std::string openssl_error(const std::string& what) {
  unsigned long e = ERR_get_error();
  char b[256] = "";
  if (e != 0) ERR_error_string_n(e, b, sizeof b);
  ERR_clear_error();
  return what + (e != 0 ? std::string(": ") + b : std::string());
}

}  // namespace

HttpClient::HttpClient(const std::string& base_url, std::string token,
                       std::chrono::milliseconds timeout, std::optional<TlsFiles> tls)
    : token_(std::move(token)), timeout_(timeout) {
  std::string u = base_url;
  bool https = u.rfind("https://", 0) == 0;
  if (!https && u.rfind("http://", 0) != 0) {
    setup_error_ = "the URL must look like http://HOST:PORT or https://HOST:PORT";
    return;
  }
  u = u.substr(https ? 8 : 7);
  while (!u.empty() && u.back() == '/') u.pop_back();
  auto colon = u.rfind(':');
  if (colon == std::string::npos) {
    host_ = u;
    port_ = https ? 443 : 80;
  } else {
    host_ = u.substr(0, colon);
    port_ = std::atoi(u.c_str() + colon + 1);
  }
  if (port_ <= 0) setup_error_ = "the URL has no valid port: " + base_url;
  if (!https) return;
  if (!tls || tls->ca.empty()) {
    setup_error_ = "an https:// URL needs the CA to verify the server with";
    return;
  }
  tls_ = SSL_CTX_new(TLS_client_method());
  if (tls_ == nullptr) {
    setup_error_ = openssl_error("TLS context");
    return;
  }
  SSL_CTX_set_min_proto_version(tls_, TLS1_2_VERSION);
  SSL_CTX_set_verify(tls_, SSL_VERIFY_PEER, nullptr);
  if (SSL_CTX_load_verify_locations(tls_, tls->ca.c_str(), nullptr) != 1)
    setup_error_ = openssl_error("CA " + tls->ca);
  else if (!tls->cert.empty() &&
           (SSL_CTX_use_certificate_chain_file(tls_, tls->cert.c_str()) != 1 ||
            SSL_CTX_use_PrivateKey_file(tls_, tls->key.c_str(), SSL_FILETYPE_PEM) != 1 ||
            SSL_CTX_check_private_key(tls_) != 1))
    setup_error_ = openssl_error("client certificate " + tls->cert + " / " + tls->key);
}

HttpClient::~HttpClient() {
  close_socket();
  if (tls_ != nullptr) SSL_CTX_free(tls_);
}

void HttpClient::close_socket() {
  if (ssl_ != nullptr) SSL_free(ssl_);
  ssl_ = nullptr;
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  buf_.clear();
}

bool HttpClient::connect_socket(std::string& error) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_socktype = SOCK_STREAM;
  int rc = ::getaddrinfo(host_.c_str(), std::to_string(port_).c_str(), &hints, &res);
  if (rc != 0) {
    error = std::string("resolve ") + host_ + ": " + gai_strerror(rc);
    return false;
  }
  for (auto* a = res; a; a = a->ai_next) {
    fd_ = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd_ < 0) continue;
    timeval tv{};
    tv.tv_sec = timeout_.count() / 1000;
    tv.tv_usec = (timeout_.count() % 1000) * 1000;
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ::setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (::connect(fd_, a->ai_addr, a->ai_addrlen) == 0) break;
    error = std::string("connect: ") + std::strerror(errno);
    ::close(fd_);
    fd_ = -1;
  }
  ::freeaddrinfo(res);
  if (fd_ < 0 || tls_ == nullptr) return fd_ >= 0;
  // TLS: the server's certificate must chain to our CA and name the host we dialled.
  ssl_ = SSL_new(tls_);
  bool ok = ssl_ != nullptr && SSL_set_fd(ssl_, fd_) == 1;
  if (ok) {
    in6_addr ip6;
    in_addr ip4;
    bool is_ip = ::inet_pton(AF_INET, host_.c_str(), &ip4) == 1 ||
                 ::inet_pton(AF_INET6, host_.c_str(), &ip6) == 1;
    X509_VERIFY_PARAM* param = SSL_get0_param(ssl_);
    ok = is_ip ? X509_VERIFY_PARAM_set1_ip_asc(param, host_.c_str()) == 1
               : (SSL_set_tlsext_host_name(ssl_, host_.c_str()) == 1 &&
                  X509_VERIFY_PARAM_set1_host(param, host_.c_str(), 0) == 1);
  }
  if (ok && SSL_connect(ssl_) != 1) {
    long v = SSL_get_verify_result(ssl_);
    error = v != X509_V_OK
                ? "TLS: the server's certificate: " + std::string(X509_verify_cert_error_string(v))
                : openssl_error("TLS handshake with " + host_);
    close_socket();
    return false;
  }
  if (!ok) {
    error = openssl_error("TLS session");
    close_socket();
    return false;
  }
  return true;
}

bool HttpClient::send_all(const std::string& msg) {
  size_t off = 0;
  while (off < msg.size()) {
    if (ssl_ != nullptr) {
      int n = SSL_write(ssl_, msg.data() + off, int(std::min<size_t>(msg.size() - off, 1 << 30)));
      if (n <= 0) return false;
      off += size_t(n);
      continue;
    }
    ssize_t n = ::send(fd_, msg.data() + off, msg.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    off += size_t(n);
  }
  return true;
}

bool HttpClient::read_more(std::string& error) {
  char tmp[65536];
  ssize_t n;
  if (ssl_ != nullptr) {
    n = SSL_read(ssl_, tmp, int(sizeof tmp));
    if (n <= 0) {
      int e = SSL_get_error(ssl_, int(n));
      error = e == SSL_ERROR_ZERO_RETURN ? "connection closed"
              : e == SSL_ERROR_SYSCALL   ? std::string("recv: ") + std::strerror(errno)
                                         : openssl_error("TLS read");
      return false;
    }
    buf_.append(tmp, size_t(n));
    return true;
  }
  do {
    n = ::recv(fd_, tmp, sizeof tmp, 0);
  } while (n < 0 && errno == EINTR);
  if (n <= 0) {
    error = n == 0 ? "connection closed" : std::string("recv: ") + std::strerror(errno);
    return false;
  }
  buf_.append(tmp, size_t(n));
  return true;
}

bool HttpClient::read_line(std::string& line, std::string& error) {
  for (;;) {
    auto p = buf_.find("\r\n");
    if (p != std::string::npos) {
      line = buf_.substr(0, p);
      buf_.erase(0, p + 2);
      return true;
    }
    if (!read_more(error)) return false;
  }
}

bool HttpClient::read_exact(size_t n, std::string& out, std::string& error) {
  while (buf_.size() < n)
    if (!read_more(error)) return false;
  out.append(buf_, 0, n);
  buf_.erase(0, n);
  return true;
}

HttpResponse HttpClient::request(const std::string& method, const std::string& path,
                                 const std::string& body, const std::string& content_type) {
  return request_impl(method, path, body, content_type, nullptr);
}

HttpResponse HttpClient::request_impl(const std::string& method, const std::string& path,
                                      const std::string& body, const std::string& content_type,
                                      const std::function<void(const std::string&)>& on_data,
                                      const std::string& extra_headers, const Accept& accept,
                                      size_t max_body) {
  HttpResponse r;
  if (!valid_url()) {
    r.error = setup_error_;
    return r;
  }
  std::string head = method + " " + path + " HTTP/1.1\r\nHost: " + host_ + "\r\n";
  if (!token_.empty()) head += "Authorization: Bearer " + token_ + "\r\n";
  head += extra_headers;
  if (!body.empty() || method == "POST" || method == "PUT" || method == "PATCH")
    head += "Content-Type: " + content_type + "\r\nContent-Length: " + std::to_string(body.size()) +
            "\r\n";
  head += "\r\n";
  std::string msg = head + body;
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (fd_ < 0 && !connect_socket(r.error)) return r;
    bool reused = attempt == 0 && buf_.empty();
    bool sent = send_all(msg);
    std::string line;
    if (!sent || !read_line(line, r.error)) {
      close_socket();
      if (reused) continue;  // the server closed a kept-alive connection: once more
      if (r.error.empty()) r.error = "send failed";
      return r;
    }
    r.error.clear();
    if (line.size() < 12 || line.rfind("HTTP/1.", 0) != 0) {
      r.error = "bad status line: " + line;
      close_socket();
      return r;
    }
    r.status = std::atoi(line.c_str() + 9);
    for (;;) {
      if (!read_line(line, r.error)) {
        close_socket();
        r.status = 0;
        return r;
      }
      if (line.empty()) break;
      auto c = line.find(':');
      if (c == std::string::npos) continue;
      std::string k = line.substr(0, c), v = line.substr(c + 1);
      for (auto& ch : k) ch = char(std::tolower((unsigned char)ch));
      while (!v.empty() && v.front() == ' ') v.erase(0, 1);
      r.headers[k] = v;
    }
    if (r.status == 101) return r;  // the connection is someone else's protocol now
    const bool streamed = on_data && (!accept || accept(r.status, r.headers));
    bool ok = true;
    auto deliver = [&](std::string chunk) {
      if (streamed) {
        on_data(chunk);
      } else if (r.body.size() + chunk.size() > max_body) {
        r.error = "the answer's body is larger than " + std::to_string(max_body) + " bytes";
        ok = false;
      } else {
        r.body += chunk;
      }
    };
    if (method == "HEAD" || r.status == 204 || r.status == 304) {
      // no body, whatever Content-Length says
    } else if (r.headers["transfer-encoding"].find("chunked") != std::string::npos) {
      for (;;) {
        if (!read_line(line, r.error)) {
          ok = false;
          break;
        }
        size_t n = std::strtoul(line.c_str(), nullptr, 16);
        std::string chunk;
        if (!read_exact(n, chunk, r.error) || !read_line(line, r.error)) {
          ok = false;
          break;
        }
        if (n == 0) break;
        deliver(std::move(chunk));
        if (!ok) break;
      }
    } else if (r.headers.count("content-length")) {
      uint64_t left = std::strtoull(r.headers["content-length"].c_str(), nullptr, 10);
      if (!streamed && left > max_body) {
        r.error = "the answer's body is larger than " + std::to_string(max_body) + " bytes";
        ok = false;
      }
      while (ok && left > 0) {  // (in parts: a streamed body is never held whole)
        std::string part;
        size_t n = size_t(std::min<uint64_t>(left, 1 << 20));
        ok = read_exact(n, part, r.error);
        if (ok) deliver(std::move(part));
        left -= n;
      }
    } else {
      std::string err;
      while (read_more(err)) {
      }
      deliver(std::move(buf_));
      buf_.clear();
      close_socket();
    }
    if (!ok) {
      close_socket();
      r.status = 0;
    }
    if (r.headers["connection"] == "close") close_socket();
    return r;
  }
  return r;
}

HttpResponse HttpClient::exchange(const std::string& method, const std::string& path,
                                  const std::string& extra_headers, const Accept& accept,
                                  const std::function<void(const std::string&)>& on_data,
                                  size_t max_body) {
  return request_impl(method, path, "", "application/json", on_data, extra_headers, accept,
                      max_body);
}

HttpResponse HttpClient::send(const std::string& method, const std::string& path,
                              const std::string& body, const std::string& content_type,
                              const std::string& extra_headers, size_t max_body) {
  return request_impl(method, path, body, content_type, nullptr, extra_headers, nullptr, max_body);
}

int HttpClient::upgrade(const std::string& path, std::string& leftover, HttpResponse& refused) {
  close_socket();
  if (tls_ != nullptr) {  // (the socket handed over would carry TLS records)
    refused = HttpResponse{};
    refused.error = "WebSocket upgrades over https:// are not supported by this client";
    return -1;
  }
  std::random_device rd;
  unsigned char nonce[16];
  for (auto& b : nonce) b = static_cast<unsigned char>(rd());
  std::string headers =
      "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
      "Sec-WebSocket-Key: " +
      base64(std::string_view(reinterpret_cast<char*>(nonce), sizeof nonce)) + "\r\n";
  refused = request_impl("GET", path, "", "", nullptr, headers);
  if (refused.status != 101) {
    close_socket();
    return -1;
  }
  int fd = fd_;
  fd_ = -1;
  leftover.swap(buf_);
  buf_.clear();
  timeval none{};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &none, sizeof none);
  return fd;
}

}  // namespace pandastack::tools
