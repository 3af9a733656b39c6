#include "redis/url.h"

#include <charconv>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "core/percent.h"

namespace ratelimit::redis {
namespace {

Status UrlError(std::string_view what) {
  return InvalidArgument("invalid redis url: " + std::string(what));
}

StatusOr<std::string> PercentDecode(std::string_view in, std::string_view field) {
  std::optional<std::string> out = core::PercentDecode(in);
  if (!out) return UrlError("bad percent-escape in " + std::string(field) + " (expected %XX)");
  return *std::move(out);
}

// Parses a whole decimal string into [min, max].
bool ParseInt(std::string_view s, int64_t min, int64_t max, int64_t* out) {
  if (s.empty()) return false;
  int64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || v < min || v > max) return false;
  *out = v;
  return true;
}

Status ApplyQueryParam(std::string_view key, std::string_view value, Options* o) {
  auto bad = [&](std::string_view expected) {
    return UrlError("query parameter '" + std::string(key) + "=" + std::string(value) +
                    "': expected " + std::string(expected));
  };
  int64_t n = 0;
  if (key == "insecure") {
    if (value != "1" && value != "0" && value != "true" && value != "false") {
      return bad("1, 0, true or false");
    }
    o->tls_verify = !(value == "1" || value == "true");
  } else if (key == "tls_ca_file") {
    o->tls_ca_file = std::string(value);
  } else if (key == "tls_cert_file") {
    o->tls_cert_file = std::string(value);
  } else if (key == "tls_key_file") {
    o->tls_key_file = std::string(value);
  } else if (key == "connect_timeout_ms") {
    if (!ParseInt(value, 1, 3'600'000, &n)) return bad("milliseconds in [1, 3600000]");
    o->connect_timeout = std::chrono::milliseconds(n);
  } else if (key == "command_timeout_ms") {
    if (!ParseInt(value, 1, 3'600'000, &n)) return bad("milliseconds in [1, 3600000]");
    o->command_timeout = std::chrono::milliseconds(n);
    o->from_url.command_timeout = true;
  } else if (key == "connections") {
    if (!ParseInt(value, 1, 1024, &n)) return bad("an integer in [1, 1024]");
    o->connections = static_cast<int>(n);
    o->from_url.connections = true;
  } else if (key == "max_pending") {
    if (!ParseInt(value, 1, 100'000'000, &n)) return bad("an integer in [1, 100000000]");
    o->max_pending = static_cast<int>(n);
    o->from_url.max_pending = true;
  } else {
    return UrlError("unknown query parameter '" + std::string(key) +
                    "' (known: insecure, tls_ca_file, tls_cert_file, tls_key_file, "
                    "connect_timeout_ms, command_timeout_ms, connections, max_pending)");
  }
  return Status::Ok();
}

}  // namespace

StatusOr<Options> ParseRedisUrl(std::string_view url) {
  Options o;
  std::string_view rest;
  if (url.starts_with("redis://")) {
    rest = url.substr(8);
  } else if (url.starts_with("rediss://")) {
    rest = url.substr(9);
    o.tls = true;
  } else {
    return UrlError("'" + std::string(url.substr(0, url.find("://"))) +
                    "': scheme must be redis:// or rediss://");
  }

  std::string_view query;
  if (size_t q = rest.find('?'); q != std::string_view::npos) {
    query = rest.substr(q + 1);
    rest = rest.substr(0, q);
  }
  std::string_view path;
  if (size_t slash = rest.find('/'); slash != std::string_view::npos) {
    path = rest.substr(slash + 1);
    rest = rest.substr(0, slash);
  }

  // userinfo: everything before the last '@' (a password may contain a raw '@').
  if (size_t at = rest.rfind('@'); at != std::string_view::npos) {
    std::string_view userinfo = rest.substr(0, at);
    rest = rest.substr(at + 1);
    size_t colon = userinfo.find(':');
    if (colon == std::string_view::npos) {
      return UrlError("user '" + std::string(userinfo) +
                      "' given without a password; use user:password@ or :password@");
    }
    StatusOr<std::string> user = PercentDecode(userinfo.substr(0, colon), "user");
    if (!user.ok()) return user.status();
    StatusOr<std::string> password = PercentDecode(userinfo.substr(colon + 1), "password");
    if (!password.ok()) return password.status();
    if (password->empty()) return UrlError("empty password after ':'");
    o.user = std::move(*user);
    o.password = std::move(*password);
  }

  // host[:port], host may be "[v6]".
  std::string_view port_text;
  if (rest.starts_with("[")) {
    size_t close = rest.find(']');
    if (close == std::string_view::npos) return UrlError("IPv6 host is missing ']'");
    o.host = std::string(rest.substr(1, close - 1));
    std::string_view after = rest.substr(close + 1);
    if (!after.empty()) {
      if (after[0] != ':') return UrlError("expected ':port' after ']'");
      port_text = after.substr(1);
      if (port_text.empty()) return UrlError("empty port after ':'");
    }
    if (o.host.empty()) return UrlError("empty IPv6 host");
  } else {
    size_t colon = rest.find(':');
    if (colon != rest.rfind(':')) return UrlError("IPv6 host must be in [brackets]");
    o.host = std::string(rest.substr(0, colon));
    if (colon != std::string_view::npos) {
      port_text = rest.substr(colon + 1);
      if (port_text.empty()) return UrlError("empty port after ':'");
    }
  }
  if (o.host.empty()) return UrlError("missing host");
  if (!port_text.empty()) {
    int64_t port = 0;
    if (!ParseInt(port_text, 1, 65535, &port)) {
      return UrlError("port '" + std::string(port_text) + "' is not an integer in [1, 65535]");
    }
    o.port = static_cast<uint16_t>(port);
  }

  if (!path.empty()) {
    int64_t db = 0;
    if (!ParseInt(path, 0, std::numeric_limits<int>::max(), &db)) {
      return UrlError("database '" + std::string(path) + "' is not a non-negative integer");
    }
    o.db = static_cast<int>(db);
  }

  while (!query.empty()) {
    size_t amp = query.find('&');
    std::string_view param = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    if (param.empty()) continue;
    size_t eq = param.find('=');
    if (eq == std::string_view::npos) {
      return UrlError("query parameter '" + std::string(param) + "' has no '=value'");
    }
    StatusOr<std::string> value = PercentDecode(param.substr(eq + 1), "query");
    if (!value.ok()) return value.status();
    Status s = ApplyQueryParam(param.substr(0, eq), *value, &o);
    if (!s.ok()) return s;
  }
  if (!o.tls && (!o.tls_verify || !o.tls_ca_file.empty() || !o.tls_cert_file.empty())) {
    return UrlError("TLS parameters given for a redis:// url; use rediss://");
  }
  if (o.tls_cert_file.empty() != o.tls_key_file.empty()) {
    return UrlError("tls_cert_file and tls_key_file must be given together");
  }
  return o;
}

