#include "server/decision_api.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <charconv>
#include <limits>
#include <optional>
#include <string_view>
#include <tuple>
#include <unordered_set>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/utf8.h"
#include "server/headers.h"
#include "server/outcome_reply.h"
#include "server/problem.h"
#include "server/reservation.h"

namespace ratelimit::server {
namespace {

using core::ValidUtf8;
using nlohmann::json;
using namespace std::string_view_literals;

// A JSON integer in [1, max] (positive) or [0, max].
bool GetInt(const json& v, int64_t min, int64_t& out) {
  if (v.is_number_unsigned()) {
    const auto u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
    out = static_cast<int64_t>(u);
  } else if (v.is_number_integer()) {
    out = v.get<int64_t>();
  } else {
    return false;
  }
  return out >= min;
}

// `with_prefetch`: the field `prefetch` is read (an override's limit keeps a
// configured limit's token prefetch); the decision API's own inline limits
// have none.
StatusOr<Limit> ParseInlineLimit(const json& j, const std::string& where,
                                 bool with_prefetch = false) {
  const json* algorithm = nullptr;
  const json* name = nullptr;
  const json* align = nullptr;     // a calendar quota's: "calendar" (or "epoch")
  const json* timezone = nullptr;  // and its IANA time zone
  const json* block_for = nullptr;
  const json* prefetch = nullptr;
  // The count and the rate or window, under the names the algorithm uses.
  static constexpr std::string_view kFields[] = {
      "capacity", "refill_per_second", "depth", "rate_per_second", "limit", "window"};
  const json* fields[std::size(kFields)] = {};
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    if (k == "algorithm") {
      algorithm = &it.value();
    } else if (k == "align" || k == "timezone") {
      (k == "align" ? align : timezone) = &it.value();
    } else if (k == "name") {
      name = &it.value();
    } else if (k == "block_for") {
      block_for = &it.value();
    } else if (k == "prefetch" && with_prefetch) {
      prefetch = &it.value();
    } else {
      const auto* f = std::find(std::begin(kFields), std::end(kFields), k);
      if (f == std::end(kFields)) return InvalidArgument(where + ": unknown field '" + k + "'");
      fields[f - std::begin(kFields)] = &it.value();
    }
  }
  std::string limit_name = "default";
  if (name != nullptr) {
    if (!name->is_string()) return InvalidArgument(where + ": field 'name' must be a string");
    limit_name = name->get<std::string>();
    if (Status s = ValidateLimitName(limit_name); !s.ok())
      return InvalidArgument(where + ": " + s.message());
  }
  if (algorithm == nullptr) return InvalidArgument(where + ": field 'algorithm' is required");
  if (!algorithm->is_string())
    return InvalidArgument(where + ": field 'algorithm' must be a string");
  StatusOr<Algorithm> algo = ParseAlgorithm(algorithm->get_ref<const std::string&>());
  if (!algo.ok()) {
    return InvalidArgument(
        where + ": unknown algorithm '" + algorithm->get<std::string>() +
        "' (token_bucket, leaky_bucket, fixed_window, sliding_window or sliding_log)");
  }
  const std::string algo_name(AlgorithmName(*algo));
  const auto [count_field_name, second_field_name] = SpecFieldNames(*algo);
  const std::string count_name(count_field_name), second_name(second_field_name);
  const json* count_field = nullptr;
  const json* second = nullptr;
  for (size_t f = 0; f < std::size(kFields); ++f) {
    if (kFields[f] == count_name) {
      count_field = fields[f];
    } else if (kFields[f] == second_name) {
      second = fields[f];
    } else if (fields[f] != nullptr) {
      return InvalidArgument(where + ": field '" + std::string(kFields[f]) +
                             "' does not apply to " + algo_name + " (use '" + count_name +
                             "' and '" + second_name + "')");
    }
  }
  LimitSpec spec{.name = std::move(limit_name), .algorithm = *algo};
  if (count_field == nullptr)
    return InvalidArgument(where + ": field '" + count_name + "' is required for " + algo_name);
  if (!GetInt(*count_field, 1, spec.count))
    return InvalidArgument(where + ": field '" + count_name + "' must be a positive integer");
  if (second == nullptr)
    return InvalidArgument(where + ": field '" + second_name + "' is required for " + algo_name);
  if (TakesRate(*algo)) {
    if (!second->is_number() || !(second->get<double>() > 0)) {
      return InvalidArgument(where + ": field '" + second_name + "' must be a positive number");
    }
    spec.per_second = second->get<double>();
  } else {
    if (!second->is_string()) {
      return InvalidArgument(where + ": field 'window' must be a duration string such as \"60s\"");
    }
    std::optional<std::string_view> align_text, timezone_text;
    for (auto [field, text, key] : {std::tuple{align, &align_text, "align"},
                                    std::tuple{timezone, &timezone_text, "timezone"}}) {
      if (field == nullptr) continue;
      if (!field->is_string())
        return InvalidArgument(where + ": field '" + key + "' must be a string");
      *text = field->get_ref<const std::string&>();
    }
    Status w =
        ApplyWindowFields(spec, second->get_ref<const std::string&>(), align_text, timezone_text);
    if (!w.ok()) {
      const std::string_view m = w.message();
      const bool names_its_field = m.starts_with("align") || m.starts_with("timezone");
      return InvalidArgument(where + ": " + (names_its_field ? "" : "field 'window': ") +
                             std::string(m));
    }
  }
  if (TakesRate(*algo) && (align != nullptr || timezone != nullptr)) {
    return InvalidArgument(where + ": field '" + (align != nullptr ? "align" : "timezone") +
                           "' is for fixed_window only, not " + algo_name);
  }
  // The core names the limit ("limit 'default': capacity must ..."); `where`
  // already says which one, and 'default' is no name the caller wrote.
  const std::string named = "limit '" + spec.name + "': ";
  StatusOr<Limit> out = MakeLimit(std::move(spec));
  if (!out.ok()) {
    std::string_view m = out.status().message();
    if (m.starts_with(named)) m.remove_prefix(named.size());
    return InvalidArgument(where + ": " + std::string(m));
  }
  if (block_for != nullptr) {  // a block period (issue 21), "10m"
    if (!block_for->is_string()) {
      return InvalidArgument(where +
                             ": field 'block_for' must be a duration string such as \"10m\"");
    }
    StatusOr<std::chrono::microseconds> d = ParseDuration(block_for->get_ref<const std::string&>());
    if (!d.ok()) return InvalidArgument(where + ": field 'block_for': " + d.status().message());
    out = out->WithBlockFor(*d);
    if (!out.ok()) return InvalidArgument(where + ": " + out.status().message());
  }
  if (prefetch != nullptr) {
    int64_t n = 0;
    if (!GetInt(*prefetch, 0, n)) {
      return InvalidArgument(where + ": field 'prefetch' must be 0 (off) or an integer from 2");
    }
    out = out->WithPrefetch(n);
    if (!out.ok()) return InvalidArgument(where + ": " + out.status().message());
  }
  return out;
}

// One name means one set of parameters: a limit's state is keyed by its
// name (and algorithm), so an inline limit that took a configured limit's
// name with other parameters would share, and corrupt, its state. The same
// parameters are the same limit, and allowed.
Status NotAConfiguredLimitsName(const Limit& l, const policy::Policy* policy) {
  const Limit* configured = policy != nullptr ? policy->NamedLimit(l.name()) : nullptr;
  if (configured == nullptr || *configured == l) return Status::Ok();
  return InvalidArgument("limit '" + l.name() +
                         "' is configured with other parameters; name it (\"limit\": \"" +
                         l.name() + "\") to use the configured one, or give this one another name");
}

void AppendInt(std::string& out, int64_t v) {
  char buf[24];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  (void)ec;
  out.append(buf, static_cast<size_t>(end - buf));  // not append(first, last): a general replace
}

void AppendDecisionFields(std::string& out, const Decision& d) {
  out += d.allowed ? "\"allowed\":true,\"limit\":"sv : "\"allowed\":false,\"limit\":"sv;
  AppendInt(out, d.limit);
  out += ",\"remaining\":"sv;
  AppendInt(out, d.remaining < 0 ? 0 : d.remaining);
  out += ",\"retry_after_ms\":"sv;
  AppendInt(out, d.allowed ? 0 : CeilMillis(d.retry_after));
  out += ",\"reset_after_ms\":"sv;
  AppendInt(out, CeilMillis(d.reset_after));
  out += ",\"delay_ms\":"sv;
  AppendInt(out, d.allowed ? CeilMillis(d.delay) : 0);
}

}  // namespace

