// Policy: identity precedence, proxies, route matching, groups, cost, shadow.
#include "policy/policy.h"

#include <gtest/gtest.h>

#include <strings.h>

#include <map>

namespace ratelimit::policy {
namespace {

constexpr std::string_view kConfig = R"(
store: {type: memory, failure_mode: open}
clients:
  api_key_header: X-API-Key
  user_header: X-User-Id
  trusted_proxies: [10.0.0.0/8]
  ipv6_prefix: 64
limits:
  burst: {algorithm: token_bucket, capacity: 10, refill_per_second: 5}
  daily: {algorithm: fixed_window, limit: 1000, window: 1d}
plans:
  free: {limits: [daily]}
  pro:
    limits:
      - {name: daily_pro, algorithm: fixed_window, limit: 100000, window: 1d}
      - {name: pro_watch, algorithm: sliding_window, limit: 50, window: 1m, shadow: true}
default_plan: free
api_keys: {"key-pro": pro, "key-free": free}
global: [burst]
routes:
  - {name: login, methods: [POST], path: /login, match: exact, key_by: ip,
     limits: [{name: login, algorithm: sliding_log, limit: 5, window: 15m}]}
  - {name: search, path: /api/search, match: prefix, cost: 5, limits: [burst]}
  - {name: item, methods: [GET], path: "/api/items/{id}", match: template, shadow: true,
     limits: [{name: item, algorithm: fixed_window, limit: 100, window: 1m}]}
  - {name: pay, path: /api/pay, failure_mode: closed,
     limits: [{name: pay, algorithm: fixed_window, limit: 10, window: 1m}]}
  - {name: daily_too, path: /api/daily, cost: 3, limits: [daily]}
  - {name: upload, path: /api/upload, concurrency: {max_in_flight: 3, lease_ttl: 2s}}
  - {name: export, path: /api/export, key_by: ip, failure_mode: closed,
     concurrency: {max_in_flight: 2, per: route, on_limit: wait, max_wait: 1500ms}}
  - {name: report, path: /api/report, key_by: ip, concurrency: {max_in_flight: 1}}
  - {name: api, path: /api, limits: []}
)";

class PolicyTest : public testing::Test {
 protected:
  void SetUp() override {
    StatusOr<Config> c = ParseConfig(kConfig, "test.yaml");
    ASSERT_TRUE(c.ok()) << c.status().message();
    StatusOr<std::shared_ptr<const Policy>> p = Policy::Create(*std::move(c));
    ASSERT_TRUE(p.ok()) << p.status().message();
    policy_ = *p;
  }

  StatusOr<RequestPlan> Resolve(std::string_view method, std::string_view target,
                                std::string_view peer = "203.0.113.9") {
    RequestView r{.method = method,
                  .target = target,
                  .peer = *IpAddress::Parse(peer),
                  .header = [this](std::string_view name) -> std::optional<std::string_view> {
                    for (const auto& [k, v] : headers_) {
                      if (strcasecmp(k.c_str(), std::string(name).c_str()) == 0) return v;
                    }
                    return std::nullopt;
                  }};
    return policy_->Resolve(r);
  }

  std::string RouteOf(std::string_view method, std::string_view target) {
    StatusOr<RequestPlan> p = Resolve(method, target);
    if (!p.ok()) return "error";
    return p->route ? p->route->name : "none";
  }

  // "key|shadow|mode: limit*cost limit*cost"
  static std::vector<std::string> Groups(const RequestPlan& p) {
    std::vector<std::string> out;
    for (const CheckGroup& g : p.groups) {
      std::string s = g.key + (g.shadow ? "|shadow" : "") + "|" +
                      std::string(FailureModeName(g.failure_mode)) + ":";
      for (const LimitCheck& c : g.checks)
        s += " " + c.limit->name() + "*" + std::to_string(c.cost);
      out.push_back(s);
    }
    return out;
  }

  std::shared_ptr<const Policy> policy_;
  std::map<std::string, std::string> headers_;
};

using V = std::vector<std::string>;

TEST_F(PolicyTest, IdentityPrecedenceApiKeyThenUserThenIp) {
  StatusOr<RequestPlan> p = Resolve("GET", "/x");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->identity.source, IdentitySource::kIp);
  EXPECT_EQ(p->identity.key, "ip:203.0.113.9");
  EXPECT_EQ(p->identity.ip_key, "ip:203.0.113.9");
  EXPECT_EQ(p->identity.plan, "free");

