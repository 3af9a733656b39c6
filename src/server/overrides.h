// Overrides: per-client limits changed at run time through the admin API
// (PUT /v1/overrides/<client>, docs/admin.md), applied by the Enforcer to
// every request of that client, on every instance that shares the store.
//
//   Overrides overrides(MakeMemoryOverrideStore(), Clock::System());
//   overrides.SetPolicy(policy);                   // and again after every reload
//   overrides.Start(executor);                     // first read, watch, periodic backstop
//   enforcer.SetOverrides(&overrides);
//   overrides.Put(std::move(o), done);             // o.client, o.by: who asked
//
// An override names a client ("k:acme-key", "u:ada", "ip:203.0.113.7" or a
// decision-API key "d:<key>") and either or both of: a plan to move the
// client to, and limits (by name) of which it changes some fields. Only the
// fields given are kept (the record); they are resolved over the configured
// limit of that name of the current config whenever the table is made: when
// the store is read and on every reload (SetPolicy), so a reload that changes
// a field the override did not give reaches the client. Precedence: the
// override > the client's plan (API key or default_plan) > the route's
// limits; a limit named in the override keeps the configured name and
// algorithm, hence its state key: a changed capacity applies to the state the
// client has (docs/admin.md, "What a changed limit does to the state"). A
// part that does not resolve under the current config (the limit or plan is
// gone, a given field the configured algorithm lacks, a cost a route charges
// that it could never allow) is not applied, and the override says why
// (not_applied); the parts that resolve apply. An override may expire
// (expires_unix_ms); from that time on it no longer applies, whatever the
// store still holds, and one instance removes it.
//
// The per-decision cost: with no override at all, one relaxed atomic load;
// else an atomic shared_ptr load and one hash lookup; only a client with an
// override pays for a copy of its plan's groups. The table is immutable and
// swapped whole (RCU style) when the store says something changed: a change
// made on this instance is in effect here when Put/Remove answer, and on the
// others as soon as they hear of it (Redis pub/sub: any change heard is
// read, whatever its version; a full re-read on every (re)subscription, and
// every refresh_interval as a backstop). The same channel carries the admin
// API's resets (AnnounceReset, OnReset).
//
// Every change is logged ("override changed": op, client, by, reason, what)
// and counted (ratelimit_overrides_changes_total{op}); the gauges
// ratelimit_overrides_in_effect and ratelimit_overrides_not_applied count
// this instance's table (wholly applied / not, or not wholly), and each
// change of what of an override does not apply is logged once ("override
// not applied" or "override applies again").
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <nlohmann/json_fwd.hpp>

#include "policy/policy.h"
#include "ratelimit/clock.h"
#include "ratelimit/limit.h"
#include "ratelimit/override_store.h"
#include "ratelimit/status.h"
#include "ratelimit/thread_annotations.h"

namespace ratelimit::server {

// One limit of an override as the admin gave it: the name of the limit and
// the fields given for it, the text of a JSON object ({"capacity":50}). A
// record of an earlier version gave every field: they are all "given".
struct GivenLimit {
  std::string name;
  std::string fields;
  bool operator==(const GivenLimit&) const = default;
};

// One client's override: what was given (the record), and what of it
// applies under one config (ResolveOverride; the table's are resolved).
struct ClientOverride {
  std::string client;               // "k:acme-key", "d:job-7", ...
  std::optional<std::string> plan;  // move the client to this plan
  std::vector<GivenLimit> given;    // change these fields of the limits of these names
  int64_t expires_unix_ms = 0;      // 0: never
  std::string reason;
  std::string by;  // who set it: "admin token" / "no token", and the peer
  int64_t set_unix_ms = 0;
  std::string record;  // the stored text (ToRecord)

  // Resolved: the given limits that resolve, each the configured limit with
  // the given fields; whether the plan applies; why each part that does not
  // apply does not ("limits.burst: ...", "field 'plan': ...").
  std::vector<Limit> limits;
  bool plan_applies = false;
  std::vector<std::string> not_applied;

