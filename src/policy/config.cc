// The YAML loader: YAML text -> Config, or one precise error
// "<file>:<line>: <what>". The schema is documented field by field in
// docs/configuration.md; keep the two in step.
#include "policy/config.h"

#include <thread>
#include "core/ascii.h"

#include <yaml-cpp/yaml.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <set>
#include <sstream>
#include <utility>

#include "core/percent.h"
#include "core/return_if_error.h"
#include "core/utf8.h"
#include "policy/policy.h"
#include "ratelimit/concurrency.h"

namespace ratelimit::policy {
namespace {

using core::Quote;
// Printable ASCII without space: what an API key, user id or plan may hold.
bool IsVisibleAscii(std::string_view s) {
  for (char c : s) {
    if (c < 0x21 || c > 0x7e) return false;
  }
  return true;
}

bool IsHeaderName(std::string_view s) {
  for (char c : s) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
    if (!ok) return false;
  }
  return !s.empty();
}

// "host:port", "[v6]:port"; port 0..65535 (0: any free port, for tests).
bool IsListenAddress(std::string_view s) {
  const size_t colon = s.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return false;
  std::string_view port = s.substr(colon + 1);
  int p = 0;
  auto [ptr, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
  if (port.empty() || ec != std::errc() || ptr != port.data() + port.size() || p < 0 || p > 65535) {
    return false;
  }
  std::string_view host = s.substr(0, colon);
  if (host.front() == '[') return host.size() > 2 && host.back() == ']';
  return host.find(':') == std::string_view::npos;
}

// An HTTP field name (RFC 9110 token characters).
bool IsToken(std::string_view s) {
  for (char c : s) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
    if (!ok) return false;
  }
  return true;
}

std::string Join(std::initializer_list<std::string_view> items) {
  std::string out;
  for (std::string_view i : items) {
    if (!out.empty()) out += ", ";
    out += i;
  }
  return out;
}

class Loader {
 public:
  Loader(std::string source, std::string base_dir)
      : source_(std::move(source)), base_dir_(std::move(base_dir)) {}

  Status Load(const YAML::Node& root, Config* c);

 private:
  // ---- errors -------------------------------------------------------------
  Status Error(const YAML::Node& at, std::string_view what) const {
    return ErrorAt(at.Mark().line, what);
  }
  Status ErrorAt(int zero_based_line, std::string_view what) const {
    std::string m = source_;
    if (zero_based_line >= 0) m += ":" + std::to_string(zero_based_line + 1);
    m += ": ";
    m += what;
    return InvalidArgument(std::move(m));
  }
  // Prefixes a builder's message ("limit 'x': capacity must be positive") with file:line.
  Status Wrap(const YAML::Node& at, const Status& s) const {
    return s.ok() ? s : Error(at, s.message());
  }

  // ---- structure ----------------------------------------------------------
  // `n` must be a map (or null = empty) whose keys are all in `allowed`.
  Status CheckMap(const YAML::Node& n, std::string_view what,
                  std::initializer_list<std::string_view> allowed) const {
    if (!n.IsDefined() || n.IsNull()) return Status::Ok();
    if (!n.IsMap()) return Error(n, std::string(what) + " must be a map of keys to values");
    std::set<std::string> seen;
    for (const auto& kv : n) {
      if (!kv.first.IsScalar())
        return Error(kv.first, "keys in " + std::string(what) + " must be plain strings");
      const std::string& key = kv.first.Scalar();
      bool ok = false;
      for (std::string_view a : allowed) ok = ok || a == key;
      if (!ok) {
        return Error(kv.first, "unknown key " + Quote(key) + " in " + std::string(what) +
                                   " (expected one of: " + Join(allowed) + ")");
      }
      if (!seen.insert(key).second) {
        return Error(kv.first, "duplicate key " + Quote(key) + " in " + std::string(what));
      }
    }
    return Status::Ok();
  }

  static YAML::Node Get(const YAML::Node& map, const char* key) {
    // A missing key yields an invalid ("zombie") node whose accessors throw:
    // hand out a plain undefined node instead.
    if (!map.IsDefined() || !map.IsMap()) return YAML::Node(YAML::NodeType::Undefined);
    YAML::Node n = map[key];
    return n.IsDefined() ? n : YAML::Node(YAML::NodeType::Undefined);
  }

  Status Scalar(const YAML::Node& n, std::string_view field, std::string* out) const {
    if (!n.IsScalar()) {
      return Error(n, Quote(field) + " must be a single value, not " +
                          (n.IsNull()  ? "empty"
                           : n.IsMap() ? "a map"
                                       : "a list"));
    }
    *out = n.Scalar();
    return Status::Ok();
  }

  Status String(const YAML::Node& map, const char* key, std::string* out) const {
    YAML::Node n = Get(map, key);
    if (!n.IsDefined()) return Status::Ok();
    return Scalar(n, key, out);
  }

  // A quoted scalar ("10") is a string in YAML: numbers and booleans must be
  // written plain, so that a string never passes for one by accident.
  Status Plain(const YAML::Node& n, std::string_view field, std::string_view kind) const {
    if (n.Tag() != "!") return Status::Ok();
    return Error(n, Quote(field) + " must be a plain " + std::string(kind) +
                        ", not a quoted string: " + "write " + n.Scalar() + ", not \"" +
                        n.Scalar() + "\"");
  }

  Status Int(const YAML::Node& n, std::string_view field, int64_t* out) const {
    std::string s;
    RL_RETURN_IF_ERROR(Scalar(n, field, &s));
    RL_RETURN_IF_ERROR(Plain(n, field, "number"));
    int64_t v = 0;
    const char* b = s.data() + (!s.empty() && s[0] == '+' ? 1 : 0);
    auto [ptr, ec] = std::from_chars(b, s.data() + s.size(), v);
    if (s.empty() || ec != std::errc() || ptr != s.data() + s.size()) {
      double d = 0;
      auto [dp, dec] = std::from_chars(s.data(), s.data() + s.size(), d);
      if (!s.empty() && dec == std::errc() && dp == s.data() + s.size()) {
        return Error(n, Quote(field) + " must be a whole number, got " + s);
      }
      return Error(n, Quote(field) + " must be a whole number, got " + Quote(s));
    }
    *out = v;
    return Status::Ok();
  }

  template <typename T>
  Status IntIn(const YAML::Node& map, const char* key, int64_t min, int64_t max, T* out) const {
    YAML::Node n = Get(map, key);
    if (!n.IsDefined()) return Status::Ok();
    int64_t v = 0;
    RL_RETURN_IF_ERROR(Int(n, key, &v));
    if (v < min || v > max) {
      return Error(n, Quote(key) + " must be between " + std::to_string(min) + " and " +
                          std::to_string(max) + ", got " + std::to_string(v));
    }
    *out = static_cast<T>(v);
    return Status::Ok();
  }

  Status Double(const YAML::Node& n, std::string_view field, double* out) const {
    std::string s;
    RL_RETURN_IF_ERROR(Scalar(n, field, &s));
    RL_RETURN_IF_ERROR(Plain(n, field, "number"));
    double d = 0;
    const char* b = s.data() + (!s.empty() && s[0] == '+' ? 1 : 0);
    auto [ptr, ec] = std::from_chars(b, s.data() + s.size(), d);
    if (s.empty() || ec != std::errc() || ptr != s.data() + s.size() || !std::isfinite(d)) {
      return Error(n, Quote(field) + " must be a number, got " + Quote(s));
    }
    *out = d;
    return Status::Ok();
  }

  Status Bool(const YAML::Node& map, const char* key, bool* out) const {
    YAML::Node n = Get(map, key);
    if (!n.IsDefined()) return Status::Ok();
    std::string s;
    RL_RETURN_IF_ERROR(Scalar(n, key, &s));
    RL_RETURN_IF_ERROR(Plain(n, key, "true or false"));
    if (s == "true") {
      *out = true;
    } else if (s == "false") {
      *out = false;
    } else {
      return Error(n, Quote(key) + " must be true or false, got " + Quote(s));
    }
    return Status::Ok();
  }

  Status Millis(const YAML::Node& map, const char* key, std::chrono::milliseconds* out) const {
    YAML::Node n = Get(map, key);
    if (!n.IsDefined()) return Status::Ok();
    std::string s;
    RL_RETURN_IF_ERROR(Scalar(n, key, &s));
    StatusOr<std::chrono::microseconds> d = ParseDuration(s);
    if (!d.ok()) return Error(n, Quote(key) + ": " + d.status().message());
    if (d->count() % 1000 != 0) return Error(n, Quote(key) + " must be whole milliseconds");
    *out = std::chrono::duration_cast<std::chrono::milliseconds>(*d);
    return Status::Ok();
  }

