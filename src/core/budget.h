// Budget: at most `max` of something at once (calls queued or in flight over
// a group of Redis connections, exchanges with the gateway's upstream),
// counted without a lock.
//
//   core::Budget budget(1024);
//   if (!budget.TryAcquire()) return Overloaded();
//   ...
//   budget.Release();
//
// Thread-safety: thread-safe (one atomic). A refused TryAcquire may count
// for an instant before it takes itself back: another caller can then be
// refused too while one place is free (never admitted beyond max).
#pragma once

#include <atomic>
#include <cstdint>

namespace ratelimit::core {

class Budget {
 public:
  explicit Budget(int64_t max) : max_(max) {}
  // Takes one place; false (and nothing taken) when `max` are taken.
  bool TryAcquire() {
    if (used_.fetch_add(1, std::memory_order_relaxed) >= max_) {
      used_.fetch_sub(1, std::memory_order_relaxed);
      return false;
    }
    return true;
  }
  // Gives back a place TryAcquire took.
  void Release() { used_.fetch_sub(1, std::memory_order_relaxed); }
  int64_t used() const { return used_.load(std::memory_order_relaxed); }
  int64_t max() const { return max_; }

 private:
  const int64_t max_;
  std::atomic<int64_t> used_{0};
};

}  // namespace ratelimit::core
