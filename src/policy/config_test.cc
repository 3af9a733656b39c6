// The YAML loader: one fixture per mistake (tests/config_errors), every
// example in examples/, defaults, api_keys_file, and the redacted dump.
#include "policy/config.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <unistd.h>

#include "policy/policy.h"

namespace ratelimit::policy {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> YamlFiles(const char* dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().extension() == ".yaml") out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string TestName(const testing::TestParamInfo<std::string>& info) {
  std::string n = fs::path(info.param).stem().string();
  for (char& c : n) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return n;
}

// ---- tests/config_errors/NN-name.yaml: first line "# expect: <substring>" ----
class ConfigErrorFixture : public testing::TestWithParam<std::string> {};

TEST_P(ConfigErrorFixture, FailsWithExpectedMessage) {
  std::ifstream in(GetParam());
  std::string first;
  std::getline(in, first);
  const std::string tag = "# expect: ";
  ASSERT_EQ(first.rfind(tag, 0), 0u) << GetParam() << ": first line must be '# expect: ...'";
  const std::string expect = first.substr(tag.size());
  StatusOr<Config> c = LoadConfigFile(GetParam());
  ASSERT_FALSE(c.ok()) << GetParam() << " loaded, but should fail with: " << expect;
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c.status().message().rfind(GetParam() + ":", 0), 0u)
      << "the error must start with the file name: " << c.status().message();
  EXPECT_NE(c.status().message().find(expect), std::string::npos)
      << "expected '" << expect << "' in: " << c.status().message();
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ConfigErrorFixture,
                         testing::ValuesIn(YamlFiles(RL_CONFIG_ERRORS_DIR)), TestName);

TEST(ConfigErrorFixtures, AtLeastFifteen) {
  EXPECT_GE(YamlFiles(RL_CONFIG_ERRORS_DIR).size(), 15u);
}

// ---- examples/*.yaml: each loads, compiles and survives a dump ----
class Example : public testing::TestWithParam<std::string> {};

TEST_P(Example, LoadsAndCompiles) {
  StatusOr<Config> c = LoadConfigFile(GetParam());
  ASSERT_TRUE(c.ok()) << c.status().message();
  StatusOr<std::shared_ptr<const Policy>> p = Policy::Create(*c);
  ASSERT_TRUE(p.ok()) << p.status().message();
  const std::string dump = DumpRedacted(*c);
  for (const auto& [key, plan] : c->api_keys) {
    EXPECT_EQ(dump.find(key), std::string::npos) << "API key leaked in dump";
  }
  // Without API keys the dump is itself a valid config that means the same.
  if (c->api_keys.empty()) {
    StatusOr<Config> again = ParseConfig(dump, "dump");
    ASSERT_TRUE(again.ok()) << again.status().message() << "\n" << dump;
    const std::string dump2 = DumpRedacted(*again);
    EXPECT_EQ(dump2.substr(dump2.find('\n')), dump.substr(dump.find('\n')));
  }
}

INSTANTIATE_TEST_SUITE_P(Examples, Example, testing::ValuesIn(YamlFiles(RL_EXAMPLES_DIR)),
                         TestName);

TEST(Examples, TheFourDocumentedOnesExist) {
  for (const char* name :
       {"decision-api.yaml", "gateway.yaml", "nginx-auth-request.yaml", "redis.yaml"}) {
    EXPECT_TRUE(fs::exists(fs::path(RL_EXAMPLES_DIR) / name)) << name;
  }
}

// ---- defaults and details ----
TEST(ParseConfig, MinimalConfigHasDocumentedDefaults) {
  StatusOr<Config> c = ParseConfig("store: {type: memory}\n", "t.yaml");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->server.listen, "127.0.0.1:8080");
  EXPECT_EQ(c->server.headers, HeaderDialect::kDraft06);
  EXPECT_EQ(c->store.failure_mode, FailureMode::kOpen);
  EXPECT_EQ(c->store.deadline, std::chrono::milliseconds(100));
  EXPECT_EQ(c->store.key_prefix, "rl:");
  EXPECT_EQ(c->clients.api_key_header, "X-API-Key");
  EXPECT_EQ(c->clients.ipv6_prefix, 64);
  EXPECT_FALSE(c->clients.accept_unknown_api_keys);
  EXPECT_EQ(c->clients.client_ip_header, ClientIpHeader::kAny);
  EXPECT_TRUE(c->routes.empty());
}

