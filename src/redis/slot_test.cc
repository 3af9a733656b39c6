#include "redis/slot.h"

#include <gtest/gtest.h>

namespace ratelimit::redis {
namespace {

TEST(Crc16, CheckValue) { EXPECT_EQ(Crc16("123456789"), 0x31C3); }

TEST(KeySlot, KnownValues) {
  EXPECT_EQ(KeySlot("123456789"), 12739);
  EXPECT_EQ(KeySlot(""), 0);
  EXPECT_LT(KeySlot("some-key"), kClusterSlots);
}

TEST(KeySlot, HashTags) {
  EXPECT_EQ(KeySlot("{user1000}.following"), KeySlot("{user1000}.followers"));
  EXPECT_EQ(KeySlot("{user1000}.following"), KeySlot("user1000"));
  // Empty tag: the whole key is hashed.
  EXPECT_EQ(KeySlot("foo{}{bar}"), Crc16("foo{}{bar}") & 16383);
  EXPECT_NE(KeySlot("foo{}{bar}"), KeySlot("bar"));
  // The tag runs from the first '{' to the next '}'.
  EXPECT_EQ(KeySlot("foo{{bar}}zap"), KeySlot("{bar"));
  EXPECT_EQ(KeySlot("foo{{bar}}zap"), Crc16("{bar") & 16383);
  // No closing brace: the whole key.
  EXPECT_EQ(KeySlot("foo{bar"), Crc16("foo{bar") & 16383);
}

}  // namespace
}  // namespace ratelimit::redis
