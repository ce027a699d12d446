#include "tools/tar_writer.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

namespace pandastack::tools {

namespace fs = std::filesystem;

namespace {

// An octal field of `width` bytes (its last one NUL), as ustar writes numbers.
void octal(char* field, size_t width, uint64_t v) {
  std::string s(width - 1, '0');
  for (size_t i = width - 1; i-- > 0 && v;) {
    s[i] = char('0' + (v & 7));
    v >>= 3;
  }
  std::memcpy(field, s.data(), width - 1);
  field[width - 1] = '\0';
}

}  // namespace

std::string ustar_header(const std::string& name, char type, uint64_t size, uint32_t mode,
                         int64_t mtime, const std::string& link) {
  char h[512] = {};
  std::memcpy(h, name.data(), std::min<size_t>(name.size(), 100));
  octal(h + 100, 8, mode & 07777);
  octal(h + 108, 8, 0);  // uid: root
  octal(h + 116, 8, 0);  // gid
  octal(h + 124, 12, size);
  octal(h + 136, 12, uint64_t(std::max<int64_t>(mtime, 0)));
  std::memset(h + 148, ' ', 8);
  h[156] = type;
  std::memcpy(h + 157, link.data(), std::min<size_t>(link.size(), 100));
  std::memcpy(h + 257, "ustar", 6);
  std::memcpy(h + 263, "00", 2);
  unsigned sum = 0;
  for (unsigned char c : h) sum += c;
  octal(h + 148, 7, sum);
  h[155] = ' ';
  return std::string(h, 512);
}

namespace {

void pad(std::string& out) { out.append((512 - out.size() % 512) % 512, '\0'); }

// A PAX extended header ('x') carrying a long path or link name.
void pax(std::string& out, const std::string& name, const std::string& link) {
  std::string records;
  auto record = [&](const std::string& key, const std::string& value) {
    std::string body = " " + key + "=" + value + "\n";
    size_t n = body.size() + 1;
    while (std::to_string(n).size() + body.size() != n) ++n;
    records += std::to_string(n) + body;
  };
  if (name.size() > 100) record("path", name);
  if (link.size() > 100) record("linkpath", link);
  if (records.empty()) return;
  out += ustar_header("PaxHeader", 'x', records.size(), 0644, 0, "");
  out += records;
  pad(out);
}

}  // namespace

Result<std::string, TarError> tar_of_folder(const fs::path& dir, const TarLimits& limits) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return TarError{dir.string() + ": not a folder"};
  std::vector<fs::path> paths;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::end(it);
       it.increment(ec)) {
    paths.push_back(it->path());
    if (paths.size() > limits.max_entries)
      return TarError{"more than " + std::to_string(limits.max_entries) + " entries"};
  }
  if (ec) return TarError{dir.string() + ": " + ec.message()};
  std::sort(paths.begin(), paths.end());
  std::string out;
  for (auto& p : paths) {
    struct stat st {};
    if (::lstat(p.c_str(), &st) != 0) return TarError{p.string() + ": cannot stat it"};
    // (lexically: fs::relative would resolve a symlink to where it points)
    std::string name = p.lexically_relative(dir).generic_string();
    if (S_ISDIR(st.st_mode)) {
      name += "/";
      pax(out, name, "");
      out += ustar_header(name, '5', 0, st.st_mode, st.st_mtime, "");
    } else if (S_ISLNK(st.st_mode)) {
      auto target = fs::read_symlink(p, ec).string();
      if (ec) return TarError{p.string() + ": " + ec.message()};
      pax(out, name, target);
      out += ustar_header(name, '2', 0, st.st_mode, st.st_mtime, target);
    } else if (S_ISREG(st.st_mode)) {
      std::ifstream f(p, std::ios::binary);
      if (!f) return TarError{p.string() + ": cannot read it"};
      std::ostringstream data;
      data << f.rdbuf();
      pax(out, name, "");
      out += ustar_header(name, '0', data.str().size(), st.st_mode, st.st_mtime, "");
      out += data.str();
      pad(out);
    } else {
      continue;  // (sockets, fifos, devices: not a build's context)
    }
    if (out.size() > limits.max_bytes)
      return TarError{"larger than " + std::to_string(limits.max_bytes >> 20) + " MiB"};
  }
  out.append(1024, '\0');  // the end: two empty blocks
  return out;
}

}  // namespace pandastack::tools