struct CheckOp {
  std::shared_ptr<const policy::Policy> policy;
  ParsedCheck check;
  DecisionApi* api = nullptr;
};

namespace {

// Points out.checks at the requested limits in request order: named[i], or
// (where it is null) the next of out.owned. Rejects a limit named twice and a
// cost the limit can never grant.
Status AssembleChecks(std::span<const Limit* const> named, ParsedCheck& out) {
  size_t next_owned = 0;
  out.checks.reserve(named.size());
  for (const Limit* n : named) {
    const Limit* l = n != nullptr ? n : &out.owned[next_owned++];
    for (const LimitCheck& c : out.checks) {
      if (c.limit->name() == l->name())
        return InvalidArgument("limit '" + l->name() + "' appears twice");
    }
    if (Status s = l->ValidateCost(out.cost); !s.ok()) {
      return InvalidArgument("limit '" + l->name() + "': " + s.message());
    }
    out.checks.push_back({l, out.cost});
  }
  return Status::Ok();
}

// ---- The fast path of POST /v1/check ------------------------------------
// Most bodies are small and plain: a key, maybe a cost, and named limits or
// the same inline limit objects again and again. Building nlohmann's DOM for
// them (a std::map per object, a string per member) was the largest cost of a
// decision after the kernel's. The scanner below reads such bodies in place;
// anything it is not sure of (an escape, a float cost, an unknown or repeated
// field, an error of any kind) sends the body down the full parser, which
// gives the answer and the error message. Inline limit objects are parsed by
// the full parser once per distinct text and kept in a small per-thread table.

struct Scanner {
  std::string_view s;
  size_t i = 0;

