// RedisConcurrencyStore: concurrency leases in a Redis sorted set per key.
// The script is src/store/lua/concurrency.lua; calls go through the
// RedisBackend RedisStore uses too (src/store/redis_backend.h): one Redis,
// a Cluster, the breakers per node and the drain are its business.
#include <algorithm>

#include "ratelimit/concurrency.h"
#include "ratelimit/redis_store.h"
#include "store/lua/concurrency_script.h"
#include "store/redis_backend.h"
#include "store/redis_keys.h"

namespace ratelimit {

struct RedisConcurrencyStore::Impl {
  Options opts;
  const Clock* clock = nullptr;
  store::RedisKeys keys;
  std::unique_ptr<store::RedisBackend> backend;
};

StatusOr<std::unique_ptr<RedisConcurrencyStore>> RedisConcurrencyStore::Create(Options options) {
  StatusOr<std::unique_ptr<store::RedisBackend>> backend =
      store::RedisBackend::Create(options, store::kConcurrencyScript);
  if (!backend.ok()) return backend.status();
  const Clock* clock = options.clock != nullptr ? options.clock : &Clock::System();
  store::RedisKeys keys(options.key_prefix);
  return std::unique_ptr<RedisConcurrencyStore>(new RedisConcurrencyStore(std::make_unique<Impl>(
      Impl{std::move(options), clock, std::move(keys), *std::move(backend)})));
}

RedisConcurrencyStore::RedisConcurrencyStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

RedisConcurrencyStore::~RedisConcurrencyStore() { impl_->backend->CloseAndWait(nullptr); }

std::string RedisConcurrencyStore::KeyFor(std::string_view key, std::string_view name) const {
  return impl_->keys.Concurrency(key, name);
}

CircuitBreaker::State RedisConcurrencyStore::breaker_state() const {
  return impl_->backend->breaker_state();
}

void RedisConcurrencyStore::Acquire(const AcquireRequest& request, AcquireCallback done) {
  if (Status s = ValidateAcquire(request, impl_->opts.max_key_length); !s.ok()) return done(s);
  std::string key = impl_->keys.Concurrency(request.key, request.name);
  const std::string now = impl_->opts.time_source == TimeSource::kLocal
                              ? std::to_string(impl_->clock->NowMicros())
                              : std::string();
  std::string lease_id = NewLeaseId();
  const int64_t max = request.max_in_flight;
  const std::string max_s = std::to_string(max), ttl_s = std::to_string(request.lease_ttl.count());
  const std::string_view keys[] = {key};
  const std::string_view args[] = {now, max_s, ttl_s, lease_id};
  // The lease id is ours: when no answer comes (a timeout, a lost
  // connection), the acquire fails, but Redis may run the script yet and
  // hold the lease for all of lease_ttl. Its ZREM goes out behind the script
  // on its connection, so that it takes back whatever the script took.
  const std::string_view undo[] = {"ZREM", key, lease_id};
  impl_->backend->GuardedEval(
      keys, args,
      [done = std::move(done), lease_id,  // a copy: `args` views the original
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
      },
      undo);
}

namespace {

// The script's release or renew mode (`mode`) on one lease: `done` gets
// whether it was held. The time is Redis's, or ours with TimeSource::kLocal,
// as for an acquire.
void LeaseCall(RedisConcurrencyStore::Impl& impl, std::string_view key, std::string_view name,
               std::string_view lease_id, std::string_view mode, std::string_view ttl,
               ReleaseCallback done) {
  if (Status s = ValidateLeaseId(lease_id); !s.ok()) return done(s);
  const std::string k = impl.keys.Concurrency(key, name);
  const std::string now = impl.opts.time_source == RedisConcurrencyStore::TimeSource::kLocal
                              ? std::to_string(impl.clock->NowMicros())
                              : std::string();
  const std::string_view keys[] = {k};
  const std::string_view args[] = {now, mode, ttl, lease_id};
  impl.backend->GuardedEval(keys, args, [done = std::move(done)](StatusOr<redis::Reply> r) {
    if (!r.ok()) return done(r.status());
    if (r->type == redis::Reply::Type::kError) {
      return done(Internal("redis concurrency script error: " + r->str));
    }
    done(r->type == redis::Reply::Type::kInteger && r->integer == 1);
  });
}

}  // namespace

void RedisConcurrencyStore::Release(std::string_view key, std::string_view name,
                                    std::string_view lease_id, ReleaseCallback done) {
  if (Status s = ValidateKey(key, impl_->opts.max_key_length); !s.ok()) return done(s);
  if (Status s = ValidateLimitName(name); !s.ok()) return done(s);
  // The script removes the lease and says whether it was still held: an
  // expired lease no acquire has swept yet is in the set but not held.
  LeaseCall(*impl_, key, name, lease_id, "release", "", std::move(done));
}

void RedisConcurrencyStore::Renew(std::string_view key, std::string_view name,
                                  std::string_view lease_id, std::chrono::microseconds ttl,
                                  RenewCallback done) {
  const AcquireRequest as_acquire{.key = key, .name = name, .lease_ttl = ttl};
  if (Status s = ValidateAcquire(as_acquire, impl_->opts.max_key_length); !s.ok()) return done(s);
  LeaseCall(*impl_, key, name, lease_id, "renew", std::to_string(ttl.count()), std::move(done));
}

}  // namespace ratelimit
