// Docker's Dockerfile lexer (actors/dockerfile_translator.h): logical lines (comments,
// continuations, the escape directive), words (quotes, the escape character) and variables
// ($VAR, ${VAR}, ${VAR:-default}, ${VAR:+alt}).
#include "actors/dockerfile_translator.h"
#include "wire/json.h"

namespace pandastack::actors::dockerfile {

using wire::Json;

std::optional<Refusal> Translator::split(const std::string& text, std::vector<Instruction>& out) {
  std::vector<std::string> lines;
  size_t at = 0;
  while (at <= text.size()) {
    size_t nl = text.find('\n', at);
    if (nl == std::string::npos) nl = text.size();
    lines.push_back(text.substr(at, nl - at));
    at = nl + 1;
  }
  size_t i = 0;
  // Parser directives: `# escape=X` (\ or `); others (syntax, check) have no effect here.
  for (; i < lines.size(); ++i) {
    auto l = trim(lines[i]);
    if (l.size() < 2 || l[0] != '#') break;
    auto eq = l.find('=');
    if (eq == std::string::npos) break;
    auto key = trim(l.substr(1, eq - 1));
    auto value = trim(l.substr(eq + 1));
    for (auto& c : key) c = char(std::tolower(static_cast<unsigned char>(c)));
    if (key.find(' ') != std::string::npos) break;
    if (key == "escape") {
      if (value != "\\" && value != "`")
        return Refusal{Code::invalid_argument,
                       "Dockerfile line " + std::to_string(i + 1) + ": escape is \\ or `"};
      escape_ = value[0];
    }
  }
  while (i < lines.size()) {
    auto l = trim(lines[i]);
    if (l.empty() || l[0] == '#') {
      ++i;
      continue;
    }
    Instruction in;
    in.line = i + 1;
    std::string joined;
    for (;;) {
      std::string part = lines[i];
      while (!part.empty() && (part.back() == ' ' || part.back() == '\t' || part.back() == '\r'))
        part.pop_back();
      ++i;
      bool more = !part.empty() && part.back() == escape_;
      if (more) part.pop_back();
      joined += part;
      if (!more) break;
      // (comment and empty lines inside a continuation are dropped, as Docker does)
      while (i < lines.size() && (trim(lines[i]).empty() || trim(lines[i])[0] == '#')) ++i;
      if (i >= lines.size()) break;
    }
    joined = trim(joined);
    size_t sp = joined.find_first_of(" \t");
    in.keyword = upper(joined.substr(0, sp));
    in.rest = sp == std::string::npos ? "" : trim(joined.substr(sp));
    out.push_back(std::move(in));
    if (out.size() > limits_.max_instructions)
      return Refusal{Code::invalid_argument, "a Dockerfile here has at most " +
                                                 std::to_string(limits_.max_instructions) +
                                                 " instructions"};
  }
  return std::nullopt;
}

std::optional<std::string> Translator::expand_var(const std::string& s, size_t& at,
                                                  std::string& out) const {
  // at: just past the '$'.
  if (at < s.size() && s[at] == '{') {
    size_t end = s.find('}', at);
    if (end == std::string::npos) return "an unclosed ${";
    std::string inner = s.substr(at + 1, end - at - 1);
    at = end + 1;
    size_t n = 0;
    while (n < inner.size() && name_char(inner[n], n == 0)) ++n;
    if (n == 0) return "a bad variable: ${" + inner + "}";
    std::string name = inner.substr(0, n), mod = inner.substr(n);
    bool set = vars_.count(name) > 0;
    std::string value = lookup(name);
    if (mod.empty()) {
      out += value;
    } else if (mod[0] == '-' || mod[0] == '+' || mod.rfind(":-", 0) == 0 ||
               mod.rfind(":+", 0) == 0) {
      // ${V-x}/${V+x} ask whether V is set; ${V:-x}/${V:+x} count an empty V as unset.
      bool colon = mod[0] == ':';
      char op = mod[colon ? 1 : 0];
      std::vector<std::string> w;
      if (auto e = words(mod.substr(colon ? 2 : 1), w)) return e;
      std::string word = joined(w);
      bool present = colon ? !value.empty() : set;
      out += op == '+' ? (present ? word : "") : (present ? value : word);
    } else {
      return "a variable modifier not served: ${" + inner + "}";
    }
    return std::nullopt;
  }
  size_t n = 0;
  while (at + n < s.size() && name_char(s[at + n], n == 0)) ++n;
  if (n == 0) {
    out += '$';
    return std::nullopt;
  }
  out += lookup(s.substr(at, n));
  at += n;
  return std::nullopt;
}

std::optional<std::string> Translator::words(const std::string& s, std::vector<std::string>& out,
                                             bool expand) const {
  std::string cur;
  bool in_word = false;
  for (size_t at = 0; at < s.size();) {
    char c = s[at];
    if (c == ' ' || c == '\t') {
      if (in_word) out.push_back(cur);
      cur.clear();
      in_word = false;
      ++at;
      continue;
    }
    in_word = true;
    if (c == escape_) {
      if (at + 1 < s.size()) cur += s[at + 1];
      at += 2;
    } else if (c == '\'') {
      size_t end = s.find('\'', at + 1);
      if (end == std::string::npos) return "an unclosed quote";
      cur += s.substr(at + 1, end - at - 1);
      at = end + 1;
    } else if (c == '"') {
      ++at;
      for (;;) {
        if (at >= s.size()) return "an unclosed quote";
        char d = s[at];
        if (d == '"') {
          ++at;
          break;
        }
        if (d == escape_ && at + 1 < s.size() &&
            (s[at + 1] == '"' || s[at + 1] == '$' || s[at + 1] == escape_)) {
          cur += s[at + 1];
          at += 2;
        } else if (d == '$' && expand) {
          ++at;
          if (auto e = expand_var(s, at, cur)) return e;
        } else {
          cur += d;
          ++at;
        }
      }
    } else if (c == '$' && expand) {
      ++at;
      if (auto e = expand_var(s, at, cur)) return e;
    } else {
      cur += c;
      ++at;
    }
  }
  if (in_word) out.push_back(cur);
  return std::nullopt;
}

// The JSON form of RUN, COPY, ...: a list of strings, or nullopt (then the shell form).
std::optional<std::vector<std::string>> json_form(const std::string& rest) {
  if (rest.empty() || rest[0] != '[') return std::nullopt;
  auto j = Json::parse(rest);
  if (!j || !j->is_array()) return std::nullopt;
  std::vector<std::string> out;
  for (auto& v : j->as_array()) {
    if (!v.is_string()) return std::nullopt;
    out.push_back(v.as_string());
  }
  return out;
}

bool heredoc(const std::string& rest) {
  for (size_t at = rest.find("<<"); at != std::string::npos; at = rest.find("<<", at + 2)) {
    size_t k = at + 2;
    if (k < rest.size() && rest[k] == '-') ++k;
    if (k < rest.size() && (rest[k] == '"' || rest[k] == '\'')) ++k;
    if (k < rest.size() && name_char(rest[k], true)) return true;
  }
  return false;
}

}  // namespace pandastack::actors::dockerfile
