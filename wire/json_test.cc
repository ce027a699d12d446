#include "wire/json.h"

#include <gtest/gtest.h>

#include <cmath>

namespace pandastack::wire {
namespace {

TEST(Json, ParsesNestedValues) {
  auto v = Json::parse(R"( {"a": [1, -2.5, "x\n\u00e9", true, null], "b": {"c": 12345678901}} )");
  ASSERT_TRUE(v);
  EXPECT_EQ((*v)["a"].size(), 5u);
  EXPECT_EQ((*v)["a"].as_array()[0].as_int(), 1);
  EXPECT_DOUBLE_EQ((*v)["a"].as_array()[1].as_double(), -2.5);
  EXPECT_EQ((*v)["a"].as_array()[2].as_string(), "x\n\xc3\xa9");
  EXPECT_TRUE((*v)["a"].as_array()[3].as_bool());
  EXPECT_TRUE((*v)["a"].as_array()[4].is_null());
  EXPECT_EQ((*v)["b"]["c"].as_int(), 12345678901);
  EXPECT_TRUE((*v)["missing"].is_null());
}

TEST(Json, RoundTripsThroughDump) {
  Json o = Json::object();
  o.set("s", "quote\" backslash\\ ctl\x01");
  o.set("n", 42);
  o.set("f", 0.5);
  Json arr = Json::array();
  arr.push(Json(false));
  o.set("arr", arr);
  auto back = Json::parse(o.dump());
  ASSERT_TRUE(back);
  EXPECT_EQ(back->dump(), o.dump());
  EXPECT_EQ((*back)["s"].as_string(), "quote\" backslash\\ ctl\x01");
  // Negative zero stays a number that prints the same (fuzz_json found "-0" reading back as 0).
  auto z = Json::parse("[-0e1]");
  ASSERT_TRUE(z);
  EXPECT_EQ(z->dump(), "[-0.0]");
  EXPECT_EQ(Json::parse(z->dump())->dump(), "[-0.0]");
}

TEST(Json, RejectsMalformedInputWithOffset) {
  Json::ParseError err;
  EXPECT_FALSE(Json::parse("{\"a\": }", &err));
  EXPECT_EQ(err.offset, 6u);
  EXPECT_FALSE(Json::parse("[1, 2", &err));
  EXPECT_FALSE(Json::parse("{} extra", &err));
  EXPECT_NE(err.message.find("trailing"), std::string::npos);
  EXPECT_FALSE(Json::parse("\"\xff\"", &err));
  EXPECT_FALSE(Json::parse("\"\\ud800\"", &err));
  EXPECT_FALSE(Json::parse("01", &err));
  EXPECT_FALSE(Json::parse("", &err));
  // A repeated key: which value counts would be a guess.
  EXPECT_FALSE(Json::parse("{\"t\": 1, \"t\": 2}", &err));
  EXPECT_NE(err.message.find("duplicate key \"t\""), std::string::npos) << err.message;
  EXPECT_EQ(err.offset, 9u);                                  // the second key
  EXPECT_TRUE(Json::parse("{\"a\": {\"t\": 1}, \"t\": 2}"));  // the same key at two levels
}

TEST(Json, LimitsDepth) {
  std::string deep(100, '[');
  deep += std::string(100, ']');
  Json::ParseError err;
  EXPECT_FALSE(Json::parse(deep, &err));
  EXPECT_NE(err.message.find("nesting"), std::string::npos);
  std::string ok(60, '[');
  ok += std::string(60, ']');
  EXPECT_TRUE(Json::parse(ok));
}

TEST(Json, Utf8Validation) {
  EXPECT_TRUE(is_valid_utf8("plain"));
  EXPECT_TRUE(is_valid_utf8("\xe2\x82\xac"));
  EXPECT_FALSE(is_valid_utf8("\xe2\x82"));
  EXPECT_FALSE(is_valid_utf8("\xc0\x80"));      // overlong
  EXPECT_FALSE(is_valid_utf8("\xed\xa0\x80"));  // surrogate
}

// Found by fuzz_qmp and fuzz_snapshot_meta once UBSan findings aborted: a number past int64
// read as an integer was undefined behaviour. It saturates now (and NaN is 0).
TEST(Json, AnIntegerPastInt64Saturates) {
  EXPECT_EQ(Json::parse("1e300")->as_int(), INT64_MAX);
  EXPECT_EQ(Json::parse("-1e300")->as_int(), INT64_MIN);
  EXPECT_EQ(Json::parse("66666666666666666666666666666")->as_int(), INT64_MAX);
  EXPECT_EQ(Json::parse("9223372036854775808")->as_int(), INT64_MAX);
  EXPECT_EQ(Json::parse("-2.5")->as_int(), -2);
  EXPECT_EQ(Json::parse("9007199254740993")->as_int(), 9007199254740993);
  EXPECT_EQ(Json(std::nan("")).as_int(), 0);
}

}  // namespace
}  // namespace pandastack::wire
