#include "server/admin.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <vector>

#include "core/percent.h"
#include "policy/config.h"
#include "policy/ip.h"
#include "server/explain.h"
#include "server/json_log.h"
#include "server/metrics.h"
#include "server/overrides.h"
#include "server/problem.h"

namespace ratelimit::server {
namespace {

using json = nlohmann::json;

// Longest client text accepted ("k:" + a 200-byte header value, with room).
constexpr size_t kMaxClientText = 256;
constexpr size_t kMaxTopN = 100;

// Percent-decodes (and '+' -> ' ' in queries). Malformed escapes: error.
StatusOr<std::string> Decode(std::string_view s, bool query) {
  std::optional<std::string> out = core::PercentDecode(s, /*plus_is_space=*/query);
  if (!out) return InvalidArgument("malformed percent-escape");
  return *std::move(out);
}

// name -> value; a repeated name is an error.
StatusOr<std::map<std::string, std::string>> ParseQuery(std::string_view q) {
  std::map<std::string, std::string> out;
  while (!q.empty()) {
    const size_t amp = q.find('&');
    std::string_view part = q.substr(0, amp);
    q = amp == std::string_view::npos ? std::string_view() : q.substr(amp + 1);
    if (part.empty()) continue;
    const size_t eq = part.find('=');
    StatusOr<std::string> name = Decode(part.substr(0, eq), true);
    StatusOr<std::string> value =
        Decode(eq == std::string_view::npos ? std::string_view() : part.substr(eq + 1), true);
    if (!name.ok() || !value.ok()) return InvalidArgument("malformed query string");
    if (!out.emplace(*name, *value).second) {
      return InvalidArgument("query parameter '" + *name + "' given twice");
    }
  }
  return out;
}

// A client text that could be an identity: 1..256 visible ASCII characters.
Status ValidateClientText(std::string_view client) {
  if (client.empty()) return InvalidArgument("the client is empty");
  if (client.size() > kMaxClientText) {
    return InvalidArgument("the client is longer than " + std::to_string(kMaxClientText) +
                           " bytes");
  }
  for (unsigned char c : client) {
    if (c <= 0x20 || c >= 0x7f) {
      return InvalidArgument("the client may hold only visible ASCII characters");
    }
  }
  return Status::Ok();
}

// The identity the policy forms for `client` ("k:..", "u:..", "ip:.."):
// kInvalidArgument when malformed, kNotFound when no request could have it.
StatusOr<policy::Identity> IdentityOf(const policy::Policy& policy, std::string_view client) {
  if (Status s = ValidateClientText(client); !s.ok()) return s;
  const policy::ClientConfig& cc = policy.config().clients;
  std::string header_name;
  std::string_view header_value;
  policy::IpAddress peer = policy::IpAddress::FromV4(0);
  if (client.starts_with("k:")) {
    if (cc.api_key_header.empty()) return NotFound("API keys are off (clients.api_key_header)");
    header_name = cc.api_key_header;
    header_value = client.substr(2);
  } else if (client.starts_with("u:")) {
    if (cc.user_header.empty()) return NotFound("user identities are off (clients.user_header)");
    header_name = cc.user_header;
    header_value = client.substr(2);
  } else if (client.starts_with("ip:")) {
    std::string_view addr = client.substr(3);
    addr = addr.substr(0, addr.find('/'));
    StatusOr<policy::IpAddress> ip = policy::IpAddress::Parse(addr);
    if (!ip.ok()) return InvalidArgument("'" + std::string(addr) + "' is not an IP address");
    peer = *ip;
  } else {
    return InvalidArgument("the client must start with k:, u: or ip:");
  }
  policy::RequestView view{.method = "GET",
                           .target = "/",
                           .peer = peer,
                           .header = [&](std::string_view name) -> std::optional<std::string_view> {
                             if (!header_name.empty() && EqualsIgnoreCase(name, header_name))
                               return header_value;
                             return std::nullopt;
                           }};
  policy::Identity who = policy.Identify(view);
  if (who.key != client) {
    if (client.starts_with("ip:")) {
      return NotFound("no client '" + std::string(client) + "': this config names that address '" +
                      who.key + "'");
    }
    return NotFound("no client '" + std::string(RedactKey(client)) + "' in this config");
  }
  return who;
}

// "k:demo***1f2e3d4c", an API key as the admin answers and logs show it ->
// "k:<the key>", found among the config's api_keys and the keys of this
// instance's recent denials (the only keys an operator can have seen shown).
StatusOr<std::string> Unredact(const policy::Policy& policy, const AdminDenials& denials,
                               std::string_view shown) {
  const std::string_view start = shown.substr(0, shown.find("***"));
  std::vector<std::string> found;
  auto consider = [&](std::string key) {
    if (!key.starts_with(start) || RedactKey(key) != shown) return;
    if (std::find(found.begin(), found.end(), key) == found.end()) found.push_back(std::move(key));
  };
  for (const auto& [key, plan] : policy.config().api_keys) consider("k:" + key);
  for (std::string& key : denials.Keys()) consider(std::move(key));
  if (found.empty()) {
    return NotFound("no API key shown as '" + std::string(shown) +
                    "' in this config or this instance's recent denials: name it in full");
  }
  if (found.size() > 1) {
    return InvalidArgument("'" + std::string(shown) +
                           "' stands for more than one API key: name it in full");
  }
  return std::move(found.front());
}

// A Host (RFC 9110 7.2: host [":" port]) that DNS cannot point elsewhere:
// an IP literal (IPv6 in brackets), "localhost" or a name under
// ".localhost" (RFC 6761: never delegated, browsers keep it on loopback).
// A web page that rebinds its own name to 127.0.0.1 sends that name.
bool IsRebindSafeHost(std::string_view host) {
  std::string_view name = host;
  std::string_view port;
  if (host.starts_with('[')) {
    const size_t close = host.find(']');
    if (close == std::string_view::npos) return false;
    name = host.substr(1, close - 1);
    const std::string_view rest = host.substr(close + 1);
    if (!rest.empty() && rest.front() != ':') return false;
    port = rest.empty() ? rest : rest.substr(1);
    if (name.find(':') == std::string_view::npos || !policy::IpAddress::Parse(name).ok()) {
      return false;
    }
  } else {
    const size_t colon = host.find(':');
    if (colon != std::string_view::npos) {
      name = host.substr(0, colon);
      port = host.substr(colon + 1);
    }
    constexpr std::string_view kLocalhost = "localhost";
    const bool local =
        EqualsIgnoreCase(name, kLocalhost) ||
        (name.size() > kLocalhost.size() + 1 &&
         EqualsIgnoreCase(name.substr(name.size() - kLocalhost.size() - 1), ".localhost"));
    if (!local && !policy::IpAddress::Parse(name).ok()) return false;
  }
  return port.size() <= 5 && port.find_first_not_of("0123456789") == std::string_view::npos;
}

int64_t Ms(std::chrono::microseconds d) { return (d.count() + 999) / 1000; }

std::string IsoTime(int64_t unix_ms) {
  std::time_t secs = static_cast<std::time_t>(unix_ms / 1000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<int>(unix_ms % 1000));
  return buf;
}

// The groups that hold `who`'s own state: keyed by its identity (and, for
// the demo's caller, by its IP). Never another key.
std::vector<policy::CheckGroup> OwnGroups(const policy::Policy& policy, const policy::Identity& who,
                                          bool include_ip_key) {
  std::vector<policy::CheckGroup> groups = policy.PeekGroupsFor(who);
  std::erase_if(groups, [&](const policy::CheckGroup& g) {
    return !(g.key == who.key || (include_ip_key && g.key == who.ip_key));
  });
  return groups;
}

}  // namespace

// Whom an admin path names: an identity the policy forms (k:, u:, ip:) or a
// decision-API caller's key (d:<key>), with every (key, limit) that may hold
// its state.
struct AdminApi::Client {
  std::string key;          // the client part of its store keys ("d:<key>" for the decision API)
  std::string shown;        // in answers (API keys shortened)
  std::string_view source;  // api_key, user, ip, decision_api
  std::string plan;         // the plan it is enforced with (an override's, if any)
  // The groups it is enforced with: its override applied (the plan it moves
  // the client to, its limits' parameters). State and blocks read these.
  std::vector<policy::CheckGroup> groups;
  // With an override in effect, the configured groups too (the ones without
  // it), which a reset clears as well: the state the client finds once the
  // override is removed or expires. Empty without an override.
  std::vector<policy::CheckGroup> configured;
  // Holds the override's limits that `groups` point to.
  std::shared_ptr<const OverrideTable> overrides;
};

namespace {

// The override in effect for `client` now, or nullptr; `table` then holds it.
const ClientOverride* OverrideOf(const Overrides* overrides, std::string_view client,
                                 std::shared_ptr<const OverrideTable>& table) {
  if (overrides == nullptr || overrides->empty()) return nullptr;
  table = overrides->table();
  return table->Find(client, overrides->NowMillis());
}

AdminApi::Client FromIdentity(const policy::Policy& policy, const policy::Identity& who,
                              bool include_ip_key, const Overrides* overrides) {
  AdminApi::Client c{.key = who.key,
                     .shown = RedactKey(who.key),
                     .source = IdentitySourceName(who.source),
                     .plan = who.plan,
                     .groups = OwnGroups(policy, who, include_ip_key)};
  std::shared_ptr<const OverrideTable> table;
  const ClientOverride* o = OverrideOf(overrides, who.key, table);
  if (o == nullptr) return c;
  // As the Enforcer applies it (ApplyOverride): a plan the config has
  // replaces the client's; its limits replace those of the client's own key.
  policy::Identity enforced = who;
  if (o->plan && o->plan_applies && policy.config().plans.count(*o->plan) != 0) {
    enforced.plan = *o->plan;
  }
  c.configured = std::move(c.groups);
  c.plan = enforced.plan;
  c.groups = OwnGroups(policy, enforced, include_ip_key);
  for (policy::CheckGroup& g : c.groups) {
    if (g.key == who.key) ApplyOverrideLimits(*o, g.checks);
  }
  c.overrides = std::move(table);
  return c;
}

// A decision-API key "d:<key>": the key as /v1/check and /v1/acquire take it
// (percent-encoded in the path), whose state lives under the store key
// "d:<key>" itself. Its limits come with each request, so only the config's
// named limits (`limits:`) can be read or reset.
StatusOr<AdminApi::Client> DecisionApiClientOf(const policy::Policy& policy,
                                               std::string_view client,
                                               const Overrides* overrides) {
  const std::string_view key = client.substr(kDecisionApiPrefix.size());
  const size_t max = policy.config().store.max_key_length;
  if (key.empty() || key.size() > max) {
    return InvalidArgument("a decision-API key is 1.." + std::to_string(max) + " bytes");
  }
  AdminApi::Client c{.key = std::string(client),
                     .shown = std::string(client),
                     .source = "decision_api",
                     .plan = "",
                     .groups = {}};
  for (const auto& [name, limit] : policy.config().named_limits) {
    if (c.groups.empty() || c.groups.back().checks.size() == kMaxChecksPerRequest) {
      c.groups.push_back({c.key, {}, false, policy.config().store.failure_mode});
    }
    c.groups.back().checks.push_back({&limit, 0});
  }
  std::shared_ptr<const OverrideTable> table;
  const ClientOverride* o = OverrideOf(overrides, client, table);
  if (o == nullptr) return c;
  // Its override's limits replace the named limits of their name and
  // algorithm, as in the key's checks (a name the config lacks applies to
  // the requests' inline limits of that name: listed too).
  c.configured = c.groups;
  for (policy::CheckGroup& g : c.groups) ApplyOverrideLimits(*o, g.checks);
  for (const Limit& l : o->limits) {
    const bool listed = std::any_of(c.groups.begin(), c.groups.end(), [&](const auto& g) {
      return std::any_of(g.checks.begin(), g.checks.end(),
                         [&](const LimitCheck& check) { return check.limit == &l; });
    });
    if (listed) continue;
    if (c.groups.empty() || c.groups.back().checks.size() == kMaxChecksPerRequest) {
      c.groups.push_back({c.key, {}, false, policy.config().store.failure_mode});
    }
    c.groups.back().checks.push_back({&l, 0});
  }
  c.overrides = std::move(table);
  return c;
}

}  // namespace

Reply AdminMethodNotAllowed(std::string_view path, std::string_view allow) {
  Reply r = ProblemReply(405, "use " + std::string(allow) + " for " + std::string(path), path);
  r.Add("Allow", std::string(allow));
  return r;
}

Reply AdminJsonReply(unsigned status, const json& body) {
  Reply r;
  r.status = status;
  r.content_type = "application/json";
  r.body = body.dump(-1, ' ', false, json::error_handler_t::replace);
  r.Add("Cache-Control", "no-store");
  return r;
}

AdminApi::AdminApi(Enforcer& enforcer, std::string token)
    : enforcer_(enforcer), token_(std::move(token)) {}

StatusOr<std::string> AdminApi::ReadTokenFile(const std::string& path) {
  StatusOr<std::string> text = policy::ReadTextFile(path);
  if (!text.ok()) {
    return InvalidArgument("cannot read server.admin_token_file '" + path +
                           "': " + text.status().message());
  }
  std::string t = std::move(*text);
  const auto not_space = [](unsigned char c) { return !std::isspace(c); };
  t.erase(t.begin(), std::find_if(t.begin(), t.end(), not_space));
  t.erase(std::find_if(t.rbegin(), t.rend(), not_space).base(), t.end());
  if (t.empty()) return InvalidArgument("server.admin_token_file '" + path + "' is empty");
  return t;
}

bool AdminApi::Authorized(const Request& req) const {
  if (token_.empty()) return true;
  auto it = req.find(http::field::authorization);
  if (it == req.end()) return false;
  std::string_view v = it->value();
  if (v.size() < 7 || !EqualsIgnoreCase(v.substr(0, 7), "Bearer ")) return false;
  v = v.substr(7);
  // Hash both sides so the comparison takes the same time whatever the lengths.
  unsigned char a[SHA256_DIGEST_LENGTH], b[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(v.data()), v.size(), a);
  SHA256(reinterpret_cast<const unsigned char*>(token_.data()), token_.size(), b);
  return CRYPTO_memcmp(a, b, sizeof a) == 0;
}

void AdminApi::AddView(std::string path, std::function<json()> view) {
  LockGuard lock(views_mu_);
  views_[std::move(path)] = std::move(view);
}

void AdminApi::Handle(const Request& req, std::shared_ptr<const policy::Policy> policy,
                      std::function<void(Reply&&)> done, std::string_view peer) {
  const std::string_view target = req.target();
  const size_t qpos = target.find('?');
  const std::string_view path = target.substr(0, qpos);
  const std::string_view query =
      qpos == std::string_view::npos ? std::string_view() : target.substr(qpos + 1);
  const bool get = req.method() == http::verb::get || req.method() == http::verb::head;

  const bool draining = draining_.load(std::memory_order_relaxed);
  if (path == "/healthz") {
    if (!get) return done(AdminMethodNotAllowed(path, "GET"));
    // Alive while draining: a liveness probe must not kill the drain.
    return done(AdminJsonReply(200, {{"status", draining ? "draining" : "ok"}}));
  }
  if (path == "/readyz") {
    if (!get) return done(AdminMethodNotAllowed(path, "GET"));
    if (draining) {
      Reply r = AdminJsonReply(503, {{"ready", false}, {"draining", true}});
      r.Add("Retry-After", "1");
      return done(std::move(r));
    }
    return Ready(std::move(policy), std::move(done));
  }
  // Without a token, a page in a browser on this host could reach us by DNS
  // rebinding (its own name re-resolved to 127.0.0.1): it cannot choose the
  // Host its requests carry. Requests without a Host (HTTP/1.0) come from
  // no browser. With a token, the token is what a page cannot know.
  if (token_.empty()) {
    if (auto host = req.find(http::field::host);
        host != req.end() && !IsRebindSafeHost(host->value())) {
      return done(ProblemReply(
          403,
          "this admin API has no token, so it answers only requests addressed to an IP "
          "address or localhost (a web page could reach it through a DNS name of its own); "
          "got Host '" +
              std::string(host->value().substr(0, 100)) +
              "': call it as 127.0.0.1:<port>, [::1]:<port> or localhost:<port>, or set "
              "server.admin_token_file (docs/admin.md#access)",
          path));
    }
  } else if (!Authorized(req)) {
    Reply r = ProblemReply(401, "this admin API requires Authorization: Bearer <token>", path);
    r.Add("WWW-Authenticate", "Bearer realm=\"ratelimitd-admin\"");
    return done(std::move(r));
  }
  StatusOr<std::map<std::string, std::string>> params = ParseQuery(query);
  if (!params.ok()) return done(ProblemReply(400, params.status().message(), path));

  if (path == "/metrics") {
    if (!get) return done(AdminMethodNotAllowed(path, "GET"));
    Reply r;
    r.content_type = "text/plain; version=0.0.4; charset=utf-8";
    r.body = Metrics::Global().Render(&store());
    return done(std::move(r));
  }
  if (path == "/v1/config") {
    if (!get) return done(AdminMethodNotAllowed(path, "GET"));
    Reply r;
    r.content_type = "application/yaml; charset=utf-8";
    r.body = policy::DumpRedacted(policy->config());
    r.Add("Cache-Control", "no-store");
    return done(std::move(r));
  }
  if (path == "/v1/top-denied") {
    if (!get) return done(AdminMethodNotAllowed(path, "GET"));
    size_t n = 10;
    int minutes = 5;
    std::string window = "5m";
    for (const auto& [k, v] : *params) {
      if (k == "n") {
        if (v.empty() || v.size() > 6 || v.find_first_not_of("0123456789") != std::string::npos ||
            std::stoul(v) < 1 || std::stoul(v) > kMaxTopN) {
          return done(ProblemReply(
              400, "n must be a whole number from 1 to " + std::to_string(kMaxTopN), path));
        }
        n = std::stoul(v);
      } else if (k == "window") {
        StatusOr<std::chrono::microseconds> d = ParseDuration(v);
        if (!d.ok() || *d > std::chrono::minutes(AdminDenials::kMinutes)) {
          return done(ProblemReply(400, "window must be a duration from 1s to 60m, like 5m", path));
        }
        minutes = static_cast<int>((d->count() + 59'999'999) / 60'000'000);
        window = v;
      } else {
        return done(
            ProblemReply(400, "unknown query parameter '" + k + "' (expected n, window)", path));
      }
    }
    const int64_t now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                               std::chrono::system_clock::now().time_since_epoch())
                               .count();
    uint64_t others = 0;
    json clients = json::array();
    for (const TopEntry& e : enforcer_.denials().Top(n, minutes, now_ms, &others)) {
      clients.push_back({{"client", RedactKey(e.key)}, {"denials", e.denials}});
    }
    return done(AdminJsonReply(
        200, {{"window", window}, {"n", n}, {"clients", clients}, {"others", others}}));
  }
  if (path == "/v1/explain") {
    if (req.method() != http::verb::post) return done(AdminMethodNotAllowed(path, "POST"));
    json body = json::parse(req.body(), nullptr, false);
    if (body.is_discarded()) return done(ProblemReply(400, "the body is not JSON", path));
    StatusOr<ExplainRequest> r = ParseExplainRequest(body);
    if (!r.ok()) return done(ProblemReply(400, r.status().message(), path));
    const Overrides* overrides = enforcer_.overrides();
    StatusOr<json> answer = overrides == nullptr ? Explain(*policy, *r)
                                                 : Explain(*policy, *r, overrides->table().get(),
                                                           overrides->NowMillis());
    if (!answer.ok()) return done(ProblemReply(400, answer.status().message(), path));
    return done(AdminJsonReply(200, *answer));
  }
  {
    std::function<json()> view;
    {
      LockGuard lock(views_mu_);
      if (auto it = views_.find(path); it != views_.end()) view = it->second;
    }
    if (view) {
      if (!get) return done(AdminMethodNotAllowed(path, "GET"));
      return done(AdminJsonReply(200, view()));
    }
  }
  if (path == "/v1/overrides" || path.starts_with("/v1/overrides/")) {
    return OverridesPath(req, *policy, path, *params, peer, std::move(done));
  }
  constexpr std::string_view kClients = "/v1/clients/";
  if (path.starts_with(kClients)) {
    std::string_view rest = path.substr(kClients.size());
    const size_t slash = rest.find('/');
    if (slash == std::string_view::npos) {
      return done(ProblemReply(404, "no such admin path (see docs/admin.md)", path));
    }
    const std::string_view action = rest.substr(slash + 1);
    StatusOr<std::string> client = Decode(rest.substr(0, slash), false);
    if (!client.ok()) return done(ProblemReply(400, "the client is malformed", path));
    // "-" and one of ?api_key=, ?user=, ?ip= forms the identity for the caller.
    std::string formed;
    for (const auto& [k, v] : *params) {
      std::string_view prefix = k == "api_key" ? "k:" : k == "user" ? "u:" : k == "ip" ? "ip:" : "";
      if (prefix.empty()) {
        return done(ProblemReply(
            400, "unknown query parameter '" + k + "' (expected api_key, user or ip)", path));
      }
      if (!formed.empty()) {
        return done(ProblemReply(400, "give only one of api_key, user, ip", path));
      }
      formed = std::string(prefix) + v;
    }
    if (*client == "-") {
      if (formed.empty()) {
        return done(ProblemReply(400, "client '-' needs ?api_key=, ?user= or ?ip=", path));
      }
      client = formed;
    } else if (!formed.empty()) {
      return done(ProblemReply(400, "name the client in the path or use '-' with a query", path));
    }
    StatusOr<Client> who = ClientOf(*policy, *client);
    if (!who.ok()) {
      const unsigned status = who.status().code() == StatusCode::kNotFound ? 404 : 400;
      return done(ProblemReply(status, who.status().message(), path));
    }
    const std::string instance(path);
    if (action == "state") {
      if (req.method() == http::verb::delete_) {
        return Reset(std::move(policy), std::move(*who), instance, std::move(done));
      }
      if (!get) return done(AdminMethodNotAllowed(path, "GET, DELETE"));
      return State(std::move(policy), std::move(*who), true, instance, std::move(done));
    }
    if (action == "reset") {
      if (req.method() != http::verb::post) return done(AdminMethodNotAllowed(path, "POST"));
      return Reset(std::move(policy), std::move(*who), instance, std::move(done));
    }
    if (action == "blocks") {
      if (req.method() == http::verb::delete_) {
        return Blocks(std::move(policy), std::move(*who), true, instance, std::move(done));
      }
      if (!get) return done(AdminMethodNotAllowed(path, "GET, DELETE"));
      return Blocks(std::move(policy), std::move(*who), false, instance, std::move(done));
    }
    if (action == "denials") {
      if (!get) return done(AdminMethodNotAllowed(path, "GET"));
      json list = json::array();
      for (const DenialEntry& e : enforcer_.denials().ForClient(who->key)) {
        list.push_back({{"time", IsoTime(e.unix_ms)},
                        {"unix_ms", e.unix_ms},
                        {"route", e.route},
                        {"limit", e.limit},
                        {"path", e.path},
                        {"shadow", e.shadow}});
      }
      return done(AdminJsonReply(
          200, {{"client", who->shown}, {"denials", list}, {"kept", AdminDenials::kRingSize}}));
    }
    return done(ProblemReply(404, "no such admin path (see docs/admin.md)", path));
  }
  done(ProblemReply(404, "no such admin path (see docs/admin.md)", path));
}

