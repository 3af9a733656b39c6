#include "redis/command.h"

#include <gtest/gtest.h>

#include <array>

namespace ratelimit::redis {
namespace {

TEST(Command, EncodesMultiBulk) {
  std::array<std::string_view, 3> args = {"SET", "k", "v"};
  EXPECT_EQ(EncodeCommand(args), "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n");
  EXPECT_EQ(EncodedCommandSize(args), EncodeCommand(args).size());
}

TEST(Command, BinarySafeAndEmptyArguments) {
  const std::string binary("a\0\r\nb", 5);
  std::array<std::string_view, 3> args = {"SET", binary, ""};
  constexpr char kExpected[] = "*3\r\n$3\r\nSET\r\n$5\r\na\0\r\nb\r\n$0\r\n\r\n";
  EXPECT_EQ(EncodeCommand(args), std::string(kExpected, sizeof(kExpected) - 1));
  EXPECT_EQ(EncodedCommandSize(args), EncodeCommand(args).size());
}

TEST(Command, SizeMatchesForLongArguments) {
  const std::string big(12345, 'x');
  std::vector<std::string_view> args(11, big);
  args[0] = "RPUSH";
  std::string out = "prefix";
  AppendCommand(out, args);
  EXPECT_EQ(out.size(), 6 + EncodedCommandSize(args));
  EXPECT_TRUE(out.starts_with("prefix*11\r\n$5\r\nRPUSH\r\n$12345\r\n"));
}

}  // namespace
}  // namespace ratelimit::redis
