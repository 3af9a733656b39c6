#include "envoy/config.h"
#include "core/ascii.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <set>
#include <sstream>

#include "core/return_if_error.h"

namespace ratelimit::envoy {

namespace {

using namespace std::chrono_literals;

using core::Quote;

// A plain (unquoted) scalar that YAML would read as a number, a boolean or
// null: envoyproxy/ratelimit's Go decoder refuses it as a map key.
bool LooksNonString(const YAML::Node& n) {
  if (n.Tag() != "?") return false;  // quoted: a string
  const std::string& s = n.Scalar();
  if (s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL") return true;
  static const std::set<std::string> kBools = {"true",  "false", "True", "False", "TRUE",
                                               "FALSE", "yes",   "no",   "on",    "off"};
  if (kBools.count(s) != 0) return true;
  size_t i = (s[0] == '-' || s[0] == '+') ? 1 : 0;
  bool digit = false, other = false;
  for (; i < s.size(); ++i) {
    const char c = s[i];
    if (std::isdigit(static_cast<unsigned char>(c)))
      digit = true;
    else if (c != '.' && c != 'e' && c != 'E' && c != '_' && c != '-' && c != '+')
      other = true;
  }
  return digit && !other;
}

class Parser {
 public:
  explicit Parser(std::string_view source) : source_(source) {}

  Status Error(const YAML::Node& n, const std::string& why) const {
    const int line = n.IsDefined() ? n.Mark().line + 1 : 1;
    return InvalidArgument(source_ + ":" + std::to_string(line < 1 ? 1 : line) + ": " + why);
  }

  // `n` is a map whose keys are strings from `allowed`.
  Status CheckMap(const YAML::Node& n, std::string_view what,
                  std::initializer_list<std::string_view> allowed) const {
    if (!n.IsMap()) return Error(n, std::string(what) + " must be a map");
    std::set<std::string> seen;
    for (const auto& kv : n) {
      if (!kv.first.IsScalar() || LooksNonString(kv.first)) {
        return Error(kv.first, "keys in " + std::string(what) + " must be strings, got " +
                                   Quote(kv.first.IsScalar() ? kv.first.Scalar() : "?"));
      }
      const std::string& key = kv.first.Scalar();
      if (std::find(allowed.begin(), allowed.end(), key) == allowed.end()) {
        std::string list;
        for (std::string_view a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
        return Error(kv.first, "unknown field " + Quote(key) + " in " + std::string(what) +
                                   " (expected one of: " + list + ")");
      }
      if (!seen.insert(key).second)
        return Error(kv.first, "duplicate field " + Quote(key) + " in " + std::string(what));
    }
    return Status::Ok();
  }

  Status String(const YAML::Node& map, const char* key, std::string* out) const {
    const YAML::Node n = map[key];
    if (!n.IsDefined() || n.IsNull()) return Status::Ok();
    if (!n.IsScalar()) return Error(n, Quote(key) + " must be a string");
    *out = n.Scalar();
    return Status::Ok();
  }

  Status Bool(const YAML::Node& map, const char* key, bool* out) const {
    const YAML::Node n = map[key];
    if (!n.IsDefined() || n.IsNull()) return Status::Ok();
    if (!n.IsScalar() || !YAML::convert<bool>::decode(n, *out))
      return Error(n, Quote(key) + " must be true or false");
    return Status::Ok();
  }

  Status Uint(const YAML::Node& map, const char* key, uint64_t max, uint64_t* out) const {
    const YAML::Node n = map[key];
    if (!n.IsDefined() || n.IsNull()) return Status::Ok();
    const std::string s = n.IsScalar() ? n.Scalar() : "";
    if (s.empty() || s.size() > 19 ||
        !std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
        std::stoull(s) > max) {
      return Error(n, Quote(key) + " must be a whole number from 0 to " + std::to_string(max));
    }
    *out = std::stoull(s);
    return Status::Ok();
  }

  Status Rule(const YAML::Node& n, envoy::Rule* r) const {
    RL_RETURN_IF_ERROR(
        CheckMap(n, "rate_limit",
                 {"unit", "requests_per_unit", "name", "unlimited", "replaces", "algorithm",
                  "burst", "unit_multiplier", "period", "align", "timezone"}));
    r->line = n.Mark().line + 1;
    std::string unit_text, algorithm, period;
    uint64_t rpu = 0, burst = 0, multiplier = 0;
    RL_RETURN_IF_ERROR(String(n, "unit", &unit_text));
    RL_RETURN_IF_ERROR(Uint(n, "requests_per_unit", 4294967295u, &rpu));
    RL_RETURN_IF_ERROR(String(n, "name", &r->name));
    RL_RETURN_IF_ERROR(Bool(n, "unlimited", &r->unlimited));
    RL_RETURN_IF_ERROR(String(n, "algorithm", &algorithm));
    RL_RETURN_IF_ERROR(Uint(n, "burst", Limit::kMaxCount, &burst));
    RL_RETURN_IF_ERROR(Uint(n, "unit_multiplier", 1'000'000, &multiplier));
    RL_RETURN_IF_ERROR(String(n, "period", &period));
    r->requests_per_unit = static_cast<uint32_t>(rpu);
    r->unit = ParseUnit(unit_text);
    r->burst = static_cast<int64_t>(burst);
    if (r->unlimited) {
      if (r->unit != Unit::kUnknown)
        return Error(n["unit"], "should not specify rate limit unit when unlimited");
    } else if (!period.empty()) {
      if (!unit_text.empty() && r->unit == Unit::kUnknown)
        return Error(n["unit"], "invalid rate limit unit " + Quote(unit_text));
      StatusOr<std::chrono::microseconds> p = ParseDuration(period);
      if (!p.ok()) return Error(n["period"], "'period': " + p.status().message());
      r->period = *p;
    } else if (r->unit == Unit::kUnknown) {
      return Error(n["unit"].IsDefined() ? n["unit"] : n,
                   "invalid rate limit unit " + Quote(unit_text));
    } else {
      // Checked before the product, which overflows int64 (a year x 300,000
      // came out negative and passed the check below).
      const int64_t unit_us = UnitLength(r->unit).count();
      const int64_t times = multiplier == 0 ? 1 : static_cast<int64_t>(multiplier);
      if (times > Limit::kMaxWindowMicros / unit_us)
        return Error(n, "the period is longer than a year");
      r->period = std::chrono::microseconds(unit_us * times);
    }
    if (!period.empty() && multiplier != 0)
      return Error(n["period"], "give 'period' or 'unit_multiplier', not both");
    if (!algorithm.empty()) {
      StatusOr<Algorithm> a = ParseAlgorithm(algorithm);
      if (!a.ok()) return Error(n["algorithm"], a.status().message());
      r->algorithm = *a;
    }
    RL_RETURN_IF_ERROR(CalendarAlign(n, unit_text, period, multiplier, r));
    if (burst != 0 && r->algorithm != Algorithm::kTokenBucket &&
        r->algorithm != Algorithm::kLeakyBucket) {
      return Error(n["burst"], "'burst' needs algorithm token_bucket or leaky_bucket");
    }
    if (const YAML::Node rep = n["replaces"]; rep.IsDefined() && !rep.IsNull()) {
      if (!rep.IsSequence()) return Error(rep, "'replaces' must be a list of {name: ...}");
      for (const YAML::Node& item : rep) {
        RL_RETURN_IF_ERROR(CheckMap(item, "a replaces entry", {"name"}));
        std::string name;
        RL_RETURN_IF_ERROR(String(item, "name", &name));
        if (name.empty()) return Error(item, "should not have an empty replaces entry");
        if (name == r->name)
          return Error(item, "replaces should not contain name of same descriptor");
        r->replaces.push_back(std::move(name));
      }
    }
    if (!r->unlimited) {
      // requests_per_unit 0 blocks (envoyproxy/ratelimit's "black list"
      // example): every request is over it; the plan answers it
      // without a store limit of 0. Above the store's largest count a limit
      // counts to that (plan.cc), as envoyproxy/ratelimit takes any uint32.
      if (r->requests_per_unit == 0 && burst != 0)
        return Error(n["burst"], "'burst' needs 'requests_per_unit' above 0");
      if (r->period > std::chrono::microseconds(Limit::kMaxWindowMicros))
        return Error(n, "the period is longer than a year");
      // The store's limit is built per request from the rule: one it
      // cannot build is refused here, not with every matching request.
      if (StatusOr<Limit> l = RuleLimit(*r, "x"); !l.ok()) {
        std::string why = l.status().message();
        if (constexpr std::string_view kOf = "limit 'x': "; why.starts_with(kOf))
          why.erase(0, kOf.size());
        return Error(n, "cannot apply this rate_limit: " + why);
      }
    }
    return Status::Ok();
  }

  // `align: calendar` and `timezone:` (our extension): the unit's calendar
  // window in that zone (UTC by default) instead of a window from the epoch.
  Status CalendarAlign(const YAML::Node& n, const std::string& unit_text, const std::string& period,
                       uint64_t multiplier, envoy::Rule* r) const {
    std::string align, timezone;
    RL_RETURN_IF_ERROR(String(n, "align", &align));
    RL_RETURN_IF_ERROR(String(n, "timezone", &timezone));
    if (align.empty() || align == "epoch") {
      if (!timezone.empty()) return Error(n["timezone"], "'timezone' needs 'align: calendar'");
      return Status::Ok();
    }
    if (align != "calendar")
      return Error(n["align"], "'align' must be calendar or epoch, got " + Quote(align));
    if (r->algorithm != Algorithm::kFixedWindow)
      return Error(n["align"], "'align: calendar' needs algorithm fixed_window");
    const CalendarUnit unit = r->unit == Unit::kDay     ? CalendarUnit::kDay
                              : r->unit == Unit::kWeek  ? CalendarUnit::kWeek
                              : r->unit == Unit::kMonth ? CalendarUnit::kMonth
                              : r->unit == Unit::kYear  ? CalendarUnit::kYear
                                                        : CalendarUnit::kNone;
    if (unit == CalendarUnit::kNone || !period.empty() || multiplier > 1) {
      return Error(n["align"], "'align: calendar' needs unit day, week, month or year (got " +
                                   Quote(unit_text) + "), without 'period' or 'unit_multiplier'");
    }
    StatusOr<std::shared_ptr<const ratelimit::Calendar>> c =
        ratelimit::Calendar::Get(unit, timezone);
    if (!c.ok()) return Error(n["timezone"].IsDefined() ? n["timezone"] : n, c.status().message());
    r->calendar = *std::move(c);
    return Status::Ok();
  }

  Status Descriptors(const YAML::Node& list, Node* parent, const std::string& parent_path,
                     const std::string& composite_prefix) const {
    if (!list.IsDefined() || list.IsNull()) return Status::Ok();
    if (!list.IsSequence()) return Error(list, "'descriptors' must be a list");
    for (const YAML::Node& d : list) {
      RL_RETURN_IF_ERROR(
          CheckMap(d, "a descriptor",
                   {"key", "value", "rate_limit", "rate_limits", "descriptors", "shadow_mode",
                    "detailed_metric", "value_to_metric", "metadata"}));
      Node node;
      RL_RETURN_IF_ERROR(String(d, "key", &node.key));
      RL_RETURN_IF_ERROR(String(d, "value", &node.value));
      if (node.key.empty()) return Error(d, "descriptor has empty key");
      RL_RETURN_IF_ERROR(Bool(d, "shadow_mode", &node.shadow_mode));
      RL_RETURN_IF_ERROR(Bool(d, "detailed_metric", &node.detailed_metric));
      const std::string final_key = node.value.empty() ? node.key : node.key + "_" + node.value;
      node.metric_path = parent_path.empty() ? final_key : parent_path + "." + final_key;
      if (parent->children.count(final_key) != 0) {
        return Error(d,
                     "duplicate descriptor composite key " + Quote(composite_prefix + final_key));
      }
      if (d["rate_limit"].IsDefined() && d["rate_limits"].IsDefined())
        return Error(d["rate_limits"], "give 'rate_limit' or 'rate_limits', not both");
      if (const YAML::Node rl = d["rate_limit"]; rl.IsDefined() && !rl.IsNull()) {
        node.rules.emplace_back();
        RL_RETURN_IF_ERROR(Rule(rl, &node.rules.back()));
      }
      if (const YAML::Node rls = d["rate_limits"]; rls.IsDefined() && !rls.IsNull()) {
        if (!rls.IsSequence() || rls.size() == 0 || rls.size() > 8)
          return Error(rls, "'rate_limits' must be a list of 1 to 8 limits");
        for (const YAML::Node& one : rls) {
          node.rules.emplace_back();
          RL_RETURN_IF_ERROR(Rule(one, &node.rules.back()));
          if (node.rules.back().unlimited)
            return Error(one, "'unlimited' cannot be one of several 'rate_limits'");
        }
      }
      RL_RETURN_IF_ERROR(Descriptors(d["descriptors"], &node, node.metric_path,
                                     composite_prefix + final_key + "."));
      auto [it, inserted] = parent->children.emplace(final_key, std::move(node));
      if (it->second.value.find('*') != std::string::npos) parent->wildcards.push_back(&it->second);
    }
    return Status::Ok();
  }

  Status Domain(const YAML::Node& root, envoy::Domain* out) const {
    if (!root.IsDefined() || root.IsNull()) return Error(root, "the file is empty");
    RL_RETURN_IF_ERROR(CheckMap(root, "the file (top level)", {"domain", "descriptors"}));
    RL_RETURN_IF_ERROR(String(root, "domain", &out->name));
    if (out->name.empty()) return Error(root, "config file cannot have empty domain");
    return Descriptors(root["descriptors"], &out->root, "", "");
  }

 private:
  std::string source_;
};

}  // namespace

StatusOr<Limit> RuleLimit(const Rule& r, std::string name) {
  const int64_t rpu = std::clamp<int64_t>(r.requests_per_unit, 1, Limit::kMaxCount);
  const int64_t count = r.burst != 0 ? r.burst : rpu;
  const double per_second =
      static_cast<double>(r.requests_per_unit == 0 ? 1 : r.requests_per_unit) * 1e6 /
      static_cast<double>(r.period.count());
  switch (r.algorithm) {
    case Algorithm::kTokenBucket: return Limit::TokenBucket(std::move(name), count, per_second);
    case Algorithm::kLeakyBucket: return Limit::LeakyBucket(std::move(name), count, per_second);
    case Algorithm::kSlidingWindow: return Limit::SlidingWindow(std::move(name), rpu, r.period);
    case Algorithm::kSlidingLog: return Limit::SlidingLog(std::move(name), rpu, r.period);
    case Algorithm::kFixedWindow: break;
  }
  if (r.calendar) return Limit::CalendarQuota(std::move(name), rpu, r.calendar);
  return Limit::FixedWindow(std::move(name), rpu, r.period);
}

std::chrono::microseconds UnitLength(Unit unit) {
  switch (unit) {
    case Unit::kSecond: return 1s;
    case Unit::kMinute: return 60s;
    case Unit::kHour: return 3600s;
    case Unit::kDay: return 86400s;
    case Unit::kWeek: return 7 * 86400s;
    case Unit::kMonth: return 30 * 86400s;
    case Unit::kYear: return 365 * 86400s;
    case Unit::kUnknown: break;
  }
  return 0s;
}

Unit ParseUnit(std::string_view text) {
  std::string up(text);
  for (char& c : up) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  for (int u = 1; u <= 7; ++u) {
    if (UnitName(static_cast<Unit>(u)) == up) return static_cast<Unit>(u);
  }
  return Unit::kUnknown;
}

std::string_view UnitName(Unit unit) {
  static constexpr std::string_view kNames[] = {"UNKNOWN", "SECOND", "MINUTE", "HOUR",
                                                "DAY",     "MONTH",  "YEAR",   "WEEK"};
  const auto i = static_cast<size_t>(unit);
  return i < std::size(kNames) ? kNames[i] : "UNKNOWN";
}

Status ParseDomain(std::string_view yaml, std::string_view source_name, Config& config) {
  Parser p(source_name);
  envoy::Domain d;
  d.file = std::string(source_name);
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml));
  } catch (const YAML::Exception& e) {
    return InvalidArgument(std::string(source_name) + ":" + std::to_string(e.mark.line + 1) + ": " +
                           e.msg);
  }
  try {
    RL_RETURN_IF_ERROR(p.Domain(root, &d));
  } catch (const YAML::Exception& e) {
    return InvalidArgument(std::string(source_name) + ":" + std::to_string(e.mark.line + 1) + ": " +
                           e.msg);
  }
  if (auto it = config.domains.find(d.name); it != config.domains.end()) {
    return p.Error(root["domain"],
                   "duplicate domain " + Quote(d.name) + " (also in " + it->second.file + ")");
  }
  std::string name = d.name;
  config.domains.emplace(std::move(name), std::move(d));
  return Status::Ok();
}