  void Ws() {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) ++i;
  }
  bool Peek(char c) {
    Ws();
    return i < s.size() && s[i] == c;
  }
  bool Eat(char c) {
    if (!Peek(c)) return false;
    ++i;
    return true;
  }
  // A string without escapes or control characters.
  bool String(std::string_view& out) {
    if (!Eat('"')) return false;
    const size_t start = i;
    for (; i < s.size(); ++i) {
      const unsigned char c = static_cast<unsigned char>(s[i]);
      if (c == '"') {
        out = s.substr(start, i++ - start);
        return true;
      }
      if (c == '\\' || c < 0x20) return false;
    }
    return false;
  }
  // A non-negative JSON integer of at most 18 digits (no fraction, no exponent).
  bool Integer(int64_t& out) {
    Ws();
    const size_t start = i;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
    const size_t n = i - start;
    if (n == 0 || n > 18 || (n > 1 && s[start] == '0')) return false;
    if (i < s.size() && (s[i] == '.' || s[i] == 'e' || s[i] == 'E')) return false;
    std::from_chars(s.data() + start, s.data() + i, out);
    return true;
  }
  // The text of an object, '{' to its '}', whose strings have no escapes.
  bool ObjectText(std::string_view& out) {
    if (!Peek('{')) return false;
    const size_t start = i;
    int depth = 0;
    bool in_string = false;
    for (; i < s.size(); ++i) {
      const unsigned char c = static_cast<unsigned char>(s[i]);
      if (in_string) {
        if (c == '"') in_string = false;
        if (c == '\\' || c < 0x20) return false;
      } else if (c == '"') {
        in_string = true;
      } else if (c == '{' || c == '[') {
        if (++depth > 4) return false;
      } else if (c == '}' || c == ']') {
        if (--depth == 0) {
          out = s.substr(start, ++i - start);
          return true;
        }
      }
    }
    return false;
  }
  bool AtEnd() {
    Ws();
    return i == s.size();
  }
};

// Inline limit objects by their exact text: parsed by the full parser on the
// first sight of a text, then copied. Direct-mapped, per thread, bounded.
class InlineLimits {
 public:
  const Limit* Get(std::string_view text) {
    if (text.size() > kMaxText) return nullptr;
    Entry& e = entries_[std::hash<std::string_view>{}(text) % kEntries];
    if (e.limit && e.text == text) return &*e.limit;
    StatusOr<json> j = ParseBody(text);  // refuses a repeated member too
    if (!j.ok()) return nullptr;
    StatusOr<Limit> l = ParseInlineLimit(*j, "limit");
    if (!l.ok()) return nullptr;
    e.text.assign(text);
    e.limit = *std::move(l);
    return &*e.limit;
  }

 private:
  static constexpr size_t kEntries = 64;
  static constexpr size_t kMaxText = 512;
  struct Entry {
    std::string text;
    std::optional<Limit> limit;
  };
  std::array<Entry, kEntries> entries_;
};

}  // namespace

bool operator==(const ParsedCheck& a, const ParsedCheck& b) {
  if (a.key != b.key || a.store_key != b.store_key || a.cost != b.cost ||
      a.checks.size() != b.checks.size()) {
    return false;
  }
  for (size_t i = 0; i < a.checks.size(); ++i) {
    const Limit& x = *a.checks[i].limit;
    const Limit& y = *b.checks[i].limit;
    if (a.checks[i].cost != b.checks[i].cost || x.name() != y.name() ||
        x.algorithm() != y.algorithm() || x.limit() != y.limit() ||
        x.window_micros() != y.window_micros() || x.interval_micros() != y.interval_micros() ||
        x.identity_hash() != y.identity_hash() || x.calendar() != y.calendar() ||
        x.block_for() != y.block_for()) {
      return false;
    }
  }
  return true;
}

