#include "redis/callback.h"

#include <gtest/gtest.h>

#include <array>
#include <memory>

namespace ratelimit::redis {
namespace {

TEST(Callback, InlineAndHeapCallablesRunAndMove) {
  int calls = 0;
  Callback small = [&calls](StatusOr<Reply> r) { calls += r.ok() ? 1 : 100; };
  std::array<int64_t, 32> big{};
  big[0] = 10;
  Callback large = [&calls, big](StatusOr<Reply> r) {
    calls += static_cast<int>(big[0]) + (r.ok() ? 2 : 100);
  };
  Callback moved = std::move(large);
  EXPECT_FALSE(static_cast<bool>(large));  // NOLINT(bugprone-use-after-move)
  small(Reply::Nil());
  moved(Reply::Nil());
  EXPECT_EQ(calls, 13);
}

TEST(Callback, MoveOnlyCaptureIsDestroyedOnce) {
  auto counter = std::make_shared<int>(0);
  {
    auto owned = std::make_unique<int>(5);
    Callback a = [counter, owned = std::move(owned)](StatusOr<Reply>) { ++*counter; };
    EXPECT_EQ(counter.use_count(), 2);
    Callback b;
    b = std::move(a);
    EXPECT_EQ(counter.use_count(), 2);
    b(Unavailable("x"));
  }
  EXPECT_EQ(counter.use_count(), 1);
  EXPECT_EQ(*counter, 1);
}

}  // namespace
}  // namespace ratelimit::redis
