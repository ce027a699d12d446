// `pandastack sandbox shell ID [-- CMD...]`: an interactive terminal in a sandbox over the
// WebSocket /v1/sandboxes/{id}/pty. The local terminal goes raw (every key goes to the sandbox's
// terminal; its line discipline answers Ctrl-C, Ctrl-D, ...), window size changes follow
// (SIGWINCH -> a resize message), and the exit status is the shell's. Without a local terminal
// (piped input) the input is typed as it is, followed by Ctrl-D at its end.
#include "tools/cli/shell.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <termios.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>

#include "wire/json.h"

namespace pandastack::cli {

namespace {

using wire::Json;

int g_winch_pipe[2] = {-1, -1};

void on_winch(int) {
  char c = 1;
  ssize_t r = ::write(g_winch_pipe[1], &c, 1);
  (void)r;
}

bool send_all(int fd, const std::string& data) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    off += size_t(n);
  }
  return true;
}

// One client frame (RFC 6455: final, masked).
bool send_frame(int fd, int opcode, const std::string& payload) {
  static std::mt19937 rng{std::random_device{}()};
  std::string f;
  f += char(0x80 | opcode);
  size_t n = payload.size();
  if (n < 126) {
    f += char(0x80 | n);
  } else if (n < 65536) {
    f += char(0x80 | 126);
    f += char(n >> 8);
    f += char(n & 0xff);
  } else {
    f += char(0x80 | 127);
    for (int i = 7; i >= 0; --i) f += char((uint64_t(n) >> (8 * i)) & 0xff);
  }
  char mask[4];
  for (auto& m : mask) m = char(rng());
  f.append(mask, 4);
  for (size_t i = 0; i < n; ++i) f += char(payload[i] ^ mask[i % 4]);
  return send_all(fd, f);
}

bool window_size(int& cols, int& rows) {
  winsize ws{};
  if (::ioctl(STDIN_FILENO, TIOCGWINSZ, &ws) != 0 || ws.ws_col == 0 || ws.ws_row == 0) return false;
  cols = ws.ws_col;
  rows = ws.ws_row;
  return true;
}

// The local terminal in raw mode for as long as this lives.
class RawMode {
 public:
  RawMode() {
    if (!::isatty(STDIN_FILENO) || ::tcgetattr(STDIN_FILENO, &saved_) != 0) return;
    termios raw = saved_;
    ::cfmakeraw(&raw);
    active_ = ::tcsetattr(STDIN_FILENO, TCSANOW, &raw) == 0;
  }
  ~RawMode() { restore(); }
  // The terminal as it was (before anything is printed for the user to read).
  void restore() {
    if (active_) ::tcsetattr(STDIN_FILENO, TCSANOW, &saved_);
    active_ = false;
  }
  RawMode(const RawMode&) = delete;
  RawMode& operator=(const RawMode&) = delete;

 private:
  termios saved_{};
  bool active_ = false;
};

void write_out(const std::string& data) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::write(STDOUT_FILENO, data.data() + off, data.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    off += size_t(n);
  }
}

}  // namespace