// A route path whose canonical bytes are not ASCII: escapes that decode to
// bytes that are not UTF-8 (%FF; %C1%BF, an overlong form the YAML emitter
// wrote as a DEL) and UTF-8 text, raw and escaped. The dump writes them
// percent-encoded and loads back to the same bytes and the same dump.
TEST(ConfigDump, RoutePathsOutsideAsciiLoadBackAsTheSameBytes) {
  const std::string yaml =
      "routes:\n"
      "  - {name: a, path: \"/x%C1%BF%ff/caf%C3%A9/\xc3\xa9T\xc3\xa9\", limits: []}\n";
  StatusOr<Config> c = ParseConfig(yaml, "t.yaml");
  ASSERT_TRUE(c.ok()) << c.status().message();
  ASSERT_EQ(c->routes.size(), 1u);
  EXPECT_EQ(c->routes[0].path, "/x\xc1\xbf\xff/caf\xc3\xa9/\xc3\xa9t\xc3\xa9");
  const std::string dump = DumpRedacted(*c);
  EXPECT_NE(dump.find("path: /x%C1%BF%FF/caf%C3%A9/%C3%A9t%C3%A9"), std::string::npos) << dump;
  StatusOr<Config> again = ParseConfig(dump, "t.yaml");
  ASSERT_TRUE(again.ok()) << again.status().message() << "\n" << dump;
  EXPECT_EQ(again->routes[0].path, c->routes[0].path);
  EXPECT_EQ(DumpRedacted(*again), dump);
}

// YAML text is Unicode: bytes that are not UTF-8 anywhere in the file (a
// value, a comment) are refused with their line, before they can reach a
// setting or a dump that could not write them back.
TEST(ParseConfig, BytesThatAreNotUtf8AreRefusedWithTheirLine) {
  for (const std::string& bad :
       {std::string("server:\n  user: \"r\xff\"\n"), std::string("server:\n  # caf\xe9\n"),
        std::string("routes:\n  - {name: a, path: \"/x\xc1\xbf\", limits: []}\n"),
        std::string("server:\n  user: \"\xed\xa0\x80\"\n")}) {  // a surrogate
    StatusOr<Config> c = ParseConfig(bad, "t.yaml");
    ASSERT_FALSE(c.ok()) << bad;
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(std::string_view(c.status().message()).starts_with("t.yaml:2: not valid UTF-8"))
        << c.status().message();
  }
  StatusOr<Config> ok = ParseConfig("server:\n  user: \"r\xc3\xa9\"  # caf\xc3\xa9\n", "t.yaml");
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(ok->server.user, "r\xc3\xa9");
}

TEST(ParseConfig, LeakyBucketAndMaxHeldRequests) {
  StatusOr<Config> c = ParseConfig(R"(
server: {upstream: "http://127.0.0.1:3000", max_held_requests: 7}
limits:
  shape: {algorithm: leaky_bucket, depth: 20, rate_per_second: 5}
routes:
  - {name: all, path: /, limits: [shape]}
)",
                                   "t.yaml");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->server.max_held_requests, 7u);
  const Limit& l = c->named_limits.at("shape");
  EXPECT_EQ(l.algorithm(), Algorithm::kLeakyBucket);
  EXPECT_EQ(l.limit(), 20);
  EXPECT_EQ(l.interval_micros(), 200'000);
  const std::string dump = DumpRedacted(*c);
  EXPECT_NE(dump.find("algorithm: leaky_bucket, depth: 20, rate_per_second: 5"), std::string::npos)
      << dump;
  EXPECT_NE(dump.find("max_held_requests: 7"), std::string::npos) << dump;
  EXPECT_EQ(ParseConfig("store: {type: memory}\n", "t.yaml")->server.max_held_requests, 1000u);
  StatusOr<Config> bad = ParseConfig(
      "limits:\n  s: {algorithm: leaky_bucket, depth: 3, rate_per_second: 0}\n", "t.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("rate_per_second must be a positive"), std::string::npos)
      << bad.status().message();
}

TEST(ParseConfig, ReadsEverySection) {
  StatusOr<Config> c = ParseConfig(R"(
server: {listen: "0.0.0.0:8080", admin_listen: "", headers: structured, threads: 4,
         read_timeout: 5s, upstream: "http://127.0.0.1:3000"}
store: {type: redis, url: "redis://:pw@localhost:6379", deadline: 50ms, failure_mode: local,
        expected_instances: 3, time_source: local}
clients: {api_key_header: X-Key, user_header: X-User-Id, trusted_proxies: ["10.0.0.0/8", "::1"],
          client_ip_header: X-Forwarded-For, ipv6_prefix: 56, accept_unknown_api_keys: true}
limits:
  burst: {algorithm: token_bucket, capacity: 10, refill_per_second: 0.5}
  daily: {algorithm: fixed_window, limit: 1000, window: 1d}
plans:
  free: {limits: [daily]}
  pro: {limits: [{name: daily_pro, algorithm: sliding_window, limit: 100000, window: 1d, shadow: true}]}
default_plan: free
api_keys: {"key-abc": pro}
global: [{name: burst, failure_mode: closed}]
routes:
  - {name: login, methods: [post], path: /Login/, match: exact, key_by: ip,
     limits: [{name: login, algorithm: sliding_log, limit: 5, window: 15m}]}
  - {name: search, path: /api/search, cost: 5, limits: [burst]}
)",
                                   "t.yaml");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->server.admin_listen, "");
  EXPECT_EQ(c->server.threads, 4);
  EXPECT_EQ(c->server.read_timeout, std::chrono::milliseconds(5000));
  EXPECT_EQ(c->store.type, StoreConfig::Type::kRedis);
  EXPECT_EQ(c->store.failure_mode, FailureMode::kLocal);
  EXPECT_EQ(c->store.time_source, StoreConfig::TimeSource::kLocal);
  EXPECT_EQ(c->clients.trusted_proxies.size(), 2u);
  EXPECT_EQ(c->clients.client_ip_header, ClientIpHeader::kXForwardedFor);
  EXPECT_EQ(c->clients.ipv6_prefix, 56);
  EXPECT_EQ(c->plans.at("pro").limits.at(0).limit.algorithm(), Algorithm::kSlidingWindow);
  EXPECT_TRUE(c->plans.at("pro").limits.at(0).shadow);
  EXPECT_EQ(c->global_limits.at(0).failure_mode, FailureMode::kClosed);
  EXPECT_EQ(c->global_limits.at(0).limit.refill_per_second(), 0.5);
  ASSERT_EQ(c->routes.size(), 2u);
  EXPECT_EQ(c->routes[0].path, "/login");
  EXPECT_EQ(c->routes[0].methods, std::vector<std::string>{"POST"});
  EXPECT_EQ(c->routes[0].key_by, RouteClass::KeyBy::kIp);
  EXPECT_EQ(c->routes[0].source_line, 18);
  EXPECT_EQ(c->routes[1].match, RouteClass::Match::kPrefix);
  EXPECT_EQ(c->routes[1].cost, 5);
  // Inline limits join the named ones (the decision API may name them).
  for (const char* n : {"burst", "daily", "daily_pro", "login"})
    EXPECT_TRUE(c->named_limits.count(n)) << n;
}