std::string NodeAddress::ToString() const {
  return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" +
         std::to_string(port);
}

namespace {

// The node scheme of a "redis+<kind>://" or "rediss+<kind>://" url
// ("redis://" or "rediss://") and what follows the scheme; nullopt for
// another scheme.
std::optional<std::pair<std::string_view, std::string_view>> SplitPlusScheme(
    std::string_view url, std::string_view kind) {
  for (std::string_view node : {"redis", "rediss"}) {
    const std::string prefix = std::string(node) + "+" + std::string(kind) + "://";
    if (url.starts_with(prefix)) {
      return std::pair(node == "redis" ? std::string_view("redis://") : "rediss://",
                       url.substr(prefix.size()));
    }
  }
  return std::nullopt;
}

Status PlusSchemeError(std::string_view url, std::string_view kind) {
  return UrlError("'" + std::string(url.substr(0, url.find("://"))) + "': scheme must be redis+" +
                  std::string(kind) + ":// or rediss+" + std::string(kind) + "://");
}

}  // namespace

bool IsClusterUrl(std::string_view url) { return SplitPlusScheme(url, "cluster").has_value(); }

StatusOr<ClusterOptions> ParseClusterUrl(std::string_view url) {
  const auto split = SplitPlusScheme(url, "cluster");
  if (!split) return PlusSchemeError(url, "cluster");
  auto [scheme, rest] = *split;
  // Split like ParseRedisUrl: ?query, /path, userinfo@ (last '@'), then the host list.
  std::string_view query;
  if (size_t q = rest.find('?'); q != std::string_view::npos) {
    query = rest.substr(q);
    rest = rest.substr(0, q);
  }
  if (size_t slash = rest.find('/'); slash != std::string_view::npos) {
    std::string_view path = rest.substr(slash + 1);
    if (!path.empty() && path != "0") {
      return UrlError("a cluster url has no database ('/" + std::string(path) + "')");
    }
    rest = rest.substr(0, slash);
  }
  std::string_view userinfo;
  if (size_t at = rest.rfind('@'); at != std::string_view::npos) {
    userinfo = rest.substr(0, at + 1);
    rest = rest.substr(at + 1);
  }
  ClusterOptions out;
  bool first = true;
  while (true) {
    const size_t comma = rest.find(',');
    const std::string_view host = rest.substr(0, comma);
    if (host.empty()) return UrlError("empty host in the cluster node list");
    std::string one =
        std::string(scheme) + std::string(userinfo) + std::string(host) + std::string(query);
    StatusOr<Options> o = ParseRedisUrl(one);
    if (!o.ok()) return o.status();
    out.seeds.push_back(NodeAddress{o->host, o->port});
    if (first) out.node = *std::move(o);
    first = false;
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  return out;
}

bool IsSentinelUrl(std::string_view url) { return SplitPlusScheme(url, "sentinel").has_value(); }

StatusOr<SentinelOptions> ParseSentinelUrl(std::string_view url) {
  const auto split = SplitPlusScheme(url, "sentinel");
  if (!split) return PlusSchemeError(url, "sentinel");
  auto [scheme, rest] = *split;
  // ?query: sentinel_user, sentinel_password and db are ours; the rest is every node's.
  SentinelOptions out;
  std::string sentinel_user, sentinel_password;
  int64_t db = 0;
  std::string query;
  if (size_t q = rest.find('?'); q != std::string_view::npos) {
    std::string_view params = rest.substr(q + 1);
    rest = rest.substr(0, q);
    while (!params.empty()) {
      const size_t amp = params.find('&');
      const std::string_view param = params.substr(0, amp);
      params = amp == std::string_view::npos ? std::string_view() : params.substr(amp + 1);
      const size_t eq = param.find('=');
      const std::string_view key = param.substr(0, eq);
      if (key != "sentinel_user" && key != "sentinel_password" && key != "db") {
        query += (query.empty() ? "?" : "&") + std::string(param);
        continue;
      }
      StatusOr<std::string> value = PercentDecode(
          eq == std::string_view::npos ? std::string_view() : param.substr(eq + 1), "query");
      if (!value.ok()) return value.status();
      if (key == "db") {
        if (!ParseInt(*value, 0, std::numeric_limits<int>::max(), &db)) {
          return UrlError("query parameter 'db=" + *value + "': expected a non-negative integer");
        }
      } else if (value->empty()) {
        return UrlError("query parameter '" + std::string(key) + "' is empty");
      } else {
        (key == "sentinel_user" ? sentinel_user : sentinel_password) = *std::move(value);
      }
    }
  }
  // /<master-name>
  const size_t slash = rest.find('/');
  if (slash == std::string_view::npos || slash + 1 == rest.size()) {
    return UrlError("a sentinel url names the master after the hosts ('/<master-name>')");
  }
  StatusOr<std::string> name = PercentDecode(rest.substr(slash + 1), "master name");
  if (!name.ok()) return name.status();
  if (name->find_first_of("/ ") != std::string::npos) {
    return UrlError("master name '" + *name + "' has a '/' or a space");
  }
  out.master_name = *std::move(name);
  rest = rest.substr(0, slash);
  std::string_view userinfo;
  if (size_t at = rest.rfind('@'); at != std::string_view::npos) {
    userinfo = rest.substr(0, at + 1);
    rest = rest.substr(at + 1);
  }
  while (true) {
    const size_t comma = rest.find(',');
    const std::string_view host = rest.substr(0, comma);
    if (host.empty()) return UrlError("empty host in the sentinel list");
    StatusOr<Options> o =
        ParseRedisUrl(std::string(scheme) + std::string(userinfo) + std::string(host) + query);
    if (!o.ok()) return o.status();
    // No port given: the sentinels' default, not the data nodes'.
    const bool has_port = !host.ends_with("]") && host.find(':') != std::string_view::npos;
    out.sentinels.push_back(NodeAddress{o->host, has_port ? o->port : uint16_t{26379}});
    if (out.sentinels.size() == 1) out.node = *std::move(o);
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  out.node.db = static_cast<int>(db);
  out.sentinel = out.node;
  out.sentinel.user = std::move(sentinel_user);
  out.sentinel.password = std::move(sentinel_password);
  out.sentinel.db = 0;
  if (!out.sentinel.user.empty() && out.sentinel.password.empty()) {
    return UrlError("sentinel_user given without sentinel_password");
  }
  return out;
}

std::string RedactedUrl(const SentinelOptions& s) {
  std::string out = s.node.tls ? "rediss+sentinel://" : "redis+sentinel://";
  if (!s.node.password.empty()) out += s.node.user + ":***@";
  for (size_t i = 0; i < s.sentinels.size(); ++i) {
    out += (i > 0 ? "," : "") + s.sentinels[i].ToString();
  }
  out += "/" + s.master_name;
  if (s.node.db != 0) out += "?db=" + std::to_string(s.node.db);
  return out;
}

std::string RedactedUrl(const Options& o) {
  std::string out = o.tls ? "rediss://" : "redis://";
  if (!o.password.empty()) out += o.user + ":***@";
  if (o.host.find(':') != std::string::npos) {
    out += "[" + o.host + "]";
  } else {
    out += o.host;
  }
  out += ":" + std::to_string(o.port);
  if (o.db != 0) out += "/" + std::to_string(o.db);
  return out;
}

std::string RedactedUrl(const ClusterOptions& c) {
  std::string out = c.node.tls ? "rediss+cluster://" : "redis+cluster://";
  if (!c.node.password.empty()) out += c.node.user + ":***@";
  for (size_t i = 0; i < c.seeds.size(); ++i) out += (i > 0 ? "," : "") + c.seeds[i].ToString();
  return out;
}

}  // namespace ratelimit::redis
