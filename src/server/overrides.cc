#include "server/overrides.h"

#include <algorithm>
#include <ctime>
#include <nlohmann/json.hpp>
#include <utility>

#include <future>

#include "core/limit_fields.h"
#include "server/decision_api.h"
#include "server/json_log.h"
#include "server/metrics.h"
#include "server/store_factory.h"

namespace ratelimit::server {
namespace {

using json = nlohmann::json;

std::string UtcText(int64_t unix_ms) {
  const auto secs = static_cast<std::time_t>(unix_ms / 1000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[32];
  const size_t n = std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return std::string(buf, n);
}

Counter& ChangesCounter(std::string_view op) {
  Metrics& m = Metrics::Global();
  return op == "put" ? m.overrides_put : op == "delete" ? m.overrides_delete : m.overrides_expire;
}

// The JSON log line and the count of one change.
void Record(std::string_view op, const std::string& client, const std::string& by,
            const std::string& reason, const std::string& what) {
  ChangesCounter(op).Inc();
  Log(Level::kInfo, "override changed",
      {{"op", op}, {"client", RedactKey(client)}, {"by", by}, {"reason", reason}, {"what", what}});
}

}  // namespace

const Limit* ClientOverride::Replacing(const Limit& limit) const {
  for (const Limit& l : limits) {
    if (l.name() == limit.name() && l.algorithm() == limit.algorithm()) return &l;
  }
  return nullptr;
}

json LimitFields(const Limit& limit) {
  json j = json::object();
  for (core::LimitField& f : core::LimitFieldsOf(limit)) {
    json& v = j[std::string(f.key)];
    switch (f.kind) {
      case core::LimitField::Kind::kInteger: v = f.integer; break;
      case core::LimitField::Kind::kNumber: v = f.number; break;
      case core::LimitField::Kind::kText: v = std::move(f.text); break;
    }
  }
  return j;
}

namespace {

// The "limits" member as given: name -> the given fields.
json GivenJson(const std::vector<GivenLimit>& given) {
  json ls = json::object();
  for (const GivenLimit& g : given) ls[g.name] = json::parse(g.fields, nullptr, false);
  return ls;
}

}  // namespace

json ClientOverride::ToJson(int64_t now_ms) const {
  json ls = json::object();
  for (const Limit& l : limits) ls[l.name()] = LimitFields(l);
  json j = {{"client", RedactKey(client)},
            {"given", GivenJson(given)},
            {"limits", ls},
            {"in_effect", InEffectAt(now_ms)},
            {"not_applied", not_applied},
            {"reason", reason},
            {"by", by}};
  if (plan) j["plan"] = *plan;
  if (expires_unix_ms != 0) {
    j["expires_at"] = UtcText(expires_unix_ms);
    j["expires_at_ms"] = expires_unix_ms;
  }
  if (set_unix_ms != 0) j["set_at"] = UtcText(set_unix_ms);
  return j;
}

std::string ToRecord(const ClientOverride& o) {
  json j = {{"limits", GivenJson(o.given)},
            {"reason", o.reason},
            {"by", o.by},
            {"set_at_ms", o.set_unix_ms}};
  if (o.plan) j["plan"] = *o.plan;
  if (o.expires_unix_ms != 0) j["expires_at_ms"] = o.expires_unix_ms;
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

StatusOr<ClientOverride> FromRecord(std::string_view client, std::string_view record) {
  const json j = json::parse(record, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return InvalidArgument("the record is not a JSON object");
  ClientOverride o;
  o.client = std::string(client);
  o.record = std::string(record);
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    const json& v = it.value();
    if (k == "plan" && v.is_string()) {
      o.plan = v.get<std::string>();
    } else if (k == "limits" && v.is_object()) {
      // Only the fields given (an earlier version's record: every field);
      // whether they make a limit is the config's to say (ResolveOverride).
      for (auto l = v.begin(); l != v.end(); ++l) {
        if (!l.value().is_object()) return InvalidArgument("limit '" + l.key() + "' is no object");
        o.given.push_back({l.key(), l.value().dump()});
      }
    } else if (k == "expires_at_ms" && v.is_number_integer()) {
      o.expires_unix_ms = v.get<int64_t>();
    } else if (k == "set_at_ms" && v.is_number_integer()) {
      o.set_unix_ms = v.get<int64_t>();
    } else if (k == "reason" && v.is_string()) {
      o.reason = v.get<std::string>();
    } else if (k == "by" && v.is_string()) {
      o.by = v.get<std::string>();
    } else {
      return InvalidArgument("unexpected field '" + k + "'");
    }
  }
  return o;
}

GivenLimit EveryField(const Limit& limit) { return {limit.name(), LimitFields(limit).dump()}; }

StatusOr<Limit> ResolveOverrideLimit(const policy::Policy& policy, std::string_view client,
                                     const GivenLimit& given) {
  const std::string& name = given.name;
  const std::string where = "limits." + name;
  const json fields = json::parse(given.fields, nullptr, false);
  if (!fields.is_object()) return InvalidArgument(where + " must be an object of fields");
  const Limit* configured = policy.NamedLimit(name);
  json spec = json::object();
  if (configured != nullptr) {
    spec = LimitFields(*configured);
    if (auto a = fields.find("algorithm"); a != fields.end() && *a != spec["algorithm"]) {
      return InvalidArgument(where + ": '" + name + "' is a " +
                             spec["algorithm"].get<std::string>() +
                             "; an override keeps the algorithm (the client's state would mean "
                             "something else)");
    }
  } else if (!client.starts_with(kDecisionApiPrefix)) {
    return InvalidArgument(where + ": this config has no limit '" + name + "'");
  }
  for (auto it = fields.begin(); it != fields.end(); ++it) {
    if (it.key() == "name") return InvalidArgument(where + ": the name is the key of 'limits'");
    spec[it.key()] = it.value();
  }
  spec["name"] = name;
  StatusOr<Limit> limit = ParseLimitObject(spec, where);
  if (!limit.ok()) return limit.status();
  // A route's cost must stay possible under the new count, and a metered
  // route's limit settleable (the config's rules: every settlement of the
  // client's would be refused).
  for (const policy::RouteClass& r : policy.config().routes) {
    for (const policy::RuleLimit& rl : r.limits) {
      if (rl.limit.name() != name) continue;
      if (Status s = limit->ValidateCost(r.cost); !s.ok()) {
        return InvalidArgument(where + ": route '" + r.name + "' costs " + std::to_string(r.cost) +
                               ": " + s.message());
      }
      if (!r.metered) continue;
      if (Status s = policy::CheckMeteredLimit(*limit); !s.ok()) {
        return InvalidArgument(where + ": cost of route '" + r.name + "': " + s.message());
      }
    }
  }
  return limit;
}

void ResolveOverride(ClientOverride& o, const policy::Policy& policy) {
  o.limits.clear();
  o.not_applied.clear();
  o.plan_applies = false;
  if (o.plan) {
    o.plan_applies = policy.config().plans.count(*o.plan) != 0;
    if (!o.plan_applies) {
      o.not_applied.push_back("field 'plan': this config has no plan '" + *o.plan + "'");
    }
  }
  for (const GivenLimit& g : o.given) {
    StatusOr<Limit> l = ResolveOverrideLimit(policy, o.client, g);
    if (l.ok()) {
      o.limits.push_back(*std::move(l));
    } else {
      o.not_applied.push_back(l.status().message());
    }
  }
}

OverrideTable::OverrideTable(int64_t version, std::vector<ClientOverride> overrides)
    : version_(version) {
  for (ClientOverride& o : overrides) {
    if (o.client.starts_with(kDecisionApiPrefix)) {
      std::string key = o.client.substr(kDecisionApiPrefix.size());
      by_decision_key_.emplace(std::move(key), std::move(o));
    } else {
      std::string key = o.client;
      by_client_.emplace(std::move(key), std::move(o));
    }
  }
}

const ClientOverride* OverrideTable::Find(std::string_view client, int64_t now_ms) const {
  if (client.starts_with(kDecisionApiPrefix)) {
    return FindDecisionKey(client.substr(kDecisionApiPrefix.size()), now_ms);
  }
  auto it = by_client_.find(client);
  return it == by_client_.end() || it->second.ExpiredAt(now_ms) ? nullptr : &it->second;
}

const ClientOverride* OverrideTable::FindDecisionKey(std::string_view key, int64_t now_ms) const {
  auto it = by_decision_key_.find(key);
  return it == by_decision_key_.end() || it->second.ExpiredAt(now_ms) ? nullptr : &it->second;
}

std::vector<const ClientOverride*> OverrideTable::Sorted() const {
  std::vector<const ClientOverride*> out;
  out.reserve(size());
  for (const auto& [k, o] : by_client_) out.push_back(&o);
  for (const auto& [k, o] : by_decision_key_) out.push_back(&o);
  std::sort(out.begin(), out.end(),
            [](const ClientOverride* a, const ClientOverride* b) { return a->client < b->client; });
  return out;
}

void ApplyOverride(const ClientOverride& o, const policy::Policy& policy,
                   policy::RequestPlan& plan) {
  if (o.plan && o.plan_applies && *o.plan != plan.identity.plan) policy.Replan(plan, *o.plan);
  if (o.limits.empty()) return;
  for (policy::CheckGroup& g : plan.groups) {
    // Only the client's own state: a route keyed by IP keeps its limits.
    if (g.key != plan.identity.key) continue;
    ApplyOverrideLimits(o, g.checks);
  }
}

void ApplyOverrideLimits(const ClientOverride& o, std::vector<LimitCheck>& checks) {
  for (LimitCheck& c : checks) {
    if (const Limit* l = o.Replacing(*c.limit)) c.limit = l;
  }
}

StatusOr<std::shared_ptr<const OverrideTable>> ReadStoredOverrides(
    const policy::Policy& policy, std::chrono::milliseconds patience) {
  const policy::StoreConfig& config = policy.config().store;
  if (config.type == policy::StoreConfig::Type::kMemory) {
    return std::make_shared<const OverrideTable>();
  }
  StatusOr<std::unique_ptr<OverrideStore>> store = MakeOverrideStore(config);
  if (!store.ok()) return store.status();
  auto answer = std::make_shared<std::promise<StatusOr<OverrideSet>>>();
  std::future<StatusOr<OverrideSet>> got = answer->get_future();
  (*store)->ReadAll([answer](StatusOr<OverrideSet> set) { answer->set_value(std::move(set)); });
  if (got.wait_for(patience) != std::future_status::ready) {
    return DeadlineExceeded("the override store did not answer within " +
                            std::to_string(patience.count()) + " ms");
  }
  StatusOr<OverrideSet> set = got.get();
  if (!set.ok()) return set.status();
  std::vector<ClientOverride> parsed;
  for (const OverrideRecord& r : set->records) {
    StatusOr<ClientOverride> o = FromRecord(r.client, r.value);
    if (!o.ok()) continue;
    ResolveOverride(*o, policy);
    parsed.push_back(*std::move(o));
  }
  return std::make_shared<const OverrideTable>(set->version, std::move(parsed));
}

Overrides::Overrides(std::unique_ptr<OverrideStore> store, const Clock& clock, Options options)
    : store_(std::move(store)),
      clock_(clock),
      options_(options),
      table_(std::make_shared<const OverrideTable>()) {}

Overrides::~Overrides() {
  Stop();
  // Its last callbacks (failing now) run while the members they use exist.
  store_.reset();
}

void Overrides::Start(boost::asio::any_io_executor executor) {
  timer_ = std::make_unique<boost::asio::steady_timer>(executor);
  if (on_reset_) store_->WatchResets(on_reset_);
  // Every change heard is read, whatever its version: the version restarts
  // at 1 when Redis lost its key (FLUSHALL, a restart without persistence,
  // an eviction), so a lower or equal one may be news. A change made here is
  // read twice (Put's read, then the message's): changes are rare.
  store_->Watch([this](int64_t /*version*/) { Refresh(); });
  // An evicted hash loses every override, and an evicted version makes the
  // next change's version one the instances may have seen: only a read
  // after it tells (docs/admin.md, "Where they live").
  store_->EvictionPolicy([](const std::string& policy) {
    if (!policy.starts_with("allkeys-")) return;
    Log(Level::kWarn, "overrides: Redis may evict the overrides (maxmemory-policy " + policy + ")",
        {{"maxmemory_policy", policy},
         {"hint",
          "set maxmemory-policy noeviction or a volatile-* one: the overrides have no TTL"}});
  });
  Refresh();
  Tick();
}

void Overrides::AnnounceReset(std::string client, std::function<void(Status)> done) {
  store_->AnnounceReset(std::move(client), std::move(done));
}

void Overrides::Stop() {
  {
    LockGuard lock(mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  if (timer_) timer_->cancel();
  store_->Close();
}

void Overrides::Tick() {
  timer_->expires_after(options_.expiry_check);
  timer_->async_wait([this](boost::system::error_code ec) {
    if (ec) return;
    bool refresh = false;
    {
      LockGuard lock(mu_);
      if (stopped_) return;
      refresh = NowMillis() - last_refresh_ms_ >= options_.refresh_interval.count();
    }
    RemoveExpired();
    if (refresh) Refresh();
    Tick();
  });
}

void Overrides::Refresh(std::function<void(Status)> done) {
  bool stopped = false;
  {
    LockGuard lock(mu_);
    stopped = stopped_;
  }
  if (stopped) {
    if (done) done(Unavailable("the overrides are stopped"));
    return;
  }
  // Reads are one at a time, so each installs a set no older than the last.
  std::vector<std::function<void(Status)>> served;
  {
    LockGuard lock(mu_);
    if (done) waiting_.push_back(std::move(done));
    if (reading_) {
      again_ = true;  // the read out may have started before the change: one more
      return;
    }
    reading_ = true;
    last_refresh_ms_ = NowMillis();
    served.swap(waiting_);
  }
  store_->ReadAll([this, served = std::move(served)](StatusOr<OverrideSet> set) mutable {
    Status status = set.status();
    if (set.ok()) {
      Install(*set);
    } else {
      Log(Level::kWarn, "overrides: cannot read the store", {{"error", status.message()}});
    }
    bool again = false;
    {
      LockGuard lock(mu_);
      reading_ = false;
      again = std::exchange(again_, false) || !waiting_.empty();
    }
    for (auto& d : served) d(status);
    if (again) Refresh();
  });
}

void Overrides::SetPolicy(std::shared_ptr<const policy::Policy> policy) {
  LockGuard lock(mu_);
  policy_ = std::move(policy);
  // The table keeps what was given beside what it resolved to: the same
  // overrides, resolved again (a table swapped in by a read holds the lock too).
  const std::shared_ptr<const OverrideTable> now = table_.load();
  std::vector<ClientOverride> again;
  again.reserve(now->size());
  for (const ClientOverride* o : now->Sorted()) again.push_back(*o);
  Publish(std::move(again), now->version());
}

void Overrides::Install(const OverrideSet& set) {
  std::vector<ClientOverride> parsed;
  parsed.reserve(set.records.size());
  for (const OverrideRecord& r : set.records) {
    StatusOr<ClientOverride> o = FromRecord(r.client, r.value);
    if (!o.ok()) {
      Log(Level::kWarn, "overrides: a stored override cannot be read: ignored",
          {{"client", RedactKey(r.client)}, {"error", o.status().message()}});
      continue;
    }
    parsed.push_back(*std::move(o));
  }
  LockGuard lock(mu_);
  Publish(std::move(parsed), set.version);
}

namespace {

// The gauges: the overrides not expired at `now_ms`, wholly applied or not.
struct Gauges {
  int64_t now_ms = 0;
  int64_t in_effect = 0;
  int64_t not_applied = 0;
  void Add(const ClientOverride& o) {
    if (!o.ExpiredAt(now_ms)) ++(o.not_applied.empty() ? in_effect : not_applied);
  }
  void Set() const {
    Metrics::Global().overrides_in_effect.Set(in_effect);
    Metrics::Global().overrides_not_applied.Set(not_applied);
  }
};

}  // namespace

void Overrides::Publish(std::vector<ClientOverride> overrides, int64_t version) {
  // Made under the lock: a table resolved over an older policy or read
  // never replaces a newer one. Reads and reloads are rare; requests only
  // load the table.
  std::unordered_map<std::string, std::string> not_applied;
  for (ClientOverride& o : overrides) {
    if (policy_ == nullptr) {
      o.not_applied = {"no config to resolve it over yet (Overrides::SetPolicy)"};
      continue;
    }
    ResolveOverride(o, *policy_);
    // Logged when what does not apply changes, not on every read.
    auto was = not_applied_.find(o.client);
    if (o.not_applied.empty()) {
      if (was != not_applied_.end()) {
        Log(Level::kInfo, "override applies again", {{"client", RedactKey(o.client)}});
      }
      continue;
    }
    const json reasons = o.not_applied;
    std::string text = reasons.dump(-1, ' ', false, json::error_handler_t::replace);
    if (was == not_applied_.end() || was->second != text) {
      Log(Level::kWarn, "override not applied",
          {{"client", RedactKey(o.client)}, {"not_applied", text}});
    }
    not_applied.emplace(o.client, std::move(text));
  }
  not_applied_ = std::move(not_applied);
  Gauges gauges{.now_ms = NowMillis()};
  for (const ClientOverride& o : overrides) gauges.Add(o);
  gauges.Set();
  auto table = std::make_shared<const OverrideTable>(version, std::move(overrides));
  count_.store(table->size(), std::memory_order_relaxed);
  table_.store(std::move(table));
}

void Overrides::Put(ClientOverride o, std::function<void(StatusOr<Stored>)> done) {
  o.set_unix_ms = NowMillis();
  o.record = ToRecord(o);
  std::string client = o.client;
  std::string record = o.record;
  store_->Put(std::move(client), std::move(record),
              [this, o = std::move(o), done = std::move(done)](StatusOr<int64_t> v) mutable {
                if (!v.ok()) return done(v.status());
                json what = o.ToJson(o.set_unix_ms);
                what.erase("client");
                what.erase("by");
                what.erase("reason");
                for (const char* resolved : {"limits", "in_effect", "not_applied"}) {
                  what.erase(resolved);
                }
                Record("put", o.client, o.by, o.reason,
                       what.dump(-1, ' ', false, json::error_handler_t::replace));
                // Stored whatever the read after it says: a failure to
                // read is not one to write (Refresh logged it).
                Refresh([version = *v, done = std::move(done)](const Status& s) {
                  done(Stored{.changed = true, .applied = s.ok(), .version = version});
                });
              });
}

void Overrides::Remove(std::string client, std::string by,
                       std::function<void(StatusOr<Stored>)> done) {
  std::string key = client;
  store_->Remove(std::move(key), std::nullopt,
                 [this, client = std::move(client), by = std::move(by),
                  done = std::move(done)](StatusOr<bool> removed) mutable {
                   if (!removed.ok()) return done(removed.status());
                   if (!*removed) return done(Stored{.changed = false});
                   Record("delete", client, by, "", "");
                   Refresh([done = std::move(done)](const Status& s) {
                     done(Stored{.changed = true, .applied = s.ok()});
                   });
                 });
}

void Overrides::RemoveExpired() {
  const std::shared_ptr<const OverrideTable> t = table();
  const int64_t now = NowMillis();
  Gauges gauges{.now_ms = now};
  for (const ClientOverride* o : t->Sorted()) {
    gauges.Add(*o);
    if (!o->ExpiredAt(now)) continue;
    // Only while it is still this record: a newer PUT is never removed. Of
    // the instances that try, one removes it, logs and counts.
    store_->Remove(o->client, o->record,
                   [this, client = o->client, what = o->record](StatusOr<bool> removed) {
                     if (!removed.ok() || !*removed) return;
                     Record("expire", client, "expiry", "", what);
                     Refresh();
                   });
  }
  gauges.Set();
}

}  // namespace ratelimit::server
