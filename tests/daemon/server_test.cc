// The public listener's own behaviour on the real binary: no pacing of the
// decision API's callers by default, the paths that are ratelimitd's and never
// forwarded, the status line and problem bodies of HTTP-level errors, and
// /v1/release's check of a lease id.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "harness.h"

namespace rltest {
namespace {

// The value of an unlabelled metric in a scrape, or -1.
long long MetricValue(const std::string& scrape, const std::string& name) {
  const std::string line = "\n" + name + " ";
  const size_t at = scrape.find(line);
  if (at == std::string::npos) return -1;
  return std::stoll(scrape.substr(at + line.size()));
}

// One keep-alive connection, 3,000 sequential decisions with the default
// server settings. The old default (1,000 a second per connection, burst one
// second) made requests 1,001..3,000 wait for the pacing timer: at least 2 s
// in all. Now none waits (ratelimit_paced_requests_total stays 0); the rate
// is printed, not asserted (the box is shared).
TEST(ServerDefaults, OneKeepAliveConnectionIsNotPaced) {
  std::string dir = MakeTempDir();
  WriteFile(
      dir + "/c.yaml",
      "limits:\n  big: {algorithm: token_bucket, capacity: 1000000, refill_per_second: 1000}\n");
  Daemon d({"--config", dir + "/c.yaml"});
  ASSERT_TRUE(d.started()) << d.Log();
  const std::string body = R"({"key": "one-connection", "limit": "big"})";
  const std::string request =
      "POST /v1/check HTTP/1.1\r\nHost: rl\r\nContent-Length: " + std::to_string(body.size()) +
      "\r\n\r\n" + body;
  const int fd = Connect(d.port());
  ASSERT_GE(fd, 0);
  constexpr int kRequests = 3000;
  std::string pending;
  int ok = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kRequests; ++i) {
    if (!SendAll(fd, request)) break;
    if (ReadResponse(fd, pending, std::chrono::seconds(10)).status != 200) break;
    ++ok;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ::close(fd);
  EXPECT_EQ(ok, kRequests);
  std::printf("one keep-alive connection: %d decisions in %.3f s (%.0f a second)\n", ok, seconds,
              ok / seconds);
  const std::string scrape = Http(d.admin_port(), "GET", "/metrics").body;
  EXPECT_EQ(MetricValue(scrape, "ratelimit_paced_requests_total"), 0) << scrape;
  // Every request passed each stage once (the scrape itself is on the admin
  // listener, which has its own sessions: counted too, hence >=).
  for (const char* stage : {"parse", "handler", "dispatch", "write"}) {
    EXPECT_GE(
        MetricValue(scrape, std::string("ratelimit_stage_seconds_count{stage=\"") + stage + "\"}"),
        kRequests)
        << stage;
  }
}

// Gateway mode: every spelling of ratelimitd's own paths other than the exact
// endpoint is a 404 problem and never reaches the upstream; /v1/checkx is not
// under /v1/check (segment-aware: an upstream may have /v1/checkout) and is
// forwarded like any other path.
TEST(OwnPaths, OtherSpellingsAre404AndNeverForwarded) {
  TestUpstream upstream;
  std::string dir = MakeTempDir();
  WriteFile(dir + "/c.yaml",
            "server:\n  upstream: http://127.0.0.1:" + std::to_string(upstream.port()) +
                "\nlimits:\n  api: {algorithm: token_bucket, capacity: 1000, "
                "refill_per_second: 100}\n"
                "routes:\n  - {name: all, path: /, match: prefix, limits: [api]}\n");
  Daemon d({"--config", dir + "/c.yaml"});
  ASSERT_TRUE(d.started()) << d.Log();
  const std::string body =
      R"({"key": "k", "limit": {"algorithm": "token_bucket", "capacity": 5, "refill_per_second": 1}})";
  for (const std::string path :
       {"/v1/check/", "/V1/CHECK", "/v1/check/batch/", "/v1/auth/", "/v1/Auth", "/v1//check",
        "/v1/./check", "/v1/%63heck", "/v1/check/anything", "/v1/acquire/", "/V1/RELEASE",
        "/v1/check;x=1", "/v1/auth;jsessionid=0A", "/v1/settle/", "/V1/Settle", "/v1/settle/x",
        "/v1/renew/", "/V1/Renew", "/v1/renew/x"}) {
    for (const std::string method : {"POST", "GET"}) {
      HttpResponse r = Http(d.port(), method, path, {{"X-Original-URI", "/x"}}, body);
      EXPECT_EQ(r.status, 404) << method << " " << path << ": " << r.body;
      EXPECT_EQ(r.Header("Content-Type"), "application/problem+json") << path;
      EXPECT_NE(r.body.find("never forwarded"), std::string::npos) << r.body;
      EXPECT_FALSE(r.Has("X-Upstream")) << path;
    }
  }
  EXPECT_EQ(upstream.requests(), 0) << "none of them reached the upstream";
  // The 404 names all six reserved paths and every endpoint spelling.
  HttpResponse named = Http(d.port(), "POST", "/v1/check/", {}, body);
  EXPECT_NE(named.body.find("/v1/release, /v1/renew and /v1/settle are ratelimitd's"),
            std::string::npos)
      << named.body;
  EXPECT_NE(named.body.find("/v1/release, /v1/renew, /v1/settle\""), std::string::npos)
      << named.body;
  // The exact spellings are served by ratelimitd.
  HttpResponse check = Http(d.port(), "POST", "/v1/check", {}, body);
  EXPECT_EQ(check.status, 200) << check.body;
  EXPECT_NE(check.body.find("\"allowed\":true"), std::string::npos) << check.body;
  EXPECT_EQ(
      Http(d.port(), "GET", "/v1/auth", {{"X-Original-Method", "GET"}, {"X-Original-URI", "/x"}})
          .status,
      204);
  // /v1/settle is ratelimitd's: a bad reservation is its 400, not the upstream's 200.
  HttpResponse settle =
      Http(d.port(), "POST", "/v1/settle", {}, R"({"reservation": "x", "cost": 1})");
  EXPECT_EQ(settle.status, 400) << settle.body;
  EXPECT_FALSE(settle.Has("X-Upstream"));
  EXPECT_EQ(upstream.requests(), 0);
  // Not under one of them: the upstream's.
  for (const std::string path : {"/v1/checkx", "/v1/checkout", "/v1/authors", "/v2/check",
                                 "/v1/settlement", "/v1/renewal"}) {
    HttpResponse r = Http(d.port(), "POST", path, {}, "{}");
    EXPECT_EQ(r.status, 200) << path << ": " << r.body;
    EXPECT_EQ(r.Header("X-Upstream"), "yes") << path;
  }
  EXPECT_EQ(upstream.requests(), 6);
}

// The decision API without an upstream: the same 404, and nothing consumed
// (before, /v1/check/ went through the rules and took a token).
TEST(OwnPaths, OtherSpellingsConsumeNothingWithoutAnUpstream) {
  std::string dir = MakeTempDir();
  WriteFile(dir + "/c.yaml",
            "limits:\n  one: {algorithm: token_bucket, capacity: 1, refill_per_second: 0.001}\n"
            "routes:\n  - {name: all, path: /, match: prefix, limits: [one]}\n");
  Daemon d({"--config", dir + "/c.yaml"});
  ASSERT_TRUE(d.started()) << d.Log();
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(Http(d.port(), "POST", "/v1/check/", {{"X-API-Key", "x"}}).status, 404);
  }
  // The one token is still there: a rules path gets it, then 429.
  EXPECT_EQ(Http(d.port(), "GET", "/api/x").status, 404);  // allowed: no upstream, no route
  EXPECT_EQ(Http(d.port(), "GET", "/api/x").status, 429);
}

// 413 and 431: the status line and the problem title agree (RFC 9110's
// "Content Too Large"), and the problem names the request target.
TEST(HttpErrors, StatusLineAndProblemAgreeAndNameTheTarget) {
  Daemon d({});
  ASSERT_TRUE(d.started()) << d.Log();
  // The head alone: the declared length is refused before any body is read.
  HttpResponse big = RawHttp(
      d.port(), "POST /v1/check?x=1 HTTP/1.1\r\nHost: rl\r\nContent-Length: 100000\r\n\r\n");
  EXPECT_EQ(big.status, 413);
  EXPECT_EQ(big.raw_head.substr(0, big.raw_head.find("\r\n")), "HTTP/1.1 413 Content Too Large");
  EXPECT_NE(big.body.find("\"title\":\"Content Too Large\""), std::string::npos) << big.body;
  EXPECT_NE(big.body.find("\"instance\":\"/v1/check\""), std::string::npos) << big.body;

  HttpResponse head = RawHttp(d.port(), "GET /api/ping?q=2 HTTP/1.1\r\nHost: rl\r\nX-Big: " +
                                            std::string(10000, 'b') + "\r\n\r\n");
  EXPECT_EQ(head.status, 431);
  EXPECT_EQ(head.raw_head.substr(0, head.raw_head.find("\r\n")),
            "HTTP/1.1 431 Request Header Fields Too Large");
  EXPECT_NE(head.body.find("\"instance\":\"/api/ping\""), std::string::npos) << head.body;

  HttpResponse bad = RawHttp(d.port(), "GET /api/ping HTTP/1.1\r\nHost: rl\r\nno colon\r\n\r\n");
  EXPECT_EQ(bad.status, 400);
  EXPECT_NE(bad.body.find("\"instance\":\"/api/ping\""), std::string::npos) << bad.body;
  EXPECT_NE(bad.body.find("malformed HTTP request"), std::string::npos) << bad.body;
}

// /v1/release: a lease id /v1/acquire cannot have given out is a 400 problem,
// not {"released": false}.
TEST(Release, AMalformedLeaseIdIs400) {
  Daemon d({});
  ASSERT_TRUE(d.started()) << d.Log();
  for (const std::string id : {"not-a-lease", "abc", "l-abc", "0123456789ABCDEF0123456789ABCDEF"}) {
    HttpResponse r = Http(d.port(), "POST", "/v1/release", {},
                          R"({"key": "user:ada", "name": "upload", "lease_id": ")" + id + "\"}");
    EXPECT_EQ(r.status, 400) << id << ": " << r.body;
    EXPECT_EQ(r.Header("Content-Type"), "application/problem+json");
    EXPECT_NE(r.body.find("lease_id"), std::string::npos) << r.body;
    EXPECT_NE(r.body.find("\"instance\":\"/v1/release\""), std::string::npos) << r.body;
  }
  HttpResponse r = Http(
      d.port(), "POST", "/v1/release", {},
      R"({"key": "user:ada", "name": "upload", "lease_id": "0123456789abcdef0123456789abcdef"})");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, R"({"released":false})");
}

}  // namespace
}  // namespace rltest
