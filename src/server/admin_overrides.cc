// The admin API's per-client overrides (docs/admin.md, "Overrides"):
//   GET    /v1/overrides?limit=100&offset=0
//   GET    /v1/overrides/{client}
//   PUT    /v1/overrides/{client}   {"limits": {"burst": {"capacity": 50}}, "plan": "pro",
//                                    "ttl": "1h" | "expires_at": "2026-12-02T03:00:00Z",
//                                    "reason": "incident 123"}
//   DELETE /v1/overrides/{client}
// The body is read like the decision API's (ParseBody: repeated members
// refused); each limit keeps the fields given, which must resolve over the
// configured limit's (ResolveOverrideLimit) to be taken.
#include <ctime>
#include <nlohmann/json.hpp>

#include "core/percent.h"
#include "server/admin.h"
#include "server/decision_api.h"
#include "server/json_log.h"
#include "server/overrides.h"
#include "server/problem.h"

namespace ratelimit::server {
namespace {

using json = nlohmann::json;

constexpr size_t kMaxReason = 500;
constexpr int64_t kMaxPage = 1000;

// "2026-12-02T03:00:00Z" (UTC, optional fraction of a second) -> unix ms.
StatusOr<int64_t> ParseUtc(const std::string& text) {
  std::tm tm{};
  int ms = 0;
  char rest[16] = {};
  const int n = std::sscanf(text.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d%15s", &tm.tm_year, &tm.tm_mon,
                            &tm.tm_mday, &tm.tm_hour, &tm.tm_min, &tm.tm_sec, rest);
  std::string_view tail(rest);
  if (n == 7 && tail.starts_with('.')) {
    size_t digits = 1;
    while (digits < tail.size() && digits <= 3 && tail[digits] >= '0' && tail[digits] <= '9') {
      ms = ms * 10 + (tail[digits] - '0');
      ++digits;
    }
    for (size_t i = digits; i < 4; ++i) ms *= 10;
    while (digits < tail.size() && tail[digits] >= '0' && tail[digits] <= '9') ++digits;
    tail.remove_prefix(digits);
  }
  if (n != 7 || tail != "Z" || tm.tm_mon < 1 || tm.tm_mon > 12 || tm.tm_mday < 1 ||
      tm.tm_mday > 31 || tm.tm_hour > 23 || tm.tm_min > 59 || tm.tm_sec > 60) {
    return InvalidArgument("field 'expires_at' must be a UTC time like \"2026-12-02T03:00:00Z\"");
  }
  // timegm would take "02-31" for 3 March: a day the month lacks is a typo.
  const bool leap = tm.tm_year % 4 == 0 && (tm.tm_year % 100 != 0 || tm.tm_year % 400 == 0);
  constexpr int kDays[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  const int days = kDays[tm.tm_mon - 1] + (tm.tm_mon == 2 && leap ? 1 : 0);
  if (tm.tm_mday > days) {
    return InvalidArgument("field 'expires_at': " + text.substr(0, 10) + " is no date (month " +
                           std::to_string(tm.tm_mon) + " has " + std::to_string(days) + " days)");
  }
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  return static_cast<int64_t>(timegm(&tm)) * 1000 + ms;
}

StatusOr<ClientOverride> ParseOverride(const json& body, const policy::Policy& policy,
                                       const std::string& client, int64_t now_ms) {
  if (!body.is_object()) return InvalidArgument("the body must be a JSON object");
  const bool decision_api = client.starts_with(kDecisionApiPrefix);
  ClientOverride o;
  o.client = client;
  bool have_ttl = false, have_expiry = false;
  for (auto it = body.begin(); it != body.end(); ++it) {
    const std::string& k = it.key();
    const json& v = it.value();
    if (k == "limits") {
      if (!v.is_object() || v.empty()) {
        return InvalidArgument("field 'limits' must be an object: limit name -> its fields");
      }
      if (v.size() > kMaxChecksPerRequest) {
        return InvalidArgument("field 'limits' names more than " +
                               std::to_string(kMaxChecksPerRequest) + " limits");
      }
      for (auto l = v.begin(); l != v.end(); ++l) o.given.push_back({l.key(), l.value().dump()});
    } else if (k == "plan") {
      if (!v.is_string()) return InvalidArgument("field 'plan' must be a string");
      if (decision_api) {
        return InvalidArgument("a decision-API key has no plan: give 'limits' instead");
      }
      o.plan = v.get<std::string>();
    } else if (k == "ttl") {
      if (!v.is_string()) return InvalidArgument("field 'ttl' must be a duration like \"1h\"");
      StatusOr<std::chrono::microseconds> d = ParseDuration(v.get<std::string>());
      if (!d.ok()) return InvalidArgument("field 'ttl': " + d.status().message());
      o.expires_unix_ms = now_ms + (d->count() + 999) / 1000;
      have_ttl = true;
    } else if (k == "expires_at") {
      if (!v.is_string()) {
        return InvalidArgument(
            "field 'expires_at' must be a UTC time like \"2026-12-02T03:00:00Z\"");
      }
      StatusOr<int64_t> at = ParseUtc(v.get<std::string>());
      if (!at.ok()) return at.status();
      if (*at <= now_ms) return InvalidArgument("field 'expires_at' is not in the future");
      o.expires_unix_ms = *at;
      have_expiry = true;
    } else if (k == "reason") {
      if (!v.is_string() || v.get_ref<const std::string&>().size() > kMaxReason) {
        return InvalidArgument("field 'reason' must be a string of at most " +
                               std::to_string(kMaxReason) + " bytes");
      }
      o.reason = v.get<std::string>();
    } else {
      return InvalidArgument("unknown field '" + k +
                             "' (expected limits, plan, ttl, expires_at, reason)");
    }
  }
  if (have_ttl && have_expiry) return InvalidArgument("give 'ttl' or 'expires_at', not both");
  if (o.given.empty() && !o.plan) return InvalidArgument("give 'limits', 'plan' or both");
  // Only what was given is kept, resolved over the config now and on every
  // reload: what could not apply now is refused, with the reason a reload
  // that made it impossible would give.
  ResolveOverride(o, policy);
  if (!o.not_applied.empty()) return InvalidArgument(o.not_applied.front());
  return o;
}

std::string_view Scope(bool shared) {
  return shared ? "every instance on this Redis" : "this instance only (memory store)";
}

// A change the store took whose read afterwards failed: it stands (every
// instance applies it once it reads the store), but not yet here.
void NotAppliedHere(json& answer) {
  answer["applied"] = false;
  answer["note"] =
      "stored, but not yet in effect on this instance: reading the override store after the "
      "change failed; it applies on the next read (within 5 s)";
}

Reply StoreFailed(const Status& s, std::string_view path) {
  Reply r = ProblemReply(503, "the override store could not answer: " + s.message(), path);
  r.Add("Retry-After", "1");
  return r;
}

}  // namespace

void AdminApi::OverridesPath(const Request& req, const policy::Policy& policy,
                             std::string_view path,
                             const std::map<std::string, std::string>& params,
                             std::string_view peer, std::function<void(Reply&&)> done) {
  Overrides* overrides = enforcer_.overrides();
  if (overrides == nullptr) {
    return done(ProblemReply(404, "this server keeps no overrides", path));
  }
  const bool get = req.method() == http::verb::get || req.method() == http::verb::head;
  const std::shared_ptr<const OverrideTable> table = overrides->table();
  const int64_t now_ms = overrides->NowMillis();
  if (path == "/v1/overrides") {
    if (!get) return done(AdminMethodNotAllowed(path, "GET"));
    int64_t limit = 100, offset = 0;
    for (const auto& [k, v] : params) {
      int64_t* slot = k == "limit" ? &limit : k == "offset" ? &offset : nullptr;
      if (slot == nullptr) {
        return done(ProblemReply(
            400, "unknown query parameter '" + k + "' (expected limit, offset)", path));
      }
      if (v.empty() || v.size() > 9 || v.find_first_not_of("0123456789") != std::string::npos) {
        return done(ProblemReply(400, k + " must be a whole number", path));
      }
      *slot = std::stoll(v);
    }
    if (limit < 1 || limit > kMaxPage) {
      return done(ProblemReply(400, "limit must be from 1 to " + std::to_string(kMaxPage), path));
    }
    const std::vector<const ClientOverride*> all = table->Sorted();
    json list = json::array();
    for (size_t i = static_cast<size_t>(offset);
         i < all.size() && list.size() < static_cast<size_t>(limit); ++i) {
      list.push_back(all[i]->ToJson(now_ms));
    }
    json answer = {{"overrides", list},
                   {"total", all.size()},
                   {"offset", offset},
                   {"version", table->version()},
                   {"shared", overrides->shared()},
                   {"scope", Scope(overrides->shared())}};
    const size_t next = static_cast<size_t>(offset) + list.size();
    answer["next_offset"] = next < all.size() ? json(next) : json(nullptr);
    return done(AdminJsonReply(200, answer));
  }

  StatusOr<std::string> named = [&]() -> StatusOr<std::string> {
    std::optional<std::string> s =
        core::PercentDecode(path.substr(std::string_view("/v1/overrides/").size()), false);
    if (!s || s->empty()) return InvalidArgument("the client is malformed");
    return *std::move(s);
  }();
  if (!named.ok()) return done(ProblemReply(400, named.status().message(), path));
  if (!params.empty()) {
    return done(ProblemReply(400, "no query parameters here: name the client in the path", path));
  }
  // The client as the admin API names it (a shortened API key resolved);
  // GET and DELETE also take one the config no longer knows.
  StatusOr<std::string> who = ClientKeyOf(policy, *named);
  std::string client;
  if (who.ok()) {
    client = *std::move(who);
  } else if (req.method() != http::verb::put && table->Find(*named, 0) != nullptr) {
    client = *named;
  } else {
    const unsigned status = who.status().code() == StatusCode::kNotFound ? 404 : 400;
    return done(ProblemReply(status, who.status().message(), path));
  }
  const std::string instance(path);
  // Who: the holder of the admin token (there is one token), and from where.
  const std::string by = std::string(token_.empty() ? "no token" : "admin token") + " from " +
                         std::string(peer.empty() ? "?" : peer);

  if (get) {
    const ClientOverride* o = table->Find(client, 0);
    if (o == nullptr) {
      return done(ProblemReply(404, "no override for client '" + RedactKey(client) + "'", path));
    }
    json j = o->ToJson(now_ms);
    j["shared"] = overrides->shared();
    return done(AdminJsonReply(200, j));
  }
  if (req.method() == http::verb::delete_) {
    return overrides->Remove(
        client, by, [client, instance, done = std::move(done)](StatusOr<Overrides::Stored> r) {
          if (!r.ok()) return done(StoreFailed(r.status(), instance));
          if (!r->changed) {
            return done(
                ProblemReply(404, "no override for client '" + RedactKey(client) + "'", instance));
          }
          json answer = {{"client", RedactKey(client)}, {"deleted", true}};
          if (!r->applied) NotAppliedHere(answer);
          done(AdminJsonReply(200, answer));
        });
  }
  if (req.method() != http::verb::put) {
    return done(AdminMethodNotAllowed(path, "GET, PUT, DELETE"));
  }
  StatusOr<json> body = ParseBody(req.body());
  if (!body.ok()) return done(ProblemReply(400, body.status().message(), path));
  StatusOr<ClientOverride> o = ParseOverride(*body, policy, client, now_ms);
  if (!o.ok()) return done(ProblemReply(400, o.status().message(), path));
  o->by = by;
  const bool shared = overrides->shared();
  overrides->Put(*std::move(o), [overrides, client, instance, shared,
                                 done = std::move(done)](StatusOr<Overrides::Stored> r) {
    if (!r.ok()) return done(StoreFailed(r.status(), instance));
    const std::shared_ptr<const OverrideTable> now = overrides->table();
    const ClientOverride* in_effect = r->applied ? now->Find(client, 0) : nullptr;
    json answer = in_effect != nullptr ? in_effect->ToJson(overrides->NowMillis())
                                       : json{{"client", RedactKey(client)}};
    if (!r->applied) NotAppliedHere(answer);
    answer["version"] = r->version;
    answer["shared"] = shared;
    answer["scope"] = Scope(shared);
    done(AdminJsonReply(200, answer));
  });
}

}  // namespace ratelimit::server
