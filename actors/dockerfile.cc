// Each Dockerfile instruction translated into the template spec's steps (actors/dockerfile.h);
// the lexer is actors/dockerfile_lexer.cc.
#include <fnmatch.h>

#include <algorithm>
#include <set>

#include "actors/dockerfile_translator.h"
#include "actors/sh_quote.h"
#include "wire/json.h"

namespace pandastack::actors::dockerfile {

namespace {

using wire::Json;

// A path made normal: no "//", ".", ".." (nullopt when ".." would climb above the root).
std::optional<std::string> normal(const std::string& p) {
  std::vector<std::string> parts;
  size_t at = 0;
  while (at <= p.size()) {
    size_t slash = p.find('/', at);
    if (slash == std::string::npos) slash = p.size();
    auto part = p.substr(at, slash - at);
    if (part == "..") {
      if (parts.empty()) return std::nullopt;
      parts.pop_back();
    } else if (!part.empty() && part != ".") {
      parts.push_back(part);
    }
    at = slash + 1;
  }
  std::string out;
  for (auto& x : parts) out += "/" + x;
  return out.empty() ? "/" : out;
}

// A USER's user and group ("" when none), and whether the user is a number.
struct UserGroup {
  std::string user, group;
  bool numeric = false;
};
UserGroup user_group(const std::string& spec) {
  auto colon = spec.find(':');
  UserGroup ug{spec.substr(0, colon), colon == std::string::npos ? "" : spec.substr(colon + 1)};
  ug.numeric = ug.user.find_first_not_of("0123456789") == std::string::npos;
  return ug;
}

// setpriv for a numeric user (its group: the one given, else the same number).
std::string setpriv_numeric(const UserGroup& ug) {
  return "setpriv --reuid=" + ug.user + " --regid=" + (ug.group.empty() ? ug.user : ug.group) +
         " --clear-groups -- ";
}

}  // namespace

std::string Translator::path_in(const std::string& p) const {
  if (!p.empty() && p[0] == '/') return p;
  return (workdir_ == "/" ? "" : workdir_) + "/" + p;
}

std::string Translator::as_user() const {
  if (user_.empty()) return "";
  auto ug = user_group(user_);
  if (ug.numeric) return setpriv_numeric(ug);
  return "runuser -u " + sh_quote(ug.user) + (ug.group.empty() ? "" : " -g " + sh_quote(ug.group)) +
         " -- ";
}

std::string Translator::exec_as_user() const {
  if (user_.empty()) return "exec ";
  auto ug = user_group(user_);
  if (ug.numeric) return "exec " + setpriv_numeric(ug);
  auto u = sh_quote(ug.user);
  return "export HOME=\"$(getent passwd " + u + " | cut -d: -f6)\" USER=" + u + " LOGNAME=" + u +
         " && exec setpriv --reuid=" + u +
         " --regid=" + (ug.group.empty() ? "\"$(id -g " + u + ")\"" : sh_quote(ug.group)) +
         " --init-groups -- ";
}

std::optional<Refusal> Translator::from(const Instruction& in) {
  if (from_seen_)
    return unserved(in, "multi-stage builds (a second FROM) are not served: one stage");
  std::vector<std::string> w;
  vars_ = global_args_;  // (FROM sees the ARGs declared before it)
  if (auto e = words(in.rest, w)) return bad(in, *e);
  if (!w.empty() && w[0].rfind("--", 0) == 0)
    return bad(in, w[0] + " is not served (FROM names a template of this host)");
  if (w.empty() || (w.size() != 1 && !(w.size() == 3 && upper(w[1]) == "AS")))
    return bad(in, "FROM TEMPLATE [AS name]");
  const auto& t = w[0];
  if (t.empty()) return bad(in, "FROM names nothing (its variable is empty)");
  if (t == "scratch")
    return unserved(in, "FROM scratch is not served: start from an image or a template");
  // An image reference (checked by the build: actors/image_pull.h) is pulled by the build.
  out_.spec.from = t.find_first_of("/:@") != std::string::npos ? kFromImagePrefix + t : t;
  from_seen_ = true;
  vars_.clear();
  return std::nullopt;
}

std::optional<Refusal> Translator::arg(const Instruction& in) {
  std::vector<std::string> w;
  if (auto e = words(in.rest, w)) return bad(in, *e);
  if (w.empty()) return bad(in, "ARG NAME[=default]");
  for (auto& x : w) {
    auto eq = x.find('=');
    std::string name = x.substr(0, eq);
    bool ok = !name.empty();
    for (size_t k = 0; k < name.size(); ++k) ok = ok && name_char(name[k], k == 0);
    if (!ok) return bad(in, "'" + name + "' is not a variable name");
    std::optional<std::string> value;
    if (eq != std::string::npos) value = x.substr(eq + 1);
    if (auto it = build_args_.find(name); it != build_args_.end()) value = it->second;
    if (!from_seen_) {
      global_args_[name] = value.value_or("");
      continue;
    }
    if (!value)
      if (auto it = global_args_.find(name); it != global_args_.end()) value = it->second;
    args_[name] = value.value_or("");
    if (!env_.count(name)) vars_[name] = args_[name];  // (an ENV of the name wins)
  }
  return std::nullopt;
}

std::optional<Refusal> Translator::env(const Instruction& in) {
  std::vector<std::pair<std::string, std::string>> pairs;
  std::vector<std::string> w;
  if (auto e = words(in.rest, w)) return bad(in, *e);
  if (w.empty()) return bad(in, "ENV NAME=value ...");
  if (w[0].find('=') == std::string::npos) {
    // The old form: ENV NAME the rest of the line.
    size_t sp = in.rest.find_first_of(" \t");
    if (sp == std::string::npos) return bad(in, "ENV NAME value");
    std::vector<std::string> v;
    if (auto e = words(trim(in.rest.substr(sp)), v)) return bad(in, *e);
    pairs.emplace_back(w[0], joined(v));
  } else {
    for (auto& x : w) {
      auto eq = x.find('=');
      if (eq == std::string::npos) return bad(in, "'" + x + "': ENV takes NAME=value pairs");
      pairs.emplace_back(x.substr(0, eq), x.substr(eq + 1));
    }
  }
  for (auto& [k, v] : pairs) {
    bool ok = !k.empty();
    for (size_t n = 0; n < k.size(); ++n) ok = ok && name_char(k[n], n == 0);
    if (!ok) return bad(in, "'" + k + "' is not a variable name");
    if (v.find('\n') != std::string::npos) return bad(in, k + ": a value is one line");
    env_[k] = v;
    vars_[k] = v;
  }
  return std::nullopt;
}

std::optional<Refusal> Translator::run_(const Instruction& in) {
  if (in.rest.rfind("--", 0) == 0)
    return unserved(in, "RUN's flags (--mount, --network, --security) are not served");
  if (heredoc(in.rest)) return unserved(in, "heredocs (<<EOF) are not served: use printf or COPY");
  std::string body;
  std::string as = as_user();
  if (auto exec = json_form(in.rest)) {
    if (exec->empty()) return bad(in, "an empty command");
    for (auto& a : *exec) body += (body.empty() ? "" : " ") + sh_quote(a);
    body = as + body;
  } else {
    if (in.rest.empty()) return bad(in, "an empty command");
    body = as + "sh -c " + sh_quote(in.rest);
  }
  steps_.push_back({body, env_, args_, true, in.line, workdir_});
  return std::nullopt;
}

std::optional<Refusal> Translator::copy(const Instruction& in) {
  bool add = in.keyword == "ADD";
  if (heredoc(in.rest))
    return unserved(in, "heredocs (<<EOF) are not served: put the file in the context");
  std::vector<std::string> w;
  // Flags may come before an exec form: COPY --chown=u ["a b", "/c/"].
  std::string flags, rest = in.rest;
  while (rest.rfind("--", 0) == 0) {
    size_t sp = rest.find_first_of(" \t");
    flags += rest.substr(0, sp) + " ";
    rest = sp == std::string::npos ? "" : trim(rest.substr(sp));
  }
  if (auto exec = json_form(rest)) {
    if (!flags.empty())
      if (auto e = words(flags, w)) return bad(in, *e);
    for (auto& a : *exec) {
      std::string x = a;  // (variables expanded; no splitting, no quotes)
      std::string expanded;
      for (size_t at = 0; at < x.size();) {
        if (x[at] == '$') {
          ++at;
          if (auto e = expand_var(x, at, expanded)) return bad(in, *e);
        } else {
          expanded += x[at++];
        }
      }
      w.push_back(expanded);
    }
  } else if (auto e = words(in.rest, w)) {
    return bad(in, *e);
  }
  std::string chown, chmod;
  while (!w.empty() && w[0].rfind("--", 0) == 0) {
    auto flag = w[0];
    w.erase(w.begin());
    if (flag.rfind("--chown=", 0) == 0) {
      chown = flag.substr(8);
      if (chown.empty() ||
          chown.find_first_not_of(
              "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-:") !=
              std::string::npos)
        return bad(in, "--chown=user[:group]");
    } else if (flag.rfind("--chmod=", 0) == 0) {
      chmod = flag.substr(8);
      if (chmod.empty() || chmod.size() > 4 ||
          chmod.find_first_not_of("01234567") != std::string::npos)
        return bad(in, "--chmod takes an octal mode");
    } else if (flag.rfind("--from=", 0) == 0) {
      return unserved(in, "--from (multi-stage builds) is not served");
    } else if (flag == "--link") {
      // (a layer-caching hint: no effect here)
    } else {
      return bad(in, flag + " is not served");
    }
  }
  if (w.size() < 2) return bad(in, in.keyword + " SOURCE... DEST");
  std::string dest_raw = w.back();
  w.pop_back();
  if (dest_raw.empty()) return bad(in, "its destination is empty (an empty variable?)");
  for (auto& s : w)
    if (s.empty()) return bad(in, "a source is empty (an empty variable?)");
  bool dest_dir = dest_raw.back() == '/' || w.size() > 1;
  auto dest = normal(path_in(dest_raw));
  if (!dest) return bad(in, "'" + dest_raw + "' climbs above the root");
  // The sources: (context path, copied as a file) or (directory prefix, its files).
  struct Source {
    std::string path;  // in the context ("" = all of it)
    bool dir = false;
  };
  std::vector<Source> sources;
  for (auto& s : w) {
    if (s.find("://") != std::string::npos || s.rfind("git@", 0) == 0)
      return add ? unserved(in,
                            "ADD from a URL is not served (the build has no network to "
                            "fetch it): fetch it in a RUN, or put it in the context")
                 : bad(in, "COPY takes paths of the build context");
    for (auto ext : {".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".txz", ".tbz2"})
      if (add && s.ends_with(ext))
        return unserved(in, "ADD's archive extraction is not served: COPY it and RUN tar");
    auto n = normal("/" + s);
    if (!n) return bad(in, "'" + s + "' is outside the build context");
    std::string rel = n->substr(1);
    if (archived_) {  // (matched in the guest, by kBuildCopyScript)
      sources.push_back({rel.empty() ? "." : rel, false});
      continue;
    }
    if (rel.find_first_of("*?[") != std::string::npos) {
      size_t matched = 0;
      for (auto& [path, content] : context_)
        if (::fnmatch(rel.c_str(), path.c_str(), FNM_PATHNAME) == 0) {
          sources.push_back({path, false});
          ++matched;
        }
      if (!matched) return bad(in, "no file of the build context matches '" + s + "'");
      dest_dir = dest_dir || matched > 1;
      continue;
    }
    if (context_.count(rel)) {
      sources.push_back({rel, false});
      continue;
    }
    bool any = false;
    for (auto& [path, content] : context_)
      any = any || rel.empty() || path.rfind(rel + "/", 0) == 0;
    if (!any) return bad(in, "'" + s + "' is not in the build context");
    sources.push_back({rel, true});
  }
  if (archived_) {
    out_.spec.files[kBuildCopyPath] = kBuildCopyScript;
    copy_staged_ = true;
    std::string body = std::string(kBuildBusyboxPath) + " sh " + kBuildCopyPath + " " +
                       std::to_string(in.line) + " " + sh_quote(*dest) + " " +
                       (dest_dir ? "1" : "0") + " " + sh_quote(chown) + " " + sh_quote(chmod);
    for (auto& src : sources) body += " " + sh_quote(src.path);
    steps_.push_back({body, {}, {}, false, in.line});
    return std::nullopt;
  }
  // Each file staged once (by the agent, before the commands run); the command copies it here.
  std::vector<std::string> parts, targets;
  auto stage = [&](const std::string& path) {
    out_.spec.files[std::string(kBuildContextDir) + "/" + path] = context_.at(path);
    staged_ = true;
    return std::string(kBuildContextDir) + "/" + path;
  };
  for (auto& src : sources) {
    if (!src.dir) {
      auto base = src.path.substr(src.path.rfind('/') + 1);
      std::string target = dest_dir ? (*dest == "/" ? "" : *dest) + "/" + base : *dest;
      auto parent = target.substr(0, target.rfind('/'));
      parts.push_back("mkdir -p " + sh_quote(parent.empty() ? "/" : parent) + " && cp " +
                      sh_quote(stage(src.path)) + " " + sh_quote(target));
      targets.push_back(target);
      continue;
    }
    for (auto& [path, content] : context_) {
      if (!src.path.empty() && path.rfind(src.path + "/", 0) != 0) continue;
      stage(path);
      auto within = src.path.empty() ? path : path.substr(src.path.size() + 1);
      targets.push_back((*dest == "/" ? "" : *dest) + "/" + within);
    }
    std::string from = std::string(kBuildContextDir) + (src.path.empty() ? "" : "/" + src.path);
    parts.push_back("mkdir -p " + sh_quote(*dest) + " && cp -R " + sh_quote(from) + "/. " +
                    sh_quote(*dest) + "/");
  }
  std::string targets_q;
  for (auto& t : targets) targets_q += " " + sh_quote(t);
  if (!chown.empty()) parts.push_back("chown " + sh_quote(chown) + targets_q);
  if (!chmod.empty()) parts.push_back("chmod " + chmod + targets_q);
  std::string body;
  for (auto& p : parts) body += (body.empty() ? "" : " && ") + p;
  steps_.push_back({body, {}, {}, false, in.line});
  return std::nullopt;
}

std::optional<Refusal> Translator::workdir(const Instruction& in) {
  std::vector<std::string> w;
  if (auto e = words(in.rest, w)) return bad(in, *e);
  std::string p = joined(w);
  if (p.empty()) return bad(in, "WORKDIR PATH");
  auto n = normal(path_in(p));
  if (!n) return bad(in, "'" + p + "' climbs above the root");
  workdir_ = *n;
  steps_.push_back({"mkdir -p " + sh_quote(workdir_), {}, {}, false, in.line});
  return std::nullopt;
}

std::optional<Refusal> Translator::user(const Instruction& in) {
  std::vector<std::string> w;
  if (auto e = words(in.rest, w)) return bad(in, *e);
  if (w.size() != 1) return bad(in, "USER user[:group]");
  auto& u = w[0];
  bool ok = !u.empty() && u.size() <= 64 && u[0] != ':' && u.back() != ':' &&
            std::count(u.begin(), u.end(), ':') <= 1;
  for (char c : u)
    ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.' ||
                c == ':');
  if (!ok) return bad(in, "'" + u + "' is not a user[:group]");
  user_ = (u == "root" || u == "0" || u == "root:root" || u == "0:0") ? "" : u;
  return std::nullopt;
}

std::optional<Refusal> Translator::one(const Instruction& in) {
  const auto& k = in.keyword;
  if (!from_seen_ && k != "FROM" && k != "ARG")
    return bad(in, "a Dockerfile starts with FROM (ARGs may come before it)");
  if (k == "FROM") return from(in);
  if (k == "ARG") return arg(in);
  if (k == "ENV") return env(in);
  if (k == "RUN") return run_(in);
  if (k == "COPY" || k == "ADD") return copy(in);
  if (k == "WORKDIR") return workdir(in);
  if (k == "USER") return user(in);
  if (k == "EXPOSE") {
    std::vector<std::string> w;
    if (auto e = words(in.rest, w)) return bad(in, *e);
    for (auto& p : w) {
      auto port = p.substr(0, p.find('/'));
      if (port.empty() || port.size() > 5 ||
          port.find_first_not_of("0123456789") != std::string::npos || std::stoi(port) < 1 ||
          std::stoi(port) > 65535)
        return bad(in, "'" + p + "' is not a port");
      out_.exposed.push_back(p);
    }
    return std::nullopt;
  }
  if (k == "LABEL" || k == "MAINTAINER") {
    std::vector<std::string> w;
    if (auto e = words(in.rest, w)) return bad(in, *e);
    return std::nullopt;
  }
  if (k == "CMD" || k == "ENTRYPOINT") {
    // The last of each counts (as in Docker); the start command is made at the end.
    if (in.rest.empty()) return bad(in, k + " needs a command");
    if (heredoc(in.rest)) return unserved(in, "heredocs (<<EOF) are not served");
    Program p;
    if (auto exec = json_form(in.rest))
      p.exec = *exec;
    else
      p.shell = in.rest;
    p.line = in.line;
    (k == "CMD" ? cmd_ : entrypoint_) = std::move(p);
    return std::nullopt;
  }
  if (k == "HEALTHCHECK" || k == "VOLUME" || k == "SHELL" || k == "ONBUILD" || k == "STOPSIGNAL")
    return bad(in, k + " is not supported here");
  return bad(in, "not an instruction");
}

std::optional<Refusal> Translator::run(const std::string& text) {
  if (text.size() > limits_.max_bytes)
    return Refusal{Code::invalid_argument,
                   "a Dockerfile is at most " + std::to_string(limits_.max_bytes) + " bytes"};
  if (text.find('\0') != std::string::npos)
    return Refusal{Code::invalid_argument, "a Dockerfile is text (no NUL bytes)"};
  if (context_.size() > limits_.max_context_files)
    return Refusal{Code::invalid_argument,
                   "context: at most " + std::to_string(limits_.max_context_files) + " files"};
  for (auto& [path, content] : context_) {
    auto n = normal("/" + path);
    if (path.empty() || path[0] == '/' || !n || n->substr(1) != path || path.size() > 200)
      return Refusal{Code::invalid_argument,
                     "context: '" + path +
                         "' is not a normal relative path (no leading /, ., .. or //; at most "
                         "200 bytes)"};
    for (char c : path)
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f || c == '\\')
        return Refusal{Code::invalid_argument, "context: '" + path + "' has control characters"};
  }
  if (build_args_.size() > limits_.max_build_args)
    return Refusal{Code::invalid_argument,
                   "build_args: at most " + std::to_string(limits_.max_build_args)};
  std::vector<Instruction> instructions;
  if (auto r = split(text, instructions)) return r;
  if (instructions.empty()) return Refusal{Code::invalid_argument, "the Dockerfile is empty"};
  for (auto& in : instructions)
    if (auto r = one(in)) return r;
  if (!from_seen_) return Refusal{Code::invalid_argument, "the Dockerfile has no FROM"};
  return std::nullopt;
}

std::optional<Refusal> Translator::finish(const TemplateLimits& limits) {
  out_.spec.env = env_;
  for (auto& s : steps_) {
    std::string cmd = s.body;
    if (s.run) {
      // RUN runs in its WORKDIR and sees the ENV declared before it (the build exports the
      // final one to every command) and the ARGs in scope; a subshell keeps them its own.
      std::string pre = "set -e; cd " + sh_quote(s.workdir) + "; ";
      for (auto& [k, v] : env_) {
        auto it = s.env.find(k);
        if (it == s.env.end())
          pre += "unset " + k + "; ";
        else if (it->second != v)
          pre += "export " + k + "=" + sh_quote(it->second) + "; ";
      }
      for (auto& [k, v] : s.args)
        if (!s.env.count(k)) pre += "export " + k + "=" + sh_quote(v) + "; ";
      cmd = "(" + pre + s.body + ")";
    }
    if (cmd.size() > limits.max_command_bytes)
      return Refusal{Code::invalid_argument,
                     "Dockerfile line " + std::to_string(s.line) + ": its build command is " +
                         std::to_string(cmd.size()) + " bytes (with its environment): at most " +
                         std::to_string(limits.max_command_bytes)};
    out_.spec.run.push_back(std::move(cmd));
  }
  if (staged_) out_.spec.run.push_back("rm -rf " + sh_quote(kBuildContextDir));
  if (copy_staged_)
    out_.spec.run.push_back(std::string(kBuildBusyboxPath) + " rm -f " + kBuildCopyPath + " " +
                            kBuildBusyboxPath);
  if (out_.spec.run.size() > limits.max_run)
    return Refusal{Code::invalid_argument,
                   "the Dockerfile makes " + std::to_string(out_.spec.run.size()) +
                       " build commands (one per RUN, COPY, ADD and WORKDIR, and one to remove "
                       "the staged context): at most " +
                       std::to_string(limits.max_run) + " (join RUNs with &&)"};
  out_.workdir = workdir_ == "/" ? "" : workdir_;
  out_.user = user_;
  // What every sandbox of it runs (Docker's rules: an exec-form ENTRYPOINT takes CMD's words as
  // arguments; a shell-form one ignores CMD), in the WORKDIR, as the USER; ready when it listens
  // on the first EXPOSEd TCP port.
  if (cmd_ || entrypoint_) {
    const Program& first = entrypoint_ ? *entrypoint_ : *cmd_;
    std::vector<std::string> words =
        first.exec ? *first.exec : std::vector<std::string>{"/bin/sh", "-c", first.shell};
    if (first.exec && entrypoint_ && cmd_) {
      if (cmd_->exec)
        words.insert(words.end(), cmd_->exec->begin(), cmd_->exec->end());
      else
        words.insert(words.end(), {"/bin/sh", "-c", cmd_->shell});
    }
    if (words.empty())
      return Refusal{Code::invalid_argument,
                     "Dockerfile line " + std::to_string(first.line) + ": an empty command"};
    std::string line = "cd " + sh_quote(workdir_) + " && " + exec_as_user();
    for (size_t i = 0; i < words.size(); ++i) line += (i ? " " : "") + sh_quote(words[i]);
    if (line.size() > limits.max_command_bytes)
      return Refusal{Code::invalid_argument, "Dockerfile line " + std::to_string(first.line) +
                                                 ": the start command is " +
                                                 std::to_string(line.size()) + " bytes: at most " +
                                                 std::to_string(limits.max_command_bytes)};
    out_.spec.start = line;
    for (auto& p : out_.exposed) {
      auto slash = p.find('/');
      if (slash != std::string::npos && p.substr(slash + 1) != "tcp") continue;
      out_.spec.ready_port = uint16_t(std::stoi(p.substr(0, slash)));
      break;
    }
  }
  return std::nullopt;
}

}  // namespace pandastack::actors::dockerfile