StatusOr<AdminApi::Client> AdminApi::ClientOf(const policy::Policy& policy,
                                              std::string_view client) const {
  if (client.starts_with(kDecisionApiPrefix)) {
    return DecisionApiClientOf(policy, client, enforcer_.overrides());
  }
  std::string full;
  if (client.starts_with("k:") && client.find("***") != std::string_view::npos) {
    StatusOr<std::string> key = Unredact(policy, enforcer_.denials(), client);
    if (!key.ok()) return key.status();
    full = std::move(*key);
    client = full;
  }
  StatusOr<policy::Identity> who = IdentityOf(policy, client);
  if (!who.ok()) return who.status();
  return FromIdentity(policy, *who, false, enforcer_.overrides());
}

StatusOr<std::string> AdminApi::ClientKeyOf(const policy::Policy& policy,
                                            std::string_view client) const {
  StatusOr<Client> who = ClientOf(policy, client);
  if (!who.ok()) return who.status();
  return who->key;
}

struct AdminApi::StateOp {
  std::shared_ptr<const policy::Policy> policy;
  Client who;
  size_t next = 0;
  json limits = json::array();
  bool any_state = false;
  bool not_found_if_empty = false;
  std::string instance;
  std::function<void(Reply&&)> done;
};

void AdminApi::DemoState(std::shared_ptr<const policy::Policy> policy, const policy::Identity& who,
                         std::function<void(Reply&&)> done) {
  Client c = FromIdentity(*policy, who, true, enforcer_.overrides());
  State(std::move(policy), std::move(c), false, "/demo/state", std::move(done));
}