  // One of `names` (index into `values`).
  template <typename E>
  Status Enum(const YAML::Node& map, const char* key,
              std::initializer_list<std::pair<std::string_view, E>> values, E* out) const {
    YAML::Node n = Get(map, key);
    if (!n.IsDefined()) return Status::Ok();
    std::string s;
    RL_RETURN_IF_ERROR(Scalar(n, key, &s));
    std::string expected;
    for (const auto& [name, v] : values) {
      if (s == name) {
        *out = v;
        return Status::Ok();
      }
      if (!expected.empty()) expected += ", ";
      expected += name;
    }
    return Error(n,
                 "unknown " + std::string(key) + " " + Quote(s) + " (expected " + expected + ")");
  }

  // `headers:` (server, envoy).
  Status Dialect(const YAML::Node& map, HeaderDialect* out) const {
    return Enum<HeaderDialect>(
        map, "headers",
        {{HeaderDialectName(HeaderDialect::kDraft06), HeaderDialect::kDraft06},
         {HeaderDialectName(HeaderDialect::kStructured), HeaderDialect::kStructured},
         {HeaderDialectName(HeaderDialect::kLegacy), HeaderDialect::kLegacy},
         {HeaderDialectName(HeaderDialect::kNone), HeaderDialect::kNone}},
        out);
  }

  Status Failure(const YAML::Node& map, std::optional<FailureMode>* out) const {
    if (!Get(map, "failure_mode").IsDefined()) return Status::Ok();
    FailureMode m = FailureMode::kOpen;
    RL_RETURN_IF_ERROR(
        Enum<FailureMode>(map, "failure_mode",
                          {{FailureModeName(FailureMode::kOpen), FailureMode::kOpen},
                           {FailureModeName(FailureMode::kClosed), FailureMode::kClosed},
                           {FailureModeName(FailureMode::kLocal), FailureMode::kLocal}},
                          &m));
    *out = m;
    return Status::Ok();
  }

  // ---- sections -----------------------------------------------------------
  Status Server(const YAML::Node& n, ServerConfig* s);
  Status Store(const YAML::Node& n, StoreConfig* s);
  Status ClusterNodes(const YAML::Node& n, StoreConfig* s);
  Status Clients(const YAML::Node& n, ClientConfig* s);
  Status Envoy(const YAML::Node& n, EnvoySection* e);
  // A limit definition: `spec` holds algorithm and its parameters.
  Status WindowFields(const YAML::Node& spec, const std::string& what, ratelimit::LimitSpec* out);
  Status LimitSpec(const YAML::Node& spec, const std::string& name, const YAML::Node& name_node,
                   std::optional<Limit>* out);
  // Records a definition; the same name twice must mean the same limit.
  Status Define(const Limit& limit, const YAML::Node& at);
  // A list of limit entries (route, plan, global).
  Status Entries(const YAML::Node& n, const std::string& what, std::vector<RuleLimit>* out);
  Status Route(const YAML::Node& n, RouteClass* r);
  Status Concurrency(const YAML::Node& n, const std::string& what, ConcurrencyConfig* c);
  Status Metered(const YAML::Node& n, const std::string& what, RouteClass* r);
  Status ApiKeysFile(const std::string& path, const YAML::Node& at, Config* c);

