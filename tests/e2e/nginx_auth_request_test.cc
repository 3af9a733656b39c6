// Real nginx with auth_request (examples/nginx-auth-request.conf) in front
// of a real upstream, ratelimitd deciding, driven by curl. Clients are told
// apart by their source address (127.0.0.2, 127.0.0.3, ...).
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "harness.h"
#include "nginx.h"

namespace rltest {
namespace {

struct Curl {
  int status = 0;
  HttpResponse response;
};

// curl -s -i [--interface SRC] [-H ...] URL
Curl RunCurl(const std::string& url, const std::string& source,
             const std::vector<std::string>& headers = {}) {
  std::string cmd = "curl -s -i --max-time 10";
  if (!source.empty()) cmd += " --interface " + source;
  for (const auto& h : headers) cmd += " -H '" + h + "'";
  cmd += " '" + url + "'";
  Curl c;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return c;
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  ::pclose(p);
  c.response = ParseResponse(out);
  c.status = c.response.status;
  return c;
}

TEST(NginxAuthRequest, LimitsThroughNginx) {
  ASSERT_EQ(::access("/usr/sbin/nginx", X_OK), 0) << "nginx is required (apt-get install nginx)";
  ASSERT_EQ(std::system("curl --version > /dev/null 2>&1"), 0) << "curl is required";

  TestUpstream upstream;
  const std::string dir = MakeTempDir();
  ::chmod(dir.c_str(), 0755);
  WriteFile(dir + "/rl.yaml",
            "clients:\n  trusted_proxies: [127.0.0.1/32]\n"
            "limits:\n  api: {algorithm: token_bucket, capacity: 3, refill_per_second: 0.01}\n"
            "routes:\n  - name: all\n    path: /\n    match: prefix\n    limits: [api]\n");
  Daemon rl({"--config", dir + "/rl.yaml"});
  ASSERT_TRUE(rl.started()) << rl.Log();

  const int nginx_port = FreePort();
  std::string conf = ReadFile(NGINX_CONF_TEMPLATE);
  ASSERT_FALSE(conf.empty());
  conf = Replace(conf, "{{PREFIX}}", dir);
  conf = Replace(conf, "{{LISTEN}}", "127.0.0.1:" + std::to_string(nginx_port));
  conf = Replace(conf, "{{RATELIMITD}}", "127.0.0.1:" + std::to_string(rl.port()));
  conf = Replace(conf, "{{UPSTREAM}}", "127.0.0.1:" + std::to_string(upstream.port()));
  WriteFile(dir + "/nginx.conf", conf);
  Nginx nginx(dir, nginx_port);
  ASSERT_TRUE(nginx.running()) << ReadFile(dir + "/error.log");
  const std::string url = "http://127.0.0.1:" + std::to_string(nginx_port) + "/api/items?page=2";

  for (int i = 0; i < 3; ++i) {
    Curl c = RunCurl(url, "127.0.0.2");
    ASSERT_EQ(c.status, 200) << c.response.raw_head << ReadFile(dir + "/error.log");
    EXPECT_EQ(c.response.Header("RateLimit-Limit"), "3");
    EXPECT_EQ(c.response.Header("RateLimit-Remaining"), std::to_string(2 - i));
    auto echo = nlohmann::json::parse(c.response.body);
    EXPECT_EQ(echo["target"], "/api/items?page=2");
  }
  EXPECT_EQ(upstream.requests(), 3) << "allowed requests reach the upstream";

  Curl denied = RunCurl(url, "127.0.0.2");
  EXPECT_EQ(denied.status, 429) << denied.response.raw_head;
  EXPECT_GE(std::atoi(denied.response.Header("Retry-After").c_str()), 1)
      << denied.response.raw_head;
  EXPECT_EQ(denied.response.Header("Content-Type"), "application/problem+json");
  EXPECT_EQ(denied.response.Header("RateLimit-Remaining"), "0");
  auto problem = nlohmann::json::parse(denied.response.body, nullptr, false);
  ASSERT_TRUE(problem.is_object()) << denied.response.body;
  EXPECT_EQ(problem["status"], 429);
  EXPECT_EQ(upstream.requests(), 3) << "a denied request must not reach the upstream";

  // A client that forges X-Forwarded-For stays in its own bucket: nginx
  // replaces the header with the real peer.
  Curl spoof = RunCurl(url, "127.0.0.2", {"X-Forwarded-For: 198.51.100.77"});
  EXPECT_EQ(spoof.status, 429);
  // Another client (another source address, the same nginx peer) has its own
  // bucket: ratelimitd used the X-Forwarded-For of its trusted proxy.
  Curl other = RunCurl(url, "127.0.0.3");
  EXPECT_EQ(other.status, 200) << other.response.raw_head;
  EXPECT_EQ(upstream.requests(), 4);
}

}  // namespace
}  // namespace rltest