std::optional<ParsedCheck> FastParseCheck(std::string_view body, const policy::Policy* policy,
                                          size_t max_key_length) {
  thread_local InlineLimits inline_limits;
  Scanner sc{body};
  ParsedCheck out;
  std::string_view key;
  bool have_key = false, have_cost = false, have_limits = false;
  const Limit* named[kMaxChecksPerRequest];
  size_t n = 0;
  auto limit_entry = [&]() {
    if (n == kMaxChecksPerRequest) return false;
    if (sc.Peek('"')) {
      std::string_view name;
      if (!sc.String(name) || policy == nullptr) return false;
      named[n] = policy->NamedLimit(name);
      return named[n++] != nullptr;
    }
    std::string_view text;
    if (!sc.ObjectText(text)) return false;
    const Limit* l = inline_limits.Get(text);
    if (l == nullptr || !NotAConfiguredLimitsName(*l, policy).ok()) return false;
    out.owned.push_back(*l);
    named[n++] = nullptr;
    return true;
  };
  if (!sc.Eat('{')) return std::nullopt;
  do {
    std::string_view field;
    if (!sc.String(field) || !sc.Eat(':')) return std::nullopt;
    if (field == "key" && !have_key) {
      if (!sc.String(key)) return std::nullopt;
      have_key = true;
    } else if (field == "cost" && !have_cost) {
      if (!sc.Integer(out.cost)) return std::nullopt;
      have_cost = true;
    } else if (field == "limit" && !have_limits) {
      if (!limit_entry()) return std::nullopt;
      have_limits = true;
    } else if (field == "limits" && !have_limits) {
      if (!sc.Eat('[')) return std::nullopt;
      do {
        if (!limit_entry()) return std::nullopt;
      } while (sc.Eat(','));
      if (!sc.Eat(']')) return std::nullopt;
      have_limits = true;
    } else {
      return std::nullopt;
    }
  } while (sc.Eat(','));
  if (!sc.Eat('}') || !sc.AtEnd() || !have_key || !have_limits) return std::nullopt;
  if (key.empty() || key.size() > max_key_length || !ValidUtf8(key)) return std::nullopt;
  out.key.assign(key);
  out.store_key = DecisionApiClient(out.key);
  if (!AssembleChecks({named, n}, out).ok()) return std::nullopt;
  return out;
}

StatusOr<json> ParseBody(std::string_view body) {
  // nlohmann keeps the last of repeated members; JSON (RFC 8259) leaves it
  // open. A repeated member is refused: a typo must not silently change a
  // request. The member names of the objects being read, innermost last:
  std::vector<std::unordered_set<std::string>> open;
  std::string repeated;
  auto track = [&](int, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start: open.emplace_back(); break;
      case json::parse_event_t::object_end:
        if (!open.empty()) open.pop_back();
        break;
      case json::parse_event_t::key:
        if (!open.empty() && !open.back().insert(parsed.get<std::string>()).second &&
            repeated.empty()) {
          repeated = parsed.get<std::string>();
        }
        break;
      default: break;
    }
    return true;
  };
  json j = json::parse(body, track, /*allow_exceptions=*/false);
  if (!j.is_discarded()) {
    if (!repeated.empty()) {
      return InvalidArgument("member '" + repeated + "' appears twice in one JSON object");
    }
    return j;
  }
  // The error path only: parse again to learn what was wrong.
  try {
    json again = json::parse(body);
    (void)again;
  } catch (const json::exception& e) {
    std::string what = e.what();
    if (auto p = what.find("] "); p != std::string::npos) what = what.substr(p + 2);
    return InvalidArgument("request body is not valid JSON: " + what);
  }
  return InvalidArgument("request body is not valid JSON");
}

namespace {

// A reservation that can never be settled would leave its cost charged,
// whatever the work cost: refused before anything is taken, not at
// /v1/settle. `by` says who made the limit so ("" or "the key's override
// makes it ").
Status CheckReservable(std::span<const LimitCheck> checks, std::string_view by) {
  for (const LimitCheck& c : checks) {
    if (!c.limit->settleable()) {
      const bool log = c.limit->algorithm() == Algorithm::kSlidingLog;
      return InvalidArgument("limit '" + c.limit->name() +
                             "' cannot be reserved: " + std::string(by) +
                             (log ? "a sliding log" : "a calendar quota (align: calendar)") +
                             (by.empty() ? "" : ", which") +
                             " cannot be settled; reserve on token buckets, leaky buckets, "
                             "fixed windows aligned to the epoch or sliding windows");
    }
  }
  return Status::Ok();
}

// "reserve": true and "reserve_ttl": "<duration>" (issue 21).
Status ParseReserve(const json* reserve, const json* ttl, const json& limits, ParsedCheck& out) {
  if (reserve != nullptr && !reserve->is_boolean())
    return InvalidArgument("field 'reserve' must be true or false");
  out.reserve = reserve != nullptr && reserve->get<bool>();
  if (ttl != nullptr && !out.reserve)
    return InvalidArgument("field 'reserve_ttl' needs \"reserve\": true");
  if (!out.reserve) return Status::Ok();
  if (Status s = CheckReservable(out.checks, ""); !s.ok()) return s;
  out.reserve_ttl_ms = kDefaultReservationTtlMs;
  if (ttl != nullptr) {
    if (!ttl->is_string())
      return InvalidArgument("field 'reserve_ttl' must be a duration string such as \"30s\"");
    StatusOr<std::chrono::microseconds> d = ParseDuration(ttl->get_ref<const std::string&>());
    if (!d.ok()) return InvalidArgument("field 'reserve_ttl': " + d.status().message());
    if (d->count() < 1000 || d->count() > kMaxReservationTtlMs * 1000) {
      return InvalidArgument("field 'reserve_ttl' must be 1ms..1h");
    }
    out.reserve_ttl_ms = d->count() / 1000;
  }
  out.limits_json = limits.dump();
  return Status::Ok();
}

}  // namespace

