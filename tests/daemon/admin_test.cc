// The admin API and /metrics against the real ratelimitd: state that matches
// the next decision, reset, denials, top-denied, the bearer token, bad input,
// readiness, the admin paths absent from the public port, and `promtool
// check metrics` on the scraped exposition. A missing promtool is a failure.
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <tuple>
#include <utility>

#include "harness.h"
#include "json_calls.h"
#include "support/redis_server.h"

namespace rltest {
namespace {

using json = nlohmann::json;

// A slow refill (1 token per 1000 s) so the numbers cannot move during a test.
constexpr const char* kConfig = R"(server: {demo: true}
clients: {accept_unknown_api_keys: true}
limits: {ping: {algorithm: token_bucket, capacity: 5, refill_per_second: 0.001}}
routes:
  - {name: ping, methods: [GET], path: /api/ping, match: exact, limits: [ping]}
)";

std::string WriteConfig(const std::string& extra = "") {
  const std::string dir = MakeTempDir();
  WriteFile(dir + "/rl.yaml", std::string(kConfig) + extra);
  return dir + "/rl.yaml";
}

HttpResponse Ping(const Daemon& d, const std::string& key) {
  return Http(d.port(), "GET", "/api/ping", {{"X-API-Key", key}});
}

HttpResponse Admin(const Daemon& d, const std::string& method, const std::string& target,
                   const Headers& headers = {}) {
  return Http(d.admin_port(), method, target, headers);
}

class AdminApi : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(d_.started() && d_.admin_port() > 0) << d_.Log(); }
  Daemon d_{{"--config", WriteConfig()}};
};