void AdminApi::State(std::shared_ptr<const policy::Policy> policy, Client who,
                     bool not_found_if_empty, std::string instance,
                     std::function<void(Reply&&)> done) {
  auto op = std::make_shared<StateOp>();
  op->policy = std::move(policy);
  op->who = std::move(who);
  op->not_found_if_empty = not_found_if_empty;
  op->instance = std::move(instance);
  op->done = std::move(done);
  PeekNext(std::move(op));
}

void AdminApi::PeekNext(std::shared_ptr<StateOp> op) {
  if (op->next == op->who.groups.size()) {
    if (op->not_found_if_empty && !op->any_state) {
      return op->done(ProblemReply(
          404, "no state for client '" + op->who.shown + "' (unknown, or every limit full)",
          op->instance));
    }
    return op->done(AdminJsonReply(200, {{"client", op->who.shown},
                                         {"source", op->who.source},
                                         {"plan", op->who.plan},
                                         {"limits", op->limits}}));
  }
  const policy::CheckGroup& g = op->who.groups[op->next++];
  store().Peek({g.key, g.checks}, [this, op, &g](StatusOr<CheckResult> r) {
    if (!r.ok()) {
      Reply reply = ProblemReply(503,
                                 "the rate limit store could not answer: " +
                                     std::string(FailureCauseName(CauseOf(r.status()))),
                                 op->instance);
      reply.Add("Retry-After", "1");
      return op->done(std::move(reply));
    }
    for (size_t i = 0; i < g.checks.size() && i < r->decisions.size(); ++i) {
      const Limit& l = *g.checks[i].limit;
      const Decision& d = r->decisions[i];
      const bool used = d.remaining < d.limit || (l.is_gcra() && d.reset_after.count() > 0);
      op->any_state = op->any_state || used;
      // The wait before one more unit would pass (Peek asks with cost 0).
      std::chrono::microseconds retry{0};
      if (d.remaining < 1) {
        retry = l.is_gcra()
                    ? std::max(std::chrono::microseconds(0),
                               d.reset_after -
                                   std::chrono::microseconds((l.limit() - 1) * l.interval_micros()))
                    : d.reset_after;
      }
      json entry = {{"name", l.name()},
                    {"scope", g.key == op->who.key ? "client" : "ip"},
                    {"algorithm", AlgorithmName(l.algorithm())},
                    {"limit", d.limit},
                    {"remaining", d.remaining},
                    {"reset_after_ms", Ms(d.reset_after)},
                    {"retry_after_ms", Ms(retry)}};
      if (l.algorithm() == Algorithm::kTokenBucket) {
        entry["refill_per_second"] = l.refill_per_second();
      } else if (l.algorithm() == Algorithm::kLeakyBucket) {
        entry["rate_per_second"] = l.refill_per_second();
      } else {
        entry["window_ms"] = Ms(l.window());
        if (const Calendar* c = l.calendar()) {  // window_ms: the nominal length
          entry["window"] = WindowText(l);
          entry["timezone"] = c->zone().name();
        }
      }
      op->limits.push_back(std::move(entry));
    }
    PeekNext(op);
  });
}