StatusOr<ParsedCheck> ParseCheck(const json& j, const policy::Policy* policy,
                                 size_t max_key_length) {
  if (!j.is_object()) return InvalidArgument("a check must be a JSON object");
  const json* key = nullptr;
  const json* cost = nullptr;
  const json* limits = nullptr;
  const json* limit = nullptr;
  const json* reserve = nullptr;
  const json* reserve_ttl = nullptr;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    if (k == "reserve")
      reserve = &it.value();
    else if (k == "reserve_ttl")
      reserve_ttl = &it.value();
    else if (k == "key")
      key = &it.value();
    else if (k == "cost")
      cost = &it.value();
    else if (k == "limits")
      limits = &it.value();
    else if (k == "limit")
      limit = &it.value();
    else
      return InvalidArgument("unknown field '" + k +
                             "' (expected key, cost, limits or limit, or reserve and reserve_ttl)");
  }
  ParsedCheck out;
  if (key == nullptr) return InvalidArgument("field 'key' is required");
  if (!key->is_string()) return InvalidArgument("field 'key' must be a string");
  out.key = key->get<std::string>();
  if (Status s = ValidateKey(out.key, max_key_length, "field 'key'"); !s.ok()) return s;
  if (!ValidUtf8(out.key)) return InvalidArgument("field 'key' is not valid UTF-8");
  out.store_key = DecisionApiClient(out.key);
  if (cost != nullptr && !GetInt(*cost, 0, out.cost)) {
    return InvalidArgument("field 'cost' must be a non-negative integer");
  }
  if (limits != nullptr && limit != nullptr)
    return InvalidArgument("use either 'limits' or 'limit', not both");
  if (limits == nullptr && limit == nullptr) return InvalidArgument("field 'limits' is required");
  json one;
  if (limit != nullptr) {
    one = json::array({*limit});
    limits = &one;
  }
  if (!limits->is_array()) return InvalidArgument("field 'limits' must be an array");
  if (limits->empty()) return InvalidArgument("field 'limits' must name at least one limit");
  if (limits->size() > kMaxChecksPerRequest) {
    return InvalidArgument("field 'limits' has " + std::to_string(limits->size()) +
                           " entries; the maximum is " + std::to_string(kMaxChecksPerRequest));
  }
  // First the inline limits (owned), then pointers: `owned` must not reallocate.
  out.owned.reserve(limits->size());
  std::vector<const Limit*> named(limits->size(), nullptr);
  for (size_t i = 0; i < limits->size(); ++i) {
    const json& e = (*limits)[i];
    const std::string where = limit != nullptr ? "limit" : "limits[" + std::to_string(i) + "]";
    if (e.is_string()) {
      const std::string& name = e.get_ref<const std::string&>();
      named[i] = policy != nullptr ? policy->NamedLimit(name) : nullptr;
      if (named[i] == nullptr) return InvalidArgument(where + ": unknown limit '" + name + "'");
    } else if (e.is_object()) {
      StatusOr<Limit> l = ParseInlineLimit(e, where);
      if (!l.ok()) return l.status();
      if (Status s = NotAConfiguredLimitsName(*l, policy); !s.ok()) {
        return InvalidArgument(where + ": " + s.message());
      }
      out.owned.push_back(std::move(*l));
    } else {
      return InvalidArgument(where + ": must be a limit object or the name of a configured limit");
    }
  }
  if (Status s = AssembleChecks(named, out); !s.ok()) return s;
  if (Status s = ParseReserve(reserve, reserve_ttl, *limits, out); !s.ok()) return s;
  return out;
}

namespace {

// {"allowed":...,"degraded":...,"limits":[{"name":...,...},...]}: the
// overall decision, then limit(i)'s name and decision(i) for i < n.
template <typename NameOf, typename DecisionOf>
void AppendBody(const Decision& overall, bool degraded, size_t n, NameOf name_of,
                DecisionOf decision_of, std::string& out) {
  out.push_back('{');
  AppendDecisionFields(out, overall);
  out += degraded ? ",\"degraded\":true,\"limits\":["sv : ",\"degraded\":false,\"limits\":["sv;
  for (size_t i = 0; i < n; ++i) {
    if (i > 0) out.push_back(',');
    out += "{\"name\":\""sv;
    out += name_of(i);  // validated: [A-Za-z0-9_.-]
    out += "\","sv;
    AppendDecisionFields(out, decision_of(i));
    out.push_back('}');
  }
  out += "]}"sv;
}

}  // namespace

void AppendCheckBody(const CheckResult& result, std::span<const LimitCheck> checks, bool degraded,
                     std::string& out) {
  AppendBody(
      result.overall, degraded, std::min(result.decisions.size(), checks.size()),
      [&](size_t i) -> const std::string& { return checks[i].limit->name(); },
      [&](size_t i) -> const Decision& { return result.decisions[i]; }, out);
}