TEST_F(AdminApi, StateMatchesTheNextDecision) {
  for (int i = 0; i < 3; ++i) ASSERT_EQ(Ping(d_, "ada").status, 200);
  HttpResponse s = Admin(d_, "GET", "/v1/clients/k:ada/state");
  ASSERT_EQ(s.status, 200) << s.body;
  json j = Body(s);
  EXPECT_EQ(j["client"], "k:ada***fdee430d");  // API keys are shown shortened
  EXPECT_EQ(j["source"], "api_key");
  ASSERT_EQ(j["limits"].size(), 1u) << s.body;
  const json& l = j["limits"][0];
  EXPECT_EQ(l["name"], "ping");
  EXPECT_EQ(l["limit"], 5);
  EXPECT_EQ(l["remaining"], 2);
  EXPECT_GT(l["reset_after_ms"].get<int64_t>(), 0);
  EXPECT_EQ(l["retry_after_ms"], 0);
  // Reading changed nothing: the next decision is the one the state foretold.
  HttpResponse next = Ping(d_, "ada");
  EXPECT_EQ(next.status, 200);
  EXPECT_EQ(next.Header("RateLimit-Remaining"), "1");
  // "-" with ?api_key= forms the same identity.
  j = Body(Admin(d_, "GET", "/v1/clients/-/state?api_key=ada"));
  EXPECT_EQ(j["limits"][0]["remaining"], 1);
  // Empty bucket: retry_after_ms says when one more request passes.
  ASSERT_EQ(Ping(d_, "ada").status, 200);
  j = Body(Admin(d_, "GET", "/v1/clients/k:ada/state"));
  EXPECT_EQ(j["limits"][0]["remaining"], 0);
  EXPECT_GT(j["limits"][0]["retry_after_ms"].get<int64_t>(), 900'000);
  HttpResponse denied = Ping(d_, "ada");
  EXPECT_EQ(denied.status, 429);
  EXPECT_NEAR(std::stoll(denied.Header("Retry-After")),
              j["limits"][0]["retry_after_ms"].get<int64_t>() / 1000.0, 2.0);
}

TEST_F(AdminApi, IpClientsToo) {
  ASSERT_EQ(Http(d_.port(), "GET", "/api/ping").status, 200);  // from 127.0.0.1
  json j = Body(Admin(d_, "GET", "/v1/clients/ip:127.0.0.1/state"));
  EXPECT_EQ(j["limits"][0]["remaining"], 4) << j.dump();
  j = Body(Admin(d_, "GET", "/v1/clients/-/state?ip=127.0.0.1"));
  EXPECT_EQ(j["limits"][0]["remaining"], 4) << j.dump();
}

TEST_F(AdminApi, ResetGivesAFullBucket) {
  for (int i = 0; i < 5; ++i) ASSERT_EQ(Ping(d_, "bob").status, 200);
  ASSERT_EQ(Ping(d_, "bob").status, 429);
  HttpResponse r = Admin(d_, "POST", "/v1/clients/k:bob/reset");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(Body(r)["reset"], json::array({"ping"}));
  EXPECT_EQ(Admin(d_, "GET", "/v1/clients/k:bob/state").status, 404);  // nothing stored
  HttpResponse next = Ping(d_, "bob");
  EXPECT_EQ(next.status, 200);
  EXPECT_EQ(next.Header("RateLimit-Remaining"), "4");
  // DELETE on the state does the same.
  EXPECT_EQ(Admin(d_, "DELETE", "/v1/clients/k:bob/state").status, 200);
  EXPECT_EQ(Ping(d_, "bob").Header("RateLimit-Remaining"), "4");
  EXPECT_EQ(Admin(d_, "GET", "/v1/clients/k:bob/reset").status, 405);
}

TEST_F(AdminApi, UnknownClientsAre404AndReadingCreatesNoState) {
  EXPECT_EQ(Admin(d_, "GET", "/v1/clients/k:nobody/state").status, 404);
  EXPECT_EQ(Admin(d_, "GET", "/v1/clients/k:nobody/state").status, 404);  // still nothing
  // No prefix matching: "k:carol" has state, "k:car" does not.
  ASSERT_EQ(Ping(d_, "carol").status, 200);
  EXPECT_EQ(Admin(d_, "GET", "/v1/clients/k:car/state").status, 404);
  EXPECT_EQ(Admin(d_, "GET", "/v1/clients/k:carol/state").status, 200);
  // user_header is off in this config: no u: client can exist.
  EXPECT_EQ(Admin(d_, "GET", "/v1/clients/u:ada/state").status, 404);
  EXPECT_EQ(Admin(d_, "GET", "/v1/nothing").status, 404);
}

TEST_F(AdminApi, BadInputIs400) {
  const std::vector<std::string> bad = {
      "/v1/clients/k:" + std::string(300, 'a') + "/state",  // too long
      "/v1/clients/k:a%01b/state",                          // control character
      "/v1/clients/k:a%20b/state",                          // space
      "/v1/clients/k:a%zz/state",                           // malformed escape
      "/v1/clients/x:foo/state",                            // no such identity kind
      "/v1/clients/ip:not-an-ip/state",
      "/v1/clients/-/state",                       // "-" needs a query
      "/v1/clients/-/state?api_key=a&ip=1.2.3.4",  // two identities
      "/v1/clients/k:a/state?api_key=a",           // path and query
      "/v1/clients/-/state?bogus=1",
      "/v1/top-denied?n=101",
      "/v1/top-denied?n=1000000000",
      "/v1/top-denied?n=0",
      "/v1/top-denied?n=-1",
      "/v1/top-denied?window=2h",
      "/v1/top-denied?window=soon",
      "/v1/top-denied?x=1",
  };
  for (const std::string& t : bad) {
    HttpResponse r = Admin(d_, "GET", t);
    EXPECT_EQ(r.status, 400) << t << " " << r.body;
    EXPECT_EQ(r.Header("Content-Type"), "application/problem+json") << t;
  }
}

TEST_F(AdminApi, DenialsAndTopDenied) {
  for (int i = 0; i < 7; ++i) Ping(d_, "dave");   // 2 denied
  for (int i = 0; i < 6; ++i) Ping(d_, "erin");   // 1 denied
  for (int i = 0; i < 6; ++i) Ping(d_, "davey");  // 1 denied: never shown as dave's
  HttpResponse r = Admin(d_, "GET", "/v1/clients/k:dave/denials");
  ASSERT_EQ(r.status, 200) << r.body;
  json j = Body(r);
  ASSERT_EQ(j["denials"].size(), 2u) << r.body;
  EXPECT_EQ(j["denials"][0]["limit"], "ping");
  EXPECT_EQ(j["denials"][0]["route"], "ping");
  EXPECT_EQ(j["denials"][0]["path"], "/api/ping");
  EXPECT_TRUE(j["denials"][0]["time"].is_string());
  r = Admin(d_, "GET", "/v1/top-denied?n=2&window=5m");
  ASSERT_EQ(r.status, 200) << r.body;
  j = Body(r);
  ASSERT_EQ(j["clients"].size(), 2u) << r.body;
  EXPECT_EQ(j["clients"][0]["client"], "k:dave***61ea0803");
  EXPECT_EQ(j["clients"][0]["denials"], 2);
  EXPECT_EQ(j["clients"][1]["denials"], 1);
  EXPECT_EQ(Body(Admin(d_, "GET", "/v1/top-denied?n=100&window=1m"))["clients"].size(), 3u);
}

TEST_F(AdminApi, ConfigHealthAndReadiness) {
  HttpResponse c = Admin(d_, "GET", "/v1/config");
  ASSERT_EQ(c.status, 200);
  EXPECT_NE(c.body.find("refill_per_second"), std::string::npos) << c.body;
  EXPECT_EQ(Admin(d_, "GET", "/healthz").status, 200);
  HttpResponse ready = Admin(d_, "GET", "/readyz");
  EXPECT_EQ(ready.status, 200);
  EXPECT_EQ(Body(ready)["store"], "memory");
}

TEST_F(AdminApi, AdminPathsAreNotOnThePublicPort) {
  ASSERT_EQ(Ping(d_, "frank").status, 200);
  for (const std::string t : {"/v1/clients/k:frank/state", "/v1/clients/k:frank/denials",
                              "/v1/top-denied", "/v1/config", "/metrics", "/healthz", "/readyz"}) {
    EXPECT_EQ(Http(d_.port(), "GET", t).status, 404) << t;
  }
  EXPECT_EQ(Http(d_.port(), "POST", "/v1/clients/k:frank/reset").status, 404);
  EXPECT_EQ(Ping(d_, "frank").Header("RateLimit-Remaining"), "3");  // nothing was reset
}

TEST_F(AdminApi, DemoStateShowsOnlyTheCallersOwnBucket) {
  for (int i = 0; i < 2; ++i) ASSERT_EQ(Ping(d_, "gina").status, 200);
  HttpResponse mine = Http(d_.port(), "GET", "/demo/state", {{"X-API-Key", "gina"}});
  ASSERT_EQ(mine.status, 200) << mine.body;
  EXPECT_EQ(Body(mine)["limits"][0]["remaining"], 3);
  // Anyone else sees their own (full) bucket, whatever they put in the URL.
  HttpResponse other =
      Http(d_.port(), "GET", "/demo/state?api_key=gina&client=k:gina", {{"X-API-Key", "hal"}});
  ASSERT_EQ(other.status, 200);
  EXPECT_EQ(Body(other)["limits"][0]["remaining"], 5);
  EXPECT_EQ(Body(other)["client"], "k:hal***232554ca");
  EXPECT_EQ(Admin(d_, "GET", "/v1/clients/k:hal/state").status, 404);  // created nothing
}

// /demo/state is public and each call is a store Peek: a client address gets
// a burst of 20, then 10 a second (DemoStateLimit); beyond, a 429 problem
// with Retry-After. Other addresses, and the demo's own decisions, go on.
TEST_F(AdminApi, DemoStateIsLimitedPerClientAddress) {
  int ok = 0;
  HttpResponse refused;
  for (int i = 0; i < 60 && refused.status == 0; ++i) {
    HttpResponse r = Http(d_.port(), "GET", "/demo/state", {{"X-API-Key", "ivy"}});
    if (r.status == 200) {
      ++ok;
    } else {
      refused = r;
    }
  }
  ASSERT_EQ(refused.status, 429) << "after " << ok << " answers: " << refused.body;
  EXPECT_GE(ok, 20);  // the burst
  EXPECT_EQ(refused.Header("Retry-After"), "1");
  EXPECT_EQ(refused.Header("Content-Type"), "application/problem+json");
  const std::string detail = Body(refused)["detail"];
  EXPECT_NE(detail.find("at most 10 times a second"), std::string::npos) << detail;
  // Limited by address, not by key: another key from the same address is too
  // (a few tries: a stall of 100 ms on a busy box refills one call).
  int jon = 0;
  for (int i = 0; i < 3 && jon != 429; ++i) {
    jon = Http(d_.port(), "GET", "/demo/state", {{"X-API-Key", "jon"}}).status;
  }
  EXPECT_EQ(jon, 429);
  HttpResponse other =
      Http(d_.port(), "GET", "/demo/state", {{"X-API-Key", "ivy"}}, "", "127.0.0.2");
  EXPECT_EQ(other.status, 200) << other.body;
  EXPECT_EQ(Body(other)["limits"][0]["remaining"], 5);
  // The demo's own limit decides as before, for the polling address too.
  HttpResponse ping = Ping(d_, "ivy");
  EXPECT_EQ(ping.status, 200);
  EXPECT_EQ(ping.Header("RateLimit-Remaining"), "4");
  EXPECT_EQ(Http(d_.port(), "GET", "/").status, 200);
}

// One admin request carrying `host` as its Host (Http sends 127.0.0.1:<port>).
HttpResponse AdminWithHost(const Daemon& d, const std::string& method, const std::string& target,
                           const std::string& host, const std::string& extra_headers = "") {
  return RawHttp(d.admin_port(), method + " " + target + " HTTP/1.1\r\nHost: " + host +
                                     "\r\nConnection: close\r\nContent-Length: 0\r\n" +
                                     extra_headers + "\r\n");
}

// DNS rebinding: without a token, a page in a browser on this host whose own
// name re-resolves to 127.0.0.1 sends its name as the Host. Only an IP
// literal, localhost or *.localhost is answered; the probes stay open.
TEST_F(AdminApi, WithoutATokenOnlyIpAndLocalhostHostsAreAnswered) {
  ASSERT_EQ(Ping(d_, "rita").status, 200);
  const std::string port = std::to_string(d_.admin_port());
  for (const std::string& host :
       std::vector<std::string>{"127.0.0.1:" + port, "127.0.0.1", "localhost", "LocalHost:" + port,
                                "app.localhost:" + port, "[::1]", "[::1]:" + port,
                                "10.1.2.3:" + port, "[::ffff:127.0.0.1]"}) {
    HttpResponse r = AdminWithHost(d_, "GET", "/v1/clients/k:rita/state", host);
    EXPECT_EQ(r.status, 200) << host << " " << r.body;
  }
  for (const std::string& host : std::vector<std::string>{
           "evil.example", "evil.example:" + port, "localhost.evil.example",
           "127.0.0.1.nip.io:" + port, "evillocalhost", ".localhost", "[::1]x", "[evil.example]",
           "localhost:http", "::1", "127.0.0.1:" + port + ":1"}) {
    HttpResponse r = AdminWithHost(d_, "GET", "/v1/config", host);
    EXPECT_EQ(r.status, 403) << host << " " << r.body;
    EXPECT_EQ(r.Header("Content-Type"), "application/problem+json") << host;
  }
  HttpResponse refused = AdminWithHost(d_, "POST", "/v1/clients/k:rita/reset", "evil.example");
  ASSERT_EQ(refused.status, 403) << refused.body;
  const std::string detail = Body(refused)["detail"];
  EXPECT_NE(detail.find("Host 'evil.example'"), std::string::npos) << detail;
  EXPECT_NE(detail.find("server.admin_token_file"), std::string::npos) << detail;
  EXPECT_NE(detail.find("localhost"), std::string::npos) << detail;
  EXPECT_EQ(Ping(d_, "rita").Header("RateLimit-Remaining"), "3");  // nothing was reset
  EXPECT_EQ(AdminWithHost(d_, "GET", "/healthz", "evil.example").status, 200);
  EXPECT_EQ(AdminWithHost(d_, "GET", "/readyz", "evil.example").status, 200);
  EXPECT_EQ(AdminWithHost(d_, "GET", "/v1/config", "localhost").status, 200);  // still serving
}

// A decision-API caller's key is named d:<key> everywhere in the admin API:
// /v1/top-denied lists it so, and state, denials and reset take it (the
// config's named limits: a request's inline limits are its own).
TEST_F(AdminApi, DecisionApiKeysAreNamedWithD) {
  const std::string check = R"({"key": "demo", "limits": ["ping"]})";
  int denied = 0;
  for (int i = 0; i < 7; ++i)
    denied += Http(d_.port(), "POST", "/v1/check", {}, check).status == 429;
  ASSERT_EQ(denied, 2);
  json top = Body(Admin(d_, "GET", "/v1/top-denied"));
  ASSERT_EQ(top["clients"].size(), 1u) << top.dump();
  EXPECT_EQ(top["clients"][0]["client"], "d:demo");
  HttpResponse s = Admin(d_, "GET", "/v1/clients/d:demo/state");
  ASSERT_EQ(s.status, 200) << s.body;
  json j = Body(s);
  EXPECT_EQ(j["client"], "d:demo");
  EXPECT_EQ(j["source"], "decision_api");
  ASSERT_EQ(j["limits"].size(), 1u) << s.body;
  EXPECT_EQ(j["limits"][0]["name"], "ping");
  EXPECT_EQ(j["limits"][0]["remaining"], 0);
  HttpResponse den = Admin(d_, "GET", "/v1/clients/d:demo/denials");
  ASSERT_EQ(den.status, 200) << den.body;
  EXPECT_EQ(Body(den)["denials"].size(), 2u) << den.body;
  EXPECT_EQ(Body(den)["denials"][0]["path"], "/v1/check");
  // The identity the rules would form for API key "demo" is another client.
  EXPECT_EQ(Admin(d_, "GET", "/v1/clients/k:demo/state").status, 404);
  HttpResponse reset = Admin(d_, "POST", "/v1/clients/d:demo/reset");
  ASSERT_EQ(reset.status, 200) << reset.body;
  EXPECT_EQ(Body(reset)["reset"], json::array({"ping"}));
  EXPECT_EQ(Http(d_.port(), "POST", "/v1/check", {}, check).status, 200);
  // Any key, percent-encoded in the path.
  ASSERT_EQ(Http(d_.port(), "POST", "/v1/check", {}, R"({"key": "user:ada x", "limits": ["ping"]})")
                .status,
            200);
  s = Admin(d_, "GET", "/v1/clients/d:user:ada%20x/state");
  ASSERT_EQ(s.status, 200) << s.body;
  EXPECT_EQ(Body(s)["limits"][0]["remaining"], 4);
  EXPECT_EQ(Admin(d_, "GET", "/v1/clients/d:/state").status, 400);
}

// An override's new `limit` for a calendar quota applies to the month's
// count as it is (docs/admin.md, "What a changed limit does to the state"):
// 3 used of 3, raised to 5, 2 more. The override once kept the quota as a
// 30-day window aligned to the epoch, under a new state key: 5 more.
TEST(AdminOverrides, ACalendarQuotasNewLimitCountsTheMonthsUse) {
  const std::string dir = MakeTempDir();
  WriteFile(dir + "/rl.yaml", R"(server: {demo: true}
clients: {accept_unknown_api_keys: true}
limits:
  monthly: {algorithm: fixed_window, limit: 3, window: 1mo, align: calendar, timezone: UTC}
routes:
  - {name: ping, methods: [GET], path: /api/ping, match: exact, limits: [monthly]}
)");
  Daemon d({"--config", dir + "/rl.yaml"});
  ASSERT_TRUE(d.started() && d.admin_port() > 0) << d.Log();
  for (int i = 0; i < 3; ++i) ASSERT_EQ(Ping(d, "ada").status, 200);
  ASSERT_EQ(Ping(d, "ada").status, 429);
  HttpResponse put =
      Http(d.admin_port(), "PUT", "/v1/overrides/k:ada", {{"Content-Type", "application/json"}},
           R"({"limits": {"monthly": {"limit": 5}}})");
  ASSERT_EQ(put.status, 200) << put.body;
  json o = Body(Admin(d, "GET", "/v1/overrides/k:ada"));
  EXPECT_EQ(o["limits"]["monthly"], json({{"algorithm", "fixed_window"},
                                          {"limit", 5},
                                          {"window", "1mo"},
                                          {"align", "calendar"},
                                          {"timezone", "UTC"}}))
      << o.dump();
  EXPECT_EQ(Ping(d, "ada").status, 200);
  EXPECT_EQ(Ping(d, "ada").status, 200);
  EXPECT_EQ(Ping(d, "ada").status, 429);  // 5 of 5 this month
}

// How many times `text` is in `d`'s log, once there are at least `n` (or 10 s passed).
size_t WaitForLogCount(const Daemon& d, const std::string& text, size_t n) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    const std::string log = d.Log();
    size_t count = 0;
    for (size_t at = log.find(text); at != std::string::npos; at = log.find(text, at + 1)) ++count;
    if (count >= n || std::chrono::steady_clock::now() > deadline) return count;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// An override keeps only the fields given: a reload that changes another
// field of that limit reaches the client (the override once kept a copy of
// every field: capacity 3 forever), and one that changes its algorithm so
// that a given field means nothing leaves it out and says so.
TEST(AdminOverrides, AReloadReachesTheFieldsAnOverrideDidNotGive) {
  const std::string dir = MakeTempDir();
  const std::string file = dir + "/rl.yaml";
  auto config = [&file](const std::string& ping) {
    WriteFile(file,
              "server: {demo: true}\nclients: {accept_unknown_api_keys: true}\n"
              "limits: {ping: " +
                  ping +
                  "}\n"
                  "routes:\n  - {name: ping, methods: [GET], path: /api/ping, match: exact, "
                  "limits: [ping]}\n");
  };
  // What POST /v1/explain says ada's ping limit is: [its count, where from].
  auto explained = [](const Daemon& d) {
    json e = Body(Http(d.admin_port(), "POST", "/v1/explain", {},
                       R"({"target": "/api/ping", "headers": {"X-API-Key": "ada"}})"));
    const json& l = e["limits"][0];
    return json::array({l.contains("capacity") ? l["capacity"] : l["limit"], l["from"]});
  };
  auto allowed = [](const Daemon& d, const std::string& key) {
    int n = 0;
    while (n < 50 && Ping(d, key).status == 200) ++n;
    return n;
  };
  config("{algorithm: token_bucket, capacity: 3, refill_per_second: 0.001}");
  Daemon d({"--config", file});
  ASSERT_TRUE(d.started() && d.admin_port() > 0) << d.Log();
  HttpResponse put =
      Http(d.admin_port(), "PUT", "/v1/overrides/k:ada", {{"Content-Type", "application/json"}},
           R"({"limits": {"ping": {"refill_per_second": 0.002}}})");
  ASSERT_EQ(put.status, 200) << put.body;
  EXPECT_EQ(Body(put)["limits"]["ping"]["capacity"], 3) << put.body;

  config("{algorithm: token_bucket, capacity: 6, refill_per_second: 0.001}");
  d.Signal(SIGHUP);
  ASSERT_EQ(WaitForLogCount(d, "config reloaded", 1), 1u) << d.Log();
  json o = Body(Admin(d, "GET", "/v1/overrides/k:ada"));
  EXPECT_EQ(o["given"], json::parse(R"({"ping": {"refill_per_second": 0.002}})")) << o.dump();
  EXPECT_EQ(o["limits"]["ping"], json::parse(R"({"algorithm": "token_bucket", "capacity": 6,
                                                 "refill_per_second": 0.002})"))
      << o.dump();
  EXPECT_EQ(o["in_effect"], true) << o.dump();
  EXPECT_EQ(explained(d), json::array({6, "override"}));
  ASSERT_EQ(Ping(d, "ada").status, 200);
  json state = Body(Admin(d, "GET", "/v1/clients/k:ada/state"));
  ASSERT_EQ(state["limits"].size(), 1u) << state.dump();
  EXPECT_EQ(state["limits"][0]["limit"], 6) << state.dump();
  EXPECT_EQ(allowed(d, "ada"), 5) << "the reloaded capacity (6), with the override's refill";

  // A window has no refill_per_second: the override's limit is left out.
  config("{algorithm: fixed_window, limit: 2, window: 1h}");
  d.Signal(SIGHUP);
  ASSERT_EQ(WaitForLogCount(d, "config reloaded", 2), 2u) << d.Log();
  o = Body(Admin(d, "GET", "/v1/overrides/k:ada"));
  EXPECT_EQ(o["in_effect"], false) << o.dump();
  EXPECT_EQ(o["limits"], json::object()) << o.dump();
  ASSERT_EQ(o["not_applied"].size(), 1u) << o.dump();
  EXPECT_NE(o["not_applied"][0].get<std::string>().find(
                "limits.ping: field 'refill_per_second' does not apply to fixed_window"),
            std::string::npos)
      << o.dump();
  EXPECT_EQ(Body(Admin(d, "GET", "/v1/overrides"))["overrides"][0]["in_effect"], false);
  EXPECT_EQ(explained(d), json::array({2, "route"}));
  EXPECT_EQ(allowed(d, "ada"), 2) << "the configured window";
  const std::string metrics = Admin(d, "GET", "/metrics").body;
  EXPECT_NE(metrics.find("\nratelimit_overrides_not_applied 1\n"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("\nratelimit_overrides_in_effect 0\n"), std::string::npos) << metrics;
  // Logged once, not on each read of the store (here: the one after a PUT)
  // nor per request.
  put = Http(d.admin_port(), "PUT", "/v1/overrides/k:carl", {{"Content-Type", "application/json"}},
             R"({"limits": {"ping": {"limit": 9}}})");
  EXPECT_EQ(put.status, 200) << put.body;
  EXPECT_EQ(WaitForLogCount(d, "override not applied", 1), 1u) << d.Log();
  // The PUT is refused under this config, with the same reason.
  put = Http(d.admin_port(), "PUT", "/v1/overrides/k:bob", {{"Content-Type", "application/json"}},
             R"({"limits": {"ping": {"refill_per_second": 0.002}}})");
  EXPECT_EQ(put.status, 400) << put.body;
}

// A client an override moves to another plan is read and reset on the
// limits it is enforced with: state shows the override's plan's limits, and
// a reset clears them (docs/admin.md: "its next request sees full limits").
// They were the config's plan's: daily_pro stayed exhausted after a reset.
TEST(AdminOverrides, StateAndResetUseThePlanAnOverrideMovesTheClientTo) {
  const std::string dir = MakeTempDir();
  WriteFile(dir + "/rl.yaml", R"(server: {demo: true}
limits:
  daily: {algorithm: fixed_window, limit: 100, window: 1d}
  daily_pro: {algorithm: fixed_window, limit: 2, window: 1d}
plans:
  free: {limits: [daily]}
  pro: {limits: [daily_pro]}
api_keys: {ada: free}
routes:
  - {name: ping, methods: [GET], path: /api/ping, match: exact,
     limits: [{name: loose, algorithm: token_bucket, capacity: 100, refill_per_second: 1}]}
)");
  Daemon d({"--config", dir + "/rl.yaml"});
  ASSERT_TRUE(d.started() && d.admin_port() > 0) << d.Log();
  HttpResponse put = Http(d.admin_port(), "PUT", "/v1/overrides/k:ada",
                          {{"Content-Type", "application/json"}}, R"({"plan": "pro"})");
  ASSERT_EQ(put.status, 200) << put.body;
  ASSERT_EQ(Ping(d, "ada").status, 200);
  ASSERT_EQ(Ping(d, "ada").status, 200);
  ASSERT_EQ(Ping(d, "ada").status, 429);  // daily_pro: 2 a day
  json state = Body(Admin(d, "GET", "/v1/clients/k:ada/state"));
  EXPECT_EQ(state["plan"], "pro") << state.dump();
  std::map<std::string, int64_t> remaining;
  for (const json& l : state["limits"]) remaining[l["name"]] = l["remaining"].get<int64_t>();
  EXPECT_EQ(remaining, (std::map<std::string, int64_t>{{"daily_pro", 0}, {"loose", 98}}))
      << state.dump();
  HttpResponse reset = Admin(d, "POST", "/v1/clients/k:ada/reset");
  ASSERT_EQ(reset.status, 200) << reset.body;
  const json names = Body(reset)["reset"];
  EXPECT_NE(std::find(names.begin(), names.end(), "daily_pro"), names.end()) << reset.body;
  EXPECT_NE(std::find(names.begin(), names.end(), "daily"), names.end()) << reset.body;
  HttpResponse next = Ping(d, "ada");
  EXPECT_EQ(next.status, 200) << next.body;
  EXPECT_EQ(next.Header("RateLimit-Remaining"), "1");
}

// A reset with an override clears the configured calendar quota's windows
// too when the override moves it to another time zone (its windows are other
// keys): once the override is gone, the client finds the quota full. Before,
// a limit of the same name and algorithm counted as the same state and the
// configured windows kept their count.
// On Redis, where each window is a key named by its start (and a calendar
// quota's unit and time zone; the memory store keys it the same way).
TEST(AdminOverrides, AResetClearsTheConfiguredQuotaAnOverrideMovedToAnotherZone) {
  ratelimit::testing::RedisServer redis;
  const std::string dir = MakeTempDir();
  WriteFile(dir + "/rl.yaml", "store: {type: redis, url: \"" + redis.url() + R"("}
server: {demo: true}
limits:
  monthly: {algorithm: fixed_window, limit: 2, window: 1mo, align: calendar, timezone: UTC}
plans:
  free: {limits: [monthly]}
api_keys: {ada: free}
routes:
  - {name: ping, methods: [GET], path: /api/ping, match: exact,
     limits: [{name: loose, algorithm: token_bucket, capacity: 100, refill_per_second: 1}]}
)");
  Daemon d({"--config", dir + "/rl.yaml"});
  ASSERT_TRUE(d.started() && d.admin_port() > 0) << d.Log();
  ASSERT_EQ(Ping(d, "ada").status, 200);
  ASSERT_EQ(Ping(d, "ada").status, 200);
  ASSERT_EQ(Ping(d, "ada").status, 429);  // the month's 2 are used
  HttpResponse put =
      Http(d.admin_port(), "PUT", "/v1/overrides/k:ada", {{"Content-Type", "application/json"}},
           R"({"limits": {"monthly": {"timezone": "America/New_York"}}})");
  ASSERT_EQ(put.status, 200) << put.body;
  ASSERT_EQ(Admin(d, "POST", "/v1/clients/k:ada/reset").status, 200);
  ASSERT_EQ(Admin(d, "DELETE", "/v1/overrides/k:ada").status, 200);
  HttpResponse next = Ping(d, "ada");
  EXPECT_EQ(next.status, 200) << next.body;
}

// API keys that share their first characters stay apart in the admin views
// (a hash suffix), and the shortened name shown can be looked up.
TEST_F(AdminApi, ShortenedApiKeysDoNotCollideAndCanBeLookedUp) {
  for (int i = 0; i < 6; ++i) Ping(d_, "demo-pro-key-0001");   // 5 allowed, 1 denied
  for (int i = 0; i < 7; ++i) Ping(d_, "demo-internal-0001");  // 5 allowed, 2 denied
  json top = Body(Admin(d_, "GET", "/v1/top-denied"));
  ASSERT_EQ(top["clients"].size(), 2u) << top.dump();
  const std::string internal = top["clients"][0]["client"], pro = top["clients"][1]["client"];
  EXPECT_EQ(top["clients"][0]["denials"], 2);
  EXPECT_NE(internal, pro);
  for (const std::string& shown : {internal, pro}) {
    EXPECT_TRUE(shown.starts_with("k:demo***")) << shown;
    EXPECT_EQ(shown.find("internal"), std::string::npos) << shown;
    EXPECT_EQ(shown.find("pro-key"), std::string::npos) << shown;
    HttpResponse s = Admin(d_, "GET", "/v1/clients/" + shown + "/state");
    ASSERT_EQ(s.status, 200) << shown << ": " << s.body;
    EXPECT_EQ(Body(s)["client"], shown);
    HttpResponse den = Admin(d_, "GET", "/v1/clients/" + shown + "/denials");
    EXPECT_EQ(Body(den)["denials"].size(), shown == internal ? 2u : 1u) << den.body;
  }
  EXPECT_EQ(Body(Admin(d_, "GET", "/v1/clients/k:demo-internal-0001/state"))["client"], internal);
  // A shortened name nobody here has: 404.
  EXPECT_EQ(Admin(d_, "GET", "/v1/clients/k:demo***00000000/state").status, 404);
}

// The config of the explain tests: a plan by API key, a shadow route with a
// cost, a route keyed by IP, global limits and a concurrency limit.
constexpr const char* kExplainConfig = R"(store: {failure_mode: open}
clients: {trusted_proxies: [127.0.0.0/8]}
limits:
  burst: {algorithm: token_bucket, capacity: 50, refill_per_second: 20}
plans:
  free: {limits: [{name: free_daily, algorithm: fixed_window, limit: 1000, window: 1d}]}
  pro: {limits: [{name: pro_daily, algorithm: fixed_window, limit: 100000, window: 1d}]}
default_plan: free
api_keys: {"demo-pro-key-0001": pro}
global: [burst]
routes:
  - {name: login, methods: [POST], path: /login, match: exact, key_by: ip, failure_mode: closed,
     limits: [{name: login, algorithm: sliding_log, limit: 5, window: 15m}]}
  - name: search
    path: /api/search
    cost: 5
    shadow: true
    concurrency: {max_in_flight: 3}
    limits: [{name: search_burst, algorithm: token_bucket, capacity: 20, refill_per_second: 2}]
)";

