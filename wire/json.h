// A small JSON value type with a strict parser and a serializer. Used for QMP (QEMU's control
// protocol) and for the REST API. Parsing is depth-limited and reports the byte offset of an error.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace pandastack::wire {

class Json {
 public:
  enum class Type { null, boolean, number, string, array, object };
  using Array = std::vector<Json>;
  using Object = std::map<std::string, Json>;

  Json() = default;
  Json(std::nullptr_t) {}
  Json(bool b) : type_(Type::boolean), bool_(b) {}
  Json(int v) : Json(int64_t(v)) {}
  Json(unsigned v) : Json(int64_t(v)) {}
  Json(int64_t v) : type_(Type::number), num_(double(v)), int_(v), is_int_(true) {}
  Json(uint64_t v) : Json(int64_t(v)) {}
  Json(double v) : type_(Type::number), num_(v) {}
  Json(const char* s) : type_(Type::string), str_(s) {}
  Json(std::string s) : type_(Type::string), str_(std::move(s)) {}
  Json(std::string_view s) : type_(Type::string), str_(s) {}
  Json(Array a) : type_(Type::array), arr_(std::make_shared<Array>(std::move(a))) {}
  Json(Object o) : type_(Type::object), obj_(std::make_shared<Object>(std::move(o))) {}
  static Json object() { return Json(Object{}); }
  static Json array() { return Json(Array{}); }

  Type type() const { return type_; }
  bool is_null() const { return type_ == Type::null; }
  bool is_bool() const { return type_ == Type::boolean; }
  bool is_number() const { return type_ == Type::number; }
  bool is_integer() const { return type_ == Type::number && is_int_; }
  bool is_string() const { return type_ == Type::string; }
  bool is_array() const { return type_ == Type::array; }
  bool is_object() const { return type_ == Type::object; }

  bool as_bool() const { return bool_; }
  double as_double() const { return num_; }
  // A number's integer value; a fraction is cut, a value beyond int64 saturates (NaN is 0): a
  // peer's 1e300 is then out of any range check, never undefined behaviour.
  int64_t as_int() const { return is_int_ ? int_ : saturated(num_); }
  const std::string& as_string() const { return str_; }
  const Array& as_array() const;
  const Object& as_object() const;
  Array& mutable_array();
  Object& mutable_object();

  // Object member or a null Json when absent (or when this is not an object).
  const Json& operator[](std::string_view key) const;
  // Sets a member (this must be an object).
  Json& set(std::string key, Json value);
  bool has(std::string_view key) const;
  // Appends to an array.
  void push(Json value);
  size_t size() const;

  std::string dump() const;

  struct ParseError {
    size_t offset;
    std::string message;
  };
  // Parses exactly one JSON value (surrounding whitespace allowed). Depth is limited to 64.
  static std::optional<Json> parse(std::string_view text, ParseError* error = nullptr);

 private:
  static int64_t saturated(double d) {
    if (!(d == d)) return 0;
    if (d >= 9223372036854775807.0) return INT64_MAX;
    if (d <= -9223372036854775808.0) return INT64_MIN;
    return int64_t(d);
  }
  void dump_to(std::string& out) const;

  Type type_ = Type::null;
  bool bool_ = false;
  double num_ = 0;
  int64_t int_ = 0;
  bool is_int_ = false;
  std::string str_;
  std::shared_ptr<Array> arr_;
  std::shared_ptr<Object> obj_;
};

// Appends `s` to `out` as a quoted JSON string (UTF-8 passed through, controls escaped).
void json_quote(std::string& out, std::string_view s);
// True if `s` is valid UTF-8.
bool is_valid_utf8(std::string_view s);

}  // namespace pandastack::wire
