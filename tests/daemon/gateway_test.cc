// ratelimitd as a gateway in front of a real upstream, and client identity
// through X-Forwarded-For (trusted and untrusted peers).
#include <gtest/gtest.h>
#include <strings.h>

#include <nlohmann/json.hpp>

#include "harness.h"

namespace rltest {
namespace {

using nlohmann::json;

std::string GatewayConfig(int upstream_port, const std::string& extra_server = "") {
  return "server:\n  upstream: http://127.0.0.1:" + std::to_string(upstream_port) + "\n" +
         extra_server +
         "limits:\n  api: {algorithm: token_bucket, capacity: 3, refill_per_second: 0.01}\n"
         "routes:\n  - name: all\n    path: /\n    match: prefix\n    limits: [api]\n";
}

// `extra_server`: more lines of the server section.
void ExpectForwardingAndLimits(const std::string& extra_server) {
  TestUpstream upstream;
  std::string dir = MakeTempDir();
  WriteFile(dir + "/c.yaml", GatewayConfig(upstream.port(), extra_server));
  Daemon d({"--config", dir + "/c.yaml"});
  ASSERT_TRUE(d.started()) << d.Log();

  HttpResponse r = Http(d.port(), "POST", "/things?x=1",
                        {{"X-API-Key", "gw"},
                         {"X-Forwarded-For", "203.0.113.9"},
                         {"Connection", "close, X-Secret-Hop"},
                         {"X-Secret-Hop", "1"},
                         {"Keep-Alive", "timeout=1"},
                         {"Proxy-Authorization", "Basic eA=="},
                         {"TE", "trailers"},
                         {"X-End-To-End", "kept"}},
                        "hello body");
  ASSERT_EQ(r.status, 200) << r.raw_head << r.body;
  json echo = json::parse(r.body, nullptr, false);
  ASSERT_TRUE(echo.is_object()) << r.body;
  EXPECT_EQ(echo["method"], "POST");
  EXPECT_EQ(echo["target"], "/things?x=1");
  EXPECT_EQ(echo["body"], "hello body");
  const json& h = echo["headers"];
  EXPECT_EQ(h["x-forwarded-for"], json::array({"203.0.113.9, 127.0.0.1"}));
  EXPECT_EQ(h["x-end-to-end"], json::array({"kept"}));
  EXPECT_EQ(h["x-api-key"], json::array({"gw"}));
  EXPECT_FALSE(h.contains("x-secret-hop"));
  EXPECT_FALSE(h.contains("keep-alive"));
  EXPECT_FALSE(h.contains("proxy-authorization"));
  EXPECT_FALSE(h.contains("te"));
  EXPECT_EQ(h["host"], json::array({"127.0.0.1:" + std::to_string(d.port())}));
  // The upstream's answer: its end-to-end headers, not its hop-by-hop ones, plus ours.
  EXPECT_EQ(r.Header("X-Upstream"), "yes");
  // A field the upstream repeats is relayed as often as it came (two cookies).
  Headers cookies;
  for (const auto& [name, value] : r.headers) {
    if (strcasecmp(name.c_str(), "set-cookie") == 0) cookies.emplace_back(name, value);
  }
  ASSERT_EQ(cookies.size(), 2u) << r.raw_head;
  EXPECT_EQ(cookies[0].second, "a=1");
  EXPECT_EQ(cookies[1].second, "b=2");
  EXPECT_FALSE(r.Has("X-Hop"));
  EXPECT_FALSE(r.Has("Keep-Alive"));
  EXPECT_EQ(r.Header("RateLimit-Limit"), "3");
  EXPECT_EQ(r.Header("RateLimit-Remaining"), "2");

  EXPECT_EQ(Http(d.port(), "GET", "/a", {{"X-API-Key", "gw"}}).status, 200);
  EXPECT_EQ(Http(d.port(), "HEAD", "/a", {{"X-API-Key", "gw"}}).status, 200);
  const int before = upstream.requests();
  r = Http(d.port(), "GET", "/a", {{"X-API-Key", "gw"}});
  EXPECT_EQ(r.status, 429);
  EXPECT_EQ(upstream.requests(), before) << "a denied request must not reach the upstream";
  EXPECT_EQ(json::parse(r.body)["limit"], "api");
  EXPECT_FALSE(r.Header("Retry-After").empty());
  // Another client (another address: unknown API keys are keyed by IP) is unaffected; a large
  // answer comes through whole.
  r = Http(d.port(), "GET", "/big", {}, "", "127.0.0.5");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body.size(), 100u * 1024);
  // Keep-alive pool: fewer upstream connections than requests.
  EXPECT_LT(upstream.connections(), upstream.requests());
}

TEST(Gateway, ForwardsStripsHopByHopAppendsXffAndLimits) { ExpectForwardingAndLimits(""); }

// One I/O thread: client and upstream connections run on the io_context's
// executor, without strands; the gateway must behave the same.
TEST(Gateway, OneThreadForwardsTheSame) { ExpectForwardingAndLimits("  threads: 1\n"); }

// A gateway in front of `upstream_port` whose /login (exact) costs 10 of a
// 20-token bucket, and everything else 1 of a 100-token one.
std::string LoginGatewayConfig(int upstream_port) {
  return "server:\n  upstream: http://127.0.0.1:" + std::to_string(upstream_port) +
         "\nlimits:\n"
         "  cheap: {algorithm: token_bucket, capacity: 100, refill_per_second: 0.01}\n"
         "  login: {algorithm: token_bucket, capacity: 20, refill_per_second: 0.01}\n"
         "routes:\n"
         "  - {name: login, path: /login, match: exact, cost: 10, limits: [login]}\n"
         "  - {name: all, path: /, limits: [cheap]}\n";
}

// An upstream such as Tomcat, Jetty or Spring serves "/login;x=1" as
// "/login": a path parameter must not take a request out of the /login
// route's class (cost 10) into the cheap catch-all. The upstream still gets
// the target as the client sent it; an escaped ';' (%3B) is data, another path.
TEST(Gateway, PathParametersStayInTheirRouteAndReachTheUpstreamAsSent) {
  TestUpstream upstream;
  std::string dir = MakeTempDir();
  WriteFile(dir + "/c.yaml", LoginGatewayConfig(upstream.port()));
  Daemon d({"--config", dir + "/c.yaml"});
  ASSERT_TRUE(d.started()) << d.Log();
  HttpResponse r = Http(d.port(), "POST", "/login;jsessionid=0A1B?next=/", {}, "u=ada");
  ASSERT_EQ(r.status, 200) << r.raw_head << r.body;
  EXPECT_EQ(json::parse(r.body)["target"], "/login;jsessionid=0A1B?next=/");
  EXPECT_EQ(r.Header("RateLimit-Limit"), "20");
  EXPECT_EQ(r.Header("RateLimit-Remaining"), "10");
  r = Http(d.port(), "POST", "/Login;x=1", {}, "u=ada");
  ASSERT_EQ(r.status, 200) << r.raw_head << r.body;
  EXPECT_EQ(json::parse(r.body)["target"], "/Login;x=1");
  EXPECT_EQ(r.Header("RateLimit-Remaining"), "0");
  const int before = upstream.requests();
  r = Http(d.port(), "POST", "/a/b;x/../../login;y", {}, "u=ada");
  EXPECT_EQ(r.status, 429) << r.raw_head << r.body;
  EXPECT_EQ(json::parse(r.body)["limit"], "login");
  // A dot or empty segment with parameters names /login to Tomcat and a path
  // under /a to nginx: refused, not guessed.
  r = Http(d.port(), "POST", "/a/..;/login", {}, "u=ada");
  EXPECT_EQ(r.status, 400) << r.raw_head << r.body;
  EXPECT_EQ(upstream.requests(), before);
  // Escaped, ';' is part of the segment: "/login;x" is not /login.
  r = Http(d.port(), "POST", "/login%3Bx", {}, "u=ada");
  EXPECT_EQ(r.status, 200) << r.raw_head << r.body;
  EXPECT_EQ(r.Header("RateLimit-Limit"), "100");
}

// A Node, Deno, Bun or Hono upstream (WHATWG `new URL(req.url, base)`) and
// Python's urlsplit read "//evil/login" as host "evil", path "/login", and a
// raw '\' as '/': merging the slashes ("/evil/login") would let a POST reach
// the upstream's /login outside the login route. Refused (400), never
// forwarded; "//" inside a path is still merged.
TEST(Gateway, ALeadingDoubleSlashOrABackslashIsRefusedNotForwarded) {
  TestUpstream upstream;
  std::string dir = MakeTempDir();
  WriteFile(dir + "/c.yaml", LoginGatewayConfig(upstream.port()));
  Daemon d({"--config", dir + "/c.yaml"});
  ASSERT_TRUE(d.started()) << d.Log();
  const int before = upstream.requests();
  for (const std::string t : {"//evil/login", "//login", "/x/..\\login", "/x/..%5Clogin",
                              "/x/..%5clogin", "/\\evil/login", "http://h//evil/login"}) {
    HttpResponse r = Http(d.port(), "POST", t, {}, "u=ada");
    EXPECT_EQ(r.status, 400) << t << "\n" << r.raw_head << r.body;
  }
  EXPECT_EQ(upstream.requests(), before);
  HttpResponse r = Http(d.port(), "POST", "/a//../login", {}, "u=ada");
  ASSERT_EQ(r.status, 200) << r.raw_head << r.body;
  EXPECT_EQ(json::parse(r.body)["target"], "/a//../login");
  EXPECT_EQ(r.Header("RateLimit-Limit"), "20");
}

TEST(Gateway, UpstreamDownIs502AndTimeoutIs504) {
  std::string dir = MakeTempDir();
  WriteFile(dir + "/c.yaml", GatewayConfig(FreePort()));
  {
    Daemon d({"--config", dir + "/c.yaml"});
    ASSERT_TRUE(d.started()) << d.Log();
    HttpResponse r = Http(d.port(), "GET", "/x", {{"X-API-Key", "down"}});
    EXPECT_EQ(r.status, 502);
    EXPECT_EQ(r.Header("Content-Type"), "application/problem+json");
    EXPECT_NE(json::parse(r.body)["detail"].get<std::string>().find("upstream unreachable"),
              std::string::npos);
  }
  TestUpstream upstream;
  WriteFile(dir + "/c.yaml", GatewayConfig(upstream.port(), "  read_timeout: 500ms\n"));
  Daemon d({"--config", dir + "/c.yaml"});
  ASSERT_TRUE(d.started()) << d.Log();
  HttpResponse r = Http(d.port(), "GET", "/slow", {{"X-API-Key", "slow"}});
  EXPECT_EQ(r.status, 504);
  EXPECT_EQ(json::parse(r.body)["detail"], "upstream did not answer in time");
}

std::string AuthConfig(bool trust_loopback) {
  return std::string("clients:\n") +
         (trust_loopback ? "  trusted_proxies: [127.0.0.1/32]\n" : "  trusted_proxies: []\n") +
         "limits:\n  api: {algorithm: token_bucket, capacity: 2, refill_per_second: 0.01}\n"
         "routes:\n  - name: all\n    path: /\n    match: prefix\n    limits: [api]\n";
}

int Auth(int port, const std::string& source, const std::string& xff) {
  Headers h = {{"X-Original-Method", "GET"}, {"X-Original-URI", "/api/x"}};
  if (!xff.empty()) h.emplace_back("X-Forwarded-For", xff);
  return Http(port, "GET", "/v1/auth", h, "", source).status;
}

TEST(ClientIp, UntrustedPeerCannotSpoofXff) {
  std::string dir = MakeTempDir();
  WriteFile(dir + "/c.yaml", AuthConfig(true));
  Daemon d({"--config", dir + "/c.yaml"});
  ASSERT_TRUE(d.started()) << d.Log();
  // 127.0.0.2 is not a trusted proxy: its X-Forwarded-For is ignored, so
  // changing it does not buy a new bucket.
  EXPECT_EQ(Auth(d.port(), "127.0.0.2", "198.51.100.1"), 204);
  EXPECT_EQ(Auth(d.port(), "127.0.0.2", "198.51.100.2"), 204);
  EXPECT_EQ(Auth(d.port(), "127.0.0.2", "198.51.100.3"), 429);
  EXPECT_EQ(Auth(d.port(), "127.0.0.2", ""), 429);
  // 127.0.0.1 is trusted: the address it forwards is the client.
  EXPECT_EQ(Auth(d.port(), "127.0.0.1", "198.51.100.7"), 204);
  EXPECT_EQ(Auth(d.port(), "127.0.0.1", "198.51.100.7"), 204);
  EXPECT_EQ(Auth(d.port(), "127.0.0.1", "198.51.100.7"), 429);
  EXPECT_EQ(Auth(d.port(), "127.0.0.1", "198.51.100.8"), 204);
  // Missing X-Original-URI -> 400 naming it.
  HttpResponse r = Http(d.port(), "GET", "/v1/auth", {{"X-Original-Method", "GET"}});
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(json::parse(r.body)["detail"].get<std::string>().rfind(
                "X-Original-URI header is required", 0),
            0u);
  // deny_status for nginx.
  r = Http(d.port(), "GET", "/v1/auth?deny_status=403",
           {{"X-Original-Method", "GET"}, {"X-Original-URI", "/api/x"}}, "", "127.0.0.2");
  EXPECT_EQ(r.status, 403);
  EXPECT_EQ(r.Header("X-RateLimit-Denied"), "true");
  EXPECT_FALSE(r.Header("Retry-After").empty());
}

}  // namespace
}  // namespace rltest