const json* LimitNamed(const json& answer, const std::string& name) {
  for (const json& l : answer["limits"]) {
    if (l["name"] == name) return &l;
  }
  return nullptr;
}

// POST /v1/explain: the route, client, plan and limits a request would meet,
// with their parameters, costs, shadow and failure modes; nothing consumed.
TEST(Explain, AnswersRouteClientPlanAndLimitsWithoutConsuming) {
  const std::string dir = MakeTempDir();
  WriteFile(dir + "/rl.yaml", kExplainConfig);
  Daemon d({"--config", dir + "/rl.yaml"});
  ASSERT_TRUE(d.started() && d.admin_port() > 0) << d.Log();
  const std::string body =
      R"({"method": "GET", "target": "/api/search/x?q=1", "peer": "127.0.0.1",
          "headers": {"X-API-Key": "demo-pro-key-0001", "X-Forwarded-For": ["198.51.100.7", "203.0.113.9"]}})";
  HttpResponse r = Http(d.admin_port(), "POST", "/v1/explain", {}, body);
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = Body(r);
  EXPECT_EQ(j["canonical_path"], "/api/search/x");
  EXPECT_EQ(j["route"]["name"], "search");
  EXPECT_EQ(j["route"]["cost"], 5);
  EXPECT_EQ(j["route"]["shadow"], true);
  EXPECT_EQ(j["client"]["source"], "api_key");
  EXPECT_EQ(j["client"]["plan"], "pro");
  EXPECT_EQ(j["client"]["key"], "k:demo***4bc17db9");  // shortened, as everywhere
  EXPECT_EQ(j["client"]["ip"], "203.0.113.9");         // the peer is trusted: XFF, right to left
  ASSERT_EQ(j["limits"].size(), 3u) << r.body;
  const json* search = LimitNamed(j, "search_burst");
  ASSERT_NE(search, nullptr) << r.body;
  EXPECT_EQ((*search)["from"], "route");
  EXPECT_EQ((*search)["algorithm"], "token_bucket");
  EXPECT_EQ((*search)["capacity"], 20);
  EXPECT_EQ((*search)["refill_per_second"], 2.0);
  EXPECT_EQ((*search)["cost"], 5);
  EXPECT_EQ((*search)["shadow"], true);
  EXPECT_EQ((*search)["failure_mode"], "open");
  const json* daily = LimitNamed(j, "pro_daily");
  ASSERT_NE(daily, nullptr) << r.body;
  EXPECT_EQ((*daily)["from"], "plan");
  EXPECT_EQ((*daily)["limit"], 100000);
  EXPECT_EQ((*daily)["window"], "1d");
  EXPECT_EQ((*daily)["cost"], 1);
  EXPECT_EQ((*daily)["shadow"], false);
  ASSERT_NE(LimitNamed(j, "burst"), nullptr);
  EXPECT_EQ((*LimitNamed(j, "burst"))["from"], "global");
  EXPECT_EQ(j["concurrency"]["max_in_flight"], 3);
  // key_by: ip and the route's failure mode; an anonymous client's plan.
  r = Http(d.admin_port(), "POST", "/v1/explain", {},
           R"({"method": "POST", "target": "/Login/", "peer": "192.0.2.1"})");
  ASSERT_EQ(r.status, 200) << r.body;
  const json login = Body(r);
  EXPECT_EQ(login["route"]["name"], "login");
  EXPECT_EQ(login["client"]["key"], "ip:192.0.2.1");
  EXPECT_EQ(login["client"]["plan"], "free");
  EXPECT_EQ((*LimitNamed(login, "login"))["failure_mode"], "closed");
  EXPECT_EQ((*LimitNamed(login, "login"))["scope"], "client");
  // /v1/auth: the original request nginx names.
  r = Http(
      d.admin_port(), "POST", "/v1/explain", {},
      R"({"target": "/v1/auth", "headers": {"X-Original-Method": "POST", "X-Original-URI": "/login"}})");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(Body(r)["face"], "auth_request");
  EXPECT_EQ(Body(r)["route"]["name"], "login");
  // The decision API's endpoints: the body names the key and limits, not the rules.
  for (const std::string own : {"/v1/acquire", "/v1/renew", "/v1/release", "/v1/settle"}) {
    r = Http(d.admin_port(), "POST", "/v1/explain", {},
             R"({"method": "POST", "target": ")" + own + "\"}");
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(Body(r)["face"], "decision_api") << own << ": " << r.body;
  }
  // Nothing was consumed or created.
  EXPECT_EQ(Admin(d, "GET", "/v1/clients/k:demo-pro-key-0001/state").status, 404);
  EXPECT_EQ(Admin(d, "GET", "/v1/clients/ip:192.0.2.1/state").status, 404);
  // Bad input: 400 naming what; GET: 405.
  r = Http(d.admin_port(), "POST", "/v1/explain", {}, R"({"target": "x"})");
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("target"), std::string::npos) << r.body;
  r = Http(d.admin_port(), "POST", "/v1/explain", {}, R"({"target": "/", "peer": "nope"})");
  EXPECT_EQ(r.status, 400);
  r = Http(d.admin_port(), "POST", "/v1/explain", {}, R"({"target": "/", "methd": "GET"})");
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("unknown field 'methd'"), std::string::npos) << r.body;
  r = Http(d.admin_port(), "POST", "/v1/explain", {},
           R"({"target": "/", "headers": {"X-Big": ")" + std::string(20000, 'a') + "\"}}");
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(Admin(d, "GET", "/v1/explain").status, 405);
}