TEST(ParseConfig, SameLimitDefinedTwiceIdenticallyIsFine) {
  StatusOr<Config> c = ParseConfig(R"(
routes:
  - {name: a, path: /a, limits: [{name: x, algorithm: fixed_window, limit: 5, window: 1m}]}
  - {name: b, path: /b, limits: [{name: x, algorithm: fixed_window, limit: 5, window: 60s}]}
)",
                                   "t.yaml");
  EXPECT_TRUE(c.ok()) << c.status().message();
}

TEST(ParseConfig, LeasePerTokenBucketLimit) {
  StatusOr<Config> c = ParseConfig(R"(
limits:
  hot: {algorithm: token_bucket, capacity: 100, refill_per_second: 50, lease: 10}
  cold: {algorithm: token_bucket, capacity: 100, refill_per_second: 50}
)",
                                   "t.yaml");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->named_limits.at("hot").lease(), 10);
  EXPECT_EQ(c->named_limits.at("cold").lease(), 0);
  // Round trip through the dump keeps it.
  StatusOr<Config> again = ParseConfig(DumpRedacted(*c), "dump");
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ(again->named_limits.at("hot").lease(), 10);
  for (const char* bad : {"lease: 1", "lease: -3", "lease: 101", "lease: 2.5", "lease: ten"}) {
    StatusOr<Config> e = ParseConfig(
        std::string("limits: {x: {algorithm: token_bucket, capacity: 100, refill_per_second: 1, ") +
            bad + "}}\n",
        "t.yaml");
    EXPECT_FALSE(e.ok()) << bad;
  }
}