int shell(tools::HttpClient& http, const std::string& id, const std::vector<std::string>& cmd) {
  std::string buf;
  tools::HttpResponse refused;
  int fd = http.upgrade("/v1/sandboxes/" + tools::url_encode(id) + "/pty", buf, refused);
  if (fd < 0) {
    auto j = Json::parse(refused.body);
    if (j && (*j)["error"].is_object())
      std::fprintf(stderr, "pandastack: %s: %s\n", (*j)["error"]["code"].as_string().c_str(),
                   (*j)["error"]["message"].as_string().c_str());
    else
      std::fprintf(stderr, "pandastack: no terminal: %s\n",
                   refused.error.empty() ? ("HTTP " + std::to_string(refused.status)).c_str()
                                         : refused.error.c_str());
    return 1;
  }
  bool tty = ::isatty(STDIN_FILENO);
  Json settings = Json::object();
  if (cmd.size() == 1) {
    settings.set("cmd", cmd[0]);
  } else if (!cmd.empty()) {
    Json argv = Json::array();
    for (auto& a : cmd) argv.push(a);
    settings.set("argv", argv);
  }
  int cols = 80, rows = 24;
  if (window_size(cols, rows)) {
    settings.set("cols", int64_t(cols));
    settings.set("rows", int64_t(rows));
  }
  if (const char* term = std::getenv("TERM"); term && *term) {
    Json env = Json::object();
    env.set("TERM", term);
    settings.set("env", env);
  }
  send_frame(fd, 1, settings.dump());

  if (::pipe2(g_winch_pipe, O_CLOEXEC | O_NONBLOCK) == 0) ::signal(SIGWINCH, on_winch);
  RawMode raw;
  int exit_code = 1;
  std::string failure;
  bool input_open = true, done = false;
  while (!done) {
    // Whole frames already read are handled before waiting for more.
    while (buf.size() >= 2 && !done) {
      size_t n = uint8_t(buf[1]) & 0x7f, head = 2;
      if (n == 126) {
        if (buf.size() < 4) break;
        n = (size_t(uint8_t(buf[2])) << 8) | uint8_t(buf[3]);
        head = 4;
      } else if (n == 127) {
        if (buf.size() < 10) break;
        n = 0;
        for (int i = 0; i < 8; ++i) n = (n << 8) | uint8_t(buf[2 + i]);
        head = 10;
      }
      if (buf.size() < head + n) break;
      int opcode = uint8_t(buf[0]) & 0x0f;
      std::string payload = buf.substr(head, n);
      buf.erase(0, head + n);
      if (opcode == 2) {
        write_out(payload);
      } else if (opcode == 1) {
        auto j = Json::parse(payload);
        if (!j) continue;
        std::string type = (*j)["type"].is_string() ? (*j)["type"].as_string() : "";
        if (type == "exit") {
          int64_t code = (*j)["exit_code"].as_int();
          exit_code = code < 0 ? int(128 - code) : int(code & 0xff);
        } else if (type == "error") {
          failure = (*j)["code"].as_string() + ": " + (*j)["message"].as_string();
        }
      } else if (opcode == 9) {
        send_frame(fd, 10, payload);
      } else if (opcode == 8) {
        done = true;
      }
    }
    if (done) break;
    pollfd fds[3] = {
        {fd, POLLIN, 0}, {input_open ? STDIN_FILENO : -1, POLLIN, 0}, {g_winch_pipe[0], POLLIN, 0}};
    if (::poll(fds, 3, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) {
      char tmp[65536];
      ssize_t n = ::recv(fd, tmp, sizeof tmp, 0);
      if (n <= 0) break;
      buf.append(tmp, size_t(n));
    }
    if (fds[1].revents & (POLLIN | POLLHUP | POLLERR)) {
      char tmp[16384];
      ssize_t n = ::read(STDIN_FILENO, tmp, sizeof tmp);
      if (n > 0) {
        send_frame(fd, 2, std::string(tmp, size_t(n)));
      } else if (n == 0 || errno != EINTR) {
        input_open = false;
        if (!tty) send_frame(fd, 2, "\x04");  // the end of piped input: Ctrl-D
      }
    }
    if (fds[2].revents & POLLIN) {
      char drain[64];
      while (::read(g_winch_pipe[0], drain, sizeof drain) > 0) {
      }
      if (window_size(cols, rows)) {
        Json r = Json::object();
        r.set("type", "resize");
        r.set("cols", int64_t(cols));
        r.set("rows", int64_t(rows));
        send_frame(fd, 1, r.dump());
      }
    }
  }
  ::close(fd);
  raw.restore();  // (an error printed in raw mode would staircase)
  if (!failure.empty()) {
    std::fprintf(stderr, "\r\npandastack: %s\n", failure.c_str());
    return 1;
  }
  return exit_code;
}

}  // namespace pandastack::cli