// Runs a command; returns its exit code and standard output.
std::pair<int, std::string> RunCommand(const std::string& command) {
  const std::string dir = MakeTempDir();
  const int rc = std::system((command + " > " + dir + "/out 2> " + dir + "/err").c_str());
  return {WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, ReadFile(dir + "/out") + ReadFile(dir + "/err")};
}

// `ratelimitd --explain` prints the same JSON as the admin endpoint.
TEST(Explain, CommandLinePrintsTheEndpointsAnswer) {
  const std::string dir = MakeTempDir();
  WriteFile(dir + "/rl.yaml", kExplainConfig);
  Daemon d({"--config", dir + "/rl.yaml"});
  ASSERT_TRUE(d.started() && d.admin_port() > 0) << d.Log();
  HttpResponse r = Http(d.admin_port(), "POST", "/v1/explain", {},
                        R"({"method": "GET", "target": "/api/search?q=1", "peer": "192.0.2.1",
                            "headers": {"X-API-Key": "demo-pro-key-0001"}})");
  ASSERT_EQ(r.status, 200) << r.body;
  const std::string bin = RATELIMITD_PATH;
  auto [rc, out] =
      RunCommand(bin + " --config " + dir + "/rl.yaml --explain 'GET /api/search?q=1'" +
                 " -H 'X-API-Key: demo-pro-key-0001' --peer 192.0.2.1");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_EQ(json::parse(out, nullptr, false), Body(r)) << out << "\n" << r.body;
  EXPECT_EQ(Body(r)["route"]["name"], "search");
  // A bad request: 2; a bad config: 1.
  std::tie(rc, out) = RunCommand(bin + " --config " + dir + "/rl.yaml --explain 'GET'");
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("--explain"), std::string::npos) << out;
  WriteFile(dir + "/bad.yaml", "limits: {x: {algorithm: token_bucket, capacity: -1}}\n");
  std::tie(rc, out) = RunCommand(bin + " --config " + dir + "/bad.yaml --explain 'GET /'");
  EXPECT_EQ(rc, 1) << out;
}

