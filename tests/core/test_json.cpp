#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include "core/error.h"
#include "core/json.h"
#include "core/source_dir.h"
#include "support/errors.h"

using namespace precis;
using precis::testing::error_of;

TEST(Json, ParsesEveryKindOfValue) {
  Json v = Json::parse(R"( {"n": null, "t": true, "f": false, "i": -42, "r": 2.5e3, "s": "hi",
                            "a": [1, [2, {}], []], "o": {"x": 1}} )");
  EXPECT_TRUE(v.at("n").is_null());
  EXPECT_TRUE(v.at("t").as_bool());
  EXPECT_FALSE(v.at("f").as_bool());
  EXPECT_TRUE(v.at("i").is_integer());
  EXPECT_EQ(v.at("i").as_int(), -42);
  EXPECT_FALSE(v.at("r").is_integer());
  EXPECT_EQ(v.at("r").as_double(), 2500.0);
  EXPECT_EQ(v.at("r").as_int(), 2500);
  EXPECT_EQ(v.at("s").as_string(), "hi");
  EXPECT_EQ(v.at("a").size(), 3u);
  EXPECT_EQ(v.at("a").at(1).at(0).as_int(), 2);
  EXPECT_TRUE(v.at("a").at(1).at(1).is_object());
  EXPECT_EQ(v.at("o").at("x").as_int(), 1);
  EXPECT_FALSE(v.contains("missing"));
}

