#include "server/store_factory.h"

#include "ratelimit/memory_store.h"
#include "ratelimit/redis_store.h"

namespace ratelimit::server {

StatusOr<std::shared_ptr<Store>> MakeStore(const policy::StoreConfig& config) {
  switch (config.type) {
    case policy::StoreConfig::Type::kMemory: {
      MemoryStore::Options o;
      o.max_keys = config.max_keys;
      o.max_key_length = config.max_key_length;
      return std::shared_ptr<Store>(std::make_shared<MemoryStore>(o));
    }
    case policy::StoreConfig::Type::kRedis: {
      // HOOK (lead): a ResilientStore (circuit breaker, over-limit cache)
      // would wrap this one here. The failure modes are applied by the server.
      RedisStore::Options o;
      o.url = config.url;
      o.deadline = config.deadline;
      o.key_prefix = config.key_prefix;
      o.time_source = config.time_source == policy::StoreConfig::TimeSource::kRedis
                          ? RedisStore::TimeSource::kRedis
                          : RedisStore::TimeSource::kLocal;
      o.max_key_length = config.max_key_length;
      StatusOr<std::unique_ptr<RedisStore>> s = RedisStore::Create(std::move(o));
      if (!s.ok()) return s.status();
      return std::shared_ptr<Store>(std::move(*s));
    }
  }
  return InvalidArgument("unknown store type");
}

}  // namespace ratelimit::server
