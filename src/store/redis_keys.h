// The Redis keys of both Redis stores: `<prefix>{<client>}<state name>` for a
// rate limit's state, `<prefix>{<client>}~c:<name>` for a concurrency limit's
// leases (concurrency). The client part (EncodeClientKey, include/ratelimit/redis_store.h)
// is escaped or hashed, and its braces make it the hash tag: all of a
// client's keys share one Redis Cluster slot, so one script call can decide
// all its limits.
//
// A state's name (StateName) is the limit's name and, for a fixed or sliding
// window, its windows (':' is no character of a limit name): the state of
// limits that share it (SharesState, include/ratelimit/limit.h) and of no
// other, as the memory store's fingerprint (Limit::identity_hash). A window
// limit whose window changes (a reload, an override) finds another key and
// starts from fresh counts, where the old key's counts would be misread
// (check.lua keeps a window's index, which means another window under
// another length).
//
//   keys.State("ip:127.0.0.1", burst);          // "rl:{ip:127.0.0.1}burst"
//   keys.State("ip:127.0.0.1", hourly);         // "rl:{ip:127.0.0.1}hourly:1h"
//   keys.Concurrency("user:ada", "upload");     // "rl:{user:ada}~c:upload"
//   keys.Window("k:acme", monthly, 1772319600000000);
//                  // "rl:{k:acme}monthly:1mo:Europe/Berlin@1772319600"
//
// A calendar quota keeps one key per window, named by the window's start in
// Unix seconds ('@' is no character of a limit name or time zone): a new
// window is a new key, and the old one expires at its boundary.
//   keys.Block("ip:127.0.0.1", login);          // "rl:{ip:127.0.0.1}login:15m!b"
//
// Thread-safety: immutable after construction.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "ratelimit/limit.h"

namespace ratelimit::store {

class RedisKeys {
 public:
  explicit RedisKeys(std::string prefix) : prefix_(std::move(prefix)) {}

  // "burst" (a bucket, a sliding log); "hourly:1h" (a fixed or sliding
  // window: its length, FormatDuration); "monthly:1mo:Europe/Berlin" (a
  // calendar quota: its unit and time zone).
  static std::string StateName(const Limit& limit);

  // REQUIRES: not a calendar quota (Window).
  std::string State(std::string_view client_key, const Limit& limit) const {
    return Make(client_key, "", StateName(limit));
  }
  // A calendar quota's window starting at `start_us` (us since the epoch).
  std::string Window(std::string_view client_key, const Limit& limit, int64_t start_us) const {
    return Make(client_key, "", StateName(limit) + "@" + std::to_string(start_us / 1'000'000));
  }
  // A block period's key (Limit::block_for): the state's name and "!b", a
  // character no state name has (a calendar quota's: across its windows).
  // check.lua gets it in KEYS, after the limit's own (lua::KeysPerLimit).
  std::string Block(std::string_view client_key, const Limit& limit) const {
    return Make(client_key, "", StateName(limit) + "!b");
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
