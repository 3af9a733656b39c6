#include "core/hex.h"

#include <gtest/gtest.h>

#include <array>

namespace ratelimit::core {
namespace {

TEST(Hex, TwoLowerCaseDigitsAByteHighNibbleFirst) {
  const std::array<unsigned char, 5> bytes{0x00, 0x09, 0xaf, 0xf0, 0xff};
  EXPECT_EQ(Hex(bytes), "0009aff0ff");
  EXPECT_EQ(Hex({}), "");
}

TEST(Hex, AppendsAfterWhatIsThere) {
  std::string out = "id:";
  AppendHexByte(out, 0x0a);
  const std::array<unsigned char, 2> more{0x7f, 0x80};
  AppendHex(out, more);
  EXPECT_EQ(out, "id:0a7f80");
}

// Every byte value round-trips through its two digits.
TEST(Hex, EveryByteValueReadsBack) {
  for (int b = 0; b < 256; ++b) {
    const std::string s = Hex(std::array<unsigned char, 1>{static_cast<unsigned char>(b)});
    ASSERT_EQ(s.size(), 2u);
    EXPECT_EQ(std::stoi(s, nullptr, 16), b) << s;
  }
}

}  // namespace
}  // namespace ratelimit::core