TEST(ParseConfig, MeteredCostObject) {
  StatusOr<Config> c = ParseConfig(R"(
limits:
  tokens: {algorithm: token_bucket, capacity: 10000, refill_per_second: 166}
routes:
  - name: chat
    path: /v1/chat
    limits: [tokens]
    cost: {from_request_json: max_tokens, reserve: 1000, settle_from: sse_last_event,
           field: usage.total_tokens, max: 8000, unit: tokens}
  - name: embed
    path: /v1/embed
    limits: [tokens]
    cost: {from_request_header: X-Token-Estimate, settle_from: response_trailer, field: X-Usage}
  - {name: fixed, path: /v1/fixed, limits: [tokens], cost: 5}
)",
                                   "t.yaml");
  ASSERT_TRUE(c.ok()) << c.status().message();
  const RouteClass& chat = c->routes[0];
  ASSERT_TRUE(chat.metered.has_value());
  EXPECT_EQ(chat.cost, 1000);  // the reservation is the route's cost before the request is read
  EXPECT_EQ(chat.metered->source, MeteredCost::Source::kRequestJson);
  EXPECT_EQ(chat.metered->request_field, "max_tokens");
  EXPECT_EQ(chat.metered->settle_from, MeteredCost::SettleFrom::kSseLastEvent);
  EXPECT_EQ(chat.metered->field, "usage.total_tokens");
  EXPECT_EQ(chat.metered->max, 8000);
  EXPECT_EQ(chat.metered->unit, "tokens");
  const RouteClass& embed = c->routes[1];
  ASSERT_TRUE(embed.metered.has_value());
  EXPECT_EQ(embed.metered->source, MeteredCost::Source::kRequestHeader);
  EXPECT_FALSE(embed.metered->reserve.has_value());
  EXPECT_FALSE(embed.metered->max.has_value());
  EXPECT_EQ(embed.metered->settle_from, MeteredCost::SettleFrom::kResponseTrailer);
  EXPECT_FALSE(c->routes[2].metered.has_value());
  EXPECT_EQ(c->routes[2].cost, 5);
  // The dump loads again to the same.
  StatusOr<Config> again = ParseConfig(DumpRedacted(*c), "dump");
  ASSERT_TRUE(again.ok()) << again.status().message() << "\n" << DumpRedacted(*c);
  ASSERT_TRUE(again->routes[0].metered.has_value());
  EXPECT_EQ(again->routes[0].metered->max, 8000);
  EXPECT_EQ(again->routes[0].metered->request_field, "max_tokens");
  EXPECT_EQ(again->routes[0].metered->unit, "tokens");
  EXPECT_EQ(again->routes[1].metered->unit, "");  // requests: no qu
  EXPECT_EQ(again->routes[1].metered->field, "X-Usage");
  EXPECT_EQ(again->routes[2].cost, 5);
  EXPECT_EQ(SplitJsonPath("usage.total_tokens"),
            (std::vector<std::string>{"usage", "total_tokens"}));
  EXPECT_TRUE(SplitJsonPath("a.").empty());
  EXPECT_TRUE(SplitJsonPath("").empty());
  for (const char* bad :
       {"{settle_from: sse_last_event, field: x}",  // nothing to reserve
        "{reserve: -1, settle_from: sse_last_event, field: x}",
        "{reserve: 10, max: 0, settle_from: sse_last_event, field: x}",
        "{reserve: 10, settle_from: response_header, field: 'bad name'}",
        "{reserve: 10, settle_from: response_header}",
        "{reserve: 20000, settle_from: response_header, field: X-Usage}",  // above the capacity
        "{from_request_header: A, from_request_json: b, settle_from: response_header, field: X}",
        "{reserve: 10, settle_from: response_header, field: X, extra: 1}"}) {
    StatusOr<Config> e = ParseConfig(
        std::string("limits: {t: {algorithm: token_bucket, capacity: 10000, refill_per_second: "
                    "1}}\nroutes: [{name: r, path: /r, limits: [t], cost: ") +
            bad + "}]\n",
        "t.yaml");
    EXPECT_FALSE(e.ok()) << bad;
    if (!e.ok()) {
      EXPECT_EQ(e.status().message().rfind("t.yaml:2:", 0), 0u) << e.status().message();
    }
  }
}