  headers_["X-User-Id"] = "ada";
  p = Resolve("GET", "/x");
  EXPECT_EQ(p->identity.source, IdentitySource::kUser);
  EXPECT_EQ(p->identity.key, "u:ada");
  EXPECT_EQ(p->identity.plan, "free");

  headers_["x-api-key"] = "key-pro";
  p = Resolve("GET", "/x");
  EXPECT_EQ(p->identity.source, IdentitySource::kApiKey);
  EXPECT_EQ(p->identity.key, "k:key-pro");
  EXPECT_EQ(p->identity.ip_key, "ip:203.0.113.9");
  EXPECT_EQ(p->identity.plan, "pro");

  // An unknown key is not an identity here (accept_unknown_api_keys: false).
  headers_["x-api-key"] = "key-made-up";
  p = Resolve("GET", "/x");
  EXPECT_EQ(p->identity.key, "u:ada");
  headers_.erase("X-User-Id");
  p = Resolve("GET", "/x");
  EXPECT_EQ(p->identity.key, "ip:203.0.113.9");

  // Unusable values (too long, control characters, spaces) are ignored.
  headers_["X-User-Id"] = std::string(300, 'a');
  EXPECT_EQ(Resolve("GET", "/x")->identity.key, "ip:203.0.113.9");
  headers_["X-User-Id"] = "a b";
  EXPECT_EQ(Resolve("GET", "/x")->identity.key, "ip:203.0.113.9");
}

TEST_F(PolicyTest, IpV6ClientsAreKeyedByPrefix) {
  StatusOr<RequestPlan> p = Resolve("GET", "/x", "2001:db8:1:2:aaaa::1");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->identity.key, "ip:2001:db8:1:2::/64");
  EXPECT_EQ(p->identity.client_ip.ToString(), "2001:db8:1:2:aaaa::1");
}

TEST_F(PolicyTest, ForwardedHeadersOnlyFromTrustedProxies) {
  headers_["X-Forwarded-For"] = "198.51.100.7";
  EXPECT_EQ(Resolve("GET", "/x", "203.0.113.9")->identity.key, "ip:203.0.113.9");  // spoof ignored
  EXPECT_EQ(Resolve("GET", "/x", "10.1.2.3")->identity.key, "ip:198.51.100.7");
  headers_["X-Forwarded-For"] = "1.1.1.1, 198.51.100.7, 10.9.9.9";
  EXPECT_EQ(Resolve("GET", "/x", "10.1.2.3")->identity.key, "ip:198.51.100.7");
  headers_["Forwarded"] = "for=198.51.100.8";
  EXPECT_EQ(Resolve("GET", "/x", "10.1.2.3")->identity.key, "ip:198.51.100.8");
}

// A proxy that sets X-Forwarded-For passes the client's own Forwarded through
// unless told to strip it, and by default Forwarded is preferred: naming the
// header the proxies set leaves the client no other to pick its address with.
TEST_F(PolicyTest, ClientIpHeaderReadsOnlyTheHeaderTheProxiesSet) {
  headers_["X-Forwarded-For"] = "198.51.100.7";
  headers_["Forwarded"] = "for=203.0.113.66";  // the client's forgery, passed through
  const auto key_with = [&](std::string_view setting) {
    StatusOr<Config> c = ParseConfig(
        "clients: {trusted_proxies: [10.0.0.0/8], client_ip_header: " + std::string(setting) + "}",
        "t.yaml");
    EXPECT_TRUE(c.ok()) << c.status().message();
    StatusOr<std::shared_ptr<const Policy>> p = Policy::Create(*std::move(c));
    EXPECT_TRUE(p.ok()) << p.status().message();
    policy_ = *p;
    return Resolve("GET", "/x", "10.1.2.3")->identity.key;
  };
  EXPECT_EQ(key_with("X-Forwarded-For"), "ip:198.51.100.7");
  EXPECT_EQ(key_with("Forwarded"), "ip:203.0.113.66");
  EXPECT_EQ(key_with("any"), "ip:203.0.113.66");  // the default: Forwarded first
  headers_.erase("X-Forwarded-For");
  EXPECT_EQ(key_with("X-Forwarded-For"), "ip:10.1.2.3");  // none set: the peer
}

