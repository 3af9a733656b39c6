#include "server/store_factory.h"

#include "ratelimit/memory_store.h"
#include "ratelimit/redis_store.h"
#include "server/json_log.h"

namespace ratelimit::server {

namespace {

void LogBreakerChanges(CircuitBreaker::Options& o, std::string_view which) {
  // Every state change is one log line (a cluster has a breaker per node;
  // each logs its own changes). Runs under the breaker's lock: one write(2).
  o.on_change = [which](CircuitBreaker::State from, CircuitBreaker::State to) {
    Log(to == CircuitBreaker::State::kOpen ? Level::kWarn : Level::kInfo, which,
        {{"from", BreakerStateName(from)}, {"to", BreakerStateName(to)}});
  };
}

// The fields both Redis-backed stores take from `store:` alike (one place,
// so neither store misses a setting the other honours).
template <typename Options>
void FillRedisOptions(const policy::StoreConfig& config, Options& o) {
  using TimeSource = decltype(o.time_source);
  o.url = config.url;
  o.deadline = config.deadline;
  o.key_prefix = config.key_prefix;
  o.time_source = config.time_source == policy::StoreConfig::TimeSource::kRedis
                      ? TimeSource::kRedis
                      : TimeSource::kLocal;
  o.max_key_length = config.max_key_length;
  o.max_pending = config.max_pending;
  o.breaker.failure_threshold = config.breaker.failures;
  o.breaker.open_for = config.breaker.open_for;
  o.breaker.max_open_for = config.breaker.max_open_for;
  o.reconnect_max_backoff = config.reconnect_max_backoff;
}

}  // namespace

StatusOr<std::unique_ptr<ConcurrencyStore>> MakeConcurrencyStore(
    const policy::StoreConfig& config) {
  if (config.type == policy::StoreConfig::Type::kMemory) {
    return std::unique_ptr<ConcurrencyStore>(
        std::make_unique<MemoryConcurrencyStore>(MemoryConcurrencyStore::Options{
            .max_keys = config.max_keys, .max_key_length = config.max_key_length}));
  }
  RedisConcurrencyStore::Options o;
  FillRedisOptions(config, o);
  o.connections = 1;  // acquire/release are rare next to checks
  LogBreakerChanges(o.breaker, "redis circuit breaker (concurrency)");
  StatusOr<std::unique_ptr<RedisConcurrencyStore>> s = RedisConcurrencyStore::Create(std::move(o));
  if (!s.ok()) return s.status();
  return std::unique_ptr<ConcurrencyStore>(std::move(*s));
}

StatusOr<std::shared_ptr<Store>> MakeStore(const policy::StoreConfig& config,
                                           boost::asio::io_context* io_context) {
  switch (config.type) {
    case policy::StoreConfig::Type::kMemory: {
      MemoryStore::Options o;
      o.max_keys = config.max_keys;
      o.max_key_length = config.max_key_length;
      return std::shared_ptr<Store>(std::make_shared<MemoryStore>(o));
    }
    case policy::StoreConfig::Type::kRedis: {
      // RedisStore has the circuit breaker and the over-limit cache itself;
      // the failure modes are applied by the server.
      RedisStore::Options o;
      FillRedisOptions(config, o);
      o.connections = config.connections;
      o.io_context = io_context;
      LogBreakerChanges(o.breaker, "redis circuit breaker");
      StatusOr<std::unique_ptr<RedisStore>> s = RedisStore::Create(std::move(o));
      if (!s.ok()) return s.status();
      return std::shared_ptr<Store>(std::move(*s));
    }
  }
  return InvalidArgument("unknown store type");
}

}  // namespace ratelimit::server
