// OverrideStore: where per-client overrides (the admin API's
// PUT /v1/overrides/<client>, docs/admin.md) are kept, and how an instance
// hears that another one changed them. The records are opaque text here (the
// server keeps JSON in them); what they mean is the server's business
// (src/server/overrides.h), so the per-request lookup never asks which kind
// of store holds them.
//
//   std::unique_ptr<OverrideStore> s = MakeMemoryOverrideStore();      // this process only
//   auto r = MakeRedisOverrideStore({.url = "redis://127.0.0.1:6379"});  // every instance
//   (*r)->Watch([](int64_t version) { /* re-read: ReadAll */ });
//   (*r)->Put("k:acme", "{...}", [](StatusOr<int64_t> version) { ... });
//
// Redis: one hash `<prefix>{%overrides}` (client -> record; one hash tag, so
// one Cluster slot), a version counter `<prefix>{%overrides}v` and the
// channel `<prefix>overrides`. Every change is one script call that writes,
// increments the version and PUBLISHes it; Watch hears it through a
// redis::Subscriber (a new subscription, after a lost connection, reports -1:
// some may have been missed). The same channel carries "reset <client>"
// (AnnounceReset, heard by WatchResets). The `%` cannot occur unescaped in a client's
// encoded key, so no client's limit state can share these keys.
//
// Thread-safety: every method may be called from any thread; callbacks run
// on the store's thread (Redis) or inline (memory), never with a lock held.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ratelimit/redis_store.h"
#include "ratelimit/status.h"

namespace ratelimit {

struct OverrideRecord {
  std::string client;  // "k:acme-key", "d:<decision-API key>", ...
  std::string value;   // opaque to the store
};

// Every record, and the version of the set they were read at.
struct OverrideSet {
  int64_t version = 0;
  std::vector<OverrideRecord> records;
};

class OverrideStore {
 public:
  virtual ~OverrideStore() = default;

  // True when every instance on this store sees the same records (Redis);
  // false: they live in this process only and are gone at its exit.
  virtual bool shared() const = 0;

  // Sets `client`'s record; `done` gets the new version of the set.
  virtual void Put(std::string client, std::string value,
                   std::function<void(StatusOr<int64_t>)> done) = 0;
  // Removes `client`'s record; with `if_value`, only while it still is that
  // value (an expired record is removed so, never a newer one). `done` gets
  // whether one was removed.
  virtual void Remove(std::string client, std::optional<std::string> if_value,
                      std::function<void(StatusOr<bool>)> done) = 0;
  virtual void ReadAll(std::function<void(StatusOr<OverrideSet>)> done) = 0;
  // `changed(version)` after a change by any instance (the version it made),
  // and `changed(-1)` each time the notifications (re)start: what happened
  // meanwhile is unknown, read again. Set once, before the first change.
  virtual void Watch(std::function<void(int64_t version)> changed) = 0;
  // Tells every other instance that `client`'s limit state was reset (the
  // admin API's reset: their cached denials of it are stale). Redis: a
  // message "reset <client>" on the same channel; `done` once it is
  // published. Memory: nothing to tell (one process).
  virtual void AnnounceReset(std::string client, std::function<void(Status)> done) = 0;
  // `reset(client)` when an instance announced a reset, and `reset("")` each
  // time the notifications (re)start (one may have been missed): forget
  // what is cached of the state. Heard on Watch's subscription: set it
  // before Watch.
  virtual void WatchResets(std::function<void(std::string_view client)> reset) = 0;
  // Ends the notifications; later calls fail with kUnavailable. Idempotent.
  virtual void Close() = 0;
  // How the store may drop records by itself: Redis' maxmemory-policy
  // (CONFIG GET, asked of one node), or "" when it cannot be read (no
  // permission, the command renamed: not an error) or there is none (memory).
  virtual void EvictionPolicy(std::function<void(std::string)> done) { done(""); }
};

std::unique_ptr<OverrideStore> MakeMemoryOverrideStore();
// Its own connections (options.url, deadline, key_prefix; connections 1),
// through the same RedisBackend as the stores of limit state.
StatusOr<std::unique_ptr<OverrideStore>> MakeRedisOverrideStore(RedisConnectionOptions options);

}  // namespace ratelimit
