#include "core/utf8.h"

#include <string>

#include <gtest/gtest.h>

namespace ratelimit::core {
namespace {

TEST(Utf8, WellFormedTextIsValidWhole) {
  for (const std::string& s : {std::string(""), std::string("plain ascii"),
                               std::string("caf\xc3\xa9"), std::string("\xe2\x82\xac 5"),
                               std::string("\xf0\x9f\x98\x80"), std::string("\xf4\x8f\xbf\xbf")}) {
    EXPECT_TRUE(ValidUtf8(s)) << s;
    EXPECT_EQ(Utf8ValidPrefix(s), s.size());
  }
}

TEST(Utf8, TheFirstBadByteIsFound) {
  struct Case {
    std::string s;
    size_t at;
  };
  for (const Case& c : {
           Case{"ab\xff", 2},            // never a lead byte
           Case{"a\xc3", 1},             // cut short
           Case{"a\xc3(", 1},            // not a continuation byte
           Case{"x\xc1\xbf", 1},         // overlong (U+007F in two bytes)
           Case{"\xe0\x80\xaf", 0},      // overlong (three bytes)
           Case{"ok\xed\xa0\x80", 2},    // a surrogate (U+D800)
           Case{"\xf4\x90\x80\x80", 0},  // above U+10FFFF
           Case{"caf\xc3\xa9\x80", 5},   // a stray continuation byte after good text
       }) {
    EXPECT_FALSE(ValidUtf8(c.s)) << c.at;
    EXPECT_EQ(Utf8ValidPrefix(c.s), c.at);
  }
}

}  // namespace
}  // namespace ratelimit::core
