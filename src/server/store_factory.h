// MakeStore: the Store the config asks for.
//
//   StatusOr<std::shared_ptr<Store>> s = MakeStore(config.store, io_context_or_null);
//
// memory -> MemoryStore (max_keys, and keys up to StoreKeyLength).
// redis  -> RedisStore (url, deadline, key_prefix, time_source, keys up to
//           StoreKeyLength, connections, max_pending, breaker); breaker state
//           changes are logged ("redis circuit breaker", from, to).
// Either is wrapped in a ResilientStore (store/resilient_store.h): the
// failure modes, a local fallback of local_max_keys (keys up to
// StoreKeyLength too), and every store failure counted
// (ratelimit_degraded_decisions_total by cause) and logged, sampled.
//
// Thread-safety: pure function; the store it returns is thread-safe.
#pragma once

#include <memory>

#include "policy/config.h"
#include "ratelimit/concurrency.h"
#include "ratelimit/override_store.h"
#include "ratelimit/status.h"
#include "ratelimit/store.h"
#include "store/resilient_store.h"

namespace boost::asio {
class io_context;
}  // namespace boost::asio

namespace ratelimit::server {

// The longest store key of a config: store.max_key_length, the longest key a
// decision-API caller may give (and far above any identity the rules form),
// plus the "d:" that key's state lives under (kDecisionApiPrefix). Every
// store the daemon makes, and their local fallbacks, take keys this long.
size_t StoreKeyLength(const policy::StoreConfig& config);

// `io_context`: where a RedisStore runs its client (one thread of the
// caller's; see RedisStore::Options::io_context); nullptr: a thread of its own.
StatusOr<std::shared_ptr<Store>> MakeStore(const policy::StoreConfig& config,
                                           boost::asio::io_context* io_context = nullptr);

// What the daemon does with each store failure: counts it by cause
// (Metrics::Degraded) and logs it, at most 10 lines a second per reporter.
FailureObserver RateLimitFailureReporter();    // "store error: failure mode decides"
FailureObserver ConcurrencyFailureReporter();  // "concurrency store error: failure mode decides"

// The store of concurrency leases, from the same settings: memory ->
// MemoryConcurrencyStore; redis -> RedisConcurrencyStore (one connection of
// its own, its own breaker with the same settings, state changes logged).
// `io_context` as for MakeStore.
StatusOr<std::unique_ptr<ConcurrencyStore>> MakeConcurrencyStore(
    const policy::StoreConfig& config, boost::asio::io_context* io_context = nullptr);

// Where the per-client overrides live (server/overrides.h), from the same
// settings: memory -> this process only; redis -> the same Redis (one
// connection of its own, a deadline of at least 1 s). `io_context` as for
// MakeStore.
StatusOr<std::unique_ptr<OverrideStore>> MakeOverrideStore(
    const policy::StoreConfig& config, boost::asio::io_context* io_context = nullptr);

}  // namespace ratelimit::server
