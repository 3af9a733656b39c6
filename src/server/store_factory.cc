#include "server/store_factory.h"

#include "ratelimit/memory_store.h"
#include "ratelimit/redis_store.h"
#include "server/admin_denials.h"
#include "server/json_log.h"
#include "server/metrics.h"

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

// What the Redis endpoint reports (redis+sentinel://: a master adopted, a
// discovery that failed, ROLE not permitted) is one log line each; the
// store passes a repeated failure on once per 10 s (RedisConnectionOptions).
void LogRedisEvents(RedisConnectionOptions& o, std::string_view which) {
  o.on_redis_event = [which](bool warning, std::string_view message) {
    Log(warning ? Level::kWarn : Level::kInfo, which, {{"event", message}});
  };
}

// The fields both Redis-backed stores take from `store:` alike (one place,
// so neither store misses a setting the other honours).
template <typename Options>
void FillRedisOptions(const policy::StoreConfig& config, Options& o) {
  o.url = config.url;
  o.deadline = config.deadline;
  o.key_prefix = config.key_prefix;
  o.time_source = config.time_source;
  o.max_key_length = StoreKeyLength(config);
  o.max_pending = config.max_pending;
  o.breaker.failure_threshold = config.breaker.failures;
  o.breaker.open_for = config.breaker.open_for;
  o.breaker.max_open_for = config.breaker.max_open_for;
  o.reconnect_max_backoff = config.reconnect_max_backoff;
}

FailureObserver Reporter(std::string_view message, std::string_view suppressed_message,
                         bool with_mode) {
  auto sampler = std::make_shared<LogSampler>(10, std::string(suppressed_message));
  return [sampler, message, with_mode](const Status& failure, FailureMode mode) {
    Metrics::Global().Degraded(CauseOf(failure)).Inc();
    if (!sampler->AdmitAndReport()) return;
    if (with_mode) {
      Log(Level::kWarn, message,
          {{"error", failure.ToString()}, {"failure_mode", FailureModeName(mode)}});
    } else {
      Log(Level::kWarn, message, {{"error", failure.ToString()}});
    }
  };
}

}  // namespace

size_t StoreKeyLength(const policy::StoreConfig& config) {
  return config.max_key_length + kDecisionApiPrefix.size();
}

FailureObserver RateLimitFailureReporter() {
  return Reporter("store error: failure mode decides", "store errors suppressed", true);
}

FailureObserver ConcurrencyFailureReporter() {
  return Reporter("concurrency store error: failure mode decides",
                  "concurrency store errors suppressed", false);
}

StatusOr<std::unique_ptr<ConcurrencyStore>> MakeConcurrencyStore(
    const policy::StoreConfig& config, boost::asio::io_context* io_context) {
  if (config.type == policy::StoreConfig::Type::kMemory) {
    return std::unique_ptr<ConcurrencyStore>(
        std::make_unique<MemoryConcurrencyStore>(MemoryConcurrencyStore::Options{
            .max_keys = config.max_keys, .max_key_length = StoreKeyLength(config)}));
  }
  RedisConcurrencyStore::Options o;
  FillRedisOptions(config, o);
  o.connections = 1;  // acquire/release are rare next to checks
  o.io_context = io_context;
  LogBreakerChanges(o.breaker, "redis circuit breaker (concurrency)");
  LogRedisEvents(o, "redis endpoint (concurrency)");
  StatusOr<std::unique_ptr<RedisConcurrencyStore>> s = RedisConcurrencyStore::Create(std::move(o));
  if (!s.ok()) return s.status();
  return std::unique_ptr<ConcurrencyStore>(std::move(*s));
}

StatusOr<std::unique_ptr<OverrideStore>> MakeOverrideStore(const policy::StoreConfig& config,
                                                           boost::asio::io_context* io_context) {
  if (config.type == policy::StoreConfig::Type::kMemory) return MakeMemoryOverrideStore();
  RedisConnectionOptions o;
  FillRedisOptions(config, o);
  o.io_context = io_context;
  LogBreakerChanges(o.breaker, "redis circuit breaker (overrides)");
  LogRedisEvents(o, "redis endpoint (overrides)");
  return MakeRedisOverrideStore(std::move(o));
}

namespace {

StatusOr<std::shared_ptr<Store>> MakePlainStore(const policy::StoreConfig& config,
                                                boost::asio::io_context* io_context) {
  switch (config.type) {
    case policy::StoreConfig::Type::kMemory: {
      MemoryStore::Options o;
      o.max_keys = config.max_keys;
      o.max_key_length = StoreKeyLength(config);
      return std::shared_ptr<Store>(std::make_shared<MemoryStore>(o));
    }
    case policy::StoreConfig::Type::kRedis: {
      // RedisStore has the circuit breaker and the over-limit cache itself;
      // the failure modes are the ResilientStore's.
      RedisStore::Options o;
      FillRedisOptions(config, o);
      o.connections = config.connections;
      o.io_context = io_context;
      LogBreakerChanges(o.breaker, "redis circuit breaker");
      LogRedisEvents(o, "redis endpoint");
      StatusOr<std::unique_ptr<RedisStore>> s = RedisStore::Create(std::move(o));
      if (!s.ok()) return s.status();
      return std::shared_ptr<Store>(std::move(*s));
    }
  }
  return InvalidArgument("unknown store type");
}

}  // namespace

StatusOr<std::shared_ptr<Store>> MakeStore(const policy::StoreConfig& config,
                                           boost::asio::io_context* io_context) {
  StatusOr<std::shared_ptr<Store>> plain = MakePlainStore(config, io_context);
  if (!plain.ok()) return plain.status();
  return std::shared_ptr<Store>(std::make_shared<ResilientStore>(
      *std::move(plain), ResilientStore::Options{.local_max_keys = config.local_max_keys,
                                                 .local_max_key_length = StoreKeyLength(config),
                                                 .on_failure = RateLimitFailureReporter()}));
}

}  // namespace ratelimit::server