TEST(ParseConfig, ClusterUrlsAndNodes) {
  auto url_of = [](const std::string& store) -> std::string {
    StatusOr<Config> c = ParseConfig("store: " + store + "\n", "t.yaml");
    return c.ok() ? c->store.url : "error: " + c.status().message();
  };
  EXPECT_EQ(url_of(R"({type: redis, url: "rediss+cluster://a:7000,b:7000"})"),
            "rediss+cluster://a:7000,b:7000");
  EXPECT_EQ(url_of(R"({type: redis, nodes: ["10.0.0.1:7000", "10.0.0.2:7000"]})"),
            "redis+cluster://10.0.0.1:7000,10.0.0.2:7000");
  EXPECT_EQ(
      url_of(
          R"({type: redis, url: "rediss+cluster://rl:pw@?tls_ca_file=/ca.pem", nodes: ["a:1", "b:2"]})"),
      "rediss+cluster://rl:pw@a:1,b:2?tls_ca_file=/ca.pem");
  EXPECT_EQ(url_of(R"({type: redis, url: "redis+sentinel://a:1,b:2/main?db=1"})"),
            "redis+sentinel://a:1,b:2/main?db=1");
  EXPECT_EQ(url_of(R"({type: redis, url: "rediss+sentinel://a:1/main"})"),
            "rediss+sentinel://a:1/main");
  EXPECT_EQ(url_of(R"({type: redis, url: "redis+cluster://a:1", nodes: ["b:2"]})"),
            "redis+cluster://a:1,b:2");
  for (const char* bad :
       {R"({type: redis, url: "redis://a:1", nodes: ["b:2"]})", R"({type: redis, nodes: []})",
        R"({type: redis, nodes: ["b"]})", R"({type: redis, nodes: ["a:1,b:2"]})",
        R"({type: memory, nodes: ["b:2"]})", R"({type: redis, nodes: "a:1"})"}) {
    EXPECT_EQ(url_of(bad).rfind("error: ", 0), 0u) << bad << " -> " << url_of(bad);
  }
}

TEST(ParseConfig, RedisUrlErrorNeverEchoesThePassword) {
  StatusOr<Config> c = ParseConfig("store: {type: redis, url: \"http://:hunter2@h\"}\n", "t.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message().find("hunter2"), std::string::npos);
}

TEST(ParseConfig, ApiKeyErrorsNeverEchoTheKey) {
  StatusOr<Config> c = ParseConfig("plans: {free: {}}\napi_keys: {\"sekrit-1\": gold}\n", "t.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message().find("sekrit"), std::string::npos) << c.status().message();
}

class ApiKeysFile : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("rl_policy_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void Write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name) << text;
  }
  fs::path dir_;
};

TEST_F(ApiKeysFile, IsReadRelativeToTheConfig) {
  Write("keys.txt", "# key plan\nkey-1 pro\n\n  key-2   free  # trailing comment\n");
  Write("c.yaml", "plans: {free: {}, pro: {}}\napi_keys: {key-0: free}\napi_keys_file: keys.txt\n");
  StatusOr<Config> c = LoadConfigFile((dir_ / "c.yaml").string());
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->api_keys.size(), 3u);
  EXPECT_EQ(c->api_keys.at("key-1"), "pro");
  EXPECT_EQ(c->api_keys.at("key-2"), "free");
  EXPECT_EQ(c->api_keys_file, "keys.txt");
}

TEST_F(ApiKeysFile, ErrorsNameTheKeysFileAndLine) {
  Write("keys.txt", "key-1 pro\nkey-2 gold\n");
  Write("c.yaml", "plans: {pro: {}}\napi_keys_file: keys.txt\n");
  StatusOr<Config> c = LoadConfigFile((dir_ / "c.yaml").string());
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("keys.txt:2: API key maps to unknown plan 'gold'"),
            std::string::npos)
      << c.status().message();
  Write("c.yaml", "plans: {pro: {}}\napi_keys_file: missing.txt\n");
  c = LoadConfigFile((dir_ / "c.yaml").string());
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("c.yaml:2: cannot read api_keys_file"), std::string::npos)
      << c.status().message();
  EXPECT_NE(c.status().message().find("missing.txt': No such file or directory"), std::string::npos)
      << c.status().message();
}

TEST_F(ApiKeysFile, AdminTokenFileIsRelativeToTheConfigToo) {
  Write("c.yaml", "server: {admin_token_file: admin.token}\n");
  StatusOr<Config> c = LoadConfigFile((dir_ / "c.yaml").string());
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->server.admin_token_file, (dir_ / "admin.token").string());
  Write("c.yaml", "server: {admin_token_file: /etc/ratelimit/admin.token}\n");
  c = LoadConfigFile((dir_ / "c.yaml").string());
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->server.admin_token_file, "/etc/ratelimit/admin.token");
}

// The Redis URL's TLS files too (they were opened as written, relative to
// the working directory), escaped as the URL parser reads them.
TEST_F(ApiKeysFile, RedisTlsFilesAreRelativeToTheConfigToo) {
  Write("c.yaml",
        "store: {type: redis, url: \"rediss://h:6380/0?tls_ca_file=ca.pem&connections=2"
        "&tls_cert_file=/etc/c%20rt.pem&tls_key_file=my%20key.pem\"}\n");
  StatusOr<Config> c = LoadConfigFile((dir_ / "c.yaml").string());
  ASSERT_TRUE(c.ok()) << c.status().message();
  const std::string escaped = dir_.string();  // a temporary folder: no byte to escape
  ASSERT_EQ(escaped.find_first_of("% &?#+"), std::string::npos) << escaped;
  EXPECT_EQ(c->store.url, "rediss://h:6380/0?tls_ca_file=" + escaped +
                              "/ca.pem&connections=2&tls_cert_file=/etc/c%20rt.pem"
                              "&tls_key_file=" +
                              escaped + "/my%20key.pem");
  EXPECT_EQ(MapRedisUrlFiles("rediss://h?tls_ca_file=a",
                             [](const std::string&) { return std::string("/x&y z%"); }),
            "rediss://h?tls_ca_file=/x%26y%20z%25");
  EXPECT_EQ(MapRedisUrlFiles("redis://h:1", [](const std::string&) { return "x"; }), "redis://h:1");
}

// A config loaded by a relative path ("rl2/c.yaml") holds its files joined
// with that folder ("rl2/tok"); the dump writes them absolute, so it loads
// back as the same config from any folder (it said "rl2/tok", which a load
// of the dump resolved as "<dump's folder>/rl2/tok").
TEST_F(ApiKeysFile, TheDumpOfARelativeConfigLoadsBackFromAnywhere) {
  fs::create_directories(dir_ / "rl2");
  fs::create_directories(dir_ / "elsewhere");
  Write("rl2/c.yaml",
        "server: {admin_token_file: tok}\n"
        "store: {type: redis, url: \"rediss://h:6380?tls_ca_file=ca.pem\"}\n"
        "envoy: {config_dir: envoy}\n");
  const fs::path was = fs::current_path();
  fs::current_path(dir_);
  StatusOr<Config> c = LoadConfigFile("rl2/c.yaml");
  fs::current_path(was);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->server.admin_token_file, "rl2/tok");
  fs::current_path(dir_);
  const std::string dump = DumpRedacted(*c);
  fs::current_path(was);
  Write("elsewhere/d.yaml", dump);
  StatusOr<Config> again = LoadConfigFile((dir_ / "elsewhere/d.yaml").string());
  ASSERT_TRUE(again.ok()) << again.status().message() << "\n" << dump;
  EXPECT_EQ(again->server.admin_token_file, (dir_ / "rl2/tok").string()) << dump;
  EXPECT_EQ(again->store.url, "rediss://h:6380?tls_ca_file=" + (dir_ / "rl2/ca.pem").string());
  EXPECT_EQ(again->envoy.config_dir, (dir_ / "rl2/envoy").string());
  const std::string again_dump = DumpRedacted(*again);  // its first line names the source
  EXPECT_EQ(again_dump.substr(again_dump.find('\n')), dump.substr(dump.find('\n')));
}