struct AdminApi::ResetOp {
  std::shared_ptr<const policy::Policy> policy;
  std::shared_ptr<const OverrideTable> overrides;  // holds the override's limits
  std::vector<policy::CheckGroup> groups;
  std::vector<std::vector<const Limit*>> limits;  // parallel to groups
  std::string client, instance;
  size_t next = 0;
  json names = json::array();
  std::function<void(Reply&&)> done;
};

void AdminApi::Reset(std::shared_ptr<const policy::Policy> policy, Client who, std::string instance,
                     std::function<void(Reply&&)> done) {
  auto op = std::make_shared<ResetOp>();
  op->groups = std::move(who.groups);
  // With an override, the configured limits too: after a reset the client
  // finds full limits with the override and, once it is gone, without it.
  // (A limit of the same name and algorithm is the same state, but for a
  // window limit of other windows, SharesState: its counts are other keys.)
  for (const policy::CheckGroup& g : who.configured) {
    for (const LimitCheck& c : g.checks) {
      const auto same = [&](const LimitCheck& o) { return SharesState(*o.limit, *c.limit); };
      const bool listed = std::any_of(op->groups.begin(), op->groups.end(), [&](const auto& og) {
        return og.key == g.key && std::any_of(og.checks.begin(), og.checks.end(), same);
      });
      if (listed) continue;
      auto it = std::find_if(op->groups.begin(), op->groups.end(), [&](const auto& og) {
        return og.key == g.key && og.checks.size() < kMaxChecksPerRequest;
      });
      if (it == op->groups.end()) {
        op->groups.push_back({g.key, {}, false, g.failure_mode});
        it = op->groups.end() - 1;
      }
      it->checks.push_back(c);
    }
  }
  op->overrides = std::move(who.overrides);
  op->policy = std::move(policy);
  op->client = std::move(who.shown);
  op->instance = std::move(instance);
  op->done = std::move(done);
  for (const policy::CheckGroup& g : op->groups) {
    std::vector<const Limit*>& ls = op->limits.emplace_back();
    for (const LimitCheck& c : g.checks) {
      ls.push_back(c.limit);
      op->names.push_back(c.limit->name());
    }
  }
  ResetNext(std::move(op));
}