// The gateway takes an absolute-form target (a request to a proxy) and
// limits it by its path; explain refused it ("the target must start with
// '/' (origin form)"), on the endpoint and on the command line. Now both
// explain it as the gateway limits it, and what the gateway refuses they
// refuse with the gateway's words.
TEST(AdminExplain, AnAbsoluteFormTargetIsExplainedAsTheGatewayLimitsIt) {
  TestUpstream upstream;
  const std::string dir = MakeTempDir();
  WriteFile(dir + "/rl.yaml", "server: {upstream: \"http://127.0.0.1:" +
                                  std::to_string(upstream.port()) + "\"}\n" + kExplainConfig);
  Daemon d({"--config", dir + "/rl.yaml"});
  ASSERT_TRUE(d.started() && d.admin_port() > 0) << d.Log();
  // The gateway: `login` (5 per 15 minutes per IP) counts them.
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(Http(d.port(), "POST", "http://h/login").status, 200) << i;
  }
  EXPECT_EQ(upstream.requests(), 5);
  HttpResponse denied = Http(d.port(), "POST", "http://h/login");
  EXPECT_EQ(denied.status, 429) << denied.body;
  EXPECT_EQ(upstream.requests(), 5);
  EXPECT_NE(denied.body.find("login"), std::string::npos) << denied.body;
  HttpResponse r = Http(d.admin_port(), "POST", "/v1/explain", {},
                        R"({"method": "POST", "target": "http://h/login", "peer": "127.0.0.1"})");
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = Body(r);
  EXPECT_EQ(j["face"], "gateway");
  EXPECT_EQ(j["canonical_path"], "/login");
  EXPECT_EQ(j["route"]["name"], "login");
  ASSERT_NE(LimitNamed(j, "login"), nullptr) << r.body;
  EXPECT_EQ((*LimitNamed(j, "login"))["key"], "ip:127.0.0.1");
  const std::string bin = RATELIMITD_PATH;
  auto [rc, out] =
      RunCommand(bin + " --config " + dir + "/rl.yaml --explain 'POST http://h/login'");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_EQ(json::parse(out, nullptr, false), j) << out << "\n" << r.body;
  // What the gateway refuses (an authority form), explain refuses with its words.
  HttpResponse refused = Http(d.port(), "GET", "h:80");
  EXPECT_EQ(refused.status, 400) << refused.body;
  const std::string why = "request target must start with '/'";
  EXPECT_NE(refused.body.find(why), std::string::npos) << refused.body;
  r = Http(d.admin_port(), "POST", "/v1/explain", {}, R"({"target": "h:80"})");
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_NE(r.body.find(why), std::string::npos) << r.body;
  std::tie(rc, out) = RunCommand(bin + " --config " + dir + "/rl.yaml --explain 'GET h:80'");
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find(why), std::string::npos) << out;
}