TEST_F(ApiKeysFile, UnreadableConfigSaysWhy) {
  StatusOr<Config> c = LoadConfigFile(dir_.string());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(),
            dir_.string() + ": cannot read the config file: it is a directory");
  Write("c.yaml", "store: {type: memory}\n");
  fs::permissions(dir_ / "c.yaml", fs::perms::none);
  if (::geteuid() != 0) {  // root reads it anyway
    c = LoadConfigFile((dir_ / "c.yaml").string());
    ASSERT_FALSE(c.ok());
    EXPECT_NE(c.status().message().find("cannot read the config file: Permission denied"),
              std::string::npos)
        << c.status().message();
  }
}

TEST(LoadConfigFile, MissingFileIsNotFound) {
  StatusOr<Config> c = LoadConfigFile("/nonexistent/ratelimit.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(c.status().message(),
            "/nonexistent/ratelimit.yaml: cannot read the config file: No such file or directory");
}

TEST(ParseConfig, StoreReconnectMaxBackoff) {
  StatusOr<Config> c = ParseConfig("store: {type: memory}\n", "t.yaml");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->store.reconnect_max_backoff, std::chrono::milliseconds(250));
  c = ParseConfig(
      "store: {type: redis, url: \"redis://127.0.0.1:6379\", reconnect_max_backoff: 2s}\n",
      "t.yaml");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->store.reconnect_max_backoff, std::chrono::milliseconds(2000));
  EXPECT_NE(DumpRedacted(*c).find("reconnect_max_backoff: 2s"), std::string::npos)
      << DumpRedacted(*c);
  for (const char* bad : {"5ms", "2m", "1.5ms", "soon"}) {
    c = ParseConfig(std::string("store: {type: memory, reconnect_max_backoff: ") + bad + "}\n",
                    "t.yaml");
    EXPECT_FALSE(c.ok()) << bad;
  }
}

