// PolicyHolder: the current Policy, swapped atomically on reload.
//
//   std::shared_ptr<const Policy> p = holder.Get();  // keep it for the whole request
//   holder.Set(new_policy);                          // requests in flight keep the old one
//
// Thread-safety: Get and Set may be called from any thread.
#pragma once

#include <memory>

#include "policy/policy.h"
#include "ratelimit/thread_annotations.h"

namespace ratelimit::server {

class PolicyHolder {
 public:
  explicit PolicyHolder(std::shared_ptr<const policy::Policy> p) : policy_(std::move(p)) {}
  std::shared_ptr<const policy::Policy> Get() const {
    LockGuard lock(mu_);
    return policy_;
  }
  void Set(std::shared_ptr<const policy::Policy> p) {
    LockGuard lock(mu_);
    policy_.swap(p);
  }  // the old policy is released outside the lock (p)

 private:
  mutable Mutex mu_;
  std::shared_ptr<const policy::Policy> policy_ RL_GUARDED_BY(mu_);
};

}  // namespace ratelimit::server
