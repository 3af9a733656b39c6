#include "core/percent.h"

#include <gtest/gtest.h>

#include <vector>

namespace ratelimit::core {
namespace {

TEST(PercentDecode, DecodesAndRefusesMalformedEscapes) {
  EXPECT_EQ(PercentDecode("a%2Fb%2f%41"), "a/b/A");
  EXPECT_EQ(PercentDecode("a+b"), "a+b");
  EXPECT_EQ(PercentDecode("a+b%2B", kPlusIsSpace), "a b+");
  EXPECT_EQ(PercentDecode(""), "");
  for (const char* bad : {"%", "%4", "%4g", "%g4", "a%", "%%41"}) {
    EXPECT_EQ(PercentDecode(bad), std::nullopt) << bad;
  }
}

TEST(PercentDecode, EachSaysWhichBytesWereEscaped) {
  std::vector<std::pair<char, bool>> seen;
  auto r = PercentDecodeEach("a%2F", false, [&](char c, bool escaped) {
    seen.push_back({c, escaped});
    return true;
  });
  EXPECT_EQ(r, PercentResult::kOk);
  EXPECT_EQ(seen, (std::vector<std::pair<char, bool>>{{'a', false}, {'/', true}}));
  EXPECT_EQ(PercentDecodeEach("abc", false, [](char c, bool) { return c != 'b'; }),
            PercentResult::kStopped);
}

TEST(PercentEncode, EncodesWhatIsNotPrintableAsciiAndThePercentAndDecodesBack) {
  EXPECT_EQ(PercentEncode("a%b\n\xc3\xa9 ~\x7f"), "a%25b%0A%C3%A9 ~%7F");
  EXPECT_EQ(PercentEncode("/plain/path"), "/plain/path");
  std::string every;
  for (int b = 0; b < 256; ++b) every.push_back(static_cast<char>(b));
  EXPECT_EQ(PercentDecode(PercentEncode(every)), every);
}

}  // namespace
}  // namespace ratelimit::core