  bool ExpiredAt(int64_t now_ms) const { return expires_unix_ms != 0 && now_ms >= expires_unix_ms; }
  // Whether all of it applies at `now_ms` (the admin API's "in_effect").
  bool InEffectAt(int64_t now_ms) const { return !ExpiredAt(now_ms) && not_applied.empty(); }
  // The override's limit of `limit`'s name and algorithm, or nullptr.
  const Limit* Replacing(const Limit& limit) const;
  // The JSON the admin API shows (API keys shortened): "given" as given,
  // "limits" as resolved (what applies), "in_effect" at `now_ms`, and
  // "not_applied".
  nlohmann::json ToJson(int64_t now_ms) const;
};

// The stored text of `o` (JSON: plan, the given fields of each limit,
// expiry, reason, by, set time), and back (unresolved). FromRecord refuses
// what it cannot read.
std::string ToRecord(const ClientOverride& o);
StatusOr<ClientOverride> FromRecord(std::string_view client, std::string_view record);

// The limit `given` makes of the configured limit of its name in `policy`:
// the given fields over the configured ones (a decision-API client's limit
// of a name the config lacks: the given fields alone, all of them). An
// error says why it cannot apply, as the admin API's PUT refuses it: no such
// limit, another algorithm, a field the algorithm lacks, a cost a route
// charges that it could never allow, a metered route's limit made a
// calendar quota.
StatusOr<Limit> ResolveOverrideLimit(const policy::Policy& policy, std::string_view client,
                                     const GivenLimit& given);
// Fills `o`'s resolved part (limits, plan_applies, not_applied) from what
// was given, over `policy`.
void ResolveOverride(ClientOverride& o, const policy::Policy& policy);
// Every field of `limit`, as a record of an earlier version gave them.
GivenLimit EveryField(const Limit& limit);

// The limit as the decision API's inline limits spell it, without the name:
// {"algorithm": "token_bucket", "capacity": 10, "refill_per_second": 5}, and
// every other field that defines it (core::LimitFieldsOf: a calendar quota's
// align and timezone, prefetch, block_for), so that ParseLimitObject gives
// the same Limit back.
nlohmann::json LimitFields(const Limit& limit);

// An immutable snapshot of every override.
class OverrideTable {
 public:
  OverrideTable() = default;
  OverrideTable(int64_t version, std::vector<ClientOverride> overrides);

  int64_t version() const { return version_; }
  size_t size() const { return by_client_.size() + by_decision_key_.size(); }
  // `client`'s override in effect at `now_ms`, or nullptr.
  const ClientOverride* Find(std::string_view client, int64_t now_ms) const;
  // A decision-API key's ("d:" + key) without building the string.
  const ClientOverride* FindDecisionKey(std::string_view key, int64_t now_ms) const;
  // Every override, by client (expired ones too), for listing.
  std::vector<const ClientOverride*> Sorted() const;

 private:
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  using Map = std::unordered_map<std::string, ClientOverride, Hash, std::equal_to<>>;
  int64_t version_ = 0;
  Map by_client_;        // identities ("k:", "u:", "ip:")
  Map by_decision_key_;  // decision-API keys, without the "d:"
};

// Applies `o` (resolved) to a resolved request: the plan first, when it
// applies (Policy::Replan; a plan `policy` does not have is ignored), then
// each resolved limit of the override
// replaces the parameters of the check of the same name and algorithm. The
// plan's checks then point into `o`: keep the table alive with the plan.
void ApplyOverride(const ClientOverride& o, const policy::Policy& policy,
                   policy::RequestPlan& plan);
// The same for a decision-API check's limits (replaced in place).
void ApplyOverrideLimits(const ClientOverride& o, std::vector<LimitCheck>& checks);

// For the command line (--explain): the overrides the store of `policy`'s
// config holds now, resolved over `policy` (Redis: read once, within
// `patience`); the memory store's live in a running daemon only: an empty
// table.
StatusOr<std::shared_ptr<const OverrideTable>> ReadStoredOverrides(
    const policy::Policy& policy,
    std::chrono::milliseconds patience = std::chrono::milliseconds(2000));

class Overrides {
 public:
  struct Options {
    std::chrono::milliseconds refresh_interval{5'000};  // full re-read: the backstop
    std::chrono::milliseconds expiry_check{250};        // how often expired ones are removed
  };
  Overrides(std::unique_ptr<OverrideStore> store, const Clock& clock, Options options);
  Overrides(std::unique_ptr<OverrideStore> store, const Clock& clock)
      : Overrides(std::move(store), clock, Options{}) {}
  ~Overrides();

