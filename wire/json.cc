#include "wire/json.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace pandastack::wire {

namespace {
const Json kNull;
const Json::Array kEmptyArray;
const Json::Object kEmptyObject;
}  // namespace

const Json::Array& Json::as_array() const { return arr_ ? *arr_ : kEmptyArray; }
const Json::Object& Json::as_object() const { return obj_ ? *obj_ : kEmptyObject; }

Json::Array& Json::mutable_array() {
  if (type_ != Type::array) *this = Json(Array{});
  if (arr_.use_count() > 1) arr_ = std::make_shared<Array>(*arr_);
  return *arr_;
}

Json::Object& Json::mutable_object() {
  if (type_ != Type::object) *this = Json(Object{});
  if (obj_.use_count() > 1) obj_ = std::make_shared<Object>(*obj_);
  return *obj_;
}

const Json& Json::operator[](std::string_view key) const {
  if (type_ != Type::object) return kNull;
  auto it = obj_->find(std::string(key));
  return it == obj_->end() ? kNull : it->second;
}

Json& Json::set(std::string key, Json value) {
  auto& o = mutable_object();
  return o[std::move(key)] = std::move(value);
}

bool Json::has(std::string_view key) const {
  return type_ == Type::object && obj_->count(std::string(key)) != 0;
}

void Json::push(Json value) { mutable_array().push_back(std::move(value)); }

size_t Json::size() const {
  if (type_ == Type::array) return arr_->size();
  if (type_ == Type::object) return obj_->size();
  return 0;
}

void json_quote(std::string& out, std::string_view s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += char(c);
        }
    }
  }
  out += '"';
}

bool is_valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = s[i];
    size_t n;
    uint32_t cp;
    if (c < 0x80) { ++i; continue; }
    if ((c & 0xE0) == 0xC0) { n = 1; cp = c & 0x1F; }
    else if ((c & 0xF0) == 0xE0) { n = 2; cp = c & 0x0F; }
    else if ((c & 0xF8) == 0xF0) { n = 3; cp = c & 0x07; }
    else return false;
    if (i + n >= s.size()) return false;
    for (size_t k = 1; k <= n; ++k) {
      unsigned char cc = s[i + k];
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) || cp > 0x10FFFF ||
        (cp >= 0xD800 && cp <= 0xDFFF))
      return false;
    i += n + 1;
  }
  return true;
}

void Json::dump_to(std::string& out) const {
  switch (type_) {
    case Type::null: out += "null"; break;
    case Type::boolean: out += bool_ ? "true" : "false"; break;
    case Type::number:
      if (is_int_) {
        out += std::to_string(int_);
      } else if (!std::isfinite(num_)) {
        out += "null";
      } else if (num_ == 0 && std::signbit(num_)) {
        out += "-0.0";  // "-0" would read back as the integer 0 (found by fuzz_json)
      } else {
        // Shortest of %.15g / %.17g that reads back as the same double.
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.15g", num_);
        if (std::strtod(buf, nullptr) != num_) std::snprintf(buf, sizeof buf, "%.17g", num_);
        out += buf;
      }
      break;
    case Type::string: json_quote(out, str_); break;
    case Type::array: {
      out += '[';
      bool first = true;
      for (auto& v : *arr_) {
        if (!first) out += ',';
        first = false;
        v.dump_to(out);
      }
      out += ']';
      break;
    }
    case Type::object: {
      out += '{';
      bool first = true;
      for (auto& [k, v] : *obj_) {
        if (!first) out += ',';
        first = false;
        json_quote(out, k);
        out += ':';
        v.dump_to(out);
      }
      out += '}';
      break;
    }
  }
}

std::string Json::dump() const {
  std::string out;
  dump_to(out);
  return out;
}

namespace {

class Parser {
 public:
  explicit Parser(std::string_view s) : s_(s) {}

