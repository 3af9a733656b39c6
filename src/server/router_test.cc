// Router and admin routing without sockets: requests go straight into
// Router::Handle against a MemoryStore on a manual clock, and the tests read
// the Reply it hands back. Which face answers which path, the methods each
// one takes, and that admin paths never reach the public listener.
#include "server/router.h"

#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "policy/config.h"
#include "policy/policy.h"
#include "ratelimit/clock.h"
#include "ratelimit/memory_store.h"
#include "server/admin.h"
#include "server/enforcer.h"
#include "server/http.h"
#include "server/policy_holder.h"
#include "server/reply.h"

namespace ratelimit::server {
namespace {

constexpr std::string_view kConfig =
    "limits:\n"
    "  one: {algorithm: fixed_window, limit: 1, window: 1m}\n"
    "routes:\n"
    "  - name: api\n"
    "    path: /api\n"
    "    limits:\n"
    "      - {name: per_ip, algorithm: fixed_window, limit: 1, window: 1m}\n";

std::shared_ptr<const policy::Policy> Compile(std::string_view yaml) {
  StatusOr<policy::Config> c = policy::ParseConfig(yaml, "router_test.yaml");
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  StatusOr<std::shared_ptr<const policy::Policy>> p = policy::Policy::Create(std::move(*c));
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return *p;
}

class RouterTest : public ::testing::Test {
 protected:
  RouterTest()
      : holder_(Compile(kConfig)),
        store_(std::make_shared<MemoryStore>(MemoryStore::Options{.shards = 4, .clock = &clock_})),
        enforcer_(store_, 1000),
        admin_(enforcer_, "secret"),
        public_(holder_, enforcer_, /*gateway=*/nullptr, /*demo=*/false, &admin_),
        admin_router_(Router::Admin(holder_, enforcer_, admin_)) {}

  // The Reply of one request; the memory store answers before Handle returns.
  static Reply Send(Router& router, http::verb method, std::string_view target,
                    std::string body = "", std::string_view authorization = "") {
    Request req{method, target, 11};
    req.set(http::field::host, "localhost");
    if (!authorization.empty()) req.set(http::field::authorization, authorization);
    req.body() = std::move(body);
    req.prepare_payload();
    const policy::IpAddress peer = *policy::IpAddress::Parse("192.0.2.7");
    std::optional<Reply> out;
    router.Handle(req, peer, "192.0.2.7", [&](Reply r) { out = std::move(r); });
    EXPECT_TRUE(out.has_value()) << target << ": no answer before Handle returned";
    return out.value_or(Reply{.status = 0});
  }

  ManualClock clock_;
  PolicyHolder holder_;
  std::shared_ptr<MemoryStore> store_;
  Enforcer enforcer_;
  AdminApi admin_;
  Router public_;
  std::unique_ptr<Router> admin_router_;
};

// A proxy may add its own Forwarded line rather than append to the
// client's: the view joins the lines in order, as for X-Forwarded-For, so
// the client's own first line cannot name its address. The policy reads
// both names at once (two views held together).
TEST(MakeViewTest, RepeatedForwardedAndXForwardedForLinesAreJoined) {
  Request req{http::verb::get, "/api", 11};
  req.insert("Forwarded", "for=203.0.113.9");   // the client's forgery
  req.insert("Forwarded", "for=198.51.100.4");  // the trusted proxy's line
  req.insert("X-Forwarded-For", "203.0.113.9");
  req.insert("X-Forwarded-For", "198.51.100.4");
  req.insert("X-Other", "first");
  req.insert("X-Other", "second");
  const policy::IpAddress proxy = *policy::IpAddress::Parse("10.0.0.1");
  JoinedFields joined;
  const policy::RequestView view = MakeView(req, "GET", "/api", proxy, joined);
  const std::optional<std::string_view> xff = view.header("x-forwarded-for");
  const std::optional<std::string_view> fwd = view.header("forwarded");
  EXPECT_EQ(fwd, "for=203.0.113.9, for=198.51.100.4");
  EXPECT_EQ(xff, "203.0.113.9, 198.51.100.4");
  EXPECT_EQ(view.header("X-Other"), "first");  // other names: the first line
  const std::vector<policy::Cidr> trusted = {*policy::Cidr::Parse("10.0.0.0/8")};
  EXPECT_EQ(policy::ClientIp(proxy, xff, fwd, trusted).ToString(), "198.51.100.4");
}

TEST_F(RouterTest, DecisionApiTakesOnlyPost) {
  Reply r = Send(public_, http::verb::get, "/v1/check");
  EXPECT_EQ(r.status, 405u);
  ASSERT_NE(r.Find("Allow"), nullptr);
  EXPECT_EQ(*r.Find("Allow"), "POST");
  EXPECT_EQ(Send(public_, http::verb::put, "/v1/check/batch").status, 405u);
}

TEST_F(RouterTest, DecisionApiAnswersFromTheStore) {
  const std::string body = R"({"key": "user:ada", "limits": ["one"]})";
  Reply first = Send(public_, http::verb::post, "/v1/check", body);
  EXPECT_EQ(first.status, 200u) << first.body;
  EXPECT_NE(first.body.find("\"allowed\":true"), std::string::npos) << first.body;
  Reply second = Send(public_, http::verb::post, "/v1/check", body);
  EXPECT_NE(second.body.find("\"allowed\":false"), std::string::npos) << second.body;
}

TEST_F(RouterTest, ConfiguredRoutesAreLimitedThenFallThroughTo404WithoutUpstream) {
  // No gateway: an allowed request has nowhere to go (404); the next one on
  // the same client (the peer's address) is over the route's limit.
  Reply allowed = Send(public_, http::verb::get, "/api/orders");
  EXPECT_EQ(allowed.status, 404u) << allowed.body;
  Reply denied = Send(public_, http::verb::get, "/api/orders");
  EXPECT_EQ(denied.status, 429u) << denied.body;
  EXPECT_NE(denied.Find("Retry-After"), nullptr);
}

TEST_F(RouterTest, UnknownPathsAre404) {
  Reply r = Send(public_, http::verb::get, "/nowhere");
  EXPECT_EQ(r.status, 404u);
  EXPECT_EQ(r.content_type, "application/problem+json");
}

TEST_F(RouterTest, AdminPathsNeverReachThePublicListener) {
  EXPECT_EQ(Send(public_, http::verb::get, "/healthz").status, 404u);
  EXPECT_EQ(Send(public_, http::verb::get, "/metrics", "", "Bearer secret").status, 404u);
}

TEST_F(RouterTest, TheAdminListenerSendsEverythingToTheAdminApi) {
  EXPECT_EQ(Send(*admin_router_, http::verb::get, "/healthz").status, 200u);
  // The decision API is not served on the admin listener: it is an admin
  // path like any other there, so the token is asked for first.
  Reply check = Send(*admin_router_, http::verb::post, "/v1/check", R"({"key":"k"})");
  EXPECT_EQ(check.status, 401u) << check.body;
  Reply no_token = Send(*admin_router_, http::verb::get, "/metrics");
  EXPECT_EQ(no_token.status, 401u);
  EXPECT_NE(no_token.Find("WWW-Authenticate"), nullptr);
  Reply metrics = Send(*admin_router_, http::verb::get, "/metrics", "", "Bearer secret");
  EXPECT_EQ(metrics.status, 200u);
  EXPECT_NE(metrics.body.find("ratelimit_decisions_total"), std::string::npos);
}

}  // namespace
}  // namespace ratelimit::server
