// The demo page in a real headless Chromium (Debian's chromium, driven by
// playwright-core from npm, pinned in tests/e2e/browser/package-lock.json):
// clicking "Send 10 at once" draws a green (allowed) or red (denied) square
// per answer; the page describes the configured limit and draws the bucket
// from /demo/state, reads what is left in the draft and the structured
// header dialects, and says when the store could not decide. Screenshots are
// kept as build artifacts (their paths are printed). A missing chromium,
// node or npm, or an npm install that fails, is a failure, never a skip.
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "harness.h"

namespace rltest {
namespace {

// Runs `cmd` through the shell; returns the exit code and stdout.
std::pair<int, std::string> Shell(const std::string& cmd) {
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return {-1, ""};
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int rc = ::pclose(p);
  return {WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, out};
}

// playwright-core in tests/e2e/browser/node_modules: installed by
// scripts/install-deps.sh, or here from the lockfile when missing.
void EnsureNodeModules() {
  const std::string dir = RL_E2E_BROWSER_DIR;
  if (::access((dir + "/node_modules/playwright-core/package.json").c_str(), R_OK) == 0) return;
  const auto [rc, out] =
      Shell("cd '" + dir + "' && npm ci --no-audit --no-fund --loglevel=error 2>&1");
  ASSERT_EQ(rc, 0) << "npm ci in " << dir << " failed:\n" << out;
}

// Starts ratelimitd with `args`, clicks "Send 10 at once" in Chromium and
// returns what the page showed (demo.cjs's JSON line); `shot_name` names the
// screenshot kept in the artifacts folder.
nlohmann::json SendTenAtOnce(std::vector<std::string> args, const std::string& shot_name,
                             const std::string& until = "empty") {
  EXPECT_EQ(::access("/usr/bin/chromium", X_OK), 0) << "chromium is required for the browser test";
  EXPECT_EQ(Shell("command -v node npm >/dev/null 2>&1").first, 0) << "node and npm are required";
  EnsureNodeModules();
  if (::testing::Test::HasFailure()) return {};
  Daemon d(std::move(args));
  EXPECT_TRUE(d.started()) << d.Log();
  if (!d.started()) return {};
  const std::string artifacts = RL_ARTIFACTS_DIR;
  std::filesystem::create_directories(artifacts);
  const std::string shot = artifacts + "/" + shot_name;
  std::filesystem::remove(shot);
  const std::string url = "http://127.0.0.1:" + std::to_string(d.port()) + "/";
  const auto [rc, out] = Shell("cd '" + std::string(RL_E2E_BROWSER_DIR) + "' && node demo.cjs '" +
                               url + "' '" + shot + "' --until=" + until + " 2>&1");
  EXPECT_EQ(rc, 0) << out << "\n" << d.Log();
  const std::string line = out.substr(out.rfind('{') == std::string::npos ? 0 : out.find('{'));
  const nlohmann::json seen = nlohmann::json::parse(line, nullptr, false);
  EXPECT_FALSE(seen.is_discarded()) << out;
  if (rc != 0 || seen.is_discarded()) return {};
  EXPECT_TRUE(seen["pageErrors"].empty()) << out;
  EXPECT_EQ(seen["ids"].size(), 10u) << out;
  EXPECT_TRUE(std::filesystem::exists(shot) && std::filesystem::file_size(shot) > 1000u) << shot;
  std::cout << "demo screenshot: " << shot << std::endl;
  return seen;
}

int Count(const nlohmann::json& texts, const std::string& part) {
  int n = 0;
  for (const auto& t : texts) n += t.get<std::string>().find(part) != std::string::npos ? 1 : 0;
  return n;
}

// The embedded default (`make run`): a burst of 5 refilling 1 a second in real
// time, so on a loaded machine the ten may take long enough for a refill:
// at least 5 green, and the rest red, each saying when to come back. The
// exact counts and the empty bucket are held by the next test, whose limit
// does not refill meanwhile.
TEST(DemoBrowser, TheEmbeddedDefaultShowsItsBurstOfFiveAndDeniesTheRest) {
  const nlohmann::json seen = SendTenAtOnce({}, "demo.png", "described");
  ASSERT_FALSE(seen.empty());
  const int ok = seen["ok"], denied = seen["denied"];
  EXPECT_GE(ok, 5) << seen;
  EXPECT_GE(denied, 1) << seen;
  EXPECT_EQ(ok + denied, 10) << seen;
  EXPECT_EQ(seen["ids"][9], "req-10");
  EXPECT_EQ(Count(seen["titles"], "retry-after="), denied) << seen;  // each red square says when
  // The page says what the embedded default's limit is, read from /demo/state.
  EXPECT_EQ(seen["limitText"], "a token bucket: a burst of 5, then 1 request per second") << seen;
  EXPECT_EQ(seen["notice"], "") << seen;
  EXPECT_GT(seen["chartPixels"].get<int>(), 20) << "the bucket chart drew nothing: " << seen;
  const nlohmann::json buttons = seen["buttons"];
  for (const char* b : {"Send 1", "Send 10 at once", "Send 1 per second for 8 s"}) {
    EXPECT_NE(std::find(buttons.begin(), buttons.end(), b), buttons.end()) << b;
  }
}

// Another limit and the structured header dialect (RateLimit: "ping";r=N;t=S,
// no RateLimit-Remaining): the page describes that limit and reads what is
// left from the structured field. A refill of one per 100 s keeps the count
// exact however slowly the browser sends.
TEST(DemoBrowser, DescribesTheConfiguredLimitAndReadsStructuredHeaders) {
  const std::string dir = MakeTempDir();
  WriteFile(dir + "/rl.yaml", R"(server: {demo: true, headers: structured}
clients: {accept_unknown_api_keys: true}
limits:
  ping: {algorithm: token_bucket, capacity: 3, refill_per_second: 0.01}
routes:
  - {name: ping, path: /api/ping, limits: [ping]}
)");
  const nlohmann::json seen = SendTenAtOnce({"--config", dir + "/rl.yaml"}, "demo-structured.png");
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen["ok"], 3) << seen;
  EXPECT_EQ(seen["denied"], 7) << seen;
  EXPECT_EQ(seen["limitText"], "a token bucket: a burst of 3, then 1 request every 100 s") << seen;
  EXPECT_EQ(seen["bucket"], "0 / 3") << seen;
  EXPECT_EQ(Count(seen["titles"], "retry-after="), 7) << seen;
  EXPECT_EQ(Count(seen["titles"], "remaining=0"), 8) << seen;  // the third allowed and 7 denied
  EXPECT_EQ(Count(seen["titles"], "remaining=-"), 0) << seen;  // none unread
}

// A config that limits nothing on /api/ping: the page says so instead of
// claiming a limit.
TEST(DemoBrowser, AConfigWithoutALimitOnPingSaysNotLimited) {
  const std::string dir = MakeTempDir();
  WriteFile(dir + "/rl.yaml", "server: {demo: true}\n");
  const nlohmann::json seen =
      SendTenAtOnce({"--config", dir + "/rl.yaml"}, "demo-unlimited.png", "described");
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen["ok"], 10) << seen;
  EXPECT_EQ(seen["limitText"], "no limit in this config applies to it, so every request is allowed")
      << seen;
  EXPECT_EQ(seen["bucket"], "not limited") << seen;
}

