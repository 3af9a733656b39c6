// CheckConfig: every file a config names, and the warnings of the start.
#include "server/config_check.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace ratelimit::server {
namespace {

namespace fs = std::filesystem;

class CheckConfigTest : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("rl_config_check_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Write(const std::string& name, const std::string& text,
                    fs::perms mode = fs::perms::owner_read | fs::perms::owner_write) {
    std::ofstream(dir_ / name) << text;
    fs::permissions(dir_ / name, mode);
    return (dir_ / name).string();
  }
  // Loads `yaml` as <dir>/c.yaml (so relative paths are relative to dir_).
  policy::Config Load(const std::string& yaml) {
    Write("c.yaml", yaml);
    StatusOr<policy::Config> c = policy::LoadConfigFile((dir_ / "c.yaml").string());
    EXPECT_TRUE(c.ok()) << c.status().message();
    return c.ok() ? *c : policy::Config{};
  }
  fs::path dir_;
};

TEST_F(CheckConfigTest, AMissingAdminTokenFileIsAnErrorWithPathAndReason) {
  StatusOr<std::vector<std::string>> r =
      CheckConfig(Load("server: {admin_token_file: /nonexistent/tok}\n"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            "server.admin_token_file '/nonexistent/tok': No such file or directory");
  Write("empty.token", "  \n");
  r = CheckConfig(Load("server: {admin_token_file: empty.token}\n"));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("is empty"), std::string::npos) << r.status().message();
}

TEST_F(CheckConfigTest, ASecretReadableByEveryoneIsAWarning) {
  Write("admin.token", "s3cret\n");
  StatusOr<std::vector<std::string>> r =
      CheckConfig(Load("server: {admin_token_file: admin.token}\n"));
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_TRUE(r->empty());
  fs::permissions(dir_ / "admin.token", fs::perms::others_read, fs::perm_options::add);
  r = CheckConfig(Load("server: {admin_token_file: admin.token}\n"));
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->size(), 1u);
  EXPECT_NE(r->front().find("admin.token' is readable by every user of this host (mode 0604)"),
            std::string::npos)
      << r->front();
  Write("keys.txt", "key-1 free\n", fs::perms::owner_read | fs::perms::others_read);
  r = CheckConfig(Load("plans: {free: {}}\napi_keys_file: keys.txt\n"));
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->size(), 1u);
  EXPECT_EQ(r->front().rfind("api_keys_file '" + (dir_ / "keys.txt").string() + "' is readable", 0),
            0u)
      << r->front();
}

TEST_F(CheckConfigTest, RedisTlsFilesAreReadAndLoaded) {
  StatusOr<std::vector<std::string>> r = CheckConfig(
      Load("store: {type: redis, url: \"rediss://h:6380?tls_ca_file=/nonexistent/ca.pem\"}\n"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            "store.url tls_ca_file '/nonexistent/ca.pem': No such file or directory");
  const std::string garbage = Write("ca.pem", "not a certificate\n");
  r = CheckConfig(
      Load("store: {type: redis, url: \"rediss://h:6380?tls_ca_file=" + garbage + "\"}\n"));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("cannot load tls_ca_file"), std::string::npos)
      << r.status().message();
  r = CheckConfig(Load("store: {type: redis, url: \"redis://:pw@h:notaport\"}\n"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message().find("pw"), std::string::npos) << r.status().message();
  r = CheckConfig(Load("store: {type: redis, url: \"redis://127.0.0.1:6379\"}\n"));
  EXPECT_TRUE(r.ok()) << r.status().message();
}

TEST_F(CheckConfigTest, AnUpstreamWithoutAnyLimitIsAWarning) {
  StatusOr<std::vector<std::string>> r =
      CheckConfig(Load("server: {upstream: \"http://127.0.0.1:3000\"}\n"));
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->size(), 1u);
  EXPECT_NE(r->front().find("every request is forwarded unlimited"), std::string::npos);
  r = CheckConfig(Load(R"(
server: {upstream: "http://127.0.0.1:3000"}
routes: [{name: all, path: /, limits: [{name: b, algorithm: token_bucket, capacity: 5, refill_per_second: 1}]}]
)"));
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_TRUE(r->empty());
  r = CheckConfig(Load("store: {type: memory}\n"));  // no upstream: nothing is forwarded
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->empty());
}

// Every listen address is resolved as the start resolves it: a host that
// does not resolve was OK here and then stopped the start.
TEST_F(CheckConfigTest, OnThisMachineTheListenAddressesResolveAsTheStartResolvesThem) {
  EXPECT_TRUE(CheckOnThisMachine(Load("server: {listen: \"127.0.0.1:8080\"}\n")).ok());
  for (const std::string key : {"listen", "admin_listen", "grpc_listen"}) {
    SCOPED_TRACE(key);
    Status s = CheckOnThisMachine(Load("server: {" + key + ": \"rl-nosuch.invalid:8080\"}\n"));
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.message().rfind("cannot resolve listen address 'rl-nosuch.invalid:8080': ", 0), 0u)
        << s.message();
  }
}

}  // namespace
}  // namespace ratelimit::server