TEST_F(PolicyTest, LoginSpellingsAllHitTheLoginRoute) {
  for (std::string_view t : {"/login", "/Login", "/login/", "/./login", "/a/../login", "/%6Cogin",
                             "/LOGIN?next=/", "http://h/login", "/a//../login"}) {
    EXPECT_EQ(RouteOf("POST", t), "login") << t;
  }
  // Spellings that a WHATWG URL parser (Node, Deno, Bun) or Python's urlsplit
  // serves as /login while merging the slashes would not: refused, never
  // matched elsewhere ("//evil/login" is host evil, path /login, to them).
  for (std::string_view t : {"//login", "//evil/login", "/x/..\\login", "/x/..%5Clogin",
                             "/\\evil/login", "/x/..%5clogin"}) {
    StatusOr<RequestPlan> p = Resolve("POST", t);
    ASSERT_FALSE(p.ok()) << t << " -> " << p->canonical_path;
    EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument) << t;
  }
  EXPECT_EQ(RouteOf("GET", "/login"), "none");     // methods: [POST]
  EXPECT_EQ(RouteOf("POST", "/login/x"), "none");  // exact
  EXPECT_EQ(RouteOf("POST", "/loginx"), "none");
}

// A path parameter (";...", which Tomcat, Jetty and Spring drop before they
// route) must not take a request out of its route class: "/login;x" is
// "/login", with the route's limits, key and cost.
TEST_F(PolicyTest, PathParametersDoNotEscapeTheRoute) {
  for (std::string_view t : {"/login;jsessionid=0A1B", "/login;x", "/LOGIN;x=1/",
                             "/x/y;z/../../login", "/login;a=1,b=2", "http://h/login;x?next=/"}) {
    EXPECT_EQ(RouteOf("POST", t), "login") << t;
  }
  StatusOr<RequestPlan> p = Resolve("GET", "/api/search;v=2/deep;x?q=1");
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(p->canonical_path, "/api/search/deep");
  ASSERT_NE(p->route, nullptr);
  EXPECT_EQ(p->route->name, "search");
  EXPECT_EQ(p->route->cost, 5);
  EXPECT_EQ(RouteOf("GET", "/api/items/42;rev=3"), "item");  // a template's segment too
  // An escaped ';' is data: "/login%3Bx" is the path "/login;x", not /login.
  EXPECT_EQ(RouteOf("POST", "/login%3Bx"), "none");
  EXPECT_EQ(RouteOf("GET", "/api%3Bsearch"), "none");
}

// Werkzeug (Flask) upper-cases the method before it routes, so "post /login"
// is served by the POST view: a [POST] route must not be escaped by case. A
// route's GET also takes HEAD, which Go 1.22's ServeMux, Express and Flask
// serve with the GET handler. The method matched is not the one forwarded.
TEST_F(PolicyTest, MethodsMatchInAnyCaseAndGetTakesHead) {
  for (std::string_view m : {"POST", "post", "Post", "pOsT"}) {
    EXPECT_EQ(RouteOf(m, "/login"), "login") << m;
  }
  for (std::string_view m : {"GET", "get", "HEAD", "head", "Head"}) {
    EXPECT_EQ(RouteOf(m, "/api/items/7"), "item") << m;  // methods: [GET]
    EXPECT_EQ(RouteOf(m, "/login"), "none") << m;        // methods: [POST]
  }
  EXPECT_EQ(RouteOf("POST", "/api/items/7"), "api");
  EXPECT_EQ(RouteOf("POSTX", "/login"), "none");
  EXPECT_EQ(RouteOf("POS", "/login"), "none");
  EXPECT_EQ(RouteOf("HEADX", "/api/items/7"), "api");
}

TEST_F(PolicyTest, RouteMatching) {
  EXPECT_EQ(RouteOf("GET", "/api/search"), "search");
  EXPECT_EQ(RouteOf("GET", "/api/search/deep/x"), "search");
  EXPECT_EQ(RouteOf("GET", "/api/searching"), "api");  // prefix is segment-aware
  EXPECT_EQ(RouteOf("GET", "/api/items/42"), "item");
  EXPECT_EQ(RouteOf("GET", "/API/Items/42/"), "item");
  EXPECT_EQ(RouteOf("POST", "/api/items/42"), "api");   // item is GET only
  EXPECT_EQ(RouteOf("GET", "/api/items"), "api");       // {id} needs a segment
  EXPECT_EQ(RouteOf("GET", "/api/items/42/x"), "api");  // and exactly one
  EXPECT_EQ(RouteOf("GET", "/api"), "api");
  EXPECT_EQ(RouteOf("GET", "/apix"), "none");
  EXPECT_EQ(RouteOf("GET", "/"), "none");
  EXPECT_EQ(policy_->Route("GET", "/api/items/7")->name, "item");
}