  std::optional<Json> parse_document(Json::ParseError* err) {
    auto v = value(0);
    if (v) {
      ws();
      if (pos_ != s_.size()) fail("trailing characters after the JSON value");
    }
    if (!error_.empty()) {
      if (err) *err = {pos_, error_};
      return std::nullopt;
    }
    return v;
  }

 private:
  void fail(std::string msg) {
    if (error_.empty()) error_ = std::move(msg);
  }
  void ws() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\n' || s_[pos_] == '\r' || s_[pos_] == '\t'))
      ++pos_;
  }
  bool literal(std::string_view lit) {
    if (s_.substr(pos_, lit.size()) == lit) {
      pos_ += lit.size();
      return true;
    }
    return false;
  }

  std::optional<Json> value(int depth) {
    if (depth > 64) {
      fail("nesting deeper than 64");
      return std::nullopt;
    }
    ws();
    if (pos_ >= s_.size()) {
      fail("unexpected end of input");
      return std::nullopt;
    }
    char c = s_[pos_];
    if (c == '{') return object(depth);
    if (c == '[') return array(depth);
    if (c == '"') {
      auto s = string();
      if (!s) return std::nullopt;
      return Json(std::move(*s));
    }
    if (literal("true")) return Json(true);
    if (literal("false")) return Json(false);
    if (literal("null")) return Json(nullptr);
    if (c == '-' || (c >= '0' && c <= '9')) return number();
    fail(std::string("unexpected character '") + c + "'");
    return std::nullopt;
  }