void AdminApi::ResetNext(std::shared_ptr<ResetOp> op) {
  if (op->next == op->groups.size()) {
    Log(Level::kInfo, "admin: client reset", {{"key", op->client}});
    // The other instances on this Redis may hold cached denials of the state
    // just removed (a calendar quota's for weeks): they forget them on
    // hearing this. Should it not get through, they ask Redis again within
    // OverLimitCache::kMaxAge.
    Overrides* overrides = enforcer_.overrides();
    if (overrides == nullptr || !overrides->shared()) {
      return op->done(AdminJsonReply(200, {{"client", op->client}, {"reset", op->names}}));
    }
    return overrides->AnnounceReset(op->client, [op](const Status& s) {
      if (!s.ok()) {
        Log(Level::kWarn,
            "admin: the reset was not announced to the other instances: they may answer cached "
            "denials for up to 5 s",
            {{"key", op->client}, {"error", s.message()}});
      }
      op->done(AdminJsonReply(200, {{"client", op->client}, {"reset", op->names}}));
    });
  }
  const size_t i = op->next++;
  store().Reset(op->groups[i].key, op->limits[i], [this, op](const Status& s) {
    if (!s.ok()) {
      Reply r =
          ProblemReply(503, "the rate limit store could not reset: " + s.message(), op->instance);
      r.Add("Retry-After", "1");
      return op->done(std::move(r));
    }
    ResetNext(op);
  });
}

