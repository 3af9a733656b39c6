// Holder: keeps a request waiting for its leaky-bucket delay (shaping) without
// a thread, on the connection's own executor, and says whether the client is
// still there when the wait ends.
//
//   holder->Hold(steady_clock::now() + delay, [](bool client_alive) { ... });
//
// The end is a point in time, taken when the decision arrived: the time the
// hold takes to start (a hop to the connection's strand on a busy box) does
// not push the request later than its turn.
//
// Session implements it: an asio steady_timer on the session's strand, plus a
// wait for readability on the socket so that a client that disconnects while
// held is noticed at once (its place among the held requests is freed then,
// and the request is never forwarded) instead of when the delay ends.
//
// Thread-safety: Hold may be called from any thread; `then` runs on the
// connection's strand, exactly once.
#pragma once

#include <chrono>
#include <functional>

namespace ratelimit::server {

class Holder {
 public:
  virtual ~Holder() = default;
  // Calls then(true) at `until`, or then(false) as soon as the client has
  // gone (EOF or an error on its connection). One hold at a time.
  virtual void Hold(std::chrono::steady_clock::time_point until,
                    std::function<void(bool client_alive)> then) = 0;
};

}  // namespace ratelimit::server