  std::optional<Json> number() {
    size_t start = pos_;
    bool is_int = true;
    if (s_[pos_] == '-') ++pos_;
    if (pos_ >= s_.size() || !isdigit(s_[pos_])) {
      fail("invalid number");
      return std::nullopt;
    }
    if (s_[pos_] == '0') ++pos_;
    else while (pos_ < s_.size() && isdigit(s_[pos_])) ++pos_;
    if (pos_ < s_.size() && s_[pos_] == '.') {
      is_int = false;
      ++pos_;
      if (pos_ >= s_.size() || !isdigit(s_[pos_])) {
        fail("invalid number");
        return std::nullopt;
      }
      while (pos_ < s_.size() && isdigit(s_[pos_])) ++pos_;
    }
    if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      is_int = false;
      ++pos_;
      if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
      if (pos_ >= s_.size() || !isdigit(s_[pos_])) {
        fail("invalid number");
        return std::nullopt;
      }
      while (pos_ < s_.size() && isdigit(s_[pos_])) ++pos_;
    }
    std::string text(s_.substr(start, pos_ - start));
    if (is_int && text.size() < 19) return Json(int64_t(std::strtoll(text.c_str(), nullptr, 10)));
    return Json(std::strtod(text.c_str(), nullptr));
  }

  static void put_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) out += char(cp);
    else if (cp < 0x800) { out += char(0xC0 | (cp >> 6)); out += char(0x80 | (cp & 0x3F)); }
    else if (cp < 0x10000) {
      out += char(0xE0 | (cp >> 12)); out += char(0x80 | ((cp >> 6) & 0x3F)); out += char(0x80 | (cp & 0x3F));
    } else {
      out += char(0xF0 | (cp >> 18)); out += char(0x80 | ((cp >> 12) & 0x3F));
      out += char(0x80 | ((cp >> 6) & 0x3F)); out += char(0x80 | (cp & 0x3F));
    }
  }

  bool hex4(uint32_t& out) {
    if (pos_ + 4 > s_.size()) return false;
    out = 0;
    for (int i = 0; i < 4; ++i) {
      char c = s_[pos_++];
      out <<= 4;
      if (c >= '0' && c <= '9') out |= uint32_t(c - '0');
      else if (c >= 'a' && c <= 'f') out |= uint32_t(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') out |= uint32_t(c - 'A' + 10);
      else return false;
    }
    return true;
  }

  std::optional<std::string> string() {
    ++pos_;  // opening quote
    std::string out;
    size_t start = pos_;
    while (pos_ < s_.size()) {
      char c = s_[pos_];
      if (c == '"') {
        ++pos_;
        if (!is_valid_utf8(out)) {
          pos_ = start;
          fail("string is not valid UTF-8");
          return std::nullopt;
        }
        return out;
      }
      if (static_cast<unsigned char>(c) < 0x20) {
        fail("control character in string");
        return std::nullopt;
      }
      if (c == '\\') {
        ++pos_;
        if (pos_ >= s_.size()) break;
        char e = s_[pos_++];
        switch (e) {
          case '"': out += '"'; break;
          case '\\': out += '\\'; break;
          case '/': out += '/'; break;
          case 'b': out += '\b'; break;
          case 'f': out += '\f'; break;
          case 'n': out += '\n'; break;
          case 'r': out += '\r'; break;
          case 't': out += '\t'; break;
          case 'u': {
            uint32_t cp;
            if (!hex4(cp)) {
              fail("invalid \\u escape");
              return std::nullopt;
            }
            if (cp >= 0xD800 && cp <= 0xDBFF) {
              uint32_t lo;
              if (!literal("\\u") || !hex4(lo) || lo < 0xDC00 || lo > 0xDFFF) {
                fail("invalid surrogate pair");
                return std::nullopt;
              }
              cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
              fail("lone low surrogate");
              return std::nullopt;
            }
            put_utf8(out, cp);
            break;
          }
          default:
            fail("invalid escape");
            return std::nullopt;
        }
        continue;
      }
      out += c;
      ++pos_;
    }
    fail("unterminated string");
    return std::nullopt;
  }

  std::optional<Json> array(int depth) {
    ++pos_;
    Json::Array a;
    ws();
    if (pos_ < s_.size() && s_[pos_] == ']') {
      ++pos_;
      return Json(std::move(a));
    }
    for (;;) {
      auto v = value(depth + 1);
      if (!v) return std::nullopt;
      a.push_back(std::move(*v));
      ws();
      if (pos_ < s_.size() && s_[pos_] == ',') { ++pos_; continue; }
      if (pos_ < s_.size() && s_[pos_] == ']') { ++pos_; return Json(std::move(a)); }
      fail("expected ',' or ']' in array");
      return std::nullopt;
    }
  }

  std::optional<Json> object(int depth) {
    ++pos_;
    Json::Object o;
    ws();
    if (pos_ < s_.size() && s_[pos_] == '}') {
      ++pos_;
      return Json(std::move(o));
    }
    for (;;) {
      ws();
      if (pos_ >= s_.size() || s_[pos_] != '"') {
        fail("expected a string key in object");
        return std::nullopt;
      }
      size_t key_at = pos_;
      auto k = string();
      if (!k) return std::nullopt;
      // A repeated key is refused: which one counts would be a guess (RFC 8259: SHOULD be unique).
      if (o.count(*k)) {
        pos_ = key_at;
        fail("duplicate key \"" + *k + "\" in object");
        return std::nullopt;
      }
      ws();
      if (pos_ >= s_.size() || s_[pos_] != ':') {
        fail("expected ':' after object key");
        return std::nullopt;
      }
      ++pos_;
      auto v = value(depth + 1);
      if (!v) return std::nullopt;
      o[std::move(*k)] = std::move(*v);
      ws();
      if (pos_ < s_.size() && s_[pos_] == ',') { ++pos_; continue; }
      if (pos_ < s_.size() && s_[pos_] == '}') { ++pos_; return Json(std::move(o)); }
      fail("expected ',' or '}' in object");
      return std::nullopt;
    }
  }

  std::string_view s_;
  size_t pos_ = 0;
  std::string error_;
};

}  // namespace

std::optional<Json> Json::parse(std::string_view text, ParseError* error) {
  return Parser(text).parse_document(error);
}

}  // namespace pandastack::wire