// ---- reload: what needs a restart stays as it is, and the dump says what waits ----
TEST(KeepRestartBound, KeepsWhatIsInEffectAndListsWhatWaits) {
  StatusOr<Config> running = ParseConfig("server: {threads: 2}\nstore: {type: memory}\n", "a.yaml");
  ASSERT_TRUE(running.ok()) << running.status().message();
  StatusOr<Config> loaded = ParseConfig(R"(
server: {threads: 4, headers: legacy}
store: {type: redis, url: "redis://:pw@h2:6379", failure_mode: closed}
)",
                                        "a.yaml");
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  KeepRestartBound(*running, &*loaded);
  EXPECT_EQ(loaded->store.type, StoreConfig::Type::kMemory);
  EXPECT_EQ(loaded->store.url, "");
  EXPECT_EQ(loaded->server.threads, 2);
  // Settings a reload applies keep the file's value.
  EXPECT_EQ(loaded->server.headers, HeaderDialect::kLegacy);
  EXPECT_EQ(loaded->store.failure_mode, FailureMode::kClosed);
  ASSERT_EQ(loaded->pending_restart.size(), 3u);
  const std::string dump = DumpRedacted(*loaded);
  EXPECT_NE(dump.find("  type: memory\n"), std::string::npos) << dump;
  EXPECT_NE(dump.find("  threads: 2\n"), std::string::npos) << dump;
  EXPECT_NE(dump.find("# waiting for a restart"), std::string::npos) << dump;
  EXPECT_NE(dump.find("#   store.type: redis\n"), std::string::npos) << dump;
  EXPECT_NE(dump.find("#   store.url: redis://:***@h2:6379\n"), std::string::npos) << dump;
  EXPECT_NE(dump.find("#   server.threads: 4\n"), std::string::npos) << dump;
  EXPECT_EQ(dump.find("pw@"), std::string::npos) << dump;
  // The dump still loads back as the config in effect.
  StatusOr<Config> again = ParseConfig(dump, "dump");
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ(again->store.type, StoreConfig::Type::kMemory);
  // A later reload that matches the running config waits for nothing.
  StatusOr<Config> same = ParseConfig("server: {threads: 2}\n", "a.yaml");
  KeepRestartBound(*running, &*same);
  EXPECT_TRUE(same->pending_restart.empty());
  EXPECT_EQ(DumpRedacted(*same).find("waiting"), std::string::npos);
  // The gRPC face's settings are taken once, at start, too.
  StatusOr<Config> grpc =
      ParseConfig("server: {threads: 2, grpc_listen: \"127.0.0.1:8081\"}\n", "a.yaml");
  ASSERT_TRUE(grpc.ok()) << grpc.status().message();
  KeepRestartBound(*running, &*grpc);
  EXPECT_EQ(grpc->server.grpc_listen, "");
  ASSERT_EQ(grpc->pending_restart.size(), 1u);
  EXPECT_EQ(grpc->pending_restart[0].name, "server.grpc_listen");
}

// ---- the dump ----
// yaml-cpp writes a carriage return raw in a plain scalar and reads it back
// as a line break: the dump must quote such strings (the config fuzzer's
// "dump changed on reload", fuzz/regressions/config/server-user-carriage-return).
TEST(DumpRedacted, StringsWithControlCharactersReadBackExactly) {
  for (const char* user : {"rl\\r", "\\rrl", "a\\rb", "a\\nb", "tab\\there", "bell\\a", "del\\x7f",
                           "caf\\u00e9", " lead", "trail ", "# not a comment", "a: b"}) {
    const std::string yaml =
        std::string("server: {user: \"") + user + "\", upstream: \"http://h:1/" + user + "\"}\n";
    StatusOr<Config> c = ParseConfig(yaml, "t.yaml");
    ASSERT_TRUE(c.ok()) << yaml << c.status().message();
    const std::string dump = DumpRedacted(*c);
    StatusOr<Config> again = ParseConfig(dump, "t.yaml");
    ASSERT_TRUE(again.ok()) << again.status().message() << "\n" << dump;
    EXPECT_EQ(again->server.user, c->server.user) << yaml << dump;
    EXPECT_EQ(again->server.upstream, c->server.upstream) << yaml << dump;
    EXPECT_EQ(DumpRedacted(*again), dump);
  }
}

// A value waiting for a restart is shown in a comment; a line break in it
// must not end the comment and put the rest of the value into the YAML.
TEST(DumpRedacted, PendingValuesStayInsideTheirComment) {
  StatusOr<Config> running = ParseConfig("store: {type: memory}\n", "a.yaml");
  ASSERT_TRUE(running.ok()) << running.status().message();
  StatusOr<Config> loaded =
      ParseConfig("server: {upstream: \"http://h:1\\nthreads: 9\\r\"}\n", "a.yaml");
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  KeepRestartBound(*running, &*loaded);
  const std::string dump = DumpRedacted(*loaded);
  EXPECT_NE(dump.find("#   server.upstream: http://h:1\\x0athreads: 9\\x0d\n"), std::string::npos)
      << dump;
  StatusOr<Config> again = ParseConfig(dump, "dump");
  ASSERT_TRUE(again.ok()) << again.status().message() << "\n" << dump;
  EXPECT_EQ(again->server.threads, running->server.threads);
  EXPECT_EQ(again->server.upstream, "");
}

