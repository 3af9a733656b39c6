// RedisConcurrencyStore: concurrency leases in a Redis sorted set per key.
// The script is src/store/lua/concurrency.lua; the client and the cluster
// client are those of RedisStore (src/redis), each call guarded by a circuit
// breaker per node.
#include <algorithm>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "ratelimit/concurrency.h"
#include "ratelimit/redis_store.h"
#include "redis/client.h"
#include "redis/cluster_client.h"
#include "redis/io_thread.h"
#include "redis/slot.h"
#include "store/lua/concurrency_script.h"

namespace ratelimit {

struct RedisConcurrencyStore::Impl {
  Options opts;
  std::string url_for_logs;
  const Clock* clock = nullptr;
  redis::Script script;
  std::unique_ptr<CircuitBreaker> breaker;  // standalone, or a cluster's unknown slots
  std::mutex breakers_mu;
  std::vector<std::unique_ptr<CircuitBreaker>> node_breakers;  // GUARDED_BY(breakers_mu)
  std::atomic<int64_t> calls_out{0};
  redis::IoThread io;  // declared before the clients: destroyed after them
  std::unique_ptr<redis::Client> client;
  std::unique_ptr<redis::ClusterClient> cluster;

  std::string Key(std::string_view key, std::string_view name) const {
    std::string k;
    k.reserve(opts.key_prefix.size() + key.size() + name.size() + 6);
    k += opts.key_prefix;
    k += '{';
    k += EncodeClientKey(key);
    k += "}~c:";
    k += name;
    return k;
  }

  CircuitBreaker* BreakerFor(std::string_view key) {
    if (!cluster) return breaker.get();
    const int node = cluster->NodeForSlot(redis::KeySlot(key));
    if (node < 0) return breaker.get();
    std::lock_guard lock(breakers_mu);
    if (node_breakers.size() <= static_cast<size_t>(node)) node_breakers.resize(node + 1);
    auto& b = node_breakers[static_cast<size_t>(node)];
    if (!b) b = std::make_unique<CircuitBreaker>(opts.breaker);
    return b.get();
  }