TEST_F(PolicyTest, BadPathIsInvalidArgument) {
  StatusOr<RequestPlan> p = Resolve("GET", "/a%2Fb");
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(Resolve("GET", "/a%zz").ok());
}

TEST_F(PolicyTest, GroupsForAnonymousClient) {
  // No route: plan (free: daily) and global (burst), one group, cost 1.
  EXPECT_EQ(Groups(*Resolve("GET", "/other")), (V{"ip:203.0.113.9|open: daily*1 burst*1"}));
  // key_by: ip while the client IS the IP: one key, one all-or-nothing group.
  EXPECT_EQ(Groups(*Resolve("POST", "/login")),
            (V{"ip:203.0.113.9|open: login*1 daily*1 burst*1"}));
}

TEST_F(PolicyTest, GroupsForApiKeyClient) {
  headers_["X-API-Key"] = "key-pro";
  // key_by: ip: the login limit on the IP, plan and global on the key.
  EXPECT_EQ(Groups(*Resolve("POST", "/login")),
            (V{"ip:203.0.113.9|open: login*1", "k:key-pro|open: daily_pro*1 burst*1",
               "k:key-pro|shadow|open: pro_watch*1"}));
  // Cost applies to the route's limits; burst is in the route and global: once, at cost 5.
  EXPECT_EQ(Groups(*Resolve("GET", "/api/search?q=1")),
            (V{"k:key-pro|open: burst*5 daily_pro*1", "k:key-pro|shadow|open: pro_watch*1"}));
  // Route shadow applies to the route's limits only; route failure_mode likewise.
  EXPECT_EQ(Groups(*Resolve("GET", "/api/items/1")), (V{"k:key-pro|shadow|open: item*1 pro_watch*1",
                                                        "k:key-pro|open: daily_pro*1 burst*1"}));
  EXPECT_EQ(Groups(*Resolve("GET", "/api/pay")),
            (V{"k:key-pro|closed: pay*1", "k:key-pro|open: daily_pro*1 burst*1",
               "k:key-pro|shadow|open: pro_watch*1"}));
}

TEST_F(PolicyTest, SameLimitInRouteAndPlanCountsOnceWithRouteCost) {
  headers_["X-API-Key"] = "key-free";
  EXPECT_EQ(Groups(*Resolve("GET", "/api/daily")), (V{"k:key-free|open: daily*3 burst*1"}));
}

TEST_F(PolicyTest, NamedLimitsAndLimitsFor) {
  ASSERT_NE(policy_->NamedLimit("burst"), nullptr);
  ASSERT_NE(policy_->NamedLimit("login"), nullptr);  // inline limits are named too
  EXPECT_EQ(policy_->NamedLimit("nope"), nullptr);
  Identity id;
  id.plan = "pro";
  std::vector<std::string> names;
  for (const Limit* l : policy_->LimitsFor(id)) names.push_back(l->name());
  EXPECT_EQ(names, (V{"login", "burst", "item", "pay", "daily", "daily_pro", "pro_watch"}));
}

TEST_F(PolicyTest, PeekGroupsCoverEveryKeyAndLimit) {
  headers_["X-API-Key"] = "key-pro";
  Identity id = policy_->Identify(
      RequestView{.method = "GET",
                  .target = "/",
                  .peer = *IpAddress::Parse("203.0.113.9"),
                  .header = [&](std::string_view n) -> std::optional<std::string_view> {
                    if (strcasecmp(std::string(n).c_str(), "x-api-key") == 0) return "key-pro";
                    return std::nullopt;
                  }});
  EXPECT_EQ(id.key, "k:key-pro");
  std::vector<std::string> got;
  for (const CheckGroup& g : policy_->PeekGroupsFor(id)) {
    std::string s = g.key + ":";
    for (const LimitCheck& c : g.checks) s += " " + c.limit->name() + "*" + std::to_string(c.cost);
    got.push_back(s);
  }
  EXPECT_EQ(got, (V{"k:key-pro: daily_pro*0 burst*0 pro_watch*0 item*0 pay*0 daily*0",
                    "ip:203.0.113.9: login*0"}));
}