  std::string source_;
  std::string base_dir_;
  std::map<std::string, int> defined_line_;  // limit name -> 0-based line of its definition
  std::map<std::string, Limit> top_level_;   // `limits:` (what references may name)
  Config* config_ = nullptr;
};

Status Loader::Server(const YAML::Node& n, ServerConfig* s) {
  RL_RETURN_IF_ERROR(CheckMap(
      n, "server",
      {"listen", "admin_listen", "admin_token_file", "upstream", "demo", "headers", "threads",
       "max_body_bytes", "max_header_bytes", "max_connections", "max_connections_per_ip",
       "max_requests_per_second_per_connection", "max_held_requests", "read_timeout",
       "idle_timeout", "user", "group", "grpc_listen"}));
  RL_RETURN_IF_ERROR(String(n, "listen", &s->listen));
  if (!IsListenAddress(s->listen)) {
    return Error(Get(n, "listen"), "'listen' must be host:port, got " + Quote(s->listen));
  }
  RL_RETURN_IF_ERROR(String(n, "admin_listen", &s->admin_listen));
  if (!s->admin_listen.empty() && !IsListenAddress(s->admin_listen)) {
    return Error(Get(n, "admin_listen"),
                 "'admin_listen' must be host:port or \"\", got " + Quote(s->admin_listen));
  }
  RL_RETURN_IF_ERROR(String(n, "grpc_listen", &s->grpc_listen));
  if (!s->grpc_listen.empty() && !IsListenAddress(s->grpc_listen)) {
    return Error(Get(n, "grpc_listen"),
                 "'grpc_listen' must be host:port, got " + Quote(s->grpc_listen));
  }
  RL_RETURN_IF_ERROR(String(n, "admin_token_file", &s->admin_token_file));
  s->admin_token_file = RelativeTo(base_dir_, s->admin_token_file);
  RL_RETURN_IF_ERROR(String(n, "upstream", &s->upstream));
  if (!s->upstream.empty() && s->upstream.rfind("http://", 0) != 0) {
    return Error(Get(n, "upstream"),
                 "'upstream' must start with http://, got " + Quote(s->upstream));
  }
  RL_RETURN_IF_ERROR(Bool(n, "demo", &s->demo));
  if (s->demo && !s->upstream.empty()) {
    // The demo answers "/", "/index.html" and "/demo/state" itself: in front
    // of an upstream it would hide the upstream's own pages.
    return Error(Get(n, "demo"),
                 "'demo' serves '/', '/index.html' and '/demo/state' itself and would hide "
                 "the upstream's: set 'demo' or 'upstream', not both");
  }
  RL_RETURN_IF_ERROR(Dialect(n, &s->headers));
  RL_RETURN_IF_ERROR(IntIn(n, "threads", 0, 1024, &s->threads));
  RL_RETURN_IF_ERROR(IntIn(n, "max_body_bytes", 1, int64_t{1} << 30, &s->max_body_bytes));
  RL_RETURN_IF_ERROR(IntIn(n, "max_header_bytes", 1024, 1 << 20, &s->max_header_bytes));
  RL_RETURN_IF_ERROR(IntIn(n, "max_connections", 1, 10'000'000, &s->max_connections));
  RL_RETURN_IF_ERROR(IntIn(n, "max_held_requests", 0, 10'000'000, &s->max_held_requests));
  RL_RETURN_IF_ERROR(IntIn(n, "max_connections_per_ip", 0, 10'000'000, &s->max_connections_per_ip));
  RL_RETURN_IF_ERROR(IntIn(n, "max_requests_per_second_per_connection", 0, 10'000'000,
                           &s->max_requests_per_second_per_connection));
  RL_RETURN_IF_ERROR(Millis(n, "read_timeout", &s->read_timeout));
  RL_RETURN_IF_ERROR(Millis(n, "idle_timeout", &s->idle_timeout));
  RL_RETURN_IF_ERROR(String(n, "user", &s->user));
  RL_RETURN_IF_ERROR(String(n, "group", &s->group));
  if (s->user.empty() && !s->group.empty()) {
    return Error(Get(n, "group"), "'group' needs 'user' (the privilege drop switches both)");
  }
  return Status::Ok();
}

Status Loader::Store(const YAML::Node& n, StoreConfig* s) {
  RL_RETURN_IF_ERROR(
      CheckMap(n, "store",
               {"type", "url", "deadline", "key_prefix", "time_source", "failure_mode",
                "closed_status", "expected_instances", "max_keys", "max_key_length", "connections",
                "max_pending", "breaker", "reconnect_max_backoff", "local_max_keys", "nodes"}));
  RL_RETURN_IF_ERROR(Enum<StoreConfig::Type>(
      n, "type", {{"memory", StoreConfig::Type::kMemory}, {"redis", StoreConfig::Type::kRedis}},
      &s->type));
  RL_RETURN_IF_ERROR(String(n, "url", &s->url));
  // Its TLS files, like every file the config names, relative to its folder.
  s->url = MapRedisUrlFiles(s->url, [&](const std::string& f) { return RelativeTo(base_dir_, f); });
  RL_RETURN_IF_ERROR(ClusterNodes(n, s));
  if (s->type == StoreConfig::Type::kRedis) {
    if (s->url.empty()) return Error(n, "store type redis needs a 'url' (redis://host:6379)");
    if (Status bad = CheckStoreUrlScheme(s->url); !bad.ok()) {
      return Error(Get(n, "url"), "store 'url' " + bad.message());
    }
  } else if (!s->url.empty()) {
    return Error(Get(n, "url"), "store 'url' is only used with type: redis");
  }
  RL_RETURN_IF_ERROR(Millis(n, "deadline", &s->deadline));
  RL_RETURN_IF_ERROR(String(n, "key_prefix", &s->key_prefix));
  if (s->key_prefix.size() > 64 || !IsVisibleAscii(s->key_prefix) ||
      s->key_prefix.find_first_of("{}") != std::string::npos) {
    return Error(Get(n, "key_prefix"),
                 "store 'key_prefix' must be at most 64 visible characters without '{' or '}'");
  }
  RL_RETURN_IF_ERROR(Enum<StoreConfig::TimeSource>(
      n, "time_source",
      {{"redis", StoreConfig::TimeSource::kRedis}, {"local", StoreConfig::TimeSource::kLocal}},
      &s->time_source));
  std::optional<FailureMode> fm;
  RL_RETURN_IF_ERROR(Failure(n, &fm));
  if (fm) s->failure_mode = *fm;
  if (YAML::Node cs = Get(n, "closed_status"); cs.IsDefined()) {
    int64_t v = 0;
    RL_RETURN_IF_ERROR(Int(cs, "closed_status", &v));
    if (v != 429 && v != 503) {
      return Error(cs, "'closed_status' must be 429 or 503, got " + std::to_string(v));
    }
    s->closed_status = static_cast<int>(v);
  }
  RL_RETURN_IF_ERROR(IntIn(n, "expected_instances", 1, 10'000, &s->expected_instances));
  RL_RETURN_IF_ERROR(IntIn(n, "max_keys", 1, int64_t{1} << 40, &s->max_keys));
  // At least the longest key the daemon makes itself ("k:" or "u:" and an
  // identity of up to 200 characters; a concurrency key adds a little): a
  // shorter bound would load and then refuse those clients' every request.
  RL_RETURN_IF_ERROR(IntIn(n, "max_key_length", 256, 65'536, &s->max_key_length));
  RL_RETURN_IF_ERROR(IntIn(n, "connections", 1, 64, &s->connections));
  RL_RETURN_IF_ERROR(IntIn(n, "max_pending", 1, 10'000'000, &s->max_pending));
  RL_RETURN_IF_ERROR(IntIn(n, "local_max_keys", 1, int64_t{1} << 40, &s->local_max_keys));
  RL_RETURN_IF_ERROR(Millis(n, "reconnect_max_backoff", &s->reconnect_max_backoff));
  if (s->reconnect_max_backoff < std::chrono::milliseconds(10) ||
      s->reconnect_max_backoff > std::chrono::minutes(1)) {
    return Error(Get(n, "reconnect_max_backoff"),
                 "store 'reconnect_max_backoff' must be between 10ms (the first backoff) and 1m");
  }
  if (YAML::Node b = Get(n, "breaker"); b.IsDefined() && !b.IsNull()) {
    RL_RETURN_IF_ERROR(CheckMap(b, "breaker", {"failures", "open_for", "max_open_for"}));
    StoreConfig::Breaker& br = s->breaker;
    RL_RETURN_IF_ERROR(IntIn(b, "failures", 1, 1'000'000, &br.failures));
    RL_RETURN_IF_ERROR(Millis(b, "open_for", &br.open_for));
    RL_RETURN_IF_ERROR(Millis(b, "max_open_for", &br.max_open_for));
    if (br.open_for.count() < 1) {
      return Error(Get(b, "open_for"), "breaker 'open_for' must be at least 1ms");
    }
    if (br.max_open_for < br.open_for) {
      YAML::Node at = Get(b, "max_open_for").IsDefined() ? Get(b, "max_open_for") : b;
      return Error(at, "breaker 'max_open_for' must be at least 'open_for' (" +
                           std::to_string(br.open_for.count()) + "ms)");
    }
  }
  return Status::Ok();
}

// `nodes: [host:port, ...]`: Redis Cluster seed nodes, added to the host list
// of a redis+cluster:// or rediss+cluster:// `url` (which then holds only the
// credentials and options, e.g. "rediss+cluster://rl:secret@?tls_ca_file=..."),
// or making the url "redis+cluster://<nodes>" when there is none.
Status Loader::ClusterNodes(const YAML::Node& n, StoreConfig* s) {
  YAML::Node nodes = Get(n, "nodes");
  if (!nodes.IsDefined()) return Status::Ok();
  if (!nodes.IsSequence() || nodes.size() == 0) {
    return Error(nodes, "store 'nodes' must be a non-empty list of host:port");
  }
  std::string list;
  for (const YAML::Node& e : nodes) {
    std::string node;
    RL_RETURN_IF_ERROR(Scalar(e, "nodes", &node));
    const size_t colon = node.rfind(':');
    if (node.empty() || colon == std::string::npos || colon == 0 || colon + 1 == node.size() ||
        node.find_first_of(",@/?# \t") != std::string::npos) {
      return Error(e, "store 'nodes' entries must be host:port, got " + Quote(node));
    }
    list += (list.empty() ? "" : ",") + node;
  }
  if (s->type != StoreConfig::Type::kRedis) {
    return Error(nodes, "store 'nodes' is only used with type: redis");
  }
  if (s->url.empty()) {
    s->url = "redis+cluster://" + list;
    return Status::Ok();
  }
  const size_t scheme_end = s->url.find("://");
  const std::string scheme = s->url.substr(0, scheme_end);
  if (scheme_end == std::string::npos ||
      (scheme != "redis+cluster" && scheme != "rediss+cluster")) {
    return Error(nodes,
                 "store 'nodes' needs a redis+cluster:// or rediss+cluster:// 'url' (or none)");
  }
  // The host list runs from after the userinfo to the first '/' or '?'.
  const size_t start = scheme_end + 3;
  size_t end = s->url.find_first_of("/?", start);
  if (end == std::string::npos) end = s->url.size();
  const size_t at = s->url.rfind('@', end);
  const size_t hosts = at != std::string::npos && at >= start ? at + 1 : start;
  s->url.insert(end, hosts == end ? list : "," + list);
  return Status::Ok();
}

Status Loader::Envoy(const YAML::Node& n, EnvoySection* e) {
  RL_RETURN_IF_ERROR(CheckMap(n, "envoy", {"config_dir", "failure_mode", "headers"}));
  RL_RETURN_IF_ERROR(String(n, "config_dir", &e->config_dir));
  // Relative to the config file's folder, like api_keys_file.
  if (!e->config_dir.empty() && e->config_dir[0] != '/' && !base_dir_.empty())
    e->config_dir = base_dir_ + "/" + e->config_dir;
  RL_RETURN_IF_ERROR(String(n, "failure_mode", &e->failure_mode));
  // Every mode, `error` too: the gRPC face answers UNAVAILABLE with it.
  if (const std::string& m = e->failure_mode; !m.empty() && !ParseFailureMode(m).ok()) {
    return Error(Get(n, "failure_mode"),
                 "'failure_mode' must be open, closed, local or error, got " + Quote(m));
  }
  return Dialect(n, &e->headers);
}

Status Loader::Clients(const YAML::Node& n, ClientConfig* s) {
  RL_RETURN_IF_ERROR(CheckMap(n, "clients",
                              {"api_key_header", "user_header", "trusted_proxies",
                               "client_ip_header", "ipv6_prefix", "accept_unknown_api_keys"}));
  for (const char* key : {"api_key_header", "user_header"}) {
    std::string* out =
        key == std::string_view("api_key_header") ? &s->api_key_header : &s->user_header;
    RL_RETURN_IF_ERROR(String(n, key, out));
    if (!out->empty() && !IsHeaderName(*out)) {
      return Error(Get(n, key), Quote(key) + " is not a valid header name: " + Quote(*out));
    }
  }
  if (YAML::Node tp = Get(n, "trusted_proxies"); tp.IsDefined() && !tp.IsNull()) {
    if (!tp.IsSequence()) return Error(tp, "'trusted_proxies' must be a list of CIDRs");
    for (const YAML::Node& e : tp) {
      std::string text;
      RL_RETURN_IF_ERROR(Scalar(e, "trusted_proxies", &text));
      StatusOr<Cidr> c = Cidr::Parse(text);
      if (!c.ok()) return Error(e, c.status().message());
      s->trusted_proxies.push_back(*c);
    }
  }
  RL_RETURN_IF_ERROR(Enum<ClientIpHeader>(
      n, "client_ip_header",
      {{ClientIpHeaderName(ClientIpHeader::kAny), ClientIpHeader::kAny},
       {ClientIpHeaderName(ClientIpHeader::kForwarded), ClientIpHeader::kForwarded},
       {ClientIpHeaderName(ClientIpHeader::kXForwardedFor), ClientIpHeader::kXForwardedFor}},
      &s->client_ip_header));
  RL_RETURN_IF_ERROR(IntIn(n, "ipv6_prefix", 0, 128, &s->ipv6_prefix));
  RL_RETURN_IF_ERROR(Bool(n, "accept_unknown_api_keys", &s->accept_unknown_api_keys));
  return Status::Ok();
}

// A window algorithm's `window`, with `align` and `timezone` for a calendar
// quota; each error points at the field it is about.
Status Loader::WindowFields(const YAML::Node& spec, const std::string& what,
                            ratelimit::LimitSpec* out) {
  std::string window, align, timezone;
  RL_RETURN_IF_ERROR(Scalar(spec["window"], "window", &window));
  std::optional<std::string_view> align_field, timezone_field;
  YAML::Node align_node = Get(spec, "align"), timezone_node = Get(spec, "timezone");
  if (align_node.IsDefined()) {
    RL_RETURN_IF_ERROR(Scalar(align_node, "align", &align));
    align_field = align;
  }
  if (timezone_node.IsDefined()) {
    RL_RETURN_IF_ERROR(Scalar(timezone_node, "timezone", &timezone));
    timezone_field = timezone;
  }
  Status s = ApplyWindowFields(*out, window, align_field, timezone_field);
  if (s.ok() && out->calendar != CalendarUnit::kNone) {
    // The time zone is looked up now, so that its error points at it.
    if (StatusOr<std::shared_ptr<const Calendar>> c = Calendar::Get(out->calendar, out->timezone);
        !c.ok()) {
      return Error(timezone_node.IsDefined() ? timezone_node : spec,
                   what + ": " + c.status().message());
    }
  }
  if (s.ok()) return s;
  const std::string_view m = s.message();
  const YAML::Node at = m.starts_with("timezone") && timezone_node.IsDefined() ? timezone_node
                        : m.starts_with("align") && align_node.IsDefined()     ? align_node
                                                                               : spec["window"];
  return Error(at, what + ": " + std::string(m));
}

Status Loader::LimitSpec(const YAML::Node& spec, const std::string& name,
                         const YAML::Node& name_node, std::optional<Limit>* out) {
  const std::string what = "limit " + Quote(name);
  if (Status s = ValidateLimitName(name); !s.ok()) return Wrap(name_node, s);
  YAML::Node alg_node = Get(spec, "algorithm");
  if (!alg_node.IsDefined()) return Error(spec, what + " needs an 'algorithm'");
  std::string alg_text;
  RL_RETURN_IF_ERROR(Scalar(alg_node, "algorithm", &alg_text));
  StatusOr<Algorithm> alg = ParseAlgorithm(alg_text);
  if (!alg.ok()) return Wrap(alg_node, alg.status());
  // The two fields each algorithm takes: count, then rate or window.
  const std::string count_key(SpecFieldNames(*alg).first);
  const std::string second_key(SpecFieldNames(*alg).second);
  for (const char* key :
       {"capacity", "refill_per_second", "depth", "rate_per_second", "limit", "window"}) {
    const bool belongs = std::string_view(key) == count_key || std::string_view(key) == second_key;
    YAML::Node n = Get(spec, key);
    if (belongs && !n.IsDefined()) return Error(spec, what + " needs " + Quote(key));
    if (!belongs && n.IsDefined()) {
      return Error(n, what + ": " + Quote(key) + " does not apply to " + alg_text + " (it takes " +
                          count_key + " and " + second_key + ")");
    }
  }
  StatusOr<Limit> limit = Status(StatusCode::kInternal, "unset");
  ratelimit::LimitSpec limit_spec{.name = name, .algorithm = *alg};
  if (TakesRate(*alg)) {
    RL_RETURN_IF_ERROR(Int(spec[count_key], count_key, &limit_spec.count));
    RL_RETURN_IF_ERROR(Double(spec[second_key], second_key, &limit_spec.per_second));
    limit = MakeLimit(std::move(limit_spec));
    if (!limit.ok()) {
      const bool rate_error = limit.status().message().find(second_key) != std::string::npos ||
                              limit.status().message().find("366 days") != std::string::npos;
      return Wrap(rate_error ? spec[second_key] : spec[count_key], limit.status());
    }
  } else {
    RL_RETURN_IF_ERROR(Int(spec["limit"], "limit", &limit_spec.count));
    RL_RETURN_IF_ERROR(WindowFields(spec, what, &limit_spec));
    limit = MakeLimit(std::move(limit_spec));
    if (!limit.ok()) {
      const bool window_error = limit.status().message().find("window") != std::string::npos &&
                                limit.status().message().find("limit must") == std::string::npos;
      return Wrap(window_error ? spec["window"] : spec["limit"], limit.status());
    }
  }
  if (TakesRate(*alg)) {
    for (const char* key : {"align", "timezone"}) {
      if (YAML::Node n = Get(spec, key); n.IsDefined())
        return Error(n, what + ": " + Quote(key) + " is for fixed_window only, not " + alg_text);
    }
  }
  // Token prefetch: `prefetch: n`; `lease: n` is its old name, still accepted.
  for (const char* key : {"prefetch", "lease"}) {
    if (YAML::Node node = Get(spec, key); node.IsDefined()) {
      int64_t n = 0;
      RL_RETURN_IF_ERROR(Int(node, key, &n));
      limit = limit->WithPrefetch(n, key);
      if (!limit.ok()) return Error(node, what + ": " + limit.status().message());
    }
  }
  // A block period (issue 21): `block_for: 10m` after a denial.
  if (YAML::Node node = Get(spec, "block_for"); node.IsDefined()) {
    std::string text;
    RL_RETURN_IF_ERROR(Scalar(node, "block_for", &text));
    StatusOr<std::chrono::microseconds> d = ParseDuration(text);
    if (!d.ok()) return Error(node, what + ": block_for: " + d.status().message());
    limit = limit->WithBlockFor(*d);
    if (!limit.ok()) return Error(node, what + ": " + limit.status().message());
  }
  *out = *limit;
  return Status::Ok();
}

Status Loader::Define(const Limit& limit, const YAML::Node& at) {
  auto it = config_->named_limits.find(limit.name());
  if (it == config_->named_limits.end()) {
    config_->named_limits.emplace(limit.name(), limit);
    defined_line_[limit.name()] = at.Mark().line;
    return Status::Ok();
  }
  if (it->second == limit) return Status::Ok();
  return Error(at, "limit " + Quote(limit.name()) +
                       " is defined twice with different parameters (" + limit.ToString() +
                       " here, " + it->second.ToString() + " at line " +
                       std::to_string(defined_line_[limit.name()] + 1) +
                       "); a limit name is its identity in the store: pick another name");
}

Status Loader::Entries(const YAML::Node& n, const std::string& what, std::vector<RuleLimit>* out) {
  if (!n.IsDefined() || n.IsNull()) return Status::Ok();
  if (!n.IsSequence()) {
    return Error(n, "the limits of " + what + " must be a list (of limit names or limit maps)");
  }
  std::set<std::string> names;
  for (const YAML::Node& e : n) {
    RuleLimit rule{.limit = *Limit::TokenBucket("x", 1, 1)};
    std::string name;
    if (e.IsScalar()) {
      name = e.Scalar();
      auto it = top_level_.find(name);
      if (it == top_level_.end()) {
        return Error(e, "unknown limit " + Quote(name) + " in " + what +
                            " (define it under 'limits:', or write it inline with an algorithm)");
      }
      rule.limit = it->second;
    } else if (e.IsMap()) {
      RL_RETURN_IF_ERROR(CheckMap(e, "limit of " + what,
                                  {"name", "algorithm", "capacity", "refill_per_second", "depth",
                                   "rate_per_second", "limit", "window", "align", "timezone",
                                   "prefetch", "lease", "block_for", "shadow", "failure_mode"}));
      YAML::Node name_node = Get(e, "name");
      if (!name_node.IsDefined()) return Error(e, "a limit in " + what + " needs a 'name'");
      RL_RETURN_IF_ERROR(Scalar(name_node, "name", &name));
      if (Get(e, "algorithm").IsDefined()) {
        std::optional<Limit> limit;
        RL_RETURN_IF_ERROR(LimitSpec(e, name, name_node, &limit));
        RL_RETURN_IF_ERROR(Define(*limit, name_node));
        rule.limit = *limit;
      } else {
        for (const char* key :
             {"capacity", "refill_per_second", "depth", "rate_per_second", "limit", "window",
              "align", "timezone", "prefetch", "lease", "block_for"}) {
          if (Get(e, key).IsDefined()) {
            return Error(Get(e, key), Quote(key) + " given without an 'algorithm' in limit " +
                                          Quote(name) + " of " + what);
          }
        }
        auto it = top_level_.find(name);
        if (it == top_level_.end()) {
          return Error(name_node, "unknown limit " + Quote(name) + " in " + what +
                                      " (define it under 'limits:', or give an 'algorithm')");
        }
        rule.limit = it->second;
      }
      RL_RETURN_IF_ERROR(Bool(e, "shadow", &rule.shadow));
      RL_RETURN_IF_ERROR(Failure(e, &rule.failure_mode));
    } else {
      return Error(e, "a limit in " + what + " must be a limit name or a map");
    }
    if (!names.insert(name).second) {
      return Error(e, "limit " + Quote(name) + " appears twice in " + what);
    }
    out->push_back(std::move(rule));
  }
  return Status::Ok();
}

}  // namespace

StatusOr<std::string> CanonicalRoutePath(std::string_view path, RouteClass::Match match) {
  if (path.empty() || path[0] != '/') return InvalidArgument("must start with '/'");
  if (path.find_first_of("?#") != std::string_view::npos) {
    return InvalidArgument("must not contain '?' or '#' (the query is not matched)");
  }
  if (path.find(';') != std::string_view::npos) {
    return InvalidArgument(
        "must not contain ';' (path parameters are dropped from request paths before "
        "matching: '/login;x=1' is '/login')");
  }
  StatusOr<std::string> canonical = CanonicalPath(path);
  if (!canonical.ok()) return canonical.status();
  // The same rule for what the escapes decode to: a config that loads must
  // compile (Policy::Create canonicalizes the loaded path again).
  if (canonical->find_first_of("?#") != std::string::npos) {
    return InvalidArgument("must not contain '?' or '#' (the query is not matched)");
  }
  // An escaped ';' is data in a request path ("/a%3Bb" is "/a;b"), but a
  // canonical route path holding it would read as a parameter the next time
  // it is canonicalized (Policy::Create, a reload of the dumped config).
  if (canonical->find(';') != std::string::npos) {
    return InvalidArgument("must not contain an escaped ';' (%3B)");
  }
  const bool braces = canonical->find_first_of("{}") != std::string::npos;
  if (match != RouteClass::Match::kTemplate) {
    if (braces)
      return InvalidArgument("contains '{' or '}': use match: template for {param} segments");
    return canonical;
  }
  size_t pos = 1;
  while (pos <= canonical->size()) {
    size_t end = canonical->find('/', pos);
    if (end == std::string::npos) end = canonical->size();
    std::string_view seg(canonical->data() + pos, end - pos);
    pos = end + 1;
    if (seg.find_first_of("{}") == std::string_view::npos) continue;
    bool ok = seg.size() > 2 && seg.front() == '{' && seg.back() == '}';
    for (size_t i = 1; ok && i + 1 < seg.size(); ++i) {
      const char c = seg[i];
      ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
    }
    if (!ok) {
      return InvalidArgument("has a bad '{' in segment " + Quote(seg) +
                             ": a parameter is a whole segment like {id} (letters, digits, _)");
    }
  }
  return canonical;
}

namespace {

Status Loader::Route(const YAML::Node& n, RouteClass* r) {
  if (!n.IsMap()) return Error(n, "a route must be a map (name, path, limits, ...)");
  r->source_line = n.Mark().line + 1;
  // The name first, so that every message about this route names it.
  YAML::Node name = Get(n, "name");
  if (name.IsDefined() && name.IsScalar()) r->name = name.Scalar();
  const std::string what = r->name.empty() ? "route" : "route " + Quote(r->name);
  RL_RETURN_IF_ERROR(CheckMap(n, what,
                              {"name", "methods", "path", "match", "key_by", "cost", "shadow",
                               "failure_mode", "limits", "concurrency"}));
  if (!name.IsDefined()) return Error(n, "a route needs a 'name'");
  RL_RETURN_IF_ERROR(Scalar(name, "name", &r->name));
  if (Status s = ValidateLimitName(r->name); !s.ok()) {
    return Error(
        name, "route name " + Quote(r->name) + " must be 1..64 letters, digits, '_', '-' or '.'");
  }
  if (YAML::Node m = Get(n, "methods"); m.IsDefined()) {
    if (!m.IsSequence())
      return Error(m, "'methods' of " + what + " must be a list like [GET, POST]");
    for (const YAML::Node& e : m) {
      std::string method;
      RL_RETURN_IF_ERROR(Scalar(e, "methods", &method));
      bool ok = !method.empty() && method.size() <= 32;
      for (char& c : method) {
        if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
        ok = ok && c >= 'A' && c <= 'Z';
      }
      if (!ok) return Error(e, "invalid HTTP method " + Quote(e.Scalar()) + " in " + what);
      r->methods.push_back(std::move(method));
    }
  }
  RL_RETURN_IF_ERROR(Enum<RouteClass::Match>(n, "match",
                                             {{"exact", RouteClass::Match::kExact},
                                              {"prefix", RouteClass::Match::kPrefix},
                                              {"template", RouteClass::Match::kTemplate}},
                                             &r->match));
  YAML::Node path = Get(n, "path");
  if (!path.IsDefined()) return Error(n, what + " has no 'path'");
  std::string raw;
  RL_RETURN_IF_ERROR(Scalar(path, "path", &raw));
  StatusOr<std::string> canonical = CanonicalRoutePath(raw, r->match);
  if (!canonical.ok()) {
    return Error(path, "path " + Quote(raw) + " of " + what + " " + canonical.status().message());
  }
  // A route path is decoded once, like request paths; what is left must be
  // plain (no '%', no space), so that compiling it again changes nothing.
  if (canonical->find_first_of("% ") != std::string::npos) {
    return Error(path,
                 "path " + Quote(raw) + " of " + what +
                     " decodes to a '%' or a space; route paths must be plain after decoding");
  }
  r->path = *canonical;
  RL_RETURN_IF_ERROR(Enum<RouteClass::KeyBy>(
      n, "key_by", {{"client", RouteClass::KeyBy::kClient}, {"ip", RouteClass::KeyBy::kIp}},
      &r->key_by));
  RL_RETURN_IF_ERROR(Bool(n, "shadow", &r->shadow));
  RL_RETURN_IF_ERROR(Failure(n, &r->failure_mode));
  RL_RETURN_IF_ERROR(Entries(Get(n, "limits"), what, &r->limits));
  if (YAML::Node cc = Get(n, "concurrency"); cc.IsDefined()) {
    r->concurrency.emplace();
    RL_RETURN_IF_ERROR(Concurrency(cc, what, &*r->concurrency));
  }
  if (YAML::Node cost = Get(n, "cost"); cost.IsDefined() && cost.IsMap()) {
    RL_RETURN_IF_ERROR(Metered(cost, what, r));
  } else if (cost.IsDefined()) {
    RL_RETURN_IF_ERROR(Int(cost, "cost", &r->cost));
    if (r->cost < 0)
      return Error(cost,
                   "cost of " + what + " must not be negative, got " + std::to_string(r->cost));
    for (const RuleLimit& rl : r->limits) {
      if (Status s = rl.limit.ValidateCost(r->cost); !s.ok()) {
        return Error(cost, "cost of " + what + ": " + s.message());
      }
    }
  }
  return Status::Ok();
}

// cost: {reserve | from_request_header | from_request_json, settle_from, field, max}
Status Loader::Metered(const YAML::Node& n, const std::string& what, RouteClass* r) {
  const std::string where = "cost of " + what;
  RL_RETURN_IF_ERROR(CheckMap(n, where,
                              {"reserve", "from_request_header", "from_request_json", "settle_from",
                               "field", "max", "unit"}));
  MeteredCost m;
  if (const YAML::Node unit = Get(n, "unit"); unit.IsDefined()) {
    RL_RETURN_IF_ERROR(Scalar(unit, "unit", &m.unit));
    // Sent inside an sf-string (qu="tokens"): lower-case letters, digits and '-'.
    const bool ok = !m.unit.empty() && m.unit.size() <= 32 &&
                    std::all_of(m.unit.begin(), m.unit.end(), [](char c) {
                      return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-';
                    });
    if (!ok) {
      return Error(unit, "'unit' of " + where +
                             " must be 1-32 lower-case letters, digits or '-' (e.g. tokens), got " +
                             Quote(m.unit));
    }
    if (m.unit == "requests") m.unit.clear();  // the draft's default: no qu
  }
  const YAML::Node header = Get(n, "from_request_header"), json = Get(n, "from_request_json");
  if (header.IsDefined() && json.IsDefined()) {
    return Error(json, where + " takes from_request_header or from_request_json, not both");
  }
  if (header.IsDefined()) {
    m.source = MeteredCost::Source::kRequestHeader;
    RL_RETURN_IF_ERROR(Scalar(header, "from_request_header", &m.request_field));
    if (m.request_field.empty() || !IsToken(m.request_field)) {
      return Error(header, "from_request_header of " + what + " must be a header name, got " +
                               Quote(m.request_field));
    }
  } else if (json.IsDefined()) {
    m.source = MeteredCost::Source::kRequestJson;
    RL_RETURN_IF_ERROR(Scalar(json, "from_request_json", &m.request_field));
    m.request_path = SplitJsonPath(m.request_field);
    if (m.request_path.empty()) {
      return Error(json, "from_request_json of " + what +
                             " must be a JSON path like max_tokens or a.b.c, got " +
                             Quote(m.request_field));
    }
  }
  for (const char* key : {"reserve", "max"}) {
    YAML::Node v = Get(n, key);
    if (!v.IsDefined()) continue;
    int64_t x = 0;
    RL_RETURN_IF_ERROR(Int(v, key, &x));
    if (x < 0 || (x == 0 && std::string_view(key) == "max")) {
      return Error(v, Quote(key) + " of " + where + " must be " +
                          (std::string_view(key) == "max" ? "positive" : "zero or more") +
                          ", got " + std::to_string(x));
    }
    (std::string_view(key) == "max" ? m.max : m.reserve) = x;
  }
  if (m.source == MeteredCost::Source::kReserve && !m.reserve) {
    return Error(n, where +
                        " needs 'reserve' (the cost checked before forwarding), "
                        "'from_request_header' or 'from_request_json'");
  }
  if (m.reserve && m.max && *m.reserve > *m.max) {
    return Error(Get(n, "reserve"), "'reserve' of " + where + " (" + std::to_string(*m.reserve) +
                                        ") is above its 'max' (" + std::to_string(*m.max) + ")");
  }
  const YAML::Node from = Get(n, "settle_from");
  if (!from.IsDefined()) {
    return Error(n, where +
                        " needs 'settle_from' (response_header, response_trailer or "
                        "sse_last_event); a fixed cost is a plain number");
  }
  RL_RETURN_IF_ERROR(Enum<MeteredCost::SettleFrom>(
      n, "settle_from",
      {{"response_header", MeteredCost::SettleFrom::kResponseHeader},
       {"response_trailer", MeteredCost::SettleFrom::kResponseTrailer},
       {"sse_last_event", MeteredCost::SettleFrom::kSseLastEvent}},
      &m.settle_from));
  const YAML::Node field = Get(n, "field");
  const bool json_field = m.settle_from == MeteredCost::SettleFrom::kSseLastEvent;
  if (!field.IsDefined()) {
    return Error(n, where + " needs 'field': " +
                        (json_field ? "the JSON path of the actual cost in the event's data, "
                                      "like usage.total_tokens"
                                    : "the name of the header that carries the actual cost"));
  }
  RL_RETURN_IF_ERROR(Scalar(field, "field", &m.field));
  if (json_field ? SplitJsonPath(m.field).empty() : (m.field.empty() || !IsToken(m.field))) {
    return Error(field, "'field' of " + where + " must be " +
                            (json_field ? "a JSON path like usage.total_tokens" : "a header name") +
                            ", got " + Quote(m.field));
  }
  if (json_field) m.field_path = SplitJsonPath(m.field);
  r->cost = m.reserve.value_or(1);
  for (const RuleLimit& rl : r->limits) {
    if (Status s = CheckMeteredLimit(rl.limit); !s.ok())
      return Error(n, where + ": " + s.message());
    for (std::optional<int64_t> c : {m.reserve, m.max}) {
      if (!c) continue;
      if (Status s = rl.limit.ValidateCost(*c); !s.ok()) {
        return Error(n, where + ": " + s.message());
      }
    }
  }
  r->metered = std::move(m);
  return Status::Ok();
}

Status Loader::Concurrency(const YAML::Node& n, const std::string& what, ConcurrencyConfig* c) {
  const std::string where = "concurrency of " + what;
  if (!n.IsMap()) {
    return Error(n, Quote("concurrency") + " of " + what +
                        " must be a map like {max_in_flight: 3, lease_ttl: 30s}");
  }
  RL_RETURN_IF_ERROR(CheckMap(
      n, where, {"max_in_flight", "lease_ttl", "per", "on_limit", "max_wait", "max_waiting"}));
  if (!Get(n, "max_in_flight").IsDefined()) return Error(n, where + " needs 'max_in_flight'");
  RL_RETURN_IF_ERROR(IntIn(n, "max_in_flight", 1, kMaxInFlight, &c->max_in_flight));
  RL_RETURN_IF_ERROR(Millis(n, "lease_ttl", &c->lease_ttl));
  if (c->lease_ttl < std::chrono::milliseconds(10) ||
      c->lease_ttl > std::chrono::duration_cast<std::chrono::milliseconds>(kMaxLeaseTtl)) {
    return Error(Get(n, "lease_ttl"), "'lease_ttl' of " + what + " must be between 10ms and 24h");
  }
  RL_RETURN_IF_ERROR(Enum<ConcurrencyConfig::Per>(
      n, "per",
      {{"client", ConcurrencyConfig::Per::kClient}, {"route", ConcurrencyConfig::Per::kRoute}},
      &c->per));
  RL_RETURN_IF_ERROR(
      Enum<ConcurrencyConfig::OnLimit>(n, "on_limit",
                                       {{"reject", ConcurrencyConfig::OnLimit::kReject},
                                        {"wait", ConcurrencyConfig::OnLimit::kWait}},
                                       &c->on_limit));
  const bool waits = c->on_limit == ConcurrencyConfig::OnLimit::kWait;
  for (const char* key : {"max_wait", "max_waiting"}) {
    if (Get(n, key).IsDefined() && !waits) {
      return Error(Get(n, key), Quote(key) + " of " + what + " applies only with on_limit: wait");
    }
  }
  RL_RETURN_IF_ERROR(Millis(n, "max_wait", &c->max_wait));
  if (c->max_wait < std::chrono::milliseconds(1) || c->max_wait > std::chrono::minutes(10)) {
    return Error(Get(n, "max_wait"), "'max_wait' of " + what + " must be between 1ms and 10m");
  }
  RL_RETURN_IF_ERROR(IntIn(n, "max_waiting", 1, 1'000'000, &c->max_waiting));
  return Status::Ok();
}

Status Loader::ApiKeysFile(const std::string& path, const YAML::Node& at, Config* c) {
  const std::string full = RelativeTo(base_dir_, path);
  StatusOr<std::string> text = ReadTextFile(full);
  if (!text.ok()) {
    return Error(at, "cannot read api_keys_file " + Quote(full) + ": " + text.status().message());
  }
  std::istringstream in(*text);
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    const std::string where = full + ":" + std::to_string(number) + ": ";
    if (!line.empty() && line.back() == '\r') line.pop_back();
    std::istringstream fields(line);
    std::string key, plan, extra;
    fields >> key;
    if (key.empty() || key[0] == '#') continue;
    fields >> plan >> extra;
    if (plan.empty() || (!extra.empty() && extra[0] != '#')) {
      return InvalidArgument(where + "expected '<api key> <plan>'");
    }
    if (key.size() > 200 || !IsVisibleAscii(key)) {
      return InvalidArgument(where + "an API key must be 1..200 visible ASCII characters");
    }
    if (!c->plans.count(plan))
      return InvalidArgument(where + "API key maps to unknown plan " + Quote(plan));
    if (!c->api_keys.emplace(key, plan).second) {
      return InvalidArgument(where + "this API key is listed twice");
    }
  }
  return Status::Ok();
}

Status Loader::Load(const YAML::Node& root, Config* c) {
  config_ = c;
  if (!root.IsDefined() || root.IsNull()) return ErrorAt(0, "the config is empty");
  RL_RETURN_IF_ERROR(CheckMap(root, "the config (top level)",
                              {"server", "store", "clients", "limits", "plans", "default_plan",
                               "api_keys", "api_keys_file", "global", "routes", "envoy"}));
  RL_RETURN_IF_ERROR(Server(Get(root, "server"), &c->server));
  RL_RETURN_IF_ERROR(Store(Get(root, "store"), &c->store));
  RL_RETURN_IF_ERROR(Clients(Get(root, "clients"), &c->clients));

  if (YAML::Node limits = Get(root, "limits"); limits.IsDefined()) {
    if (!limits.IsNull() && !limits.IsMap())
      return Error(limits, "'limits' must be a map of name: limit");
    for (const auto& kv : limits) {
      std::string name;
      RL_RETURN_IF_ERROR(Scalar(kv.first, "limits", &name));
      if (top_level_.count(name)) return Error(kv.first, "duplicate limit " + Quote(name));
      RL_RETURN_IF_ERROR(
          CheckMap(kv.second, "limit " + Quote(name),
                   {"algorithm", "capacity", "refill_per_second", "depth", "rate_per_second",
                    "limit", "window", "align", "timezone", "prefetch", "lease", "block_for"}));
      std::optional<Limit> limit;
      RL_RETURN_IF_ERROR(LimitSpec(kv.second, name, kv.first, &limit));
      RL_RETURN_IF_ERROR(Define(*limit, kv.first));
      top_level_.emplace(name, *limit);
    }
  }

  if (YAML::Node plans = Get(root, "plans"); plans.IsDefined()) {
    if (!plans.IsNull() && !plans.IsMap())
      return Error(plans, "'plans' must be a map of name: plan");
    for (const auto& kv : plans) {
      Plan p;
      RL_RETURN_IF_ERROR(Scalar(kv.first, "plans", &p.name));
      if (Status s = ValidateLimitName(p.name); !s.ok()) {
        return Error(kv.first, "plan name " + Quote(p.name) +
                                   " must be 1..64 letters, digits, '_', '-' or '.'");
      }
      if (c->plans.count(p.name)) return Error(kv.first, "duplicate plan " + Quote(p.name));
      const std::string what = "plan " + Quote(p.name);
      RL_RETURN_IF_ERROR(CheckMap(kv.second, what, {"limits"}));
      RL_RETURN_IF_ERROR(Entries(Get(kv.second, "limits"), what, &p.limits));
      c->plans.emplace(p.name, std::move(p));
    }
  }

  if (YAML::Node dp = Get(root, "default_plan"); dp.IsDefined()) {
    RL_RETURN_IF_ERROR(Scalar(dp, "default_plan", &c->default_plan));
    if (!c->default_plan.empty() && !c->plans.count(c->default_plan)) {
      return Error(dp, "default_plan " + Quote(c->default_plan) + " is not a plan under 'plans:'");
    }
  }

  if (YAML::Node keys = Get(root, "api_keys"); keys.IsDefined() && !keys.IsNull()) {
    if (!keys.IsMap()) return Error(keys, "'api_keys' must be a map of \"key\": plan");
    for (const auto& kv : keys) {
      // Never echo an API key in an error: it is a secret.
      std::string key, plan;
      RL_RETURN_IF_ERROR(Scalar(kv.first, "api_keys", &key));
      RL_RETURN_IF_ERROR(Scalar(kv.second, "api_keys", &plan));
      if (key.empty() || key.size() > 200 || !IsVisibleAscii(key)) {
        return Error(kv.first, "an API key must be 1..200 visible ASCII characters");
      }
      if (!c->plans.count(plan))
        return Error(kv.second, "API key maps to unknown plan " + Quote(plan));
      if (!c->api_keys.emplace(key, plan).second)
        return Error(kv.first, "this API key is listed twice");
    }
  }
  if (YAML::Node file = Get(root, "api_keys_file"); file.IsDefined()) {
    RL_RETURN_IF_ERROR(Scalar(file, "api_keys_file", &c->api_keys_file));
    if (!c->api_keys_file.empty()) RL_RETURN_IF_ERROR(ApiKeysFile(c->api_keys_file, file, c));
  }

  RL_RETURN_IF_ERROR(Entries(Get(root, "global"), "global", &c->global_limits));
  RL_RETURN_IF_ERROR(Envoy(Get(root, "envoy"), &c->envoy));

  if (YAML::Node routes = Get(root, "routes"); routes.IsDefined() && !routes.IsNull()) {
    if (!routes.IsSequence()) return Error(routes, "'routes' must be a list of routes");
    std::map<std::string, int> lines;
    for (const YAML::Node& rn : routes) {
      RouteClass r;
      RL_RETURN_IF_ERROR(Route(rn, &r));
      if (auto [it, fresh] = lines.emplace(r.name, r.source_line); !fresh) {
        return Error(Get(rn, "name"), "duplicate route name " + Quote(r.name) + " (first at line " +
                                          std::to_string(it->second) + ")");
      }
      c->routes.push_back(std::move(r));
    }
  }
  return Status::Ok();
}

}  // namespace

std::string_view CostSourceName(MeteredCost::Source s) {
  switch (s) {
    case MeteredCost::Source::kReserve: return "reserve";
    case MeteredCost::Source::kRequestHeader: return "from_request_header";
    case MeteredCost::Source::kRequestJson: return "from_request_json";
  }
  return "reserve";
}

std::string_view SettleFromName(MeteredCost::SettleFrom s) {
  switch (s) {
    case MeteredCost::SettleFrom::kResponseHeader: return "response_header";
    case MeteredCost::SettleFrom::kResponseTrailer: return "response_trailer";
    case MeteredCost::SettleFrom::kSseLastEvent: return "sse_last_event";
  }
  return "response_header";
}

Status CheckMeteredLimit(const Limit& limit) {
  if (limit.settleable()) return Status::Ok();
  return InvalidArgument("limit " + Quote(limit.name()) + " is a " +
                         (limit.calendar() != nullptr ? "calendar quota" : "sliding_log") +
                         ", which cannot be settled; use a token_bucket, fixed_window or "
                         "sliding_window for a metered cost");
}

std::vector<std::string> SplitJsonPath(std::string_view path) {
  std::vector<std::string> out;
  while (true) {
    const size_t dot = path.find('.');
    std::string_view seg = path.substr(0, dot);
    if (seg.empty()) return {};
    out.emplace_back(seg);
    if (dot == std::string_view::npos) return out;
    path.remove_prefix(dot + 1);
  }
}

std::string_view HeaderDialectName(HeaderDialect d) {
  switch (d) {
    case HeaderDialect::kDraft06: return "draft06";
    case HeaderDialect::kStructured: return "structured";
    case HeaderDialect::kLegacy: return "legacy";
    case HeaderDialect::kNone: return "none";
  }
  return "draft06";
}

std::string_view ClientIpHeaderName(ClientIpHeader h) {
  switch (h) {
    case ClientIpHeader::kAny: return "any";
    case ClientIpHeader::kForwarded: return "Forwarded";
    case ClientIpHeader::kXForwardedFor: return "X-Forwarded-For";
  }
  return "any";
}

StatusOr<Config> ParseConfig(std::string_view yaml, std::string_view source_name,
                             const std::string& base_dir) {
  Config c;
  c.source = std::string(source_name);
  // YAML text is Unicode. yaml-cpp reads UTF-8 without checking it, and the
  // config's dump (DumpRedacted) could not write such bytes back: its
  // emitter turns them into U+FFFD, or an overlong pair into a control
  // character. UTF-16 and UTF-32 files (a byte-order mark) are left to
  // yaml-cpp, which converts them.
  const bool other_encoding = yaml.starts_with("\xFF\xFE") || yaml.starts_with("\xFE\xFF") ||
                              yaml.starts_with(std::string_view("\0\0\xFE\xFF", 4));
  if (const size_t bad = core::Utf8ValidPrefix(yaml); bad != yaml.size() && !other_encoding) {
    const size_t line = 1 + static_cast<size_t>(std::count(yaml.begin(), yaml.begin() + bad, '\n'));
    return InvalidArgument(c.source + ":" + std::to_string(line) +
                           ": not valid UTF-8 (a config file is UTF-8 text; write other bytes "
                           "of a path as %XX)");
  }
  Loader loader(c.source, base_dir);
  try {
    YAML::Node root = YAML::Load(std::string(yaml));
    if (Status s = loader.Load(root, &c); !s.ok()) return s;
  } catch (const YAML::Exception& e) {
    std::string m = c.source;
    if (!e.mark.is_null()) m += ":" + std::to_string(e.mark.line + 1);
    return InvalidArgument(m + ": invalid YAML: " + e.msg);
  } catch (const std::exception& e) {
    return InvalidArgument(c.source + ": " + e.what());
  }
  return c;
}

StatusOr<Config> ParseConfig(std::string_view yaml, std::string_view source_name) {
  return ParseConfig(yaml, source_name, "");
}

StatusOr<std::string> ReadTextFile(const std::string& path) {
  // open(2) and fstat(2) directly: a directory opens fine but is no file, and
  // errno says why a file cannot be read ("Permission denied").
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  // NOLINTNEXTLINE(concurrency-mt-unsafe): read at start and on reload, one thread at a time.
  if (fd < 0) return NotFound(std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const int e = errno;
    ::close(fd);
    if (S_ISDIR(st.st_mode)) return NotFound("it is a directory");
    return NotFound(e != 0 ? std::strerror(e) : "not a file");  // NOLINT(concurrency-mt-unsafe)
  }
  std::string out;
  char buf[8192];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      const int e = errno;
      ::close(fd);
      return NotFound(std::strerror(e));  // NOLINT(concurrency-mt-unsafe): as above.
    }
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

Status CheckStoreUrlScheme(std::string_view url) {
  for (std::string_view scheme : {"redis://", "rediss://", "redis+cluster://", "rediss+cluster://",
                                  "redis+sentinel://", "rediss+sentinel://"}) {
    if (url.starts_with(scheme)) return Status::Ok();
  }
  // Never echo the URL: it may hold a password.
  return InvalidArgument(
      "must start with redis://, rediss://, redis+cluster://, rediss+cluster://, "
      "redis+sentinel:// or rediss+sentinel://");
}

std::string FolderOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash == 0 ? 1 : slash);
}

std::string MapRedisUrlFiles(const std::string& url,
                             const std::function<std::string(const std::string&)>& map) {
  const size_t query = url.find('?');
  if (query == std::string::npos) return url;
  std::string out = url.substr(0, query + 1);
  std::string_view rest = std::string_view(url).substr(query + 1);
  bool first = true;
  while (true) {
    const size_t amp = rest.find('&');
    const std::string_view param = rest.substr(0, amp);
    if (!first) out += '&';
    first = false;
    const size_t eq = param.find('=');
    const std::string_view key = param.substr(0, eq);
    std::optional<std::string> value =
        eq == std::string_view::npos ? std::nullopt : core::PercentDecode(param.substr(eq + 1));
    if (value && !value->empty() &&
        (key == "tls_ca_file" || key == "tls_cert_file" || key == "tls_key_file")) {
      out += std::string(key) + "=";
      // Encoded as the URL parser decodes it: all but unreserved bytes and '/'.
      for (const char c : map(*value)) {
        if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
            c == '-' || c == '.' || c == '_' || c == '~' || c == '/') {
          out += c;
        } else {
          static constexpr char kHex[] = "0123456789ABCDEF";
          out += '%';
          out += kHex[static_cast<unsigned char>(c) >> 4];
          out += kHex[static_cast<unsigned char>(c) & 15];
        }
      }
    } else {
      out += param;  // as written: a bad one is the URL parser's to refuse
    }
    if (amp == std::string_view::npos) break;
    rest = rest.substr(amp + 1);
  }
  return out;
}