// The store unreachable (failure mode open): every answer is allowed and
// degraded, and the page says so instead of showing a full bucket.
TEST(DemoBrowser, AStoreThatCannotDecideIsShownNotHidden) {
  const std::string dir = MakeTempDir();
  WriteFile(dir + "/rl.yaml",
            "server: {demo: true}\n"
            "store: {type: redis, url: \"redis://127.0.0.1:" +
                std::to_string(FreePort()) +
                "\", failure_mode: open, deadline: 50ms}\n"
                "clients: {accept_unknown_api_keys: true}\n"
                "limits:\n"
                "  ping: {algorithm: token_bucket, capacity: 5, refill_per_second: 1}\n"
                "routes:\n"
                "  - {name: ping, path: /api/ping, limits: [ping]}\n");
  const nlohmann::json seen =
      SendTenAtOnce({"--config", dir + "/rl.yaml"}, "demo-store-down.png", "store-down");
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen["ok"], 10) << seen;
  EXPECT_EQ(seen["degraded"], 10) << seen;
  const std::string notice = seen["notice"];
  EXPECT_NE(notice.find("could not decide"), std::string::npos) << seen;
  EXPECT_NE(notice.find("GET /demo/state answered 503"), std::string::npos) << seen;
}

}  // namespace
}  // namespace rltest
