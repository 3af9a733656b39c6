// UpstreamPool<Conn>: the gateway's bounded set of upstream connections.
//
//   UpstreamPool<UpstreamConnection> pool(/*max_idle=*/64, /*max_active=*/1024);
//   if (!pool.TryStart()) return Reply503();     // max_active exchanges out
//   std::unique_ptr<Conn> c = pool.TakeIdle();   // null: connect a new one
//   ... exchange ...
//   pool.GiveBack(std::move(c));                 // only after a whole, reusable answer
//   pool.Finish();                               // the exchange is over
//   pool.TakeIf(is_c);                           // c went bad while idle: drop it
//
// Counts the exchanges in progress (at most max_active; TryStart refuses
// beyond) and keeps at most max_idle idle keep-alive connections, the one
// given back last taken first (the warmest, and the least likely to have
// been closed by the upstream's idle timeout). A connection given back to a
// full pool is dropped (destroyed: closed). A template so that a unit test
// (upstream_pool_test.cc) drives it with a fake connection, without sockets.
//
// Thread-safety: every member may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/budget.h"
#include "ratelimit/thread_annotations.h"

namespace ratelimit::server {

template <class Conn>
class UpstreamPool {
 public:
  UpstreamPool(size_t max_idle, size_t max_active)
      : max_idle_(max_idle), active_(static_cast<int64_t>(max_active)) {}

  // Takes a place for one more exchange; false (and nothing taken) when
  // max_active are already out.
  bool TryStart() { return active_.TryAcquire(); }
  // Gives back the place TryStart took.
  void Finish() { active_.Release(); }

  // The idle connection given back last, or null when none is idle.
  std::unique_ptr<Conn> TakeIdle() RL_EXCLUDES(mu_) {
    LockGuard lock(mu_);
    if (idle_.empty()) return nullptr;
    auto c = std::move(idle_.back());
    idle_.pop_back();
    return c;
  }
  // Keeps `c` for a later exchange, or drops it when max_idle are idle.
  void GiveBack(std::unique_ptr<Conn> c) RL_EXCLUDES(mu_) {
    std::unique_ptr<Conn> dropped;  // destroyed after the lock is let go
    LockGuard lock(mu_);
    if (idle_.size() < max_idle_) {
      idle_.push_back(std::move(c));
    } else {
      dropped = std::move(c);
    }
  }
  // Takes the idle connection for which `match` is true out of the pool (the
  // caller drops it: one the upstream wrote to or closed while it was idle),
  // or null when none is idle any more (taken by an exchange meanwhile).
  template <typename Match>
  std::unique_ptr<Conn> TakeIf(Match match) RL_EXCLUDES(mu_) {
    LockGuard lock(mu_);
    for (auto it = idle_.begin(); it != idle_.end(); ++it) {
      if (!match(**it)) continue;
      std::unique_ptr<Conn> c = std::move(*it);
      idle_.erase(it);
      return c;
    }
    return nullptr;
  }
  // Drops every idle connection (at shutdown).
  void CloseIdle() RL_EXCLUDES(mu_) {
    std::vector<std::unique_ptr<Conn>> dropped;
    LockGuard lock(mu_);
    dropped.swap(idle_);
  }

  size_t active() const { return static_cast<size_t>(active_.used()); }
  size_t idle() const RL_EXCLUDES(mu_) {
    LockGuard lock(mu_);
    return idle_.size();
  }

 private:
  const size_t max_idle_;
  core::Budget active_;  // exchanges in progress
  mutable Mutex mu_;
  std::vector<std::unique_ptr<Conn>> idle_ RL_GUARDED_BY(mu_);
};

}  // namespace ratelimit::server
