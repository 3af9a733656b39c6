// PolicyHolder: the current Policy, swapped atomically on reload.
//
//   std::shared_ptr<const Policy> p = holder.Get();  // keep it for the whole request
//   holder.Set(new_policy);                          // requests in flight keep the old one
//
// Thread-safety: Get and Set may be called from any thread.
#pragma once

#include <memory>
#include <mutex>

#include "policy/policy.h"

namespace ratelimit::server {

class PolicyHolder {
 public:
  explicit PolicyHolder(std::shared_ptr<const policy::Policy> p) : policy_(std::move(p)) {}
  std::shared_ptr<const policy::Policy> Get() const {
    std::lock_guard<std::mutex> lock(mu_);
    return policy_;
  }
  void Set(std::shared_ptr<const policy::Policy> p) {
    std::lock_guard<std::mutex> lock(mu_);
    policy_.swap(p);
  }  // the old policy is released outside the lock (p)

 private:
  mutable std::mutex mu_;
  std::shared_ptr<const policy::Policy> policy_;  // GUARDED_BY(mu_)
};

}  // namespace ratelimit::server