void AppendOutcomeBody(const Outcome& o, std::string& out) {
  AppendBody(
      o.decision, o.degraded, o.limits.size(),
      [&](size_t i) -> const std::string& { return o.limits[i].limit->name(); },
      [&](size_t i) -> const Decision& { return o.limits[i].decision; }, out);
}

StatusOr<Limit> ParseLimitObject(const json& j, const std::string& where) {
  return ParseInlineLimit(j, where, /*with_prefetch=*/true);
}

void DecisionApi::Check(std::shared_ptr<const policy::Policy> policy, std::string_view body,
                        std::string_view path, std::function<void(Reply&&)> done) {
  const size_t max_key_length = policy->config().store.max_key_length;
  std::optional<ParsedCheck> parsed = FastParseCheck(body, policy.get(), max_key_length);
  if (!parsed) {
    StatusOr<json> j = ParseBody(body);
    if (!j.ok()) return done(ProblemReply(400, j.status().message(), path));
    StatusOr<ParsedCheck> full = ParseCheck(*j, policy.get(), max_key_length);
    if (!full.ok()) return done(ProblemReply(400, full.status().message(), path));
    parsed = std::move(*full);
  }
  if (parsed->reserve) {
    // The key's override applies in Enforcer::Check: the limits it makes of
    // the request's must be settleable too. (An override changed between
    // here and there is the admin's race: at worst this one reservation
    // cannot be settled.)
    std::vector<LimitCheck> overridden(parsed->checks.begin(), parsed->checks.end());
    const std::shared_ptr<const OverrideTable> held =  // `overridden`'s limits live here
        enforcer_.ApplyDecisionOverride(parsed->store_key, overridden);
    if (held != nullptr) {
      if (Status s = CheckReservable(overridden, "the key's override makes it "); !s.ok()) {
        return done(ProblemReply(400, s.message(), path));
      }
    }
    // Its id must fit in a settle body, or the reservation could never be
    // settled: refused before anything is taken.
    const size_t max_id = MaxReservationIdLength(policy->config().server.max_body_bytes);
    const int64_t expires_unix_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                        std::chrono::system_clock::now().time_since_epoch())
                                        .count() +
                                    parsed->reserve_ttl_ms;
    const size_t id_length = ReservationIdLength({.key = parsed->key,
                                                  .cost = parsed->cost,
                                                  .expires_unix_ms = expires_unix_ms,
                                                  .nonce = std::string(32, '0'),
                                                  .limits = json::parse(parsed->limits_json)});
    if (id_length > max_id) {
      return done(ProblemReply(
          400,
          "the reservation id would be " + std::to_string(id_length) +
              " characters, more than a POST /v1/settle body of server.max_body_bytes (" +
              std::to_string(policy->config().server.max_body_bytes) + ") can carry (" +
              std::to_string(max_id) + "): use a shorter key or fewer inline limits",
          path));
    }
  }
  auto op = std::make_shared<CheckOp>(CheckOp{std::move(policy), std::move(*parsed), this});
  enforcer_.Check(op->check.store_key, op->check.checks, *op->policy, path, Face::kDecisionApi,
                  [op, path, done = std::move(done)](const Outcome& o) {
                    const policy::Config& config = op->policy->config();
                    const HttpFace face{
                        .dialect = config.server.headers,
                        .closed_status = static_cast<unsigned>(config.store.closed_status)};
                    if (o.verdict == Verdict::kBadRequest || o.verdict == Verdict::kStoreError) {
                      return done(RefusalReply(o, face, path));
                    }
                    Reply r;
                    r.status = HttpStatus(o, face);
                    r.content_type = "application/json";
                    r.body.reserve(128 + 128 * o.limits.size());
                    AppendOutcomeBody(o, r.body);
                    r.headers.reserve(6);
                    AddOutcomeHeaders(o, face.dialect, r);
                    if (op->check.reserve && o.allowed() && !o.degraded) {
                      return op->api->AddReservation(op, std::move(r), done);
                    }
                    done(std::move(r));
                  });
}

// An allowed, reserved check: the reservation signed under the store's
// shared secret, added to the answer as "reservation": {id, cost,
// expires_in_ms, expires_at_unix_ms}. A degraded answer (a failure mode
// decided) carries none: nothing was taken from the store to settle against.
void DecisionApi::AddReservation(std::shared_ptr<CheckOp> op, Reply r,
                                 std::function<void(Reply&&)> done) {
  enforcer_.store().SharedSecret([op, r = std::move(r),
                                  done = std::move(done)](StatusOr<std::string> secret) mutable {
    if (!secret.ok()) {
      Reply failed = ProblemReply(
          503, "the rate limit store could not sign the reservation: " + secret.status().message(),
          "/v1/check");
      failed.Add("Retry-After", "1");
      return done(std::move(failed));
    }
    const int64_t now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                               std::chrono::system_clock::now().time_since_epoch())
                               .count();
    const Reservation res{.key = op->check.key,
                          .cost = op->check.cost,
                          .expires_unix_ms = now_ms + op->check.reserve_ttl_ms,
                          .nonce = NewReservationNonce(),
                          .limits = json::parse(op->check.limits_json)};
    const json obj = {{"id", SignReservation(res, *secret)},
                      {"cost", res.cost},
                      {"expires_in_ms", op->check.reserve_ttl_ms},
                      {"expires_at_unix_ms", res.expires_unix_ms}};
    r.body.pop_back();  // the closing '}'
    r.body += ",\"reservation\":" + obj.dump() + "}";
    done(std::move(r));
  });
}

