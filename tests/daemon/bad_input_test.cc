// Bad input across every face of the real ratelimitd: the decision API and its
// batch, the gateway, nginx auth_request, the admin API, and the HTTP layer
// under them (raw bytes: smuggling, chunked tricks, oversized heads and
// bodies). One daemon serves the whole table, in order; after each row the
// same daemon must still answer a good request correctly.
#include <gtest/gtest.h>
#include <unistd.h>

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "harness.h"

namespace rltest {
namespace {

using nlohmann::json;

enum class Face { kMain, kAdmin };

struct Row {
  std::string name;
  Face face;
  std::string request;  // raw bytes
  int status;           // expected
  // Where the face answers JSON: a problem+json body with this status, and
  // `detail` containing this text ("" = any detail).
  bool problem = true;
  std::string detail;
  std::function<void(const HttpResponse&)> check = nullptr;  // further checks
};

constexpr const char* kToken = "adm1n-t0ken-for-bad-input";

std::string Post(const std::string& target, const std::string& body,
                 const std::string& extra_headers = "") {
  return "POST " + target + " HTTP/1.1\r\nHost: rl\r\nContent-Type: application/json\r\n" +
         extra_headers + "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

std::string Get(const std::string& target, const std::string& extra_headers = "") {
  return "GET " + target + " HTTP/1.1\r\nHost: rl\r\n" + extra_headers + "\r\n";
}

// A /v1/check body with one token bucket and the given fields spliced in.
std::string CheckBody(
    const std::string& key_json, const std::string& extra = "",
    const std::string& limit_fields = "\"capacity\": 10, \"refill_per_second\": 5") {
  return "{\"key\": " + key_json + extra + ", \"limit\": {\"algorithm\": \"token_bucket\", " +
         limit_fields + "}}";
}

std::string Admin(const std::string& target) {
  return Get(target, std::string("Authorization: Bearer ") + kToken + "\r\n");
}

// One exchange on a fresh connection: send everything (a server that answers
// early and closes may cut the sending short), then read one response.
HttpResponse Exchange(int port, const std::string& bytes) {
  const int fd = Connect(port);
  if (fd < 0) return {};
  SendAll(fd, bytes);
  std::string pending;
  HttpResponse r = ReadResponse(fd, pending, std::chrono::seconds(10));
  ::close(fd);
  return r;
}

std::vector<Row> Table() {
  const std::string good_limit = "\"capacity\": 10, \"refill_per_second\": 5";
  std::vector<Row> t = {
      // --- decision API: JSON and its types ---
      {"truncated json", Face::kMain, Post("/v1/check", R"({"key": "a", "cost": )"), 400, true,
       "not valid JSON"},
      {"json array", Face::kMain, Post("/v1/check", "[1, 2]"), 400},
      {"empty body", Face::kMain, Post("/v1/check", ""), 400},
      {"trailing garbage", Face::kMain, Post("/v1/check", CheckBody("\"a\"") + "}"), 400, true,
       "not valid JSON"},
      {"key is a number", Face::kMain, Post("/v1/check", CheckBody("5")), 400, true, "key"},
      {"key is null", Face::kMain, Post("/v1/check", CheckBody("null")), 400, true, "key"},
      {"cost is a string", Face::kMain, Post("/v1/check", CheckBody("\"a\"", ", \"cost\": \"1\"")),
       400, true, "cost"},
      {"cost is fractional", Face::kMain, Post("/v1/check", CheckBody("\"a\"", ", \"cost\": 1.5")),
       400, true, "cost"},
      {"negative cost", Face::kMain, Post("/v1/check", CheckBody("\"a\"", ", \"cost\": -1")), 400,
       true, "cost"},
      {"cost overflows double", Face::kMain,
       Post("/v1/check", CheckBody("\"a\"", ", \"cost\": 1e400")), 400},
      {"cost overflows int64", Face::kMain,
       Post("/v1/check", CheckBody("\"a\"", ", \"cost\": 99999999999999999999")), 400, true,
       "cost"},
      {"cost above capacity", Face::kMain, Post("/v1/check", CheckBody("\"a\"", ", \"cost\": 11")),
       400},
      {"NaN literal", Face::kMain, Post("/v1/check", CheckBody("\"a\"", ", \"cost\": NaN")), 400,
       true, "not valid JSON"},
      {"Infinity refill", Face::kMain,
       Post("/v1/check",
            CheckBody("\"a\"", "", "\"capacity\": 10, \"refill_per_second\": Infinity")),
       400, true, "not valid JSON"},
      {"refill overflows to inf", Face::kMain,
       Post("/v1/check", CheckBody("\"a\"", "", "\"capacity\": 10, \"refill_per_second\": 1e309")),
       400},
      {"negative refill", Face::kMain,
       Post("/v1/check", CheckBody("\"a\"", "", "\"capacity\": 10, \"refill_per_second\": -5")),
       400},
      {"zero capacity", Face::kMain,
       Post("/v1/check", CheckBody("\"a\"", "", "\"capacity\": 0, \"refill_per_second\": 5")), 400},
      {"capacity 2^63", Face::kMain,
       Post("/v1/check",
            CheckBody("\"a\"", "", "\"capacity\": 9223372036854775808, \"refill_per_second\": 5")),
       400},
      {"empty key", Face::kMain, Post("/v1/check", CheckBody("\"\"")), 400, true, "key"},
      {"10 kB key", Face::kMain,
       Post("/v1/check", CheckBody("\"" + std::string(10240, 'k') + "\"")), 400, true, "key"},
      {"invalid UTF-8 in key", Face::kMain, Post("/v1/check", CheckBody("\"a\xff\xfe\"")), 400,
       true, "not valid JSON"},
      {"overlong UTF-8 slash", Face::kMain, Post("/v1/check", CheckBody("\"a\xc0\xaf\"")), 400},
      {"lone surrogate escape", Face::kMain, Post("/v1/check", CheckBody(R"("a\ud800")")), 400},
      {"unknown field", Face::kMain, Post("/v1/check", CheckBody("\"a\"", ", \"costs\": 1")), 400,
       true, "costs"},
      {"17 limits", Face::kMain,
       Post("/v1/check",
            [] {
              std::string b = R"({"key": "a", "limits": [)";
              for (int i = 0; i < 17; ++i) {
                b += (i ? "," : "") + std::string(R"({"name": "l)") + std::to_string(i) +
                     R"(", "algorithm": "token_bucket", "capacity": 10, "refill_per_second": 5})";
              }
              return b + "]}";
            }()),
       400},
      {"unknown algorithm", Face::kMain,
       Post("/v1/check", R"({"key": "a", "limit": {"algorithm": "leaky", "limit": 1}})"), 400},
      {"bad window", Face::kMain,
       Post(
           "/v1/check",
           R"({"key": "a", "limit": {"algorithm": "fixed_window", "limit": 5, "window": "5 parsecs"}})"),
       400},
      {"nested 20000 deep", Face::kMain,
       Post("/v1/check", std::string(20000, '[') + std::string(20000, ']')), 400},
      {"GET /v1/check", Face::kMain, Get("/v1/check"), 405, true, "",
       [](const HttpResponse& r) { EXPECT_EQ(r.Header("Allow"), "POST"); }},
      {"PUT /v1/check", Face::kMain,
       "PUT /v1/check HTTP/1.1\r\nHost: rl\r\nContent-Length: 2\r\n\r\n{}", 405},
      // --- batch ---
      {"batch: checks not an array", Face::kMain, Post("/v1/check/batch", R"({"checks": {}})"),
       400},
      {"batch: 101 checks", Face::kMain,
       Post("/v1/check/batch",
            [good_limit] {
              std::string b = R"({"checks": [)";
              for (int i = 0; i < 101; ++i)
                b += (i ? "," : "") + CheckBody("\"b\"", "", good_limit);
              return b + "]}";
            }()),
       400},
      {"batch: one bad item", Face::kMain,
       Post("/v1/check/batch", "{\"checks\": [" + CheckBody("\"b1\"") + "," +
                                   CheckBody("\"b2\"", ", \"cost\": -3") + "]}"),
       200, false, "",
       [](const HttpResponse& r) {
         const json j = json::parse(r.body, nullptr, false);
         ASSERT_TRUE(j.contains("results")) << r.body;
         EXPECT_EQ(j["results"][0]["allowed"], true) << r.body;
         EXPECT_EQ(j["results"][1]["error"]["status"], 400) << r.body;
       }},
      {"batch: invalid UTF-8", Face::kMain,
       Post("/v1/check/batch", "{\"checks\": [\"\xed\xa0\x80\"]}"), 400},
      // --- the HTTP layer (raw bytes) ---
      {"control byte in method", Face::kMain, "G\x01T / HTTP/1.1\r\nHost: rl\r\n\r\n", 400},
      {"TLS hello on the plain port", Face::kMain,
       std::string("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 11), 400},
      {"bad version", Face::kMain, "GET /v1/check HTTP/1.x\r\nHost: rl\r\n\r\n", 400},
      {"10 kB header", Face::kMain, Get("/api/x", "X-Big: " + std::string(10240, 'a') + "\r\n"),
       431},
      {"600 small headers", Face::kMain,
       Get("/api/x",
           [] {
             std::string h;
             for (int i = 0; i < 600; ++i) h += "X-H" + std::to_string(i) + ": 0123456789\r\n";
             return h;
           }()),
       431},
      {"10 MB Content-Length", Face::kMain,
       "POST /v1/check HTTP/1.1\r\nHost: rl\r\nContent-Length: 10485760\r\n\r\n", 413},
      {"chunked body over the limit", Face::kMain,
       "POST /v1/check HTTP/1.1\r\nHost: rl\r\nTransfer-Encoding: chunked\r\n\r\n11170\r\n" +
           std::string(70000, 'x'),
       413},
      {"Content-Length and chunked (CL.TE)", Face::kMain,
       "POST /v1/check HTTP/1.1\r\nHost: rl\r\nContent-Length: 4\r\nTransfer-Encoding: "
       "chunked\r\n\r\n5c\r\nGET /smuggled HTTP/1.1\r\nHost: rl\r\n\r\n0\r\n\r\n",
       400},
      {"chunked then Content-Length (TE.CL)", Face::kMain,
       "POST /v1/check HTTP/1.1\r\nHost: rl\r\nTransfer-Encoding: chunked\r\nContent-Length: "
       "3\r\n\r\n8\r\nSMUGGLED\r\n0\r\n\r\n",
       400},
      {"two Content-Lengths", Face::kMain,
       "POST /v1/check HTTP/1.1\r\nHost: rl\r\nContent-Length: 2\r\nContent-Length: 40\r\n\r\n{}",
       400},
      {"Content-Length list", Face::kMain,
       "POST /v1/check HTTP/1.1\r\nHost: rl\r\nContent-Length: 2, 40\r\n\r\n{}", 400},
      {"negative Content-Length", Face::kMain,
       "POST /v1/check HTTP/1.1\r\nHost: rl\r\nContent-Length: -1\r\n\r\n", 400},
      {"Content-Length overflows", Face::kMain,
       "POST /v1/check HTTP/1.1\r\nHost: rl\r\nContent-Length: 99999999999999999999999\r\n\r\n",
       400},
      // The detail tells this 400 from /v1/check's for an empty body (Beast
      // alone reads the request as bodyless).
      {"chunked not last", Face::kMain,
       "POST /v1/check HTTP/1.1\r\nHost: rl\r\nTransfer-Encoding: chunked, identity\r\n\r\n2\r\n{}"
       "\r\n0\r\n\r\n",
       400, true, "Transfer-Encoding does not end in chunked"},
      {"Transfer-Encoding without chunked", Face::kMain,
       "POST /api/x HTTP/1.1\r\nHost: rl\r\nTransfer-Encoding: gzip\r\n\r\n" + Get("/api/smuggled"),
       400, true, "Transfer-Encoding does not end in chunked"},
      // RFC 9112 6.1: only chunked is decoded; the rest would be dropped.
      {"gzip then chunked", Face::kMain,
       "POST /api/x HTTP/1.1\r\nHost: rl\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"
       "2\r\n{}\r\n0\r\n\r\n" +
           Get("/api/smuggled"),
       501, true, "not implemented"},
      {"gzip and chunked in two fields", Face::kMain,
       "POST /v1/check HTTP/1.1\r\nHost: rl\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: "
       "chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
       501, true, "not implemented"},
      {"bad chunk size", Face::kMain,
       "POST /v1/check HTTP/1.1\r\nHost: rl\r\nTransfer-Encoding: "
       "chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
       400},
      {"chunk size overflows", Face::kMain,
       "POST /v1/check HTTP/1.1\r\nHost: rl\r\nTransfer-Encoding: "
       "chunked\r\n\r\nffffffffffffffffff1\r\n{}\r\n0\r\n\r\n",
       400},
      {"chunk without CRLF", Face::kMain,
       "POST /v1/check HTTP/1.1\r\nHost: rl\r\nTransfer-Encoding: "
       "chunked\r\n\r\n2\r\n{}XX0\r\n\r\n",
       400},
      // RFC 9112 5.2: reject obs-fold or replace it with spaces; Beast
      // replaces, and the upstream sees one line.
      {"obs-fold header", Face::kMain,
       "GET /api/x HTTP/1.1\r\nHost: rl\r\nX-A: 1\r\n folded\r\n\r\n", 200, false, "",
       [](const HttpResponse& r) {
         EXPECT_NE(r.body.find(R"("x-a":["1 folded"])"), std::string::npos) << r.body;
       }},
      {"space before colon", Face::kMain, "GET /api/x HTTP/1.1\r\nHost : rl\r\n\r\n", 400},
      {"header without colon", Face::kMain, "GET /api/x HTTP/1.1\r\nHost rl\r\n\r\n", 400},
      {"NUL in header value", Face::kMain,
       std::string("GET /api/x HTTP/1.1\r\nHost: rl\r\nX-A: a\0b\r\n\r\n", 43), 400},
      {"bare LF line ends", Face::kMain, "GET /api/x HTTP/1.1\nHost: rl\n\n", 400},
      // RFC 9112 3.2: HTTP/1.1 needs exactly one Host; no version may have two.
      {"gateway: no Host", Face::kMain, "GET /api/x HTTP/1.1\r\nX-A: 1\r\n\r\n", 400, true,
       "without Host"},
      {"gateway: two Hosts", Face::kMain, "GET /api/x HTTP/1.1\r\nHost: rl\r\nHost: evil\r\n\r\n",
       400, true, "more than one Host"},
      {"HTTP/1.0: two Hosts", Face::kMain, "GET /api/x HTTP/1.0\r\nHost: rl\r\nHost: evil\r\n\r\n",
       400, true, "more than one Host"},
      {"check: no Host", Face::kMain,
       [] {
         std::string r = Post("/v1/check", CheckBody("\"h\""));
         return r.erase(r.find("Host: rl\r\n"), 10);
       }(),
       400, true, "without Host"},
      {"HTTP/1.0: no Host is served", Face::kMain,
       [] {
         std::string r = Post("/v1/check", CheckBody("\"h10\""));
         r.erase(r.find("Host: rl\r\n"), 10);
         return r.replace(r.find("HTTP/1.1"), 8, "HTTP/1.0");
       }(),
       200, false},
      {"auth: no Host", Face::kMain,
       "GET /v1/auth HTTP/1.1\r\nX-Original-Method: GET\r\nX-Original-URI: /api/x\r\n\r\n", 400,
       true, "without Host"},
      {"auth: two Hosts", Face::kMain,
       Get("/v1/auth", "Host: b\r\nX-Original-Method: GET\r\nX-Original-URI: /api/x\r\n"), 400,
       true, "more than one Host"},
      // --- gateway ---
      {"gateway: bad percent escape", Face::kMain, Get("/api/%zz"), 400},
      {"gateway: NUL escape in path", Face::kMain, Get("/api/a%00b"), 400},
      {"gateway: good request passes", Face::kMain, Get("/api/items/1"), 200, false, "",
       [](const HttpResponse& r) { EXPECT_NE(r.body.find("\"target\""), std::string::npos); }},
      // --- nginx auth_request ---
      {"auth: no X-Original-URI", Face::kMain, Get("/v1/auth", "X-Original-Method: GET\r\n"), 400,
       true, "X-Original-URI"},
      {"auth: bad deny_status", Face::kMain,
       Get("/v1/auth?deny_status=500", "X-Original-Method: GET\r\nX-Original-URI: /api/x\r\n"),
       400},
      {"auth: malformed original URI", Face::kMain,
       Get("/v1/auth", "X-Original-Method: GET\r\nX-Original-URI: /api/%zz\r\n"), 400},
      // --- client IP: /login is keyed by IP and 127.0.0.1's bucket is empty
      // (SetUp): a malformed Forwarded / X-Forwarded-For must fall back to the
      // peer, never name another client. ---
      {"Forwarded: valid (control)", Face::kMain,
       "POST /login HTTP/1.1\r\nHost: rl\r\nForwarded: for=203.0.113.77\r\nContent-Length: "
       "0\r\n\r\n",
       200, false},
      {"Forwarded: empty parameter", Face::kMain,
       "POST /login HTTP/1.1\r\nHost: rl\r\nForwarded: for=203.0.113.78;;=\r\nContent-Length: "
       "0\r\n\r\n",
       429},
      {"Forwarded: unterminated quote", Face::kMain,
       "POST /login HTTP/1.1\r\nHost: rl\r\nForwarded: for=\"[2001:db8::1]\r\nContent-Length: "
       "0\r\n\r\n",
       429},
      {"Forwarded: bad address", Face::kMain,
       "POST /login HTTP/1.1\r\nHost: rl\r\nForwarded: for=999.1.1.1\r\nContent-Length: 0\r\n\r\n",
       429},
      {"Forwarded: bad port", Face::kMain,
       "POST /login HTTP/1.1\r\nHost: rl\r\nForwarded: "
       "for=\"203.0.113.79:99999\"\r\nContent-Length: "
       "0\r\n\r\n",
       429},
      {"X-Forwarded-For: garbage hop", Face::kMain,
       "POST /login HTTP/1.1\r\nHost: rl\r\nX-Forwarded-For: 203.0.113.80, "
       "not-an-ip\r\nContent-Length: 0\r\n\r\n",
       429},
      // --- admin API ---
      {"admin: no token", Face::kAdmin, Get("/v1/config"), 401, true, "",
       [](const HttpResponse& r) { EXPECT_NE(r.Header("WWW-Authenticate"), ""); }},
      {"admin: wrong token", Face::kAdmin,
       Get("/v1/config", std::string("Authorization: Bearer ") + kToken + "x\r\n"), 401},
      {"admin: bad escape in client", Face::kAdmin, Admin("/v1/clients/k:%ZZ/state"), 400},
      {"admin: 300-byte client", Face::kAdmin,
       Admin("/v1/clients/k:" + std::string(300, 'a') + "/state"), 400},
      {"admin: top-denied n=-1", Face::kAdmin, Admin("/v1/top-denied?n=-1"), 400},
      {"admin: top-denied window=abc", Face::kAdmin, Admin("/v1/top-denied?window=abc"), 400},
      {"admin: no Host", Face::kAdmin,
       [] {
         std::string r = Admin("/v1/config");
         return r.erase(r.find("Host: rl\r\n"), 10);
       }(),
       400, true, "without Host"},
      {"admin: two Hosts", Face::kAdmin,
       Get("/v1/config", std::string("Host: b\r\nAuthorization: Bearer ") + kToken + "\r\n"), 400,
       true, "more than one Host"},
      {"admin: huge header", Face::kAdmin,
       [] {
         std::string r = Admin("/v1/config");
         return r.insert(r.find("\r\n") + 2, "X-Big: " + std::string(10240, 'a') + "\r\n");
       }(),
       431},
  };
  return t;
}

class BadInput : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    upstream_ = new TestUpstream();
    const std::string dir = MakeTempDir();
    WriteFile(dir + "/token", std::string(kToken) + "\n");
    WriteFile(dir + "/rl.yaml",
              "server:\n  upstream: http://127.0.0.1:" + std::to_string(upstream_->port()) +
                  "\n  admin_token_file: " + dir + "/token\n" +
                  "clients: {trusted_proxies: [127.0.0.1/32], accept_unknown_api_keys: true}\n"
                  "limits:\n"
                  "  api: {algorithm: token_bucket, capacity: 100000, refill_per_second: 1000}\n"
                  "routes:\n"
                  "  - {name: login, methods: [POST], path: /login, match: exact, key_by: ip,\n"
                  "     limits: [{name: login, algorithm: token_bucket, capacity: 1,\n"
                  "               refill_per_second: 0.0001}]}\n"
                  "  - {name: api, path: /api, limits: [api]}\n");
    daemon_ = new Daemon({"--config", dir + "/rl.yaml"});
  }
  static void TearDownTestSuite() {
    delete daemon_;
    delete upstream_;
  }

