// Real nginx with auth_request (examples/nginx-auth-request.conf) in front
// of a real upstream, ratelimitd deciding, driven by curl. Clients are told
// apart by their source address (127.0.0.2, 127.0.0.3, ...).
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "harness.h"
#include "nginx.h"

namespace rltest {
namespace {

struct Curl {
  int status = 0;
  HttpResponse response;
};

// curl -s -i [-X METHOD] [--interface SRC] [-H ...] URL
Curl RunCurl(const std::string& url, const std::string& source,
             const std::vector<std::string>& headers = {}, const std::string& method = "GET") {
  std::string cmd = "curl -s -i --max-time 10 -X " + method;
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

// ratelimitd with `rl_yaml`, behind the example nginx config, in front of a
// TestUpstream.
class Stack {
 public:
  explicit Stack(const std::string& rl_yaml)
      : dir_(MakeTempDir()), rl_(Args(dir_, rl_yaml)), nginx_port_(FreePort()) {
    if (!rl_.started()) return;
    std::string conf = ReadFile(NGINX_CONF_TEMPLATE);
    conf = Replace(conf, "{{PREFIX}}", dir_);
    conf = Replace(conf, "{{LISTEN}}", "127.0.0.1:" + std::to_string(nginx_port_));
    conf = Replace(conf, "{{RATELIMITD}}", "127.0.0.1:" + std::to_string(rl_.port()));
    conf = Replace(conf, "{{UPSTREAM}}", "127.0.0.1:" + std::to_string(upstream_.port()));
    WriteFile(dir_ + "/nginx.conf", conf);
    nginx_ = std::make_unique<Nginx>(dir_, nginx_port_);
  }
  // Empty when everything runs, else what went wrong.
  std::string Problem() const {
    if (::access("/usr/sbin/nginx", X_OK) != 0) return "nginx is required (apt-get install nginx)";
    if (std::system("curl --version > /dev/null 2>&1") != 0) return "curl is required";
    if (!rl_.started()) return rl_.Log();
    if (nginx_ == nullptr || !nginx_->running()) return ReadFile(dir_ + "/error.log");
    return "";
  }
  std::string Url(const std::string& path) const {
    return "http://127.0.0.1:" + std::to_string(nginx_port_) + path;
  }
  std::string ErrorLog() const { return ReadFile(dir_ + "/error.log"); }
  TestUpstream& upstream() { return upstream_; }

 private:
  static std::vector<std::string> Args(const std::string& dir, const std::string& yaml) {
    ::chmod(dir.c_str(), 0755);
    WriteFile(dir + "/rl.yaml", yaml);
    return {"--config", dir + "/rl.yaml"};
  }
  TestUpstream upstream_;
  std::string dir_;
  Daemon rl_;
  int nginx_port_;
  std::unique_ptr<Nginx> nginx_;
};

TEST(NginxAuthRequest, LimitsThroughNginx) {
  Stack stack(
      "clients:\n  trusted_proxies: [127.0.0.1/32]\n"
      "limits:\n  api: {algorithm: token_bucket, capacity: 3, refill_per_second: 0.01}\n"
      "routes:\n  - name: all\n    path: /\n    match: prefix\n    limits: [api]\n");
  ASSERT_EQ(stack.Problem(), "");
  TestUpstream& upstream = stack.upstream();
  const std::string url = stack.Url("/api/items?page=2");

  for (int i = 0; i < 3; ++i) {
    Curl c = RunCurl(url, "127.0.0.2");
    ASSERT_EQ(c.status, 200) << c.response.raw_head << stack.ErrorLog();
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
  // Nor one that forges Forwarded: nginx passes the client's other headers
  // through, and from a trusted proxy ratelimitd reads Forwarded first (this
  // yaml leaves clients.client_ip_header at any), so the example conf clears it.
  Curl forged = RunCurl(url, "127.0.0.2", {"Forwarded: for=198.51.100.78"});
  EXPECT_EQ(forged.status, 429) << forged.response.raw_head;
  // Another client (another source address, the same nginx peer) has its own
  // bucket: ratelimitd used the X-Forwarded-For of its trusted proxy.
  Curl other = RunCurl(url, "127.0.0.3");
  EXPECT_EQ(other.status, 200) << other.response.raw_head;
  EXPECT_EQ(upstream.requests(), 4);
}

// The two example files together, as shipped: the client sees the RateLimit
// headers of the yaml's dialect (structured) on 200 and on 429.
TEST(NginxAuthRequest, TheExampleFilesTogetherShowTheRateLimitHeaders) {
  std::string yaml_path = NGINX_CONF_TEMPLATE;  // examples/nginx-auth-request.conf
  yaml_path.replace(yaml_path.size() - 4, 4, "yaml");
  Stack stack(ReadFile(yaml_path));
  ASSERT_EQ(stack.Problem(), "");
  const std::string url = stack.Url("/upload");
  // POST /upload costs all 10 tokens of upload_rate: allowed once, then denied.
  Curl ok = RunCurl(url, "127.0.0.2", {}, "POST");
  ASSERT_EQ(ok.status, 200) << ok.response.raw_head << stack.ErrorLog();
  EXPECT_NE(ok.response.Header("RateLimit-Policy"), "") << ok.response.raw_head;
  EXPECT_NE(ok.response.Header("RateLimit").find(";r="), std::string::npos) << ok.response.raw_head;
  EXPECT_FALSE(ok.response.Has("RateLimit-Limit")) << "no header of another dialect";
  Curl denied = RunCurl(url, "127.0.0.2", {}, "POST");
  ASSERT_EQ(denied.status, 429) << denied.response.raw_head << stack.ErrorLog();
  EXPECT_NE(denied.response.Header("RateLimit-Policy"), "") << denied.response.raw_head;
  EXPECT_NE(denied.response.Header("RateLimit").find(";r=0"), std::string::npos)
      << denied.response.raw_head;
  EXPECT_GE(std::atoi(denied.response.Header("Retry-After").c_str()), 1)
      << denied.response.raw_head;
  // The yaml keys users by X-User-Id, which only nginx may set: a client
  // that sends its own is still the anonymous client it was.
  Curl forged = RunCurl(url, "127.0.0.2", {"X-User-Id: mallory"}, "POST");
  EXPECT_EQ(forged.status, 429) << forged.response.raw_head;
  EXPECT_EQ(stack.upstream().requests(), 1);
}

// Shaping through nginx: ratelimitd answers /_ratelimit only when the
// request's turn has come, nginx holds the client meanwhile, and the upstream
// sees the burst spread at the rate.
TEST(NginxAuthRequest, ShapedBurstReachesTheUpstreamAtTheRate) {
  Stack stack(
      "clients:\n  trusted_proxies: [127.0.0.1/32]\n"
      "limits:\n  shape: {algorithm: leaky_bucket, depth: 5, rate_per_second: 5}\n"
      "routes:\n  - name: all\n    path: /\n    match: prefix\n    limits: [shape]\n");
  ASSERT_EQ(stack.Problem(), "");
  std::vector<std::thread> clients;
  std::vector<int> status(4);
  for (size_t i = 0; i < status.size(); ++i) {
    clients.emplace_back([&, i] {
      status[i] = RunCurl(stack.Url("/api/r" + std::to_string(i)), "127.0.0.2").status;
    });
  }
  for (auto& t : clients) t.join();
  for (int s : status) EXPECT_EQ(s, 200) << stack.ErrorLog();
  std::vector<TestUpstream::Arrival> a = stack.upstream().arrivals();
  ASSERT_EQ(a.size(), 4u);
  std::sort(a.begin(), a.end(), [](const auto& x, const auto& y) { return x.at < y.at; });
  for (size_t i = 1; i < a.size(); ++i) {
    const double since_first = std::chrono::duration<double, std::milli>(a[i].at - a[0].at).count();
    // One every 200 ms (unshaped, all four would arrive within a few ms);
    // loose bounds: nginx and curl add their own scheduling on a busy box.
    EXPECT_GE(since_first, 200.0 * static_cast<double>(i) - 100) << i;
    EXPECT_LE(since_first, 200.0 * static_cast<double>(i) + 200) << i;
  }
}

}  // namespace
}  // namespace rltest
