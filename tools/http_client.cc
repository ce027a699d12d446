#include "tools/http_client.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

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

HttpClient::HttpClient(const std::string& base_url, std::string token,
                       std::chrono::milliseconds timeout)
    : token_(std::move(token)), timeout_(timeout) {
  std::string u = base_url;
  if (u.rfind("http://", 0) != 0) return;
  u = u.substr(7);
  while (!u.empty() && u.back() == '/') u.pop_back();
  auto colon = u.rfind(':');
  if (colon == std::string::npos) {
    host_ = u;
    port_ = 80;
  } else {
    host_ = u.substr(0, colon);
    port_ = std::atoi(u.c_str() + colon + 1);
  }
}

HttpClient::~HttpClient() { close_socket(); }

void HttpClient::close_socket() {
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
    int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (::connect(fd_, a->ai_addr, a->ai_addrlen) == 0) break;
    error = std::string("connect: ") + std::strerror(errno);
    ::close(fd_);
    fd_ = -1;
  }
  ::freeaddrinfo(res);
  return fd_ >= 0;
}

bool HttpClient::read_more(std::string& error) {
  char tmp[65536];
  ssize_t n;
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
                                      const std::string& extra_headers) {
  HttpResponse r;
  if (!valid_url()) {
    r.error = "the URL must look like http://HOST:PORT";
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
    size_t off = 0;
    bool sent = true;
    while (off < msg.size()) {
      ssize_t n = ::send(fd_, msg.data() + off, msg.size() - off, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        sent = false;
        break;
      }
      off += size_t(n);
    }
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
    auto deliver = [&](std::string chunk) {
      if (on_data)
        on_data(chunk);
      else
        r.body += chunk;
    };
    bool ok = true;
    if (r.headers["transfer-encoding"].find("chunked") != std::string::npos) {
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
      }
    } else if (r.headers.count("content-length")) {
      std::string all;
      ok =
          read_exact(std::strtoull(r.headers["content-length"].c_str(), nullptr, 10), all, r.error);
      if (ok) deliver(std::move(all));
    } else if (r.status != 204) {
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

int HttpClient::upgrade(const std::string& path, std::string& leftover, HttpResponse& refused) {
  close_socket();
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
