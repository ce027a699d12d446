#include "vmm-driver/qmp.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

namespace pandastack::vmm {

using namespace std::chrono;
using wire::Json;

Result<std::unique_ptr<QmpClient>> QmpClient::connect(const std::string& socket_path, milliseconds deadline,
                                                     const std::function<bool()>& alive,
                                                     int64_t peer_uid) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket_path.size() >= sizeof addr.sun_path)
    return make_error(ErrorCode::invalid_argument, "QMP socket path too long: " + socket_path);
  std::strcpy(addr.sun_path, socket_path.c_str());
  auto until = steady_clock::now() + deadline;
  for (;;) {
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return make_error(ErrorCode::io_error, std::string("socket: ") + strerror(errno));
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
      if (peer_uid >= 0) {
        ucred cred{};
        socklen_t len = sizeof cred;
        if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 ||
            int64_t(cred.uid) != peer_uid) {
          ::close(fd);
          return make_error(ErrorCode::qmp_error,
                            "QMP socket " + socket_path + " is served by uid " +
                                std::to_string(cred.uid) + ", not this VM's QEMU (uid " +
                                std::to_string(peer_uid) + "): refusing it");
        }
      }
      std::unique_ptr<QmpClient> c(new QmpClient(fd));
      auto greeting = c->read_message(until);
      if (!greeting) return greeting.error();
      if (!greeting->has("QMP"))
        return make_error(ErrorCode::qmp_error, "unexpected QMP greeting: " + greeting->dump());
      const Json& v = (*greeting)["QMP"]["version"]["qemu"];
      c->version_ = std::to_string(v["major"].as_int()) + "." + std::to_string(v["minor"].as_int()) + "." +
                    std::to_string(v["micro"].as_int());
      auto caps = c->execute("qmp_capabilities", {}, duration_cast<milliseconds>(until - steady_clock::now()));
      if (!caps) return caps.error();
      return c;
    }
    int e = errno;
    ::close(fd);
    if (alive && !alive())
      return make_error(ErrorCode::qmp_error, "QMP connection closed (QEMU exited?): QEMU is gone");
    if (steady_clock::now() >= until)
      return make_error(ErrorCode::timeout, "QMP socket " + socket_path + " not available: " + strerror(e));
    std::this_thread::sleep_for(microseconds(500));
  }
}

QmpClient::~QmpClient() { ::close(fd_); }

Result<Json> QmpClient::wait_event(const std::string& name, const std::function<bool(const Json&)>& match,
                                   milliseconds timeout) {
  for (auto it = events_.begin(); it != events_.end(); ++it) {
    if ((*it)["event"].as_string() == name && match((*it)["data"])) {
      Json e = *it;
      events_.erase(it);
      return e;
    }
  }
  auto deadline = steady_clock::now() + timeout;
  for (;;) {
    auto msg = read_message(deadline);
    if (!msg) return msg.error();
    if (!msg->has("event")) continue;  // a reply to nothing we wait for
    if ((*msg)["event"].as_string() == name && match((*msg)["data"])) return std::move(*msg);
    if (events_.size() >= kMaxEvents) events_.erase(events_.begin());  // the oldest unclaimed go first
    events_.push_back(std::move(*msg));
  }
}

std::vector<Json> QmpClient::take_events() { return std::exchange(events_, {}); }

Result<Json> QmpClient::read_message(steady_clock::time_point deadline) {
  for (;;) {
    auto nl = buffer_.find('\n');
    if (nl != std::string::npos) {
      std::string line = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      if (line.find_first_not_of(" \r\t") == std::string::npos) continue;
      Json::ParseError perr;
      auto msg = Json::parse(line, &perr);
      if (!msg) return make_error(ErrorCode::qmp_error, "bad QMP message (" + perr.message + "): " + line);
      return std::move(*msg);
    }
    auto left = duration_cast<milliseconds>(deadline - steady_clock::now()).count();
    if (left <= 0) return make_error(ErrorCode::timeout, "QMP reply timed out");
    pollfd p{fd_, POLLIN, 0};
    int r = ::poll(&p, 1, int(left));
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) return make_error(ErrorCode::timeout, "QMP reply timed out");
    char buf[8192];
    ssize_t n = ::read(fd_, buf, sizeof buf);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return make_error(ErrorCode::qmp_error, "QMP connection closed (QEMU exited?)");
    buffer_.append(buf, size_t(n));
    // A compromised QEMU cannot grow the daemon: no QMP message this driver reads is near 1 MiB.
    if (buffer_.size() > kMaxLine)
      return make_error(ErrorCode::qmp_error, "QMP message over 1 MiB: closing the channel");
  }
}

Result<Json> QmpClient::execute(const std::string& command, const Json& arguments, milliseconds timeout, int fd) {
  Json req = Json::object();
  req.set("execute", command);
  if (arguments.is_object()) req.set("arguments", arguments);
  std::string line = req.dump() + "\n";
  msghdr msg{};
  iovec iov{line.data(), line.size()};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  if (fd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  }
  size_t sent = 0;
  while (sent < line.size()) {
    iov.iov_base = line.data() + sent;
    iov.iov_len = line.size() - sent;
    ssize_t n = ::sendmsg(fd_, &msg, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return make_error(ErrorCode::qmp_error, std::string("QMP send failed: ") + strerror(errno));
    sent += size_t(n);
    msg.msg_control = nullptr;  // the descriptor goes with the first bytes only
    msg.msg_controllen = 0;
  }
  auto deadline = steady_clock::now() + timeout;
  for (;;) {
    auto reply = read_message(deadline);
    if (!reply) return reply.error();
    if (reply->has("event")) {
      if (events_.size() >= kMaxEvents) events_.erase(events_.begin());
      events_.push_back(std::move(*reply));
      continue;
    }
    if (reply->has("error")) {
      const Json& e = (*reply)["error"];
      return make_error(ErrorCode::qmp_error,
                        command + ": " + e["class"].as_string() + ": " + e["desc"].as_string());
    }
    if (reply->has("return")) return (*reply)["return"];
    return make_error(ErrorCode::qmp_error, "unexpected QMP reply: " + reply->dump());
  }
}

}  // namespace pandastack::vmm