  // True when every instance on the store sees these overrides (Redis).
  bool shared() const { return store_->shared(); }
  const Clock& clock() const { return clock_; }
  int64_t NowMillis() const { return clock_.NowMicros() / 1000; }

  // What to do when another instance announces that it reset a client's
  // limit state (AnnounceReset), and each time the store's notifications
  // (re)start, with "" (an announcement may have been missed): the daemon
  // forgets what its store of limit state cached (Store::ForgetCached). Set
  // before Start.
  void OnReset(std::function<void(std::string_view client)> forget) {
    on_reset_ = std::move(forget);
  }
  // Tells the other instances on the store that `client`'s limit state was
  // reset here (Redis: on the overrides' channel; memory: nobody to tell).
  void AnnounceReset(std::string client, std::function<void(Status)> done);

  // The config the overrides resolve over: set it before Start and after
  // every reload. The table in effect is made again (same version) over it.
  // Until it is set, no override applies (not_applied says so).
  void SetPolicy(std::shared_ptr<const policy::Policy> policy);

  // Watches the store, reads it and starts the periodic timer on `executor`.
  void Start(boost::asio::any_io_executor executor);
  // Stops the timer and the store's notifications. Idempotent.
  void Stop();

  // True while no override is known: the per-decision fast path.
  bool empty() const { return count_.load(std::memory_order_relaxed) == 0; }
  // The table in effect (never null).
  std::shared_ptr<const OverrideTable> table() const { return table_.load(); }

  // What Put and Remove answer once the store took the change (a failure:
  // the store did not, or may not have).
  struct Stored {
    bool changed = true;  // Remove: false when there was no override
    // False when the read after the change failed: it is in the store
    // (every instance applies it once it reads), not yet in effect here (the
    // next read, at most refresh_interval later, applies it).
    bool applied = true;
    int64_t version = 0;  // Put: the store's version after it
  };
  // Stores `o` (its record is made here), then re-reads: `done` runs once it
  // is in effect on this instance (or the read failed: Stored::applied),
  // with the new version. Logged and counted as op "put" ("by" is who asked).
  void Put(ClientOverride o, std::function<void(StatusOr<Stored>)> done);
  // Removes `client`'s override; `done` gets whether there was one. op "delete".
  void Remove(std::string client, std::string by, std::function<void(StatusOr<Stored>)> done);
  // Reads the store again now (a missed message, a test).
  void Refresh(std::function<void(Status)> done = nullptr);
  // Removes the overrides that expired (op "expire", counted by the instance
  // that removed each), then re-reads if any went. The timer calls it.
  void RemoveExpired();

 private:
  void Install(const OverrideSet& set);
  // Resolves `overrides` (as read) over policy_ and swaps them in as the
  // table of `version`.
  void Publish(std::vector<ClientOverride> overrides, int64_t version) RL_REQUIRES(mu_);
  void Tick();

  std::unique_ptr<OverrideStore> store_;            // reset first in the destructor
  std::function<void(std::string_view)> on_reset_;  // set before Start
  const Clock& clock_;
  const Options options_;
  std::atomic<std::shared_ptr<const OverrideTable>> table_;
  std::atomic<size_t> count_{0};
  Mutex mu_;
  bool reading_ RL_GUARDED_BY(mu_) = false;  // a ReadAll is out
  bool again_ RL_GUARDED_BY(mu_) = false;    // read again when it answers
  std::vector<std::function<void(Status)>> waiting_ RL_GUARDED_BY(mu_);
  int64_t last_refresh_ms_ RL_GUARDED_BY(mu_) = 0;
  bool stopped_ RL_GUARDED_BY(mu_) = false;
  std::shared_ptr<const policy::Policy> policy_ RL_GUARDED_BY(mu_);
  // client -> what of it did not apply, as last logged.
  std::unordered_map<std::string, std::string> not_applied_ RL_GUARDED_BY(mu_);
  std::unique_ptr<boost::asio::steady_timer> timer_;  // set by Start
};

}  // namespace ratelimit::server
