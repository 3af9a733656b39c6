// ShardMutex: the lock of one memory-store shard.
//
// A shard is held for tens of nanoseconds (a table probe and a little
// arithmetic), far less than a futex round trip. std::mutex (glibc) goes to
// the kernel as soon as it is taken, so two threads meeting on a shard cost
// each other microseconds; this lock spins briefly first and sleeps on a
// futex (C++20 atomic wait) only when the holder is slow (a table rebuild,
// or a holder the OS preempted). The lock and unlock are inline: an
// uncontended pair is two atomic instructions and no call.
//
// The three states follow Drepper's "Futexes Are Tricky": 0 free, 1 held,
// 2 held and someone may be sleeping, so unlock wakes only when needed.
//
// Meets the Lockable requirements (std::lock_guard works) and is a capability
// for Clang's thread-safety analysis: members it guards are marked
// RL_GUARDED_BY(mu) and it is taken with ratelimit::LockGuard.
#pragma once

#include <atomic>
#include <cstdint>

#include "ratelimit/thread_annotations.h"

namespace ratelimit::store {

class RL_CAPABILITY("mutex") ShardMutex {
 public:
  void lock() RL_ACQUIRE() {
    uint32_t expected = 0;
    if (state_.compare_exchange_strong(expected, 1, std::memory_order_acquire)) return;
    LockSlow();
  }

  bool try_lock() RL_TRY_ACQUIRE(true) {
    uint32_t expected = 0;
    return state_.compare_exchange_strong(expected, 1, std::memory_order_acquire);
  }

  void unlock() RL_RELEASE() {
    if (state_.exchange(0, std::memory_order_release) == 2) state_.notify_one();
  }

 private:
  void LockSlow() {
    // Spin while the holder is likely still running on another core.
    for (int i = 0; i < kSpins; ++i) {
      Pause();
      if (state_.load(std::memory_order_relaxed) == 0) {
        uint32_t expected = 0;
        if (state_.compare_exchange_weak(expected, 1, std::memory_order_acquire)) return;
      }
    }
    // Announce a sleeper (state 2) and sleep until the holder leaves. Taking
    // the lock as 2 is conservative: the next unlock may wake no one.
    while (state_.exchange(2, std::memory_order_acquire) != 0) state_.wait(2);
  }

  static void Pause() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
  }

  static constexpr int kSpins = 100;
  std::atomic<uint32_t> state_{0};
};

}  // namespace ratelimit::store
