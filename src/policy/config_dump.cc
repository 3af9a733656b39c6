// DumpRedacted: the effective config as YAML, in the loader's schema, with
// every default spelled out and every secret replaced by "***".
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <system_error>

#include "core/hex.h"
#include "core/limit_fields.h"
#include "core/percent.h"
#include "policy/config.h"

namespace ratelimit::policy {
namespace {

// A string from the config. yaml-cpp 0.7 writes a string holding a carriage
// return as a plain scalar with the raw byte, and a reader takes that byte for
// a line break: `user: "rl\r"` dumped as `user: rl<CR>` read back as "rl"
// (fuzz/regressions/config/server-user-carriage-return). A string with any
// byte outside printable ASCII is written double-quoted, where every control
// character is escaped.
struct YamlString {
  const std::string& s;
};

YAML::Emitter& operator<<(YAML::Emitter& out, YamlString t) {
  const bool quote = std::any_of(t.s.begin(), t.s.end(), [](char c) {
    const auto b = static_cast<unsigned char>(c);
    return b < 0x20 || b >= 0x7f;
  });
  if (quote) out << YAML::DoubleQuoted;
  return out << t.s;
}

// A file path the loader has resolved (joined with the config's folder),
// absolute: the dump loads back the same from any folder. A joined path that
// is still relative ("rl2/tok" for a config loaded as rl2/c.yaml) would be
// joined again ("rl2/rl2/tok") by a load of the dump from elsewhere.
std::string Absolute(const std::string& path) {
  if (path.empty() || path.front() == '/') return path;
  std::error_code ec;
  const std::filesystem::path full = std::filesystem::absolute(path, ec);
  return ec ? path : full.lexically_normal().string();
}

// The fields core::LimitFieldsOf lists (the overrides' JSON takes the same list).
void EmitLimitFields(YAML::Emitter& out, const Limit& l) {
  for (const core::LimitField& f : core::LimitFieldsOf(l)) {
    out << YAML::Key << std::string(f.key) << YAML::Value;
    if (f.kind == core::LimitField::Kind::kInteger) {
      out << f.integer;
    } else if (f.kind == core::LimitField::Kind::kNumber) {
      // Shortest text that reads back as the same double: 0.1, not 0.10000000000000001.
      char buf[32];
      auto [end, ec] = std::to_chars(buf, buf + sizeof buf, f.number);
      out << std::string(buf, ec == std::errc() ? end : buf);
    } else {
      out << YamlString{f.text};
    }
  }
}

void EmitRules(YAML::Emitter& out, const std::vector<RuleLimit>& rules) {
  out << YAML::BeginSeq;
  for (const RuleLimit& r : rules) {
    out << YAML::Flow << YAML::BeginMap;
    out << YAML::Key << "name" << YAML::Value << YamlString{r.limit.name()};
    EmitLimitFields(out, r.limit);
    if (r.shadow) out << YAML::Key << "shadow" << YAML::Value << true;
    if (r.failure_mode) {
      out << YAML::Key << "failure_mode" << YAML::Value
          << std::string(FailureModeName(*r.failure_mode));
    }
    out << YAML::EndMap;
  }
  out << YAML::EndSeq;
}

// A value inside a comment line: a line break in it (a `user` of "a\nb")
// would end the comment and put the rest in the YAML.
std::string CommentText(std::string_view v) {
  std::string out;
  for (char c : v) {
    const auto b = static_cast<unsigned char>(c);
    if (b < 0x20 || b == 0x7f) {
      out += "\\x";
      core::AppendHexByte(out, b);
    } else {
      out += c;
    }
  }
  return out;
}

std::string Millis(std::chrono::milliseconds d) {
  return FormatDuration(std::chrono::duration_cast<std::chrono::microseconds>(d));
}

}  // namespace

namespace {
// "...?sentinel_password=pw&db=1" -> "...?sentinel_password=***&db=1".
std::string RedactQuery(std::string url) {
  const size_t query = url.find('?');
  if (query == std::string::npos) return url;
  const std::string key = "sentinel_password=";
  for (size_t at = url.find(key, query); at != std::string::npos; at = url.find(key, at + 1)) {
    if (url[at - 1] != '?' && url[at - 1] != '&') continue;
    const size_t value = at + key.size();
    url.replace(value, url.find('&', value) - value, "***");
  }
  return url;
}
}  // namespace

std::string RedactUrl(std::string_view url) {
  const size_t scheme = url.find("://");
  if (scheme == std::string_view::npos) return url.empty() ? "" : "***";
  const size_t start = scheme + 3;
  const size_t path = url.find_first_of("/?", start);
  const size_t at = url.rfind('@', path == std::string_view::npos ? url.size() : path);
  if (at == std::string_view::npos || at < start) return RedactQuery(std::string(url));
  std::string_view userinfo = url.substr(start, at - start);
  const size_t colon = userinfo.find(':');
  std::string out(url.substr(0, start));
  // "user:pass@" -> "user:***@"; "pass@" (no colon: a bare password) -> "***@".
  out += colon == std::string_view::npos ? std::string("***")
                                         : std::string(userinfo.substr(0, colon)) + ":***";
  out += url.substr(at);
  return RedactQuery(std::move(out));
}

std::string DumpRedacted(const Config& c) {
  YAML::Emitter out;
  out << YAML::BeginMap;

  const ServerConfig& s = c.server;
  out << YAML::Key << "server" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "listen" << YAML::Value << YamlString{s.listen};
  out << YAML::Key << "admin_listen" << YAML::Value << YamlString{s.admin_listen};
  out << YAML::Key << "admin_token_file" << YAML::Value << YamlString{Absolute(s.admin_token_file)};
  out << YAML::Key << "upstream" << YAML::Value << YamlString{s.upstream};
  out << YAML::Key << "demo" << YAML::Value << s.demo;
  out << YAML::Key << "headers" << YAML::Value << std::string(HeaderDialectName(s.headers));
  out << YAML::Key << "threads" << YAML::Value << s.threads;
  out << YAML::Key << "max_body_bytes" << YAML::Value << s.max_body_bytes;
  out << YAML::Key << "max_header_bytes" << YAML::Value << s.max_header_bytes;
  out << YAML::Key << "max_connections" << YAML::Value << s.max_connections;
  out << YAML::Key << "max_held_requests" << YAML::Value << s.max_held_requests;
  out << YAML::Key << "max_connections_per_ip" << YAML::Value << s.max_connections_per_ip;
  out << YAML::Key << "max_requests_per_second_per_connection" << YAML::Value
      << s.max_requests_per_second_per_connection;
  out << YAML::Key << "read_timeout" << YAML::Value << Millis(s.read_timeout);
  out << YAML::Key << "idle_timeout" << YAML::Value << Millis(s.idle_timeout);
  out << YAML::Key << "user" << YAML::Value << YamlString{s.user};
  out << YAML::Key << "group" << YAML::Value << YamlString{s.group};
  out << YAML::Key << "grpc_listen" << YAML::Value << YamlString{s.grpc_listen};
  out << YAML::EndMap;

  const StoreConfig& st = c.store;
  out << YAML::Key << "store" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "type" << YAML::Value
      << (st.type == StoreConfig::Type::kRedis ? "redis" : "memory");
  if (!st.url.empty()) {
    out << YAML::Key << "url" << YAML::Value
        << YamlString{RedactUrl(MapRedisUrlFiles(st.url, Absolute))};
  }
  out << YAML::Key << "deadline" << YAML::Value << Millis(st.deadline);
  out << YAML::Key << "key_prefix" << YAML::Value << YamlString{st.key_prefix};
  out << YAML::Key << "time_source" << YAML::Value
      << (st.time_source == StoreConfig::TimeSource::kRedis ? "redis" : "local");
  out << YAML::Key << "failure_mode" << YAML::Value
      << std::string(FailureModeName(st.failure_mode));
  out << YAML::Key << "closed_status" << YAML::Value << st.closed_status;
  out << YAML::Key << "expected_instances" << YAML::Value << st.expected_instances;
  out << YAML::Key << "max_keys" << YAML::Value << st.max_keys;
  out << YAML::Key << "max_key_length" << YAML::Value << st.max_key_length;
  out << YAML::Key << "connections" << YAML::Value << st.connections;
  out << YAML::Key << "max_pending" << YAML::Value << st.max_pending;
  out << YAML::Key << "breaker" << YAML::Value << YAML::Flow << YAML::BeginMap;
  out << YAML::Key << "failures" << YAML::Value << st.breaker.failures;
  out << YAML::Key << "open_for" << YAML::Value << Millis(st.breaker.open_for);
  out << YAML::Key << "max_open_for" << YAML::Value << Millis(st.breaker.max_open_for);
  out << YAML::EndMap;
  out << YAML::Key << "reconnect_max_backoff" << YAML::Value << Millis(st.reconnect_max_backoff);
  out << YAML::Key << "local_max_keys" << YAML::Value << st.local_max_keys;
  out << YAML::EndMap;

  const ClientConfig& cl = c.clients;
  out << YAML::Key << "clients" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "api_key_header" << YAML::Value << YamlString{cl.api_key_header};
  out << YAML::Key << "user_header" << YAML::Value << YamlString{cl.user_header};
  out << YAML::Key << "trusted_proxies" << YAML::Value << YAML::Flow << YAML::BeginSeq;
  for (const Cidr& cidr : cl.trusted_proxies) out << cidr.ToString();
  out << YAML::EndSeq;
  out << YAML::Key << "client_ip_header" << YAML::Value
      << std::string(ClientIpHeaderName(cl.client_ip_header));
  out << YAML::Key << "ipv6_prefix" << YAML::Value << cl.ipv6_prefix;
  out << YAML::Key << "accept_unknown_api_keys" << YAML::Value << cl.accept_unknown_api_keys;
  out << YAML::EndMap;

  out << YAML::Key << "limits" << YAML::Value << YAML::BeginMap;
  for (const auto& [name, limit] : c.named_limits) {
    out << YAML::Key << YamlString{name} << YAML::Value << YAML::Flow << YAML::BeginMap;
    EmitLimitFields(out, limit);
    out << YAML::EndMap;
  }
  out << YAML::EndMap;

  out << YAML::Key << "plans" << YAML::Value << YAML::BeginMap;
  for (const auto& [name, plan] : c.plans) {
    out << YAML::Key << YamlString{name} << YAML::Value << YAML::BeginMap;
    out << YAML::Key << "limits" << YAML::Value;
    EmitRules(out, plan.limits);
    out << YAML::EndMap;
  }
  out << YAML::EndMap;
  out << YAML::Key << "default_plan" << YAML::Value << YamlString{c.default_plan};

  // API keys are secrets: show how many map to which plan, never the key.
  // (An empty map when there are none, so that such a dump loads back.)
  out << YAML::Key << "api_keys" << YAML::Value;
  if (c.api_keys.empty()) {
    out << YAML::Flow << YAML::BeginMap << YAML::EndMap;
  } else {
    out << YAML::BeginSeq;
    for (const auto& [key, plan] : c.api_keys) {
      out << YAML::Flow << YAML::BeginMap << YAML::Key << "***" << YAML::Value << YamlString{plan}
          << YAML::EndMap;
    }
    out << YAML::EndSeq;
  }
  if (!c.api_keys_file.empty())
    out << YAML::Key << "api_keys_file" << YAML::Value
        << YamlString{Absolute(RelativeTo(FolderOf(c.source), c.api_keys_file))};

  out << YAML::Key << "global" << YAML::Value;
  EmitRules(out, c.global_limits);

  out << YAML::Key << "routes" << YAML::Value << YAML::BeginSeq;
  for (const RouteClass& r : c.routes) {
    out << YAML::BeginMap;
    out << YAML::Key << "name" << YAML::Value << YamlString{r.name};
    out << YAML::Key << "methods" << YAML::Value << YAML::Flow << r.methods;
    // The canonical bytes percent-encoded where they are not printable ASCII
    // (a canonical route path holds no '%', space or control character, so
    // only bytes from 0x80 up are): such bytes may be there (raw in the file
    // or decoded from an escape such as %FF), and YAML text is Unicode. The
    // emitter turned bytes that are not UTF-8 into U+FFFD, and an overlong
    // pair such as C1 BF into a DEL, which the reload refused
    // (fuzz/regressions/config/route-path-invalid-utf8). Encoded, the dump
    // loads back to the same canonical bytes (the loader decodes a route path
    // once, as it decodes request paths).
    const std::string path = core::PercentEncode(r.path);
    out << YAML::Key << "path" << YAML::Value << YamlString{path};
    out << YAML::Key << "match" << YAML::Value
        << (r.match == RouteClass::Match::kExact    ? "exact"
            : r.match == RouteClass::Match::kPrefix ? "prefix"
                                                    : "template");
    out << YAML::Key << "key_by" << YAML::Value
        << (r.key_by == RouteClass::KeyBy::kIp ? "ip" : "client");
    if (const std::optional<MeteredCost>& m = r.metered) {
      out << YAML::Key << "cost" << YAML::Value << YAML::Flow << YAML::BeginMap;
      if (m->source != MeteredCost::Source::kReserve) {
        out << YAML::Key << std::string(CostSourceName(m->source)) << YAML::Value
            << YamlString{m->request_field};
      }
      if (m->reserve) out << YAML::Key << "reserve" << YAML::Value << *m->reserve;
      out << YAML::Key << "settle_from" << YAML::Value
          << std::string(SettleFromName(m->settle_from));
      out << YAML::Key << "field" << YAML::Value << YamlString{m->field};
      if (m->max) out << YAML::Key << "max" << YAML::Value << *m->max;
      if (!m->unit.empty()) out << YAML::Key << "unit" << YAML::Value << YamlString{m->unit};
      out << YAML::EndMap;
    } else {
      out << YAML::Key << "cost" << YAML::Value << r.cost;
    }
    out << YAML::Key << "shadow" << YAML::Value << r.shadow;
    if (r.failure_mode) {
      out << YAML::Key << "failure_mode" << YAML::Value
          << std::string(FailureModeName(*r.failure_mode));
    }
    out << YAML::Key << "limits" << YAML::Value;
    EmitRules(out, r.limits);
    if (const std::optional<ConcurrencyConfig>& cc = r.concurrency) {
      const bool waits = cc->on_limit == ConcurrencyConfig::OnLimit::kWait;
      out << YAML::Key << "concurrency" << YAML::Value << YAML::Flow << YAML::BeginMap;
      out << YAML::Key << "max_in_flight" << YAML::Value << cc->max_in_flight;
      out << YAML::Key << "lease_ttl" << YAML::Value << FormatDuration(cc->lease_ttl);
      out << YAML::Key << "per" << YAML::Value
          << (cc->per == ConcurrencyConfig::Per::kRoute ? "route" : "client");
      out << YAML::Key << "on_limit" << YAML::Value << (waits ? "wait" : "reject");
      if (waits) {
        out << YAML::Key << "max_wait" << YAML::Value << FormatDuration(cc->max_wait);
        out << YAML::Key << "max_waiting" << YAML::Value << cc->max_waiting;
      }
      out << YAML::EndMap;
    }
    out << YAML::EndMap;
  }
  out << YAML::EndSeq;
  out << YAML::Key << "envoy" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "config_dir" << YAML::Value << YamlString{Absolute(c.envoy.config_dir)};
  out << YAML::Key << "failure_mode" << YAML::Value << YamlString{c.envoy.failure_mode};
  out << YAML::Key << "headers" << YAML::Value << std::string(HeaderDialectName(c.envoy.headers));
  out << YAML::EndMap;
  out << YAML::EndMap;
  // Comments, so that the dump still loads back as the config in effect.
  std::string text = "# effective config from " + c.source + " (secrets redacted)\n";
  if (!c.pending_restart.empty()) {
    text += "# waiting for a restart (read from the file at the last reload, not in effect):\n";
    for (const PendingSetting& p : c.pending_restart) {
      text += "#   " + p.name + ": " + CommentText(p.value) + "\n";
    }
  }
  text += out.c_str();
  text += '\n';
  return text;
}

}  // namespace ratelimit::policy