namespace {

// What a settlement answers: the reservation's numbers and the limits'
// state afterwards (each limit's decision: the next cost-1 request's view).
std::string SettledBody(const Reservation& res, int64_t cost, const CheckResult& result,
                        std::span<const LimitCheck> checks) {
  std::string body = "{\"settled\":true,\"reserved\":" + std::to_string(res.cost) +
                     ",\"cost\":" + std::to_string(cost) +
                     ",\"difference\":" + std::to_string(cost - res.cost) + ",\"state\":";
  AppendCheckBody(result, checks, result.degraded, body);
  body += "}";
  return body;
}

}  // namespace

void DecisionApi::Settle(std::shared_ptr<const policy::Policy> policy, std::string_view body,
                         std::string_view path, std::function<void(Reply&&)> done) {
  StatusOr<json> j = ParseBody(body);
  if (!j.ok()) return done(ProblemReply(400, j.status().message(), path));
  if (!j->is_object()) return done(ProblemReply(400, "the body must be a JSON object", path));
  std::string id;
  int64_t cost = -1;
  for (auto it = j->begin(); it != j->end(); ++it) {
    if (it.key() == "reservation" && it.value().is_string()) {
      id = it.value().get<std::string>();
    } else if (it.key() == "cost") {
      if (!GetInt(it.value(), 0, cost) || cost > kMaxSettleDelta) {
        return done(ProblemReply(400, "field 'cost' must be an integer in 0..2147483647", path));
      }
    } else {
      return done(ProblemReply(
          400, "field '" + it.key() + "' is unknown or not a string (expected reservation, cost)",
          path));
    }
  }
  if (id.empty()) return done(ProblemReply(400, "field 'reservation' is required", path));
  if (cost < 0) return done(ProblemReply(400, "field 'cost' is required (the actual cost)", path));
  auto where = std::make_shared<std::string>(path);
  // The secret it was signed under: this instance's, the one that replaced
  // (kSharedSecretOverlap), or the store's asked again (another instance may
  // have set a new one since this one last asked).
  static_assert(kMaxReservationTtlMs <= std::chrono::milliseconds(kSharedSecretOverlap).count());
  const size_t max_id = MaxReservationIdLength(policy->config().server.max_body_bytes);
  auto signed_under = [this, id, max_id](std::function<void(StatusOr<std::string>)> then) {
    enforcer_.store().SecretAccepting(
        [id, max_id](std::string_view secret) {
          return VerifyReservation(id, secret, max_id).ok();
        },
        std::move(then));
  };
  signed_under([this, policy = std::move(policy), id = std::move(id), cost, where, max_id,
                done = std::move(done)](StatusOr<std::string> secret) mutable {
    if (!secret.ok()) {
      Reply r = ProblemReply(
          503, "the rate limit store could not answer: " + secret.status().message(), *where);
      r.Add("Retry-After", "1");
      return done(std::move(r));
    }
    StatusOr<Reservation> res = VerifyReservation(id, *secret, max_id);
    if (!res.ok()) return done(ProblemReply(400, res.status().message(), *where));
    const int64_t now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                               std::chrono::system_clock::now().time_since_epoch())
                               .count();
    if (now_ms >= res->expires_unix_ms) {
      return done(ProblemReply(
          409,
          "the reservation expired " + std::to_string(now_ms - res->expires_unix_ms) +
              " ms ago: it stands at its reserved cost (" + std::to_string(res->cost) + ")",
          *where));
    }
    const policy::StoreConfig& config = policy->config().store;
    StatusOr<ParsedCheck> parsed =
        ParseCheck(json{{"key", res->key}, {"cost", res->cost}, {"limits", res->limits}},
                   policy.get(), config.max_key_length);
    if (!parsed.ok()) {
      return done(ProblemReply(
          409, "the reservation's limits no longer apply: " + parsed.status().message(), *where));
    }
    struct Held {
      Reservation res;
      ParsedCheck check;
      std::shared_ptr<const OverrideTable> overrides;  // the override's limits live here
    };
    auto held = std::make_shared<Held>(Held{*std::move(res), *std::move(parsed), nullptr});
    // The check took from the state under the key's override (d:<key>), if
    // one applies: settled against the configured limits instead, a changed
    // window would start the state over and a changed rate price the
    // difference wrongly.
    held->overrides = enforcer_.ApplyDecisionOverride(held->check.store_key, held->check.checks);
    // A difference of 0 still goes to the store: the settlement is recorded
    // once (a second one is refused), and with the check's limits it leaves
    // the state as it is.
    std::vector<LimitSettle> settlements;
    for (const LimitCheck& c : held->check.checks) {
      settlements.push_back({c.limit, cost - held->res.cost});
    }
    const SettleRequest request{
        .key = held->check.store_key,
        .settlements = settlements,
        .on_failure = {.mode = config.failure_mode,
                       .expected_instances = config.expected_instances},
        .once = held->res.nonce,
        .once_ttl = std::chrono::milliseconds(held->res.expires_unix_ms - now_ms + 1000)};
    enforcer_.store().Settle(request, [policy, held, cost, where,
                                       done = std::move(done)](StatusOr<CheckResult> r) {
      if (!r.ok()) {
        const bool bad = r.status().code() == StatusCode::kInvalidArgument;
        Reply reply = ProblemReply(
            bad ? 400 : 503,
            (bad ? "" : "the rate limit store could not settle: ") + r.status().message(), *where);
        if (!bad) reply.Add("Retry-After", "1");
        return done(std::move(reply));
      }
      if (r->already_settled) {
        return done(ProblemReply(409, "the reservation was settled already", *where));
      }
      Reply reply;
      reply.status = 200;
      reply.content_type = "application/json";
      reply.body = SettledBody(held->res, cost, *r, held->check.checks);
      done(std::move(reply));
    });
  });
}

