// Router and admin routing without sockets: requests go straight into
// Router::Handle against a MemoryStore on a manual clock, and the tests read
// the Reply it hands back. Which face answers which path, the methods each
// one takes, and that admin paths never reach the public listener; the
// admin API's overrides (what a PUT refuses, what it answers when the store
// took the change but could not be read back).
#include "server/router.h"

#include <gtest/gtest.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "policy/config.h"
#include "policy/policy.h"
#include "ratelimit/clock.h"
#include "ratelimit/memory_store.h"
#include "ratelimit/override_store.h"
#include "server/admin.h"
#include "server/enforcer.h"
#include "server/http.h"
#include "server/overrides.h"
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

// The Reply of one request; a memory store answers before Handle returns.
Reply Send(Router& router, http::verb method, std::string_view target, std::string body = "",
           std::string_view authorization = "") {
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

// A config served from a MemoryStore on a manual clock (from `start`): the
// enforcer, the admin API (token "secret") and the admin listener's router.
class Served : public ::testing::Test {
 protected:
  explicit Served(std::string_view yaml, int64_t start = 1'700'000'000'000'000)
      : clock_(start),
        holder_(Compile(yaml)),
        store_(std::make_shared<MemoryStore>(MemoryStore::Options{.shards = 4, .clock = &clock_})),
        enforcer_(store_, 1000),
        admin_(enforcer_, "secret"),
        admin_router_(Router::Admin(holder_, enforcer_, admin_)) {}

  ManualClock clock_;
  PolicyHolder holder_;
  std::shared_ptr<MemoryStore> store_;
  Enforcer enforcer_;
  AdminApi admin_;
  std::unique_ptr<Router> admin_router_;
};

class RouterTest : public Served {
 protected:
  RouterTest()
      : Served(kConfig),
        public_(holder_, enforcer_, /*gateway=*/nullptr, /*demo=*/false, &admin_) {}

  Router public_;
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

// ---- the admin API's overrides ----

// The memory override store, whose reads fail while `fail_reads` is set:
// a change is stored, the read after it is not.
class ReadFailsOverrideStore final : public OverrideStore {
 public:
  explicit ReadFailsOverrideStore(const bool* fail_reads) : fail_reads_(fail_reads) {}
  bool shared() const override { return true; }
  void Put(std::string client, std::string value,
           std::function<void(StatusOr<int64_t>)> done) override {
    inner_->Put(std::move(client), std::move(value), std::move(done));
  }
  void Remove(std::string client, std::optional<std::string> if_value,
              std::function<void(StatusOr<bool>)> done) override {
    inner_->Remove(std::move(client), std::move(if_value), std::move(done));
  }
  void ReadAll(std::function<void(StatusOr<OverrideSet>)> done) override {
    if (*fail_reads_) return done(Unavailable("redis: connection refused (test)"));
    inner_->ReadAll(std::move(done));
  }
  void Watch(std::function<void(int64_t)> changed) override { inner_->Watch(std::move(changed)); }
  void AnnounceReset(std::string client, std::function<void(Status)> done) override {
    inner_->AnnounceReset(std::move(client), std::move(done));
  }
  void WatchResets(std::function<void(std::string_view)> reset) override {
    inner_->WatchResets(std::move(reset));
  }
  void Close() override { inner_->Close(); }

 private:
  const bool* fail_reads_;
  std::unique_ptr<OverrideStore> inner_ = MakeMemoryOverrideStore();
};

// A metered route (its `tokens` are settled afterwards) and a plan's
// calendar quota, served by the admin router with overrides on a
// ReadFailsOverrideStore.
constexpr std::string_view kOverridesConfig = R"(
limits:
  tokens: {algorithm: fixed_window, limit: 1000, window: 1d}
  monthly: {algorithm: fixed_window, limit: 100, window: 1mo, align: calendar, timezone: UTC}
plans:
  free: {limits: [monthly]}
default_plan: free
api_keys: {acme-key: free}
routes:
  - name: chat
    path: /chat
    limits: [tokens]
    cost: {reserve: 10, settle_from: response_header, field: X-Usage}
)";

class AdminOverrides : public Served {
 protected:
  AdminOverrides()
      : Served(kOverridesConfig, 1'767'225'600'000'000),  // 2026-01-01T00:00:00Z
        overrides_(std::make_unique<ReadFailsOverrideStore>(&fail_reads_), clock_) {
    enforcer_.SetOverrides(&overrides_);
    overrides_.SetPolicy(holder_.Get());
  }

  Reply Call(http::verb method, std::string_view client, std::string body = "") {
    return Send(*admin_router_, method, "/v1/overrides/" + std::string(client), std::move(body),
                "Bearer secret");
  }

  bool fail_reads_ = false;
  Overrides overrides_;
};

// An override may not make a metered route's limit a calendar quota (nor,
// for a decision-API key's, a sliding log): every settlement of the
// client's requests on that route would be refused. The config's rule, in
// its words; the same limit on no metered route may be made one.
TEST_F(AdminOverrides, CalendarOverrideOnAMeteredRouteIs400) {
  Reply r = Call(http::verb::put, "k:acme-key",
                 R"({"limits": {"tokens": {"window": "1mo", "align": "calendar"}}})");
  EXPECT_EQ(r.status, 400u) << r.body;
  EXPECT_NE(r.body.find("limits.tokens: cost of route 'chat': limit 'tokens' is a calendar quota, "
                        "which cannot be settled; use a token_bucket, fixed_window or "
                        "sliding_window for a metered cost"),
            std::string::npos)
      << r.body;
  EXPECT_EQ(overrides_.table()->size(), 0u);
  Reply epoch = Call(http::verb::put, "k:acme-key", R"({"limits": {"tokens": {"window": "2d"}}})");
  EXPECT_EQ(epoch.status, 200u) << epoch.body;
  Reply quota = Call(http::verb::put, "k:acme-key", R"({"limits": {"monthly": {"limit": 5}}})");
  EXPECT_EQ(quota.status, 200u) << quota.body;
}

// A change the store took answers 200 with its version even when the read
// after it failed, saying it is not yet in effect here: a 503 would have the
// admin retry a change that every other instance already applies.
TEST_F(AdminOverrides, AChangeStoredButNotReadBackAnswersItsVersion) {
  fail_reads_ = true;
  Reply put = Call(http::verb::put, "k:acme-key", R"({"limits": {"monthly": {"limit": 5}}})");
  ASSERT_EQ(put.status, 200u) << put.body;
  nlohmann::json j = nlohmann::json::parse(put.body);
  EXPECT_EQ(j["version"], 1);
  EXPECT_EQ(j["applied"], false);
  EXPECT_EQ(overrides_.table()->size(), 0u) << "not read back: not in effect here";
  fail_reads_ = false;
  Status read = Internal("no answer");
  overrides_.Refresh([&read](Status s) { read = s; });
  ASSERT_TRUE(read.ok());
  EXPECT_EQ(overrides_.table()->size(), 1u);
  fail_reads_ = true;
  Reply del = Call(http::verb::delete_, "k:acme-key");
  ASSERT_EQ(del.status, 200u) << del.body;
  EXPECT_EQ(nlohmann::json::parse(del.body)["applied"], false);
  EXPECT_EQ(nlohmann::json::parse(del.body)["deleted"], true);
}

// expires_at names a real day: 31 February is not 3 March.
TEST_F(AdminOverrides, AnImpossibleExpiryDateIs400) {
  Reply r = Call(http::verb::put, "k:acme-key",
                 R"({"limits": {"monthly": {"limit": 5}}, "expires_at": "2026-02-31T00:00:00Z"})");
  EXPECT_EQ(r.status, 400u) << r.body;
  EXPECT_NE(r.body.find("2026-02-31 is no date (month 2 has 28 days)"), std::string::npos)
      << r.body;
  EXPECT_EQ(Call(http::verb::put, "k:acme-key",
                 R"({"limits": {"monthly": {"limit": 5}}, "expires_at": "2028-02-29T00:00:00Z"})")
                .status,
            200u)
      << "a leap day";
}

}  // namespace
}  // namespace ratelimit::server
