// CheckBatcher on its own: a fake Send that counts the calls out, and an
// io_context run by the test thread (the batcher's executor).
#include "store/check_batcher.h"

#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>
#include <vector>

#include "core/steady_clock.h"

namespace ratelimit::store {
namespace {

using std::chrono::seconds;

PendingCheck CheckWith(int id, std::chrono::steady_clock::time_point deadline) {
  PendingCheck p;
  p.deadline = deadline;
  p.submitted_at = id;  // names the check for the test
  return p;
}

// max_calls_in_flight is an upper bound: when a reply frees one slot while
// many checks are queued (of several calls' worth), one call leaves, not
// all of them; the rest stay queued in order and leave as replies come back.
// A queued check whose deadline passes meanwhile still fails unsent.
TEST(CheckBatcher, CallsInFlightNeverExceedTheCap) {
  boost::asio::io_context io;
  size_t out = 0, most_out = 0;
  std::vector<int64_t> sent, expired;
  CheckBatcher b(
      {.max_batch = 2, .max_calls_in_flight = 1, .hold_back = {}}, io.get_executor(),
      [&](std::vector<PendingCheck> group, std::chrono::milliseconds) {
        most_out = std::max(most_out, ++out);
        for (const PendingCheck& p : group) sent.push_back(p.submitted_at);
      },
      [&](PendingCheck& p) { expired.push_back(p.submitted_at); });
  const auto later = core::SteadyClock::now() + seconds(60);
  b.Add(CheckWith(0, later));
  io.poll();
  ASSERT_EQ(out, 1u);  // the first call is out; the rest queue behind it
  for (int id = 1; id <= 7; ++id) {
    b.Add(CheckWith(id, id == 4 ? core::SteadyClock::now() : later));
  }
  io.poll();
  EXPECT_EQ(out, 1u);
  while (out > 0) {  // each reply lets one call go
    --out;
    b.Returned();
    io.poll();
    EXPECT_LE(out, 1u);
  }
  EXPECT_EQ(most_out, 1u) << "calls in flight above max_calls_in_flight";
  EXPECT_EQ(sent, (std::vector<int64_t>{0, 1, 2, 3, 5, 6, 7}));
  EXPECT_EQ(expired, (std::vector<int64_t>{4}));
  EXPECT_TRUE(b.Idle());
}

}  // namespace
}  // namespace ratelimit::store