// Block periods: the client's limits with `block_for`, group by group (a
// group is one store key: the client's, or its IP's).
struct AdminApi::BlocksOp {
  std::vector<std::pair<std::string, std::vector<const Limit*>>> groups;  // key, limits
  // Hold the limits while the store answers: a reload may replace the policy
  // meanwhile (the configured limits), an override change the table.
  std::shared_ptr<const policy::Policy> policy;
  std::shared_ptr<const OverrideTable> overrides;  // holds the override's limits
  std::string client, instance;
  bool lift = false;
  size_t next = 0;
  json list = json::array();
  std::function<void(Reply&&)> done;
};

void AdminApi::Blocks(std::shared_ptr<const policy::Policy> policy, Client who, bool lift,
                      std::string instance, std::function<void(Reply&&)> done) {
  auto op = std::make_shared<BlocksOp>();
  op->policy = std::move(policy);
  for (const policy::CheckGroup& g : who.groups) {
    std::vector<const Limit*> ls;
    for (const LimitCheck& c : g.checks) {
      if (c.limit->block_for().count() > 0) ls.push_back(c.limit);
    }
    if (!ls.empty()) op->groups.emplace_back(g.key, std::move(ls));
  }
  op->overrides = std::move(who.overrides);
  op->client = std::move(who.shown);
  op->lift = lift;
  op->instance = std::move(instance);
  op->done = std::move(done);
  BlocksNext(std::move(op));
}

