// The memory OverrideStore: the records of this process only (the memory
// store of limit state is per process too). A change is announced to the
// watcher at once, before `done` runs.
#include <map>
#include <utility>

#include "ratelimit/override_store.h"
#include "ratelimit/thread_annotations.h"

namespace ratelimit {
namespace {

class MemoryOverrideStore final : public OverrideStore {
 public:
  bool shared() const override { return false; }

  void Put(std::string client, std::string value,
           std::function<void(StatusOr<int64_t>)> done) override {
    int64_t version = 0;
    {
      LockGuard lock(mu_);
      if (closed_) return done(Unavailable("the override store is closed"));
      records_[std::move(client)] = std::move(value);
      version = ++version_;
    }
    Announce(version);
    done(version);
  }

  void Remove(std::string client, std::optional<std::string> if_value,
              std::function<void(StatusOr<bool>)> done) override {
    int64_t version = 0;
    {
      LockGuard lock(mu_);
      if (closed_) return done(Unavailable("the override store is closed"));
      auto it = records_.find(client);
      if (it == records_.end() || (if_value && it->second != *if_value)) return done(false);
      records_.erase(it);
      version = ++version_;
    }
    Announce(version);
    done(true);
  }

  void ReadAll(std::function<void(StatusOr<OverrideSet>)> done) override {
    OverrideSet set;
    {
      LockGuard lock(mu_);
      if (closed_) return done(Unavailable("the override store is closed"));
      set.version = version_;
      set.records.reserve(records_.size());
      for (const auto& [client, value] : records_) set.records.push_back({client, value});
    }
    done(std::move(set));
  }

  void Watch(std::function<void(int64_t)> changed) override {
    LockGuard lock(mu_);
    changed_ = std::make_shared<const std::function<void(int64_t)>>(std::move(changed));
  }

  void AnnounceReset(std::string /*client*/, std::function<void(Status)> done) override {
    done(Status::Ok());
  }
  void WatchResets(std::function<void(std::string_view)> /*reset*/) override {}

  void Close() override {
    LockGuard lock(mu_);
    closed_ = true;
    changed_.reset();
  }

 private:
  void Announce(int64_t version) {
    std::shared_ptr<const std::function<void(int64_t)>> changed;
    {
      LockGuard lock(mu_);
      changed = changed_;
    }
    if (changed) (*changed)(version);
  }

  Mutex mu_;
  std::map<std::string, std::string> records_ RL_GUARDED_BY(mu_);
  int64_t version_ RL_GUARDED_BY(mu_) = 0;
  bool closed_ RL_GUARDED_BY(mu_) = false;
  std::shared_ptr<const std::function<void(int64_t)>> changed_ RL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<OverrideStore> MakeMemoryOverrideStore() {
  return std::make_unique<MemoryOverrideStore>();
}

}  // namespace ratelimit