TEST(DumpRedacted, HidesSecretsKeepsTheRest) {
  StatusOr<Config> c = ParseConfig(R"(
server: {admin_token_file: /etc/ratelimit/admin.token}
store: {type: redis, url: "rediss://rl:s3cret-pw@redis.internal:6380/2"}
plans: {free: {}, pro: {}}
api_keys: {"ak_live_123456": pro, "ak_live_abcdef": free}
)",
                                   "t.yaml");
  ASSERT_TRUE(c.ok()) << c.status().message();
  const std::string dump = DumpRedacted(*c);
  EXPECT_EQ(dump.find("s3cret-pw"), std::string::npos) << dump;
  EXPECT_EQ(dump.find("ak_live"), std::string::npos) << dump;
  EXPECT_NE(dump.find("rediss://rl:***@redis.internal:6380/2"), std::string::npos) << dump;
  EXPECT_NE(dump.find("/etc/ratelimit/admin.token"), std::string::npos) << dump;
  EXPECT_NE(dump.find("\"***\": pro"), std::string::npos) << dump;
}

TEST(RedactUrl, Forms) {
  EXPECT_EQ(RedactUrl("redis://localhost:6379"), "redis://localhost:6379");
  EXPECT_EQ(RedactUrl("redis://:pw@localhost:6379"), "redis://:***@localhost:6379");
  EXPECT_EQ(RedactUrl("redis://user:pw@h/0"), "redis://user:***@h/0");
  EXPECT_EQ(RedactUrl("redis://pw@h"), "redis://***@h");
  EXPECT_EQ(RedactUrl("redis://u:p@ss@h:1"), "redis://u:***@h:1");
  EXPECT_EQ(RedactUrl("redis+cluster://u:pw@[::1]:7000?tls_ca_file=/x@y"),
            "redis+cluster://u:***@[::1]:7000?tls_ca_file=/x@y");
  EXPECT_EQ(RedactUrl("redis+sentinel://u:pw@h:1,h:2/m?sentinel_password=s&db=1"),
            "redis+sentinel://u:***@h:1,h:2/m?sentinel_password=***&db=1");
  EXPECT_EQ(RedactUrl("redis+sentinel://h:1/m?db=1&sentinel_password=s"),
            "redis+sentinel://h:1/m?db=1&sentinel_password=***");
  EXPECT_EQ(RedactUrl(""), "");
}

TEST(EmbeddedDefault, IsTheDemo) {
  Config c = EmbeddedDefault();
  EXPECT_TRUE(c.server.demo);
  EXPECT_EQ(c.store.type, StoreConfig::Type::kMemory);
  ASSERT_EQ(c.routes.size(), 1u);
  EXPECT_EQ(c.routes[0].path, "/api/ping");
  EXPECT_EQ(c.routes[0].limits.at(0).limit.limit(), 5);
  EXPECT_EQ(c.routes[0].limits.at(0).limit.refill_per_second(), 1.0);
  EXPECT_TRUE(Policy::Create(c).ok());
  StatusOr<Config> again = ParseConfig(DumpRedacted(c), "dump");
  EXPECT_TRUE(again.ok()) << again.status().message();
}

}  // namespace
}  // namespace ratelimit::policy

namespace ratelimit::policy {
namespace {

// Block periods (issue 21): `block_for` on a named or inline limit, in the
// dump, and the errors.
TEST(ParseConfig, BlockFor) {
  StatusOr<Config> c = ParseConfig(
      "limits:\n"
      "  login: {algorithm: fixed_window, limit: 5, window: 1m, block_for: 10m}\n"
      "routes:\n"
      "  - {name: r, path: /, limits: [{name: tb, algorithm: token_bucket, capacity: 2,\n"
      "      refill_per_second: 1, block_for: 30s}]}\n",
      "t.yaml");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->named_limits.at("login").block_for(), std::chrono::minutes(10));
  EXPECT_EQ(c->named_limits.at("tb").block_for(), std::chrono::seconds(30));
  const std::string dump = DumpRedacted(*c);
  EXPECT_NE(dump.find("block_for: 10m"), std::string::npos) << dump;
  StatusOr<Config> again = ParseConfig(dump, "dump");
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ(again->named_limits.at("login"), c->named_limits.at("login"));

  StatusOr<Config> bad = ParseConfig(
      "limits: {l: {algorithm: fixed_window, limit: 5, window: 1m, block_for: 10x}}\n", "t.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("t.yaml:1: limit 'l': block_for:"), std::string::npos)
      << bad.status().message();
  bad = ParseConfig(
      "limits: {l: {algorithm: token_bucket, capacity: 10, refill_per_second: 1, prefetch: 5, "
      "block_for: 1m}}\n",
      "t.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("block_for and prefetch do not go together"),
            std::string::npos)
      << bad.status().message();
}

}  // namespace
}  // namespace ratelimit::policy
