// Config: the rules ratelimitd applies, as loaded from YAML (or the embedded
// default). A plain data model; policy.h compiles it into something fast to
// query. Every field is documented in docs/configuration.md.
//
//   StatusOr<Config> c = LoadConfigFile("examples/gateway.yaml");
//   if (!c.ok()) std::cerr << c.status().message();  // "examples/gateway.yaml:12: unknown key
//   'limitz' in route"
//
// Thread-safety: value types.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "policy/ip.h"
#include "ratelimit/clock.h"
#include "ratelimit/failure_mode.h"
#include "ratelimit/limit.h"
#include "ratelimit/status.h"

namespace ratelimit::policy {

// What to do when the store cannot decide (unreachable, deadline, breaker
// open): ratelimit/failure_mode.h. The YAML accepts open, closed and local.
using ratelimit::FailureMode;
using ratelimit::FailureModeName;

// Which rate limit headers clients are told.
enum class HeaderDialect {
  kDraft06,     // RateLimit-Limit / RateLimit-Remaining / RateLimit-Reset (default)
  kStructured,  // RateLimit-Policy / RateLimit (draft-ietf-httpapi-ratelimit-headers -08+)
  kLegacy,      // X-RateLimit-Limit / -Remaining / -Reset
  kNone,
};

struct StoreConfig {
  enum class Type { kMemory, kRedis } type = Type::kMemory;
  std::string url;                          // redis://, rediss:// (secret: never logged)
  std::chrono::milliseconds deadline{100};  // per store call
  std::string key_prefix = "rl:";
  using TimeSource = ratelimit::TimeSource;
  TimeSource time_source = TimeSource::kRedis;
  FailureMode failure_mode = FailureMode::kOpen;
  int closed_status = 503;       // 503 or 429 when failure_mode is closed
  int expected_instances = 1;    // for kLocal: each instance gets limit / this
  size_t max_keys = 10'000'000;  // memory store bound
  size_t max_key_length = 512;
  // Redis only: connections, the bound on checks queued or in flight (beyond
  // it a check fails at once and the failure mode decides), and the circuit
  // breaker (`failures` consecutive failures open it for `open_for`, doubling
  // on each failed probe up to `max_open_for`).
  int connections = 2;
  size_t max_pending = 10'000;
  struct Breaker {
    int failures = 5;
    std::chrono::milliseconds open_for{100};
    std::chrono::milliseconds max_open_for{500};
  } breaker;
  // Redis only: the longest wait between reconnect attempts (jittered
  // exponential backoff from 10ms); bounds how long after Redis returns a
  // connection is back.
  std::chrono::milliseconds reconnect_max_backoff{250};
  size_t local_max_keys = 100'000;  // the `local` failure mode's in-memory bound
};

// Which header from a trusted proxy names the client (clients.client_ip_header).
enum class ClientIpHeader {
  kAny,            // Forwarded if present and usable, else X-Forwarded-For (default)
  kForwarded,      // Forwarded only
  kXForwardedFor,  // X-Forwarded-For only
};

struct ClientConfig {
  std::string api_key_header = "X-API-Key";  // "" disables
  std::string user_header;                   // set by a trusted auth layer; "" disables
  std::vector<Cidr> trusted_proxies;         // XFF / Forwarded are read only from these peers
  // The header the trusted proxies set. A proxy passes the other one through
  // from the client unless told to strip it: naming the one it sets keeps a
  // client from choosing its address through the other.
  ClientIpHeader client_ip_header = ClientIpHeader::kAny;
  int ipv6_prefix = 64;  // IPv6 clients are keyed by this prefix
  // An API key that is not in `api_keys`: true -> it still names the client
  // ("k:<key>", on default_plan); false -> ignored (user header, then IP).
  // true lets any client mint identities: for demos and trusted networks only.
  bool accept_unknown_api_keys = false;
};

// A limit as configured: the limit itself plus how it is applied.
struct RuleLimit {
  Limit limit;
  bool shadow = false;                      // decide and count, never block
  std::optional<FailureMode> failure_mode;  // overrides the store's
};

struct Plan {
  std::string name;
  std::vector<RuleLimit> limits;  // the plan's per-client limits (global across routes)
};

// A route's limit on requests in flight at once (docs/configuration.md,
// "Concurrency"): a request takes a lease before it is forwarded and gives it
// back when the upstream answer ends; a lease left behind (a crashed
// instance) expires after lease_ttl.
struct ConcurrencyConfig {
  enum class Per { kClient, kRoute };     // each client has N, or the whole route has N
  enum class OnLimit { kReject, kWait };  // 429 at once, or hold until a lease frees
  int64_t max_in_flight = 1;
  std::chrono::milliseconds lease_ttl{30'000};
  Per per = Per::kClient;
  OnLimit on_limit = OnLimit::kReject;
  std::chrono::milliseconds max_wait{5'000};  // wait: the longest a request is held
  size_t max_waiting = 1'000;                 // wait: requests held at once (this instance)
};

// A route's cost known only after the response (issue 21, docs/configuration.md
// "Metered costs"): the gateway checks with a reserved cost, then settles the
// difference to the actual cost read from the upstream's answer.
struct MeteredCost {
  enum class Source { kReserve, kRequestHeader, kRequestJson };
  enum class SettleFrom { kResponseHeader, kResponseTrailer, kSseLastEvent };
  Source source = Source::kReserve;
  std::optional<int64_t> reserve;         // the reservation; with from_request_*: the fallback
  std::string request_field;              // from_request_header: the name; _json: the path
  std::vector<std::string> request_path;  // from_request_json: `request_field` split
  SettleFrom settle_from = SettleFrom::kResponseHeader;
  std::string field;                    // header or trailer name, or JSON path (sse_last_event)
  std::vector<std::string> field_path;  // sse_last_event: `field` split (SplitJsonPath)
  std::optional<int64_t> max;           // caps the reservation read from the request and the actual
  // What the route's own limits count ("tokens"): RateLimit-Policy's `qu`
  // when one of them speaks for the request. Empty: requests.
  std::string unit;
};
std::string_view CostSourceName(MeteredCost::Source s);  // "reserve", "from_request_header", ...
std::string_view SettleFromName(MeteredCost::SettleFrom s);  // "response_header", ...
// "usage.total_tokens" -> {"usage", "total_tokens"}; empty when malformed (an
// empty segment).
std::vector<std::string> SplitJsonPath(std::string_view path);

// Whether `limit` may be a metered route's (its cost is settled afterwards,
// Store::Settle): kInvalidArgument naming why not for a sliding log or a
// calendar quota, else Ok. The config's rule, and the admin API's for an
// override of such a limit.
Status CheckMeteredLimit(const Limit& limit);

struct RouteClass {
  enum class Match { kExact, kPrefix, kTemplate };
  enum class KeyBy { kClient, kIp };  // kIp: per client IP even if authenticated (login)
  std::string name;
  std::vector<std::string> methods;  // upper case; empty = any method
  Match match = Match::kPrefix;
  std::string path;  // canonical form; templates use {param} segments
  std::vector<RuleLimit> limits;
  int64_t cost = 1;                    // with `metered`: the reservation (or its fallback, else 1)
  std::optional<MeteredCost> metered;  // cost: {reserve: .., settle_from: ..}
  KeyBy key_by = KeyBy::kClient;
  bool shadow = false;  // every limit of this route in shadow mode
  std::optional<FailureMode> failure_mode;
  std::optional<ConcurrencyConfig> concurrency;  // no limit on requests in flight if unset
  int source_line = 0;                           // 1-based line in the config file, 0 = unknown
};

struct ServerConfig {
  std::string listen = "127.0.0.1:8080";
  std::string admin_listen = "127.0.0.1:9090";
  std::string admin_token_file;  // "" = no token required
  std::string upstream;          // "http://host:port": enables the gateway face
  bool demo = false;             // the demo page at / and /api/ping
  HeaderDialect headers = HeaderDialect::kDraft06;
  int threads = 0;  // 0 = hardware concurrency (ThreadCount)
  size_t max_body_bytes = 64 * 1024;
  size_t max_header_bytes = 8 * 1024;
  size_t max_connections = 10'000;  // per listener
  // Connections from one client address (IPv6: per clients.ipv6_prefix)
  // beyond this are refused; peers in clients.trusted_proxies are exempt. 0 = no cap.
  size_t max_connections_per_ip = 256;
  // Requests read per second on one connection (burst: one second's worth);
  // beyond, the next request is read later. Trusted proxies are exempt. 0 = no
  // cap, the default: the decision API's callers (application servers, nginx
  // auth_request) use few keep-alive connections (docs/security.md).
  int64_t max_requests_per_second_per_connection = 0;
  // Requests held at once for a leaky bucket's delay (gateway, auth_request);
  // beyond: 503. Each holds at most max_header_bytes + max_body_bytes.
  size_t max_held_requests = 1'000;
  std::chrono::milliseconds read_timeout{10'000};
  std::chrono::milliseconds idle_timeout{60'000};
  // Privilege drop after the listeners are bound ("" = stay as started).
  std::string user;
  std::string group;  // "" = the user's primary group
  // Envoy's rate limit service over gRPC (docs/envoy.md); "" = off.
  std::string grpc_listen;
};

// `server.threads` as the number of threads to run: 0 means one per core
// (at least one). The HTTP faces and the gRPC face each run that many.
int ThreadCount(int configured);

// `envoy:`: the gRPC face's settings (docs/envoy.md).
struct EnvoySection {
  std::string config_dir;    // envoyproxy/ratelimit's YAML, one domain per file ("" = none)
  std::string failure_mode;  // "open", "closed", "local", "error"; "" = store.failure_mode
  HeaderDialect headers = HeaderDialect::kNone;  // response_headers_to_add (off by default)
};

// A setting a reload read but could not apply: it waits for a restart.
struct PendingSetting {
  std::string name;   // "store.url"
  std::string value;  // as the dump would show it (secrets redacted)
};

struct Config {
  std::string source;  // file path, or "<embedded default>"
  ServerConfig server;
  StoreConfig store;
  ClientConfig clients;
  std::map<std::string, Plan> plans;
  std::string default_plan;  // plan of clients without a known API key; "" = none
  std::map<std::string, std::string> api_keys;  // API key -> plan name (secrets: never shown)
  std::string api_keys_file;                    // where some of api_keys came from ("" = none)
  std::vector<RuleLimit> global_limits;         // per client, across all routes, every plan
  std::vector<RouteClass> routes;               // first match wins
  std::map<std::string, Limit> named_limits;    // for POST /v1/check {"limits": ["burst"]}
  // After a reload: settings of the file that differ from those in effect
  // and need a restart (KeepRestartBound). Empty at start.
  std::vector<PendingSetting> pending_restart;
  EnvoySection envoy;
};

// Errors name the file, line and key: "x.yaml:12: unknown key 'limitz' in route 'api'".
// Every error is kInvalidArgument, except an unreadable file (kNotFound, with
// the reason: "x.yaml: cannot read the config file: Permission denied").
// `api_keys_file` and `server.admin_token_file` are relative to the config
// file's folder (ParseConfig: relative to the current directory unless
// `base_dir` is given); admin_token_file is stored so resolved.
StatusOr<Config> LoadConfigFile(const std::string& path);
StatusOr<Config> ParseConfig(std::string_view yaml, std::string_view source_name);
StatusOr<Config> ParseConfig(std::string_view yaml, std::string_view source_name,
                             const std::string& base_dir);

// A regular file's whole content, or kNotFound whose message says why not
// ("No such file or directory", "Permission denied", "it is a directory").
StatusOr<std::string> ReadTextFile(const std::string& path);

// Ok iff `url` starts with redis://, rediss://, redis+cluster:// or
// rediss+cluster://; the error ("must start with ...") never echoes the URL.
Status CheckStoreUrlScheme(std::string_view url);

// `url` (a store URL) with each of its tls_ca_file, tls_cert_file and
// tls_key_file values replaced by map(value), decoded and encoded again;
// everything else as written: the loader joins them with the config's folder
// (RelativeTo), the dump makes them absolute.
//   MapRedisUrlFiles("rediss://h?tls_ca_file=ca.pem", f) -> "rediss://h?tls_ca_file=" + f("ca.pem")
std::string MapRedisUrlFiles(const std::string& url,
                             const std::function<std::string(const std::string&)>& map);
// `path` relative to `dir` unless it is absolute (or `dir` is "").
std::string RelativeTo(const std::string& dir, const std::string& path);
// The folder of a file path: "examples/gateway.yaml" -> "examples", "x.yaml" -> ".".
std::string FolderOf(const std::string& path);

// Settings bound at start (listeners, threads, upstream, bounds, the store
// and its connections) cannot change on reload. Sets them in `loaded` to
// their values in `running`, so that `loaded` describes what is in effect,
// and lists each that differed, with the file's value, in
// loaded->pending_restart. (DumpRedacted shows them as comments.)
void KeepRestartBound(const Config& running, Config* loaded);

// The YAML spellings, shared with the server's admin API and logs.
std::string_view HeaderDialectName(HeaderDialect d);    // "draft06", "structured", "legacy", "none"
std::string_view ClientIpHeaderName(ClientIpHeader h);  // "any", "Forwarded", "X-Forwarded-For"

// No config file: memory store, demo page, /api/ping limited per client
// (X-API-Key if present, else client IP) with burst 5 and 1 per second.
Config EmbeddedDefault();

// The config as YAML with secrets (Redis password, API keys, admin token) redacted.
// Every default is spelled out; pending_restart follows as comments
// ("# waiting for a restart: store.url: redis://h2:6379"). API keys appear as a list of `"***":
// plan` entries, so the dump documents the mapping but cannot be loaded back as is.
std::string DumpRedacted(const Config& config);

// "redis://user:secret@host:6379/0" -> "redis://user:***@host:6379/0".
std::string RedactUrl(std::string_view url);

}  // namespace ratelimit::policy