TEST(AdminToken, Enforced) {
  const std::string dir = MakeTempDir();
  const std::string secret = "s3cret-admin-token-4f9a";
  WriteFile(dir + "/token", secret + "\n");
  WriteFile(dir + "/rl.yaml", "server: {demo: true, admin_token_file: " + dir + "/token}\n" +
                                  std::string(kConfig).substr(std::string(kConfig).find('\n') + 1));
  Daemon d({"--config", dir + "/rl.yaml"});
  ASSERT_TRUE(d.started() && d.admin_port() > 0) << d.Log();
  for (const std::string t :
       {"/metrics", "/v1/config", "/v1/top-denied", "/v1/clients/k:a/state"}) {
    HttpResponse none = Admin(d, "GET", t);
    EXPECT_EQ(none.status, 401) << t;
    EXPECT_EQ(none.Header("Content-Type"), "application/problem+json");
    EXPECT_NE(none.Header("WWW-Authenticate").find("Bearer"), std::string::npos);
    EXPECT_EQ(Admin(d, "GET", t, {{"Authorization", "Bearer wrong"}}).status, 401) << t;
    EXPECT_EQ(Admin(d, "GET", t, {{"Authorization", "Bearer " + secret + "x"}}).status, 401);
    EXPECT_EQ(Admin(d, "GET", t, {{"Authorization", secret}}).status, 401) << t;
  }
  const Headers auth = {{"Authorization", "Bearer " + secret}};
  EXPECT_EQ(Admin(d, "GET", "/metrics", auth).status, 200);
  HttpResponse config = Admin(d, "GET", "/v1/config", auth);
  EXPECT_EQ(config.status, 200);
  EXPECT_EQ(config.body.find(secret), std::string::npos);
  EXPECT_EQ(Admin(d, "GET", "/v1/clients/k:a/state", auth).status, 404);
  EXPECT_EQ(Admin(d, "POST", "/v1/clients/k:a/reset").status, 401);
  // With a token, the Host is not checked: a rebinding page cannot know the token.
  EXPECT_EQ(AdminWithHost(d, "GET", "/v1/config", "evil.example").status, 401);
  EXPECT_EQ(AdminWithHost(d, "GET", "/v1/config", "ratelimitd.internal:9090",
                          "Authorization: Bearer " + secret + "\r\n")
                .status,
            200);
  // Probes need no token.
  EXPECT_EQ(Admin(d, "GET", "/healthz").status, 200);
  EXPECT_EQ(Admin(d, "GET", "/readyz").status, 200);
  EXPECT_EQ(d.Log().find(secret), std::string::npos);
}