  // Runs `call` unless the breaker is open, and reports the outcome to it.
  // `call` gets the callback to pass to the client.
  template <typename Call>
  void Guarded(const std::string& key, Call call,
               std::function<void(StatusOr<redis::Reply>)> done) {
    CircuitBreaker* b = BreakerFor(key);
    if (!b->Allow()) {
      if (cluster) cluster->RequestRefresh();
      return done(BreakerOpenStatus("redis " + url_for_logs));
    }
    calls_out.fetch_add(1, std::memory_order_relaxed);
    call([this, b, done = std::move(done)](StatusOr<redis::Reply> r) {
      if (r.ok()) {
        b->OnSuccess();
      } else if (r.status().code() != StatusCode::kResourceExhausted) {
        b->OnFailure();
      }
      done(std::move(r));
      calls_out.fetch_sub(1, std::memory_order_relaxed);
    });
  }
};

namespace {

void ApplyOptions(const RedisConcurrencyStore::Options& o, redis::Options* ro) {
  ro->command_timeout = o.deadline;
  ro->connections = std::max(1, o.connections);
  ro->max_pending = static_cast<int>(o.max_pending);
  ro->reconnect_max_backoff = o.reconnect_max_backoff;
}

}  // namespace

StatusOr<std::unique_ptr<RedisConcurrencyStore>> RedisConcurrencyStore::Create(Options options) {
  auto impl = std::make_unique<Impl>();
  if (redis::IsClusterUrl(options.url)) {
    StatusOr<redis::ClusterOptions> co = redis::ParseClusterUrl(options.url);
    if (!co.ok()) return co.status();
    ApplyOptions(options, &co->node);
    impl->url_for_logs = "cluster";
    StatusOr<std::unique_ptr<redis::ClusterClient>> c =
        redis::ClusterClient::Create(impl->io.executor(), *std::move(co));
    if (!c.ok()) return c.status();
    impl->cluster = *std::move(c);
  } else {
    StatusOr<redis::Options> ro = redis::ParseRedisUrl(options.url);
    if (!ro.ok()) return ro.status();
    ApplyOptions(options, &*ro);
    impl->url_for_logs = redis::RedactedUrl(*ro);
    StatusOr<std::unique_ptr<redis::Client>> c =
        redis::Client::Create(impl->io.executor(), *std::move(ro));
    if (!c.ok()) return c.status();
    impl->client = *std::move(c);
  }
  impl->opts = std::move(options);
  impl->clock = impl->opts.clock != nullptr ? impl->opts.clock : &Clock::System();
  impl->breaker = std::make_unique<CircuitBreaker>(impl->opts.breaker);
  impl->script = redis::Script::Create(std::string(store::kConcurrencyScript));
  return std::unique_ptr<RedisConcurrencyStore>(new RedisConcurrencyStore(std::move(impl)));
}

RedisConcurrencyStore::RedisConcurrencyStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

RedisConcurrencyStore::~RedisConcurrencyStore() {
  if (impl_->cluster) {
    impl_->cluster->Close();
  } else {
    impl_->client->Close();
  }
  // Closing fails the calls in flight on the I/O thread; their callbacks use
  // this store: wait for them (bounded) before the members go away.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (impl_->calls_out.load() > 0 && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

std::string RedisConcurrencyStore::KeyFor(std::string_view key, std::string_view name) const {
  return impl_->Key(key, name);
}

CircuitBreaker::State RedisConcurrencyStore::breaker_state() const {
  CircuitBreaker::State worst = impl_->breaker->state();
  auto rank = [](CircuitBreaker::State s) {
    return s == CircuitBreaker::State::kOpen ? 2 : s == CircuitBreaker::State::kHalfOpen ? 1 : 0;
  };
  std::lock_guard lock(impl_->breakers_mu);
  for (const auto& b : impl_->node_breakers) {
    if (b && rank(b->state()) > rank(worst)) worst = b->state();
  }
  return worst;
}

void RedisConcurrencyStore::Acquire(const AcquireRequest& request, AcquireCallback done) {
  if (Status s = ValidateAcquire(request, impl_->opts.max_key_length); !s.ok()) return done(s);
  std::string key = impl_->Key(request.key, request.name);
  const std::string now = impl_->opts.time_source == TimeSource::kLocal
                              ? std::to_string(impl_->clock->NowMicros())
                              : std::string();
  std::string lease_id = NewLeaseId();
  const int64_t max = request.max_in_flight;
  auto call = [this, key, now, max, ttl = request.lease_ttl.count(), lease_id](redis::Callback cb) {
    const std::string max_s = std::to_string(max), ttl_s = std::to_string(ttl);
    const std::string_view keys[] = {key};
    const std::string_view args[] = {now, max_s, ttl_s, lease_id};
    if (impl_->cluster) {
      impl_->cluster->EvalScript(impl_->script, keys, args, std::move(cb), impl_->opts.deadline);
    } else {
      impl_->client->EvalScript(impl_->script, keys, args, std::move(cb), impl_->opts.deadline);
    }
  };
  impl_->Guarded(key, call,
                 [done = std::move(done), lease_id = std::move(lease_id),
                  max](StatusOr<redis::Reply> r) mutable {
                   if (!r.ok()) return done(r.status());
                   if (r->type == redis::Reply::Type::kError) {
                     return done(Internal("redis concurrency script error: " + r->str));
                   }
                   const auto& e = r->elements;
                   if (r->type != redis::Reply::Type::kArray || e.size() != 3 ||
                       std::any_of(e.begin(), e.end(), [](const redis::Reply& x) {
                         return x.type != redis::Reply::Type::kInteger;
                       })) {
                     return done(
                         Internal("unexpected reply from the redis concurrency script (expected 3 "
                                  "integers)"));
                   }
                   AcquireResult out;
                   out.acquired = e[0].integer == 1;
                   out.in_flight = e[1].integer;
                   out.max_in_flight = max;
                   out.retry_after = std::chrono::microseconds(std::max<int64_t>(0, e[2].integer));
                   if (out.acquired) out.lease_id = std::move(lease_id);
                   done(std::move(out));
                 });
}

void RedisConcurrencyStore::Release(std::string_view key, std::string_view name,
                                    std::string_view lease_id, ReleaseCallback done) {
  if (Status s = ValidateLeaseId(lease_id); !s.ok()) return done(s);
  if (Status s = ValidateKey(key, impl_->opts.max_key_length); !s.ok()) return done(s);
  if (Status s = ValidateLimitName(name); !s.ok()) return done(s);
  std::string k = impl_->Key(key, name);
  auto call = [this, k, id = std::string(lease_id)](redis::Callback cb) {
    // ZREM reports whether the member was there; an expired lease that no
    // acquire has swept yet still counts as released (it was in the set).
    std::vector<std::string> args = {"ZREM", k, id};
    if (impl_->cluster) {
      impl_->cluster->Execute(args, std::move(cb));
    } else {
      impl_->client->Execute(args, std::move(cb));
    }
  };
  impl_->Guarded(k, call, [done = std::move(done)](StatusOr<redis::Reply> r) {
    if (!r.ok()) return done(r.status());
    if (r->type == redis::Reply::Type::kError) return done(Internal("redis: " + r->str));
    done(r->type == redis::Reply::Type::kInteger && r->integer == 1);
  });
}

}  // namespace ratelimit
