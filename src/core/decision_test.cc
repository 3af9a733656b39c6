#include "ratelimit/decision.h"

#include <gtest/gtest.h>

#include <vector>

namespace ratelimit {
namespace {

using std::chrono::seconds;

TEST(Combine, AllowedTakesTheLimitWithLeastRoom) {
  std::vector<Decision> d = {{.allowed = true, .limit = 10, .remaining = 9},
                             {.allowed = true, .limit = 1000, .remaining = 3}};
  Decision c = Combine(d);
  EXPECT_TRUE(c.allowed);
  EXPECT_EQ(c.limit, 1000);
  EXPECT_EQ(c.remaining, 3);
}

TEST(Combine, DeniedTakesTheLongestWait) {
  std::vector<Decision> d = {{.allowed = false, .limit = 10, .retry_after = seconds(1)},
                             {.allowed = true, .limit = 5, .remaining = 0},
                             {.allowed = false, .limit = 1000, .retry_after = seconds(60)}};
  Decision c = Combine(d);
  EXPECT_FALSE(c.allowed);
  EXPECT_EQ(c.limit, 1000);
  EXPECT_EQ(c.retry_after, seconds(60));
}

TEST(Combine, AllowedWaitsForTheLongestDelayDeniedForNone) {
  using std::chrono::milliseconds;
  std::vector<Decision> d = {
      {.allowed = true, .limit = 10, .remaining = 9, .delay = milliseconds(400)},
      {.allowed = true, .limit = 5, .remaining = 1, .delay = milliseconds(0)},
      {.allowed = true, .limit = 20, .remaining = 7, .delay = milliseconds(1200)}};
  Decision c = Combine(d);
  EXPECT_TRUE(c.allowed);
  EXPECT_EQ(c.limit, 5);  // the least room speaks
  EXPECT_EQ(c.delay, milliseconds(1200));
  d[1] = {.allowed = false, .limit = 5, .retry_after = seconds(1)};
  c = Combine(d);
  EXPECT_FALSE(c.allowed);
  EXPECT_EQ(c.delay, milliseconds(0)) << "a denied request is not delayed";
}

}  // namespace
}  // namespace ratelimit