namespace {

struct BatchOp {
  std::shared_ptr<const policy::Policy> policy;
  std::vector<ParsedCheck> checks;
  std::vector<std::string> results;  // each a JSON object; written by one callback each
  std::atomic<size_t> pending{0};
  std::function<void(Reply&&)> done;

  void CompleteOne() {
    if (pending.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    Reply r;
    r.content_type = "application/json";
    size_t n = 16;
    for (const std::string& s : results) n += s.size() + 1;
    r.body.reserve(n);
    r.body += "{\"results\":[";
    for (size_t i = 0; i < results.size(); ++i) {
      if (i > 0) r.body.push_back(',');
      r.body += results[i];
    }
    r.body += "]}";
    auto cb = std::move(done);
    cb(std::move(r));
  }
};

std::string ErrorEntry(unsigned status, std::string_view detail) {
  json e = {{"error", Problem(status, detail, "")}};
  return e.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace

void DecisionApi::Batch(std::shared_ptr<const policy::Policy> policy, std::string_view body,
                        std::string_view path, std::function<void(Reply&&)> done) {
  StatusOr<json> j = ParseBody(body);
  if (!j.ok()) return done(ProblemReply(400, j.status().message(), path));
  if (!j->is_object()) return done(ProblemReply(400, "the body must be a JSON object", path));
  const json* checks = nullptr;
  for (auto it = j->begin(); it != j->end(); ++it) {
    if (it.key() != "checks") {
      return done(ProblemReply(400, "unknown field '" + it.key() + "' (expected checks)", path));
    }
    checks = &it.value();
  }
  if (checks == nullptr) return done(ProblemReply(400, "field 'checks' is required", path));
  if (!checks->is_array()) return done(ProblemReply(400, "field 'checks' must be an array", path));
  if (checks->size() > kMaxBatchChecks) {
    return done(ProblemReply(400,
                             "field 'checks' has " + std::to_string(checks->size()) +
                                 " entries; the maximum is " + std::to_string(kMaxBatchChecks),
                             path));
  }
  auto op = std::make_shared<BatchOp>();
  op->policy = std::move(policy);
  op->done = std::move(done);
  const size_t n = checks->size();
  op->checks.resize(n);
  op->results.resize(n);
  op->pending.store(n + 1, std::memory_order_relaxed);  // +1: released after the loop
  const policy::StoreConfig& store_config = op->policy->config().store;
  for (size_t i = 0; i < n; ++i) {
    StatusOr<ParsedCheck> parsed =
        ParseCheck((*checks)[i], op->policy.get(), store_config.max_key_length);
    if (!parsed.ok()) {
      op->results[i] =
          ErrorEntry(400, "checks[" + std::to_string(i) + "]: " + parsed.status().message());
      op->CompleteOne();
      continue;
    }
    if (parsed->reserve) {
      op->results[i] = ErrorEntry(
          400, "checks[" + std::to_string(i) + "]: 'reserve' is for POST /v1/check only");
      op->CompleteOne();
      continue;
    }
    op->checks[i] = std::move(*parsed);
    const ParsedCheck& c = op->checks[i];
    enforcer_.Check(c.store_key, c.checks, *op->policy, path, Face::kDecisionApi,
                    [op, i](const Outcome& o) {
                      std::string& out = op->results[i];
                      if (o.verdict == Verdict::kBadRequest || o.verdict == Verdict::kStoreError) {
                        out = ErrorEntry(o.verdict == Verdict::kBadRequest ? 400 : 503,
                                         "checks[" + std::to_string(i) + "]: " + o.error);
                      } else {
                        AppendOutcomeBody(o, out);
                      }
                      op->CompleteOne();
                    });
  }
  op->CompleteOne();
}

}  // namespace ratelimit::server
