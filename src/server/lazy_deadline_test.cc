// LazyDeadline on a real io_context (its timer is Asio's): when the owner's
// expiry runs, how often, and when the owner is released. Durations are tens
// of milliseconds; bounds are loose where a busy machine could be late.
#include "server/lazy_deadline.h"

#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <memory>

namespace ratelimit::server {
namespace {

namespace net = boost::asio;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

struct Owner : std::enable_shared_from_this<Owner> {
  explicit Owner(net::io_context& ioc) : deadline(ioc.get_executor(), &Owner::Expire) {}
  void Expire() {
    ++expired;
    expired_at = Clock::now();
  }
  LazyDeadline<Owner> deadline;
  int expired = 0;
  Clock::time_point expired_at{};
};

// After `after`, runs `f` on the io_context.
template <class F>
void At(net::io_context& ioc, milliseconds after, F f) {
  auto timer = std::make_shared<net::steady_timer>(ioc, after);
  timer->async_wait([timer, f](const boost::system::error_code&) { f(); });
}

class LazyDeadlineTest : public ::testing::Test {
 protected:
  net::io_context ioc;
  std::shared_ptr<Owner> owner = std::make_shared<Owner>(ioc);
  const Clock::time_point start = Clock::now();
};

TEST_F(LazyDeadlineTest, ExpiresOnceWhenTheDeadlinePasses) {
  owner->deadline.ExpiresAfter(milliseconds(50), *owner);
  ioc.run();
  EXPECT_EQ(owner->expired, 1);
  EXPECT_GE(owner->expired_at - start, milliseconds(50));
}

TEST_F(LazyDeadlineTest, ADeadlineMovedLaterIsWaitedFor) {
  // The timer armed for 50 ms fires before the deadline, now 30 + 100 ms
  // away: it waits again instead of expiring.
  owner->deadline.ExpiresAfter(milliseconds(50), *owner);
  At(ioc, milliseconds(30), [&] { owner->deadline.ExpiresAfter(milliseconds(100), *owner); });
  ioc.run();
  EXPECT_EQ(owner->expired, 1);
  EXPECT_GE(owner->expired_at - start, milliseconds(130));
}

TEST_F(LazyDeadlineTest, ADeadlineMovedEarlierReArmsTheTimer) {
  owner->deadline.ExpiresAfter(milliseconds(60'000), *owner);
  owner->deadline.ExpiresAfter(milliseconds(50), *owner);
  ioc.run_for(milliseconds(5'000));
  EXPECT_EQ(owner->expired, 1);
  EXPECT_LT(owner->expired_at - start, milliseconds(5'000));
}

TEST_F(LazyDeadlineTest, AClearedDeadlineNeverExpiresAndReleasesTheOwner) {
  std::weak_ptr<Owner> weak = owner;
  owner->deadline.ExpiresAfter(milliseconds(50), *owner);
  owner->deadline.Clear();
  owner.reset();  // the pending wait still holds it
  EXPECT_FALSE(weak.expired());
  ioc.run();  // the wait completes, sees no deadline, lets go
  EXPECT_TRUE(weak.expired());
}

TEST_F(LazyDeadlineTest, CancelReleasesTheOwnerAtOnceAndALaterDeadlineArmsAgain) {
  owner->deadline.ExpiresAfter(milliseconds(60'000), *owner);
  owner->deadline.Cancel();
  ioc.run_for(milliseconds(5'000));  // returns when the aborted wait has run
  EXPECT_LT(Clock::now() - start, milliseconds(5'000));
  EXPECT_EQ(owner.use_count(), 1);
  EXPECT_EQ(owner->expired, 0);

  // A deadline later than the cancelled one still arms the timer.
  ioc.restart();
  owner->deadline.ExpiresAfter(milliseconds(100'000), *owner);
  owner->deadline.Cancel();
  owner->deadline.ExpiresAfter(milliseconds(50), *owner);  // earlier: arms in any case
  owner->deadline.Cancel();
  owner->deadline.ExpiresAfter(milliseconds(80), *owner);  // later than the last armed time
  ioc.run_for(milliseconds(5'000));
  EXPECT_EQ(owner->expired, 1);
}

}  // namespace
}  // namespace ratelimit::server
