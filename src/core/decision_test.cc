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

// The decision Combine's numbers come from, which Combine's answer need not
// equal: it carries another limit's delay.
TEST(SpeakerOf, TheDecisionWhoseNumbersCombineCarries) {
  using std::chrono::milliseconds;
  std::vector<Decision> d = {
      {.allowed = true, .limit = 10, .remaining = 8, .delay = milliseconds(1000)},
      {.allowed = true, .limit = 3, .remaining = 1}};
  EXPECT_EQ(SpeakerOf(d), 1u);
  const Decision c = Combine(d);
  EXPECT_EQ(c.limit, 3);
  EXPECT_EQ(c.delay, milliseconds(1000));
  EXPECT_NE(c, d[1]);
  d[0] = {.allowed = false, .limit = 10, .retry_after = seconds(2)};
  EXPECT_EQ(SpeakerOf(d), 0u);
  d.push_back({.allowed = false, .limit = 5, .retry_after = seconds(9)});
  EXPECT_EQ(SpeakerOf(d), 2u);
}

}  // namespace
}  // namespace ratelimit