TEST(AdminToken, AnEmptyTokenFileIsAStartError) {
  const std::string dir = MakeTempDir();
  WriteFile(dir + "/token", "\n");
  WriteFile(dir + "/rl.yaml", "server: {admin_token_file: " + dir + "/token}\n");
  Daemon d({"--config", dir + "/rl.yaml"});
  EXPECT_FALSE(d.started());
  EXPECT_NE(d.Log().find("is empty"), std::string::npos) << d.Log();
}

TEST(AdminListener, EmptyAddressTurnsItOff) {
  Daemon d({"--admin-listen", ""});
  ASSERT_TRUE(d.started()) << d.Log();
  EXPECT_EQ(d.admin_port(), 0);
}

TEST(Readiness, RedisDownIsNotReadyOnlyWhenFailingClosed) {
  const std::string dead = "redis://127.0.0.1:" + std::to_string(FreePort());
  Daemon closed({"--redis", dead, "--failure-mode", "closed"});
  ASSERT_TRUE(closed.started()) << closed.Log();
  HttpResponse r = Admin(closed, "GET", "/readyz");
  EXPECT_EQ(r.status, 503) << r.body;
  EXPECT_EQ(Body(r)["reachable"], false);
  Daemon open({"--redis", dead, "--failure-mode", "open"});
  ASSERT_TRUE(open.started()) << open.Log();
  r = Admin(open, "GET", "/readyz");
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(Body(r)["failure_mode"], "open");
  // A store that cannot answer: the state is 503, not a made-up full bucket.
  EXPECT_EQ(Admin(open, "GET", "/v1/clients/ip:127.0.0.1/state").status, 503);
}