void AdminApi::BlocksNext(std::shared_ptr<BlocksOp> op) {
  auto unavailable = [op](const Status& s) {
    Reply r =
        ProblemReply(503, "the rate limit store could not answer: " + s.message(), op->instance);
    r.Add("Retry-After", "1");
    op->done(std::move(r));
  };
  if (op->next == op->groups.size()) {
    if (op->lift) Log(Level::kInfo, "admin: blocks lifted", {{"key", op->client}});
    return op->done(
        AdminJsonReply(200, {{"client", op->client}, {op->lift ? "lifted" : "blocks", op->list}}));
  }
  const std::string& key = op->groups[op->next].first;
  const std::vector<const Limit*>& limits = op->groups[op->next++].second;
  if (op->lift) {
    for (const Limit* l : limits) op->list.push_back(l->name());
    return store().Unblock(key, limits, [this, op, unavailable](const Status& s) {
      if (!s.ok()) return unavailable(s);
      BlocksNext(op);
    });
  }
  store().Blocks(
      key, limits,
      [this, op, unavailable, &limits](StatusOr<std::vector<std::chrono::microseconds>> r) {
        if (!r.ok()) return unavailable(r.status());
        const int64_t now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count();
        for (size_t i = 0; i < limits.size() && i < r->size(); ++i) {
          if ((*r)[i].count() <= 0) continue;
          op->list.push_back({{"limit", limits[i]->name()},
                              {"block_for_ms", Ms(limits[i]->block_for())},
                              {"remaining_ms", Ms((*r)[i])},
                              {"until", IsoTime(now_ms + Ms((*r)[i]))}});
        }
        BlocksNext(op);
      });
}