namespace {
StatusOr<std::shared_ptr<const Config>> Load(const std::vector<std::string>& files,
                                             std::string source) {
  auto config = std::make_shared<Config>();
  config->source = std::move(source);
  for (const std::string& f : files) {
    std::ifstream in(f, std::ios::binary);
    if (!in) return NotFound(f + ": cannot read the file");
    std::ostringstream text;
    text << in.rdbuf();
    RL_RETURN_IF_ERROR(ParseDomain(text.str(), f, *config));
  }
  return std::shared_ptr<const Config>(std::move(config));
}
}  // namespace

StatusOr<std::shared_ptr<const Config>> LoadFiles(const std::vector<std::string>& files) {
  return Load(files, files.empty() ? "" : files.front());
}

StatusOr<std::shared_ptr<const Config>> LoadDirectory(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::vector<std::string> files;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::path& p = it->path();
    const std::string ext = p.extension().string();
    if ((ext == ".yaml" || ext == ".yml") && p.filename().string()[0] != '.' &&
        it->is_regular_file(ec)) {
      files.push_back(p.string());
    }
  }
  if (ec) return NotFound(dir + ": cannot read the directory: " + ec.message());
  std::sort(files.begin(), files.end());
  return Load(files, dir);
}

}  // namespace ratelimit::envoy
