// The Redis OverrideStore: the records in one hash shared by every instance,
// each change announced on a channel (include/ratelimit/override_store.h for
// the keys; the script is src/store/lua/overrides.lua). Calls and the
// subscription go through a RedisBackend like the stores of limit state, so
// one node, a Cluster and Sentinel work alike.
#include <utility>

#include "ratelimit/override_store.h"
#include "store/lua/overrides_script.h"
#include "store/redis_backend.h"

namespace ratelimit {
namespace {

// {version, second} from the script, or why not.
StatusOr<std::pair<int64_t, const redis::Reply*>> Parse(const StatusOr<redis::Reply>& r) {
  if (!r.ok()) return r.status();
  if (r->IsError()) return Unavailable("redis: " + r->str);
  if (!r->IsArray() || r->elements.size() != 2 || !r->elements[0].IsInteger()) {
    return Internal("the overrides script answered " + r->DebugString());
  }
  return std::make_pair(r->elements[0].integer, &r->elements[1]);
}

class RedisOverrideStore final : public OverrideStore {
 public:
  RedisOverrideStore(std::unique_ptr<store::RedisBackend> backend, const std::string& prefix)
      : backend_(std::move(backend)),
        hash_(prefix + "{%overrides}"),
        version_(prefix + "{%overrides}v"),
        channel_(prefix + "overrides") {}
  ~RedisOverrideStore() override { backend_->CloseAndWait(nullptr); }

  bool shared() const override { return true; }

  void Put(std::string client, std::string value,
           std::function<void(StatusOr<int64_t>)> done) override {
    const std::string_view args[] = {"put", channel_, client, value};
    Call(args, [done = std::move(done)](StatusOr<redis::Reply> r) {
      auto p = Parse(r);
      if (!p.ok()) return done(p.status());
      done(p->first);
    });
  }

  void Remove(std::string client, std::optional<std::string> if_value,
              std::function<void(StatusOr<bool>)> done) override {
    std::vector<std::string_view> args = {"remove", channel_, client};
    if (if_value) args.push_back(*if_value);
    Call(args, [done = std::move(done)](StatusOr<redis::Reply> r) {
      auto p = Parse(r);
      if (!p.ok()) return done(p.status());
      done(p->second->IsInteger() && p->second->integer == 1);
    });
  }

  void ReadAll(std::function<void(StatusOr<OverrideSet>)> done) override {
    const std::string_view args[] = {"read", channel_};
    Call(args, [done = std::move(done)](StatusOr<redis::Reply> r) {
      auto p = Parse(r);
      if (!p.ok()) return done(p.status());
      const redis::Reply& pairs = *p->second;
      if (!pairs.IsArray() || pairs.elements.size() % 2 != 0) {
        return done(Internal("the overrides script answered " + r->DebugString()));
      }
      OverrideSet set{.version = p->first, .records = {}};
      set.records.reserve(pairs.elements.size() / 2);
      for (size_t i = 0; i + 1 < pairs.elements.size(); i += 2) {
        set.records.push_back({pairs.elements[i].str, pairs.elements[i + 1].str});
      }
      done(std::move(set));
    });
  }

  void AnnounceReset(std::string client, std::function<void(Status)> done) override {
    const std::string message = std::string(kResetPrefix) + client;
    const std::string_view args[] = {"announce", channel_, message};
    Call(args, [done = std::move(done)](StatusOr<redis::Reply> r) {
      auto p = Parse(r);
      done(p.status());
    });
  }

  void WatchResets(std::function<void(std::string_view)> reset) override {
    reset_ = std::move(reset);
  }

  void Watch(std::function<void(int64_t)> changed) override {
    backend_->Subscribe(channel_, [changed = std::move(changed), reset = reset_](
                                      redis::Subscriber::Event e, std::string_view payload) {
      switch (e) {
        case redis::Subscriber::Event::kSubscribed:
          if (reset) reset("");  // a reset may have been announced meanwhile
          return changed(-1);
        case redis::Subscriber::Event::kLost: return;  // kSubscribed follows the next subscription
        case redis::Subscriber::Event::kMessage: {
          if (payload.starts_with(kResetPrefix)) {
            if (reset) reset(payload.substr(kResetPrefix.size()));
            return;
          }
          int64_t v = 0;
          for (char c : payload) {
            if (c < '0' || c > '9' || v > (INT64_MAX - 9) / 10) return changed(-1);
            v = v * 10 + (c - '0');
          }
          return changed(payload.empty() ? -1 : v);
        }
      }
    });
  }

  void Close() override { backend_->Close(); }

  void EvictionPolicy(std::function<void(std::string)> done) override {
    const std::string_view args[] = {"CONFIG", "GET", "maxmemory-policy"};
    backend_->GuardedExecute(args, [done = std::move(done)](StatusOr<redis::Reply> r) {
      const bool pair = r.ok() && r->IsArray() && r->elements.size() == 2;
      done(pair && r->elements[1].type == redis::Reply::Type::kString ? r->elements[1].str : "");
    });
  }

 private:
  // The script on the hash's node, with the breaker of that node.
  void Call(std::span<const std::string_view> args, redis::Callback done) {
    const std::string_view keys[] = {hash_, version_};
    backend_->GuardedEval(keys, args, std::move(done));
  }

  static constexpr std::string_view kResetPrefix = "reset ";

  std::unique_ptr<store::RedisBackend> backend_;
  const std::string hash_, version_, channel_;
  std::function<void(std::string_view)> reset_;  // set before Watch
};

}  // namespace

StatusOr<std::unique_ptr<OverrideStore>> MakeRedisOverrideStore(RedisConnectionOptions options) {
  options.connections = 1;
  // An admin change may wait a little longer than a decision.
  options.deadline = std::max(options.deadline, std::chrono::milliseconds(1000));
  StatusOr<std::unique_ptr<store::RedisBackend>> backend =
      store::RedisBackend::Create(options, store::kOverridesScript);
  if (!backend.ok()) return backend.status();
  return std::unique_ptr<OverrideStore>(
      std::make_unique<RedisOverrideStore>(*std::move(backend), options.key_prefix));
}

}  // namespace ratelimit
