// Blocking helpers for the Client tests (client_test.cc,
// connection_fault_test.cc): one command waited for, and elapsed time.
#pragma once

#include <chrono>
#include <future>
#include <string_view>
#include <utility>
#include <vector>

#include "redis/client.h"

namespace ratelimit::redis::test_calls {

// Sends `args` and waits for the reply; timeout 0 keeps the client's own.
inline StatusOr<Reply> Call(Client& client, std::vector<std::string_view> args,
                            std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) {
  std::promise<StatusOr<Reply>> promise;
  auto future = promise.get_future();
  Callback cb = [&promise](StatusOr<Reply> r) { promise.set_value(std::move(r)); };
  if (timeout.count() > 0) {
    client.Execute(args, std::move(cb), timeout);
  } else {
    client.Execute(args, std::move(cb));
  }
  return future.get();
}

inline std::chrono::milliseconds Since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                               start);
}

}  // namespace ratelimit::redis::test_calls
