// The Dockerfile translator's parts (actors/dockerfile.h): one Translator reads a Dockerfile's
// text into instructions and words (dockerfile_lexer.cc: Docker's lexer, directives, variables)
// and translates each instruction into the template spec's steps (dockerfile.cc). Internal to
// those two files.
#pragma once

#include <cctype>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "actors/dockerfile.h"

namespace pandastack::actors::dockerfile {

inline std::string upper(std::string s) {
  for (auto& c : s) c = char(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

inline std::string trim(const std::string& s) {
  size_t a = s.find_first_not_of(" \t\r"), b = s.find_last_not_of(" \t\r");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

// Words joined by single spaces.
inline std::string joined(const std::vector<std::string>& words) {
  std::string out;
  for (size_t k = 0; k < words.size(); ++k) out += (k ? " " : "") + words[k];
  return out;
}

inline bool name_char(char c, bool first) {
  return std::isalpha(static_cast<unsigned char>(c)) || c == '_' ||
         (!first && std::isdigit(static_cast<unsigned char>(c)));
}

// The JSON form of RUN, COPY, ...: a list of strings, or nullopt (then the shell form).
std::optional<std::vector<std::string>> json_form(const std::string& rest);
// Whether a shell form holds a heredoc (<<EOF, <<-"EOF").
bool heredoc(const std::string& rest);

// One instruction: its keyword (upper case), the rest of its (joined) lines, its first line.
struct Instruction {
  std::string keyword, rest;
  size_t line = 0;
};

// A refusal that names the line.
struct Refusal {
  Code code;
  std::string message;
};

class Translator {
 public:
  Translator(const std::map<std::string, std::string>& context,
             const std::map<std::string, std::string>& build_args, const DockerfileLimits& limits,
             bool archived)
      : context_(context), build_args_(build_args), limits_(limits), archived_(archived) {}

  std::optional<Refusal> run(const std::string& text);
  // The spec (checked against the template limits, naming the line of a command too long).
  std::optional<Refusal> finish(const TemplateLimits& limits);
  const TemplateFromDockerfile& result() const { return out_; }

 private:
  // The logical lines: comments dropped, continuations joined; parser directives read.
  std::optional<Refusal> split(const std::string& text, std::vector<Instruction>& out);
  std::optional<Refusal> one(const Instruction& in);

  // Docker's word lexer: quotes, the escape character and (when `expand`) variables.
  std::optional<std::string> words(const std::string& s, std::vector<std::string>& out,
                                   bool expand = true) const;
  std::optional<std::string> expand_var(const std::string& s, size_t& at, std::string& out) const;
  std::string lookup(const std::string& name) const {
    if (auto it = vars_.find(name); it != vars_.end()) return it->second;
    return "";
  }

  Refusal bad(const Instruction& in, const std::string& why) const {
    return {Code::invalid_argument,
            "Dockerfile line " + std::to_string(in.line) + " (" + in.keyword + "): " + why};
  }
  Refusal unserved(const Instruction& in, const std::string& why) const {
    return {Code::not_implemented,
            "Dockerfile line " + std::to_string(in.line) + " (" + in.keyword + "): " + why};
  }

  std::optional<Refusal> from(const Instruction& in);
  std::optional<Refusal> arg(const Instruction& in);
  std::optional<Refusal> env(const Instruction& in);
  std::optional<Refusal> run_(const Instruction& in);
  std::optional<Refusal> copy(const Instruction& in);
  std::optional<Refusal> workdir(const Instruction& in);
  std::optional<Refusal> user(const Instruction& in);

  // A command of the build: its text is made at the end (RUN's environment needs the final ENV).
  struct Step {
    std::string body;                         // what runs
    std::map<std::string, std::string> env;   // ENV declared before it
    std::map<std::string, std::string> args;  // ARGs in scope
    bool run = false;                         // a RUN (the environment applies)
    size_t line = 0;
    std::string workdir = "/";  // where a RUN runs
  };
  std::string path_in(const std::string& p) const;  // `p` against the WORKDIR
  // What runs a program as the USER ("" for root): runuser, or setpriv for a numeric one.
  std::string as_user() const;
  // What replaces the shell with a program run as the USER ("exec " for root): setpriv (no
  // parent left behind, unlike runuser), with HOME, USER and LOGNAME of a named user's.
  std::string exec_as_user() const;

  const std::map<std::string, std::string>& context_;
  const std::map<std::string, std::string>& build_args_;
  const DockerfileLimits& limits_;
  char escape_ = '\\';
  bool from_seen_ = false;
  std::map<std::string, std::string> global_args_;  // ARGs before FROM
  std::map<std::string, std::string> args_;         // ARGs of the stage
  std::map<std::string, std::string> env_;          // ENV so far
  std::map<std::string, std::string> vars_;         // what $VAR means now (ARGs, then ENV)
  std::string workdir_ = "/", user_;
  std::vector<Step> steps_;
  // CMD and ENTRYPOINT: the exec form's words, or the shell form's text.
  struct Program {
    std::optional<std::vector<std::string>> exec;
    std::string shell;
    size_t line = 0;
  };
  std::optional<Program> cmd_, entrypoint_;
  TemplateFromDockerfile out_;
  bool staged_ = false;
  const bool archived_;       // the context is in archives: COPY matched in the guest
  bool copy_staged_ = false;  // (kBuildCopyScript staged)
};

}  // namespace pandastack::actors::dockerfile