  static TestUpstream* upstream_;
  static Daemon* daemon_;
};

TestUpstream* BadInput::upstream_ = nullptr;
Daemon* BadInput::daemon_ = nullptr;

TEST_F(BadInput, EveryRowAnswersAndTheServerStaysGood) {
  Daemon& d = *daemon_;
  ASSERT_TRUE(d.started() && d.admin_port() > 0) << d.Log();
  // 127.0.0.1 spends its one /login token: the Forwarded rows below must not
  // find a fresh bucket under a spoofed address.
  ASSERT_EQ(Http(d.port(), "POST", "/login").status, 200) << d.Log();
  ASSERT_EQ(Http(d.port(), "POST", "/login").status, 429);

  const std::vector<Row> table = Table();
  ASSERT_GE(table.size(), 40u);
  int i = 0;
  for (const Row& row : table) {
    SCOPED_TRACE("row " + std::to_string(i) + ": " + row.name);
    const int port = row.face == Face::kMain ? d.port() : d.admin_port();
    const HttpResponse r = Exchange(port, row.request);
    EXPECT_EQ(r.status, row.status) << r.raw_head << "\n" << r.body;
    if (row.problem && r.status == row.status) {
      EXPECT_EQ(r.Header("Content-Type"), "application/problem+json") << r.raw_head;
      const json p = json::parse(r.body, nullptr, false);
      EXPECT_EQ(p.value("status", 0), row.status) << r.body;
      EXPECT_FALSE(p.value("title", "").empty()) << r.body;
      if (!row.detail.empty()) {
        EXPECT_NE(p.value("detail", "").find(row.detail), std::string::npos) << r.body;
      }
    }
    if (row.check && r.status == row.status) row.check(r);

    // The same server still answers a good request correctly.
    const HttpResponse good =
        Http(d.port(), "POST", "/v1/check", {{"Content-Type", "application/json"}},
             CheckBody("\"good-" + std::to_string(i) + "\"", ", \"cost\": 3",
                       "\"capacity\": 10, \"refill_per_second\": 0.001"));
    ASSERT_EQ(good.status, 200) << good.body << d.Log();
    const json g = json::parse(good.body, nullptr, false);
    EXPECT_EQ(g.value("allowed", false), true) << good.body;
    EXPECT_EQ(g.value("remaining", -1), 7) << good.body;
    if (row.face == Face::kAdmin) {
      EXPECT_EQ(Http(d.admin_port(), "GET", "/healthz").status, 200);
    }
    ++i;
  }
  // No request reached the upstream that the rules or the parser refused:
  // only the first /login, the good gateway row, the obs-fold row and the
  // Forwarded control row (and no smuggled request).
  EXPECT_EQ(upstream_->requests(), 4);
}

}  // namespace
}  // namespace rltest