TEST(Json, Int64StaysExact) {
  // 2^53 + 1 is not a double; it must survive parse and dump unchanged.
  Json v = Json::parse("[9007199254740993, -9223372036854775808, 9223372036854775807]");
  EXPECT_EQ(v.at(0).as_int(), 9007199254740993);
  EXPECT_EQ(v.at(1).as_int(), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(v.at(2).as_int(), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(v.dump(), "[9007199254740993,-9223372036854775808,9223372036854775807]");
  // Past int64 the value becomes the nearest double, as Python's float() would make it.
  Json big = Json::parse("18446744073709551616");
  EXPECT_FALSE(big.is_integer());
  EXPECT_EQ(big.as_double(), 18446744073709551616.0);
}

TEST(Json, RealsRoundTripAndStayReal) {
  for (double x : {0.1, 1.0 / 3.0, -2.5e-300, 1e300, 3.0, 6.02214076e23}) {
    Json back = Json::parse(Json(x).dump());
    EXPECT_FALSE(back.is_integer()) << x;
    EXPECT_EQ(back.as_double(), x);
  }
  EXPECT_EQ(Json(3.0).dump(), "3.0");
  EXPECT_EQ(Json(0.5).dump(), "0.5");
}

TEST(Json, NonFiniteNumbersUsePythonSpelling) {
  Json v = Json::array();
  v.push_back(std::nan(""));
  v.push_back(HUGE_VAL);
  v.push_back(-HUGE_VAL);
  EXPECT_EQ(v.dump(), "[NaN,Infinity,-Infinity]");
  Json back = Json::parse(v.dump());
  EXPECT_TRUE(std::isnan(back.at(0).as_double()));
  EXPECT_EQ(back.at(1).as_double(), HUGE_VAL);
  EXPECT_EQ(back.at(2).as_double(), -HUGE_VAL);
}

TEST(Json, StringEscapes) {
  Json v = Json::parse(R"("q\" b\\ s\/ \b\f\n\r\t")");
  EXPECT_EQ(v.as_string(), "q\" b\\ s/ \b\f\n\r\t");
  EXPECT_EQ(v.dump(), R"("q\" b\\ s/ \b\f\n\r\t")");
  EXPECT_EQ(Json(std::string("\x01\x1f", 2)).dump(), R"("\u0001\u001f")");
}

TEST(Json, UnicodeEscapesBecomeUtf8) {
  EXPECT_EQ(Json::parse(R"("\u0041")").as_string(), "A");
  EXPECT_EQ(Json::parse(R"("\u00e9")").as_string(), "\xC3\xA9");                // é, 2 bytes
  EXPECT_EQ(Json::parse(R"("\u0120")").as_string(), "\xC4\xA0");                // Ġ, GPT-2's space
  EXPECT_EQ(Json::parse(R"("\u4E2D")").as_string(), "\xE4\xB8\xAD");            // 中, 3 bytes
  EXPECT_EQ(Json::parse(R"("\uD83D\uDE00")").as_string(), "\xF0\x9F\x98\x80");  // 😀, a surrogate pair
  EXPECT_EQ(Json::parse(R"("\u0000")").as_string(), std::string(1, '\0'));
  // Raw UTF-8 passes through both ways.
  EXPECT_EQ(Json::parse("\"\xE4\xB8\xAD\"").as_string(), "\xE4\xB8\xAD");
  EXPECT_EQ(Json("\xE4\xB8\xAD").dump(), "\"\xE4\xB8\xAD\"");
}

TEST(Json, BadSurrogatesAreErrors) {
  EXPECT_NE(error_of([] { Json::parse(R"("\uD83D")"); }).find("must be followed by a \\u low surrogate"),
            std::string::npos);
  EXPECT_NE(error_of([] { Json::parse(R"("\uD83D\u0041")"); }).find("not a low surrogate"), std::string::npos);
  EXPECT_NE(error_of([] { Json::parse(R"("\uDE00")"); }).find("without a high one"), std::string::npos);
  EXPECT_NE(error_of([] { Json::parse(R"("\u12G4")"); }).find("4 hex digits"), std::string::npos);
}

TEST(Json, ObjectsKeepInsertionOrder) {
  Json v = Json::parse(R"({"zeta":1,"alpha":2,"mid":3})");
  EXPECT_EQ(v.dump(), R"({"zeta":1,"alpha":2,"mid":3})");
  Json built;
  built["b"] = 1;
  built["a"] = "x";
  built["b"] = 2;  // assigning an existing key keeps its place
  built["count"] = uint32_t{7};
  built["list"] = Json::array();
  built["list"].push_back(true);
  EXPECT_EQ(built.dump(), R"({"b":2,"a":"x","count":7,"list":[true]})");
}

TEST(Json, EqualityIsStructural) {
  EXPECT_EQ(Json::parse(R"({"a":[1,2.5,"x",null]})"), Json::parse(R"( { "a" : [ 1 , 2.5 , "x" , null ] } )"));
  EXPECT_FALSE(Json::parse("[1]") == Json::parse("[2]"));
  EXPECT_FALSE(Json::parse(R"({"a":1,"b":2})") == Json::parse(R"({"b":2,"a":1})"));  // order is part of the value
}

TEST(Json, ParseErrorsGiveLineAndColumn) {
  std::string message = error_of([] { Json::parse("{\n  \"a\": 1,\n  \"b\" 2\n}", "config.json"); });
  EXPECT_NE(message.find("config.json: invalid JSON at line 3, column 7: expected ':' but found '2'"),
            std::string::npos)
      << message;
  EXPECT_NE(error_of([] {
              Json::parse("[1, 2");
            }).find("line 1, column 6: expected ',' or ']' in an array but the text ended"),
            std::string::npos);
  EXPECT_NE(error_of([] { Json::parse("[1] x"); }).find("unexpected text after the JSON value"), std::string::npos);
  EXPECT_NE(error_of([] { Json::parse("01"); }).find("unexpected text"), std::string::npos);  // no leading zeros
  EXPECT_NE(error_of([] { Json::parse("1."); }).find("after the decimal point"), std::string::npos);
  EXPECT_NE(error_of([] { Json::parse("1e"); }).find("in the exponent"), std::string::npos);
  EXPECT_NE(error_of([] { Json::parse("\"abc"); }).find("not closed"), std::string::npos);
  EXPECT_NE(error_of([] { Json::parse("\"a\nb\""); }).find("raw control character"), std::string::npos);
  EXPECT_NE(error_of([] { Json::parse(R"("\x")"); }).find("unknown escape '\\x'"), std::string::npos);
  EXPECT_NE(error_of([] { Json::parse("{1:2}"); }).find("expected a string key"), std::string::npos);
  EXPECT_NE(error_of([] { Json::parse("tru"); }).find("expected a value"), std::string::npos);
  EXPECT_NE(error_of([] { Json::parse(""); }).find("expected a value but the text ended"), std::string::npos);
  EXPECT_NE(error_of([] { Json::parse("1e999"); }).find("out of the range"), std::string::npos);
  EXPECT_NE(error_of([] { Json::parse(std::string(600, '[') + std::string(600, ']')); }).find("nesting deeper"),
            std::string::npos);
}

TEST(Json, WrongTypeAccessNamesBothTypes) {
  Json v = Json::parse(R"({"a": "text", "b": 1.5})");
  EXPECT_NE(error_of([&] { v.at("a").as_int(); }).find("expected an integer but the value is string"),
            std::string::npos);
  EXPECT_NE(error_of([&] { v.at("b").as_int(); }).find("expected an integer but the value is 1.5"), std::string::npos);
  EXPECT_NE(error_of([&] { v.at("missing"); }).find("no key \"missing\""), std::string::npos);
  EXPECT_NE(error_of([&] { v.at(0); }).find("expected array but the value is object"), std::string::npos);
  EXPECT_NE(error_of([] { Json(std::numeric_limits<uint64_t>::max()); }).find("does not fit in int64"),
            std::string::npos);
}

TEST(Json, ReadsFilesAndNamesMissingOnes) {
  auto path = std::filesystem::temp_directory_path() / "precis_test_json.json";
  {
    std::ofstream out(path);
    out << R"({"k": [1, "\u00e9"]})";
  }
  Json v = read_json_file(path.string());
  EXPECT_EQ(v.at("k").at(1).as_string(), "\xC3\xA9");
  std::filesystem::remove(path);
  std::string message = error_of([&] { read_json_file(path.string()); });
  EXPECT_NE(message.find(path.string()), std::string::npos);
}

TEST(Json, ParsesGpt2EncoderJson) {
  Json encoder = read_json_file(PRECIS_SOURCE_DIR "/assets/gpt2/encoder.json");
  EXPECT_EQ(encoder.size(), 50257u);
  EXPECT_EQ(encoder.as_object().front().first, "!");
  EXPECT_EQ(encoder.at("<|endoftext|>").as_int(), 50256);
  EXPECT_EQ(encoder.at("\xC4\xA0the").as_int(), 262);  // "Ġthe": " the"
}
