// InTurns: long housekeeping on an I/O thread, one bounded step per turn.
//
//   InTurns(ioc.get_executor(), [&store] { return store.SweepSome(64).more; });
//
// Runs step() now and, while it returns true, again: each next call is
// posted to `executor`, behind whatever was queued meanwhile (the requests
// that arrived), so no turn holds a thread longer than one step. The
// server's sweep drops a mass expiry of concurrency leases so.
//
// Thread-safety: the calls of one InTurns never overlap; `step`, and what it
// refers to, must stay valid until it returns false or the executor's
// context is destroyed (its queued call is then dropped, never run).
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/post.hpp>
#include <functional>
#include <utility>

namespace ratelimit::server {

inline void InTurns(boost::asio::any_io_executor executor, std::function<bool()> step) {
  if (!step()) return;
  boost::asio::post(executor, [executor, step = std::move(step)]() mutable {
    InTurns(std::move(executor), std::move(step));
  });
}

}  // namespace ratelimit::server
