#include "server/admin_denials.h"

#include <gtest/gtest.h>

namespace ratelimit::server {
namespace {

constexpr int64_t kT0 = 1'800'000'000'000;  // ms

TEST(AdminDenials, ForClientIsExactNewestFirstAndBounded) {
  AdminDenials d;
  d.Record({.unix_ms = kT0, .key = "u:ada", .route = "r", .limit = "a", .path = "/x"});
  d.Record({.unix_ms = kT0 + 1, .key = "u:adam", .route = "r", .limit = "b", .path = "/x"});
  d.Record({.unix_ms = kT0 + 2, .key = "u:ada", .route = "r", .limit = "c", .path = "/x"});
  auto mine = d.ForClient("u:ada");
  ASSERT_EQ(mine.size(), 2u);  // never "u:adam": no prefix matches
  EXPECT_EQ(mine[0].limit, "c");
  EXPECT_EQ(mine[1].limit, "a");
  EXPECT_TRUE(d.ForClient("u:ad").empty());
  for (size_t i = 0; i < AdminDenials::kRingSize + 5; ++i) {
    d.Record({.unix_ms = kT0 + 10 + static_cast<int64_t>(i), .key = "u:bob", .limit = "x"});
  }
  EXPECT_TRUE(d.ForClient("u:ada").empty());  // pushed out of the ring
  auto bob = d.ForClient("u:bob");
  ASSERT_EQ(bob.size(), AdminDenials::kRingSize);
  EXPECT_EQ(bob.front().unix_ms, kT0 + 10 + static_cast<int64_t>(AdminDenials::kRingSize) + 4);
}

TEST(AdminDenials, TopCountsTheWindowOnly) {
  AdminDenials d;
  for (int i = 0; i < 3; ++i) d.Record({.unix_ms = kT0, .key = "ip:1.1.1.1", .limit = "x"});
  for (int i = 0; i < 5; ++i) {
    d.Record({.unix_ms = kT0 - 10 * 60'000, .key = "ip:2.2.2.2", .limit = "x"});
  }
  d.Record({.unix_ms = kT0, .key = "ip:3.3.3.3", .limit = "x"});
  d.Record({.unix_ms = kT0, .key = "ip:4.4.4.4", .limit = "x", .shadow = true});
  uint64_t others = 0;
  auto top = d.Top(10, 5, kT0, &others);
  ASSERT_EQ(top.size(), 2u);
  EXPECT_EQ(top[0].key, "ip:1.1.1.1");
  EXPECT_EQ(top[0].denials, 3u);
  EXPECT_EQ(top[1].key, "ip:3.3.3.3");
  auto wide = d.Top(1, 60, kT0, &others);
  ASSERT_EQ(wide.size(), 1u);
  EXPECT_EQ(wide[0].key, "ip:2.2.2.2");
}

}  // namespace
}  // namespace ratelimit::server