void AdminApi::Ready(std::shared_ptr<const policy::Policy> policy,
                     std::function<void(Reply&&)> done) {
  const Store* redis = &store();
  if (!redis->remote()) return done(AdminJsonReply(200, {{"ready", true}, {"store", "memory"}}));
  static const Limit kProbe = *Limit::TokenBucket("readyz", 1, 1.0);
  static const LimitCheck kCheck[] = {{&kProbe, 0}};
  const policy::FailureMode mode = policy->config().store.failure_mode;
  const std::string mode_name(FailureModeName(mode));
  // A Peek never creates state: a cheap round trip that proves Redis answers.
  store().Peek({"admin:readyz", kCheck}, [redis, mode, mode_name,
                                          done = std::move(done)](StatusOr<CheckResult> r) {
    const std::string breaker(BreakerStateName(redis->breaker_state()));
    if (r.ok()) {
      return done(AdminJsonReply(
          200, {{"ready", true}, {"store", "redis"}, {"reachable", true}, {"breaker", breaker}}));
    }
    const bool ready = mode != policy::FailureMode::kClosed;
    Reply reply =
        AdminJsonReply(ready ? 200 : 503, {{"ready", ready},
                                           {"store", "redis"},
                                           {"reachable", false},
                                           {"cause", FailureCauseName(CauseOf(r.status()))},
                                           {"breaker", breaker},
                                           {"failure_mode", mode_name}});
    done(std::move(reply));
  });
}

}  // namespace ratelimit::server
