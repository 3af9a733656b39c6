// Thread-safety annotations: which mutex guards which member, checked at
// compile time by Clang's -Wthread-safety (the clang builds of `make test`
// compile with it and -Werror; GCC ignores the macros).
//
// The macros are Clang's capability attributes under the names Abseil uses
// (absl/base/thread_annotations.h), prefixed RL_. Clang only understands
// locks it can see being taken, so a guarded member's mutex is a
// `ratelimit::Mutex` (std::mutex), `ratelimit::SharedMutex`
// (std::shared_mutex) or another class marked RL_CAPABILITY (e.g.
// store::ShardMutex), and it is taken with `ratelimit::LockGuard` /
// `ratelimit::SharedLockGuard` (or `ratelimit::UniqueLock` where the lock is
// let go early) rather than std::lock_guard, whose constructor the analysis
// cannot see into.
//
//   class Counter {
//    public:
//     void Add(int n) RL_EXCLUDES(mu_) {
//       ratelimit::LockGuard lock(mu_);
//       total_ += n;
//     }
//    private:
//     void AddLocked(int n) RL_REQUIRES(mu_) { total_ += n; }
//     ratelimit::Mutex mu_;
//     int total_ RL_GUARDED_BY(mu_) = 0;
//   };
//
// Reading `total_` without holding `mu_`, or calling AddLocked without it, is
// a compile error in the clang build. Code whose locking the analysis cannot
// follow (a run-time set of locks taken in address order) says so with
// RL_NO_THREAD_SAFETY_ANALYSIS and a comment naming the rule it keeps instead.
//
// Thread-safety: the wrappers are exactly as thread-safe as the mutex they wrap.
#pragma once

#include <mutex>
#include <shared_mutex>

#if defined(__clang__)
#define RL_THREAD_ANNOTATION_(x) __attribute__((x))
#else
#define RL_THREAD_ANNOTATION_(x)
#endif

#define RL_CAPABILITY(name) RL_THREAD_ANNOTATION_(capability(name))
#define RL_SCOPED_CAPABILITY RL_THREAD_ANNOTATION_(scoped_lockable)
#define RL_GUARDED_BY(x) RL_THREAD_ANNOTATION_(guarded_by(x))
#define RL_PT_GUARDED_BY(x) RL_THREAD_ANNOTATION_(pt_guarded_by(x))
#define RL_ACQUIRED_BEFORE(...) RL_THREAD_ANNOTATION_(acquired_before(__VA_ARGS__))
#define RL_ACQUIRED_AFTER(...) RL_THREAD_ANNOTATION_(acquired_after(__VA_ARGS__))
#define RL_REQUIRES(...) RL_THREAD_ANNOTATION_(requires_capability(__VA_ARGS__))
#define RL_REQUIRES_SHARED(...) RL_THREAD_ANNOTATION_(requires_shared_capability(__VA_ARGS__))
#define RL_ACQUIRE(...) RL_THREAD_ANNOTATION_(acquire_capability(__VA_ARGS__))
#define RL_ACQUIRE_SHARED(...) RL_THREAD_ANNOTATION_(acquire_shared_capability(__VA_ARGS__))
#define RL_RELEASE(...) RL_THREAD_ANNOTATION_(release_capability(__VA_ARGS__))
#define RL_RELEASE_SHARED(...) RL_THREAD_ANNOTATION_(release_shared_capability(__VA_ARGS__))
#define RL_RELEASE_GENERIC(...) RL_THREAD_ANNOTATION_(release_generic_capability(__VA_ARGS__))
#define RL_TRY_ACQUIRE(...) RL_THREAD_ANNOTATION_(try_acquire_capability(__VA_ARGS__))
#define RL_TRY_ACQUIRE_SHARED(...) RL_THREAD_ANNOTATION_(try_acquire_shared_capability(__VA_ARGS__))
#define RL_EXCLUDES(...) RL_THREAD_ANNOTATION_(locks_excluded(__VA_ARGS__))
#define RL_ASSERT_CAPABILITY(x) RL_THREAD_ANNOTATION_(assert_capability(x))
#define RL_RETURN_CAPABILITY(x) RL_THREAD_ANNOTATION_(lock_returned(x))
#define RL_NO_THREAD_SAFETY_ANALYSIS RL_THREAD_ANNOTATION_(no_thread_safety_analysis)

namespace ratelimit {

// A standard mutex (M: std::mutex, std::shared_mutex, ...) that the analysis
// knows as a capability. Meets the Lockable (and, for a shared M,
// SharedLockable) requirements, so std::condition_variable_any works with it.
template <class M>
class RL_CAPABILITY("mutex") BasicMutex {
 public:
  void lock() RL_ACQUIRE() { m_.lock(); }
  bool try_lock() RL_TRY_ACQUIRE(true) { return m_.try_lock(); }
  void unlock() RL_RELEASE() { m_.unlock(); }

  void lock_shared() RL_ACQUIRE_SHARED() { m_.lock_shared(); }
  bool try_lock_shared() RL_TRY_ACQUIRE_SHARED(true) { return m_.try_lock_shared(); }
  void unlock_shared() RL_RELEASE_SHARED() { m_.unlock_shared(); }

  // For std::condition_variable (std::unique_lock<std::mutex>) only: waiting
  // releases and retakes the lock behind the analysis' back, which is fine
  // because the caller holds it before and after.
  M& native() { return m_; }

 private:
  M m_;
};

using Mutex = BasicMutex<std::mutex>;
using SharedMutex = BasicMutex<std::shared_mutex>;

// Holds M (any RL_CAPABILITY type) exclusively for its scope.
template <class M>
class RL_SCOPED_CAPABILITY LockGuard {
 public:
  explicit LockGuard(M& m) RL_ACQUIRE(m) : m_(m) { m_.lock(); }
  ~LockGuard() RL_RELEASE() { m_.unlock(); }
  LockGuard(const LockGuard&) = delete;
  LockGuard& operator=(const LockGuard&) = delete;

 private:
  M& m_;
};

// Holds M exclusively like LockGuard, but may let go before its scope ends
// (unlock()) and take it again (lock()): the analysis follows both. For code
// that must not call out (a callback, another lock) with the mutex held.
// Meets BasicLockable, so std::condition_variable_any can wait on it.
template <class M>
class RL_SCOPED_CAPABILITY UniqueLock {
 public:
  explicit UniqueLock(M& m) RL_ACQUIRE(m) : m_(m) { m_.lock(); }
  ~UniqueLock() RL_RELEASE() {
    if (owns_) m_.unlock();
  }
  UniqueLock(const UniqueLock&) = delete;
  UniqueLock& operator=(const UniqueLock&) = delete;

  void lock() RL_ACQUIRE() {
    m_.lock();
    owns_ = true;
  }
  void unlock() RL_RELEASE() {
    owns_ = false;
    m_.unlock();
  }
  bool owns_lock() const { return owns_; }

 private:
  M& m_;
  bool owns_ = true;
};

// Holds M shared (readers) for its scope.
template <class M>
class RL_SCOPED_CAPABILITY SharedLockGuard {
 public:
  explicit SharedLockGuard(M& m) RL_ACQUIRE_SHARED(m) : m_(m) { m_.lock_shared(); }
  ~SharedLockGuard() RL_RELEASE() { m_.unlock_shared(); }
  SharedLockGuard(const SharedLockGuard&) = delete;
  SharedLockGuard& operator=(const SharedLockGuard&) = delete;

 private:
  M& m_;
};

}  // namespace ratelimit