namespace pandastack::actors {

const char* const kBuildCopyScript = R"(# A COPY or ADD of a build whose context is in archives
# (actors/dockerfile.h): LINE DEST DIR OWNER MODE SOURCE..., Docker's rules: a directory's
# contents are copied (not the directory), several sources or a DEST ending in / make DEST a
# directory, symlinks are copied as symlinks, a source that matches nothing fails the build.
# Every tool is our static busybox's (kBuildBusyboxPath): the image needs none of its own.
set -e
bb=/var/lib/pandastack/busybox
line=$1 dest=$2 dir=$3 owner=$4 mode=$5
shift 5
cd /var/lib/pandastack/build-context
IFS=''
n=0
for pat in "$@"; do
  found=0
  for s in $pat; do
    if [ -e "$s" ] || [ -L "$s" ]; then found=1; n=$((n + 1)); fi
  done
  if [ $found = 0 ]; then
    echo "Dockerfile line $line: no file of the build context matches '$pat'" >&2
    exit 1
  fi
done
if [ $n -gt 1 ]; then dir=1; fi
fix() {
  if [ -n "$owner" ]; then "$bb" chown -Rh "$owner" "$1"; fi
  if [ -n "$mode" ]; then "$bb" chmod -R "$mode" "$1"; fi
}
for pat in "$@"; do
  for s in $pat; do
    [ -e "$s" ] || [ -L "$s" ] || continue
    if [ -d "$s" ] && [ ! -L "$s" ]; then
      "$bb" mkdir -p "$dest"
      "$bb" cp -RP "$s/." "$dest/"
      if [ -n "$owner$mode" ]; then
        for e in "$s"/* "$s"/.[!.]* "$s"/..?*; do
          if [ -e "$e" ] || [ -L "$e" ]; then fix "$dest/${e##*/}"; fi
        done
      fi
    elif [ "$dir" = 1 ]; then
      "$bb" mkdir -p "$dest"
      "$bb" cp -P "$s" "$dest/"
      fix "$dest/${s##*/}"
    else
      p=${dest%/*}
      if [ -n "$p" ]; then "$bb" mkdir -p "$p"; fi
      "$bb" cp -P "$s" "$dest"
      if [ -d "$dest" ] && [ ! -L "$dest" ]; then fix "$dest/${s##*/}"; else fix "$dest"; fi
    fi
  done
done
)";

Reply<TemplateFromDockerfile> template_from_dockerfile(
    const std::string& dockerfile, const std::map<std::string, std::string>& context,
    const std::map<std::string, std::string>& build_args, const DockerfileLimits& limits,
    bool archived) {
  if (archived && !context.empty())
    return Rejection{Code::invalid_argument,
                     "context: files or archives, not both (put the files in the archive)"};
  dockerfile::Translator t(context, build_args, limits, archived);
  if (auto r = t.run(dockerfile)) return Rejection{r->code, r->message};
  if (auto r = t.finish(TemplateLimits{})) return Rejection{r->code, r->message};
  return t.result();
}

}  // namespace pandastack::actors