// Runs promtool on `text`; returns its exit code and output.
std::pair<int, std::string> Promtool(const std::string& text) {
  const std::string dir = MakeTempDir();
  WriteFile(dir + "/metrics.txt", text);
  const std::string cmd =
      "/usr/bin/promtool check metrics < " + dir + "/metrics.txt > " + dir + "/out 2>&1";
  const int rc = std::system(cmd.c_str());
  return {WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, ReadFile(dir + "/out")};
}

TEST(Metrics, PromtoolAcceptsTheScrapeAndTheCountsAreRight) {
  ASSERT_EQ(::access("/usr/bin/promtool", X_OK), 0)
      << "promtool is required (Debian package prometheus)";
  Daemon d({"--config", WriteConfig()});
  ASSERT_TRUE(d.started()) << d.Log();
  for (int i = 0; i < 7; ++i) Ping(d, "metrics");  // 5 allowed, 2 denied
  Http(d.port(), "POST", "/v1/check", {{"Content-Type", "application/json"}},
       R"({"key": "m", "limits": ["ping"]})");
  HttpResponse m = Admin(d, "GET", "/metrics");
  ASSERT_EQ(m.status, 200);
  EXPECT_EQ(m.Header("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
  const auto [rc, out] = Promtool(m.body);
  EXPECT_EQ(rc, 0) << out << "\n" << m.body;
  EXPECT_NE(m.body.find("ratelimit_decisions_total{face=\"demo\",route=\"ping\",limit=\"ping\","
                        "outcome=\"allowed\"} 5\n"),
            std::string::npos)
      << m.body;
  EXPECT_NE(m.body.find("ratelimit_decisions_total{face=\"demo\",route=\"ping\",limit=\"ping\","
                        "outcome=\"denied\"} 2\n"),
            std::string::npos);
  EXPECT_NE(m.body.find("ratelimit_decisions_total{face=\"decision_api\",route=\"\","
                        "limit=\"ping\",outcome=\"allowed\"} 1\n"),
            std::string::npos);
  EXPECT_NE(m.body.find("ratelimit_store_call_duration_seconds_count 8\n"), std::string::npos);
  // Client keys never become labels.
  EXPECT_EQ(m.body.find("\"metrics\""), std::string::npos);
  EXPECT_EQ(m.body.find("k:"), std::string::npos);
  // A reload is counted.
  d.Signal(SIGHUP);
  ASSERT_TRUE(d.WaitForLog("config reloaded", std::chrono::seconds(5))) << d.Log();
  m = Admin(d, "GET", "/metrics");
  EXPECT_NE(m.body.find("ratelimit_config_reloads_total{result=\"ok\"} 1\n"), std::string::npos);
}

// The decision API's inline limits are named by its callers: they count as
// limit="~inline", so that 4,100 made-up names (more than the 4,096 label
// sets the registry keeps) leave the config's routes and limits their own
// labels; a limit named like one of the config's `limits:` keeps its name.
TEST(Metrics, InlineLimitNamesSpendNoLabelSets) {
  Daemon d({"--config", WriteConfig()});
  ASSERT_TRUE(d.started()) << d.Log();
  for (int batch = 0; batch < 41; ++batch) {
    std::string body = R"({"checks": [)";
    for (int i = 0; i < 100; ++i) {
      body += std::string(i ? "," : "") + R"({"key": "flood", "limit": {"name": "n)" +
              std::to_string(batch * 100 + i) +
              R"(", "algorithm": "fixed_window", "limit": 10, "window": "1m"}})";
    }
    ASSERT_EQ(Http(d.port(), "POST", "/v1/check/batch", {}, body + "]}").status, 200);
  }
  // The configured "ping", by name and inline with its very parameters.
  Http(d.port(), "POST", "/v1/check", {}, R"({"key": "m", "limit": "ping"})");
  Http(d.port(), "POST", "/v1/check", {},
       R"({"key": "m", "limit": {"name": "ping", "algorithm": "token_bucket", "capacity": 5,)"
       R"( "refill_per_second": 0.001}})");
  ASSERT_EQ(Ping(d, "after").status, 200);
  const std::string m = Admin(d, "GET", "/metrics").body;
  EXPECT_NE(m.find("ratelimit_decisions_total{face=\"decision_api\",route=\"\","
                   "limit=\"~inline\",outcome=\"allowed\"} 4100\n"),
            std::string::npos)
      << m.substr(0, 4000);
  EXPECT_NE(m.find("ratelimit_decisions_total{face=\"decision_api\",route=\"\","
                   "limit=\"ping\",outcome=\"allowed\"} 2\n"),
            std::string::npos);
  EXPECT_NE(m.find("ratelimit_decisions_total{face=\"demo\",route=\"ping\",limit=\"ping\","
                   "outcome=\"allowed\"} 1\n"),
            std::string::npos);
  EXPECT_EQ(m.find("limit=\"n4099\""), std::string::npos);
  EXPECT_EQ(m.find("~other"), std::string::npos);
}

TEST(Metrics, PromtoolAcceptsTheRedisScrapeWithDegradedDecisions) {
  ASSERT_EQ(::access("/usr/bin/promtool", X_OK), 0) << "promtool is required";
  const std::string dead = "redis://127.0.0.1:" + std::to_string(FreePort());
  Daemon d({"--redis", dead, "--failure-mode", "open"});
  ASSERT_TRUE(d.started()) << d.Log();
  for (int i = 0; i < 3; ++i) EXPECT_EQ(Ping(d, "deg").status, 200);
  HttpResponse m = Admin(d, "GET", "/metrics");
  ASSERT_EQ(m.status, 200);
  const auto [rc, out] = Promtool(m.body);
  EXPECT_EQ(rc, 0) << out << "\n" << m.body;
  EXPECT_NE(m.body.find("outcome=\"degraded\"} 3\n"), std::string::npos) << m.body;
  EXPECT_NE(m.body.find("ratelimit_store_breaker_state "), std::string::npos);
  EXPECT_NE(m.body.find("ratelimit_over_limit_cache_hits_total "), std::string::npos);
  EXPECT_NE(m.body.find("ratelimit_lease_hits_total "), std::string::npos);
  EXPECT_NE(m.body.find("ratelimit_redis_queued_seconds_count "), std::string::npos);
  EXPECT_NE(m.body.find("ratelimit_redis_call_seconds_bucket{le=\"+Inf\"} "), std::string::npos);
  EXPECT_NE(m.body.find("ratelimit_stage_seconds_count{stage=\"handler\"} "), std::string::npos);
  // Each degraded decision is counted under its cause (refused, then breaker_open).
  int64_t degraded = 0;
  for (const char* cause : {"timeout", "refused", "breaker_open", "overload", "error"}) {
    const std::string line =
        std::string("ratelimit_degraded_decisions_total{cause=\"") + cause + "\"} ";
    const size_t at = m.body.find(line);
    ASSERT_NE(at, std::string::npos) << line;
    degraded += std::stoll(m.body.substr(at + line.size()));
  }
  EXPECT_EQ(degraded, 3) << m.body;
}

}  // namespace
}  // namespace rltest