TEST(Policy, EmbeddedDefaultKeysUnknownApiKeysOrIp) {
  StatusOr<std::shared_ptr<const Policy>> p = Policy::Create(EmbeddedDefault());
  ASSERT_TRUE(p.ok());
  std::optional<std::string_view> key;
  RequestView r{.method = "GET",
                .target = "/api/ping",
                .peer = *IpAddress::Parse("127.0.0.1"),
                .header = [&](std::string_view n) -> std::optional<std::string_view> {
                  return strcasecmp(std::string(n).c_str(), "X-API-Key") == 0 ? key : std::nullopt;
                }};
  StatusOr<RequestPlan> plan = (*p)->Resolve(r);
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->groups.size(), 1u);
  EXPECT_EQ(plan->groups[0].key, "ip:127.0.0.1");
  EXPECT_EQ(plan->groups[0].checks[0].limit->name(), "ping");
  key = "anything-at-all";
  plan = (*p)->Resolve(r);
  EXPECT_EQ(plan->groups[0].key, "k:anything-at-all");
  r.target = "/api/other";
  EXPECT_TRUE((*p)->Resolve(r)->groups.empty());
  r.header = nullptr;  // no header function at all
  r.target = "/api/ping";
  EXPECT_EQ((*p)->Resolve(r)->groups.at(0).key, "ip:127.0.0.1");
}

TEST_F(PolicyTest, ConcurrencyLimitsOfTheRoute) {
  headers_["X-API-Key"] = "key-pro";
  StatusOr<RequestPlan> p = Resolve("POST", "/api/upload/x");
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE(p->concurrency.has_value());
  EXPECT_EQ(p->concurrency->key, "k:key-pro");
  EXPECT_EQ(p->concurrency->config->max_in_flight, 3);
  EXPECT_EQ(p->concurrency->config->lease_ttl, std::chrono::seconds(2));
  EXPECT_EQ(p->concurrency->config->on_limit, ConcurrencyConfig::OnLimit::kReject);
  EXPECT_EQ(p->concurrency->config->per, ConcurrencyConfig::Per::kClient);
  EXPECT_EQ(p->concurrency->failure_mode, FailureMode::kOpen);  // the store's
  EXPECT_EQ(Groups(*p),
            (V{"k:key-pro|open: daily_pro*1 burst*1", "k:key-pro|shadow|open: pro_watch*1"}));

  p = Resolve("GET", "/api/export");
  ASSERT_TRUE(p.ok() && p->concurrency);
  EXPECT_EQ(p->concurrency->key, kWholeRouteKey);  // per: route, whoever asks
  EXPECT_EQ(p->concurrency->config->on_limit, ConcurrencyConfig::OnLimit::kWait);
  EXPECT_EQ(p->concurrency->config->max_wait, std::chrono::milliseconds(1500));
  EXPECT_EQ(p->concurrency->config->max_waiting, 1000u);
  EXPECT_EQ(p->concurrency->failure_mode, FailureMode::kClosed);

  p = Resolve("GET", "/api/report");  // key_by: ip keys the concurrency by IP too
  ASSERT_TRUE(p.ok() && p->concurrency);
  EXPECT_EQ(p->concurrency->key, "ip:203.0.113.9");

  p = Resolve("GET", "/api/other");
  ASSERT_TRUE(p.ok());
  EXPECT_FALSE(p->concurrency.has_value());
}

TEST(Policy, CreateRejectsWhatTheLoaderWouldHave) {
  Config c = EmbeddedDefault();
  c.routes[0].cost = 6;  // capacity is 5
  EXPECT_FALSE(Policy::Create(c).ok());
  c = EmbeddedDefault();
  c.routes[0].path = "/API/ping";  // not canonical
  EXPECT_FALSE(Policy::Create(c).ok());
  c = EmbeddedDefault();
  c.default_plan = "gold";
  EXPECT_FALSE(Policy::Create(c).ok());
  c = EmbeddedDefault();
  for (int i = 0; i < 17; ++i) {
    c.global_limits.push_back(
        RuleLimit{.limit = *Limit::TokenBucket("g" + std::to_string(i), 5, 1)});
  }
  StatusOr<std::shared_ptr<const Policy>> p = Policy::Create(c);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("more than 16 limits"), std::string::npos)
      << p.status().message();
}

}  // namespace
}  // namespace ratelimit::policy
