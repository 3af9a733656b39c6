// The Redis keys of both Redis stores: `<prefix>{<client>}<limit>` for a rate
// limit's state, `<prefix>{<client>}~c:<name>` for a concurrency limit's
// leases (concurrency). The client part (EncodeClientKey, include/ratelimit/redis_store.h)
// is escaped or hashed, and its braces make it the hash tag: all of a
// client's keys share one Redis Cluster slot, so one script call can decide
// all its limits.
//
//   RedisKeys keys("rl:");
//   keys.Rate("ip:127.0.0.1", "burst");         // "rl:{ip:127.0.0.1}burst"
//   keys.Concurrency("user:ada", "upload");     // "rl:{user:ada}~c:upload"
//   keys.Window("k:acme", "monthly", 1772319600000000);
//                                               // "rl:{k:acme}monthly@1772319600"
//
// A calendar quota keeps one key per window, named by the window's start in
// Unix seconds ('@' is no character of a limit name): a new window is a new
// key, and the old one expires at its boundary.
//   keys.Block("ip:127.0.0.1", "login");        // "rl:{ip:127.0.0.1}login!b"
//
// Thread-safety: immutable after construction.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace ratelimit::store {

class RedisKeys {
 public:
  explicit RedisKeys(std::string prefix) : prefix_(std::move(prefix)) {}

  std::string Rate(std::string_view client_key, std::string_view limit_name) const {
    return Make(client_key, "", limit_name);
  }
  // A calendar quota's window starting at `start_us` (us since the epoch).
  std::string Window(std::string_view client_key, std::string_view limit_name,
                     int64_t start_us) const {
    return Make(client_key, "",
                std::string(limit_name) + "@" + std::to_string(start_us / 1'000'000));
  }
  // A block period's key (Limit::block_for): the limit's key and "!b", a
  // character no limit name has (a calendar quota's: across its windows).
  // check.lua gets it in KEYS, after the limit's own (lua::KeysPerLimit).
  std::string Block(std::string_view client_key, std::string_view limit_name) const {
    return Rate(client_key, limit_name) + "!b";
  }
  // A settlement made once (SettleRequest::once), in the client's slot.
  std::string Settled(std::string_view client_key, std::string_view once) const {
    return Make(client_key, "~s:", once);
  }
  std::string Concurrency(std::string_view client_key, std::string_view name) const {
    return Make(client_key, "~c:", name);
  }

 private:
  std::string Make(std::string_view client_key, std::string_view kind, std::string_view name) const;

  std::string prefix_;
};

}  // namespace ratelimit::store
