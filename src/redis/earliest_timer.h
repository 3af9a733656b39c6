// EarliestTimer: a strand's timer that runs its action by the earliest time
// it was asked for. A request for a later time is already covered and does
// nothing; an earlier one moves the timer. (The cluster client's slot-map
// refresh and parked calls, the sentinel client's discovery.)
//
//   // on the strand:
//   timer.ArmBy(Clock::now() + delay, [self] { self->StartRefresh(); });
//   timer.Stop();  // at Close(): cancels, and no later ArmBy arms it again
//
// `fire` should hold what it touches alive (a shared_ptr to the owner), as
// the timer is a member of that owner.
//
// Thread-safety: strand-only (every call on the strand the timer runs on).
#pragma once

#include <chrono>
#include <utility>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>

#include "core/steady_clock.h"

namespace ratelimit::redis {

class EarliestTimer {
 public:
  using Clock = core::SteadyClock;

  explicit EarliestTimer(const boost::asio::strand<boost::asio::any_io_executor>& strand)
      : timer_(strand) {}

  template <typename Fire>
  void ArmBy(Clock::time_point when, Fire fire) {
    if (when >= at_) return;
    at_ = when;
    timer_.expires_at(when);  // a wait already pending completes as aborted
    timer_.async_wait([this, when, fire = std::move(fire)](boost::system::error_code ec) mutable {
      if (ec || at_ != when) return;
      at_ = Clock::time_point::max();
      fire();
    });
  }

  void Stop() {
    at_ = Clock::time_point::min();  // no later ArmBy arms it again
    timer_.cancel();
  }

 private:
  boost::asio::steady_timer timer_;
  Clock::time_point at_ = Clock::time_point::max();  // when it fires; max() when idle
};

}  // namespace ratelimit::redis