std::string RelativeTo(const std::string& dir, const std::string& path) {
  return path.empty() || path[0] == '/' || dir.empty() ? path : dir + "/" + path;
}

StatusOr<Config> LoadConfigFile(const std::string& path) {
  StatusOr<std::string> text = ReadTextFile(path);
  if (!text.ok()) {
    return NotFound(path + ": cannot read the config file: " + text.status().message());
  }
  return ParseConfig(*text, path, FolderOf(path));
}

Config EmbeddedDefault() {
  Config c;
  c.source = "<embedded default>";
  c.server.demo = true;
  c.store.type = StoreConfig::Type::kMemory;
  c.clients.accept_unknown_api_keys = true;  // the demo page sends any key it likes
  Limit ping = *Limit::TokenBucket("ping", 5, 1.0);
  c.named_limits.emplace("ping", ping);
  RouteClass r;
  r.name = "ping";
  r.methods = {"GET"};
  r.match = RouteClass::Match::kExact;
  r.path = "/api/ping";
  r.limits.push_back(RuleLimit{.limit = ping});
  c.routes.push_back(std::move(r));
  return c;
}

}  // namespace ratelimit::policy

namespace ratelimit::policy {
namespace {

// The text of a setting's value, as the dump writes it.
std::string Text(const std::string& s) { return s; }
std::string Text(bool b) { return b ? "true" : "false"; }
std::string Text(int64_t v) { return std::to_string(v); }
std::string Text(int v) { return std::to_string(v); }
std::string Text(size_t v) { return std::to_string(v); }
std::string Text(std::chrono::milliseconds d) {
  return FormatDuration(std::chrono::duration_cast<std::chrono::microseconds>(d));
}
std::string Text(StoreConfig::Type t) {
  return t == StoreConfig::Type::kRedis ? "redis" : "memory";
}
std::string Text(HeaderDialect d) { return std::string(HeaderDialectName(d)); }
std::string Text(StoreConfig::TimeSource t) {
  return t == StoreConfig::TimeSource::kRedis ? "redis" : "local";
}

}  // namespace

void KeepRestartBound(const Config& running, Config* loaded) {
  std::vector<PendingSetting>& pending = loaded->pending_restart;
  pending.clear();
  auto keep = [&pending](std::string_view name, auto& field, const auto& in_effect) {
    if (field == in_effect) return;
    pending.push_back({std::string(name), Text(field)});
    field = in_effect;
  };
  const StoreConfig& rs = running.store;
  StoreConfig& ls = loaded->store;
  keep("store.type", ls.type, rs.type);
  if (ls.url != rs.url) pending.push_back({"store.url", RedactUrl(ls.url)});
  ls.url = rs.url;
  keep("store.deadline", ls.deadline, rs.deadline);
  keep("store.key_prefix", ls.key_prefix, rs.key_prefix);
  keep("store.time_source", ls.time_source, rs.time_source);
  keep("store.max_keys", ls.max_keys, rs.max_keys);
  keep("store.max_key_length", ls.max_key_length, rs.max_key_length);
  keep("store.connections", ls.connections, rs.connections);
  keep("store.max_pending", ls.max_pending, rs.max_pending);
  keep("store.breaker.failures", ls.breaker.failures, rs.breaker.failures);
  keep("store.breaker.open_for", ls.breaker.open_for, rs.breaker.open_for);
  keep("store.breaker.max_open_for", ls.breaker.max_open_for, rs.breaker.max_open_for);
  keep("store.reconnect_max_backoff", ls.reconnect_max_backoff, rs.reconnect_max_backoff);
  keep("store.local_max_keys", ls.local_max_keys, rs.local_max_keys);
  const ServerConfig& r = running.server;
  ServerConfig& l = loaded->server;
  keep("server.listen", l.listen, r.listen);
  keep("server.admin_listen", l.admin_listen, r.admin_listen);
  keep("server.admin_token_file", l.admin_token_file, r.admin_token_file);
  keep("server.upstream", l.upstream, r.upstream);
  keep("server.demo", l.demo, r.demo);
  keep("server.threads", l.threads, r.threads);
  keep("server.max_body_bytes", l.max_body_bytes, r.max_body_bytes);
  keep("server.max_header_bytes", l.max_header_bytes, r.max_header_bytes);
  keep("server.max_connections", l.max_connections, r.max_connections);
  keep("server.max_connections_per_ip", l.max_connections_per_ip, r.max_connections_per_ip);
  keep("server.max_requests_per_second_per_connection", l.max_requests_per_second_per_connection,
       r.max_requests_per_second_per_connection);
  keep("server.read_timeout", l.read_timeout, r.read_timeout);
  keep("server.idle_timeout", l.idle_timeout, r.idle_timeout);
  keep("server.user", l.user, r.user);
  keep("server.group", l.group, r.group);
  // The gRPC face takes its listener and envoy section once, at start.
  keep("server.grpc_listen", l.grpc_listen, r.grpc_listen);
  const EnvoySection& re = running.envoy;
  EnvoySection& le = loaded->envoy;
  keep("envoy.config_dir", le.config_dir, re.config_dir);
  keep("envoy.failure_mode", le.failure_mode, re.failure_mode);
  keep("envoy.headers", le.headers, re.headers);
}

int ThreadCount(int configured) {
  if (configured > 0) return configured;
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

}  // namespace ratelimit::policy
