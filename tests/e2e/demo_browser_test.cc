// The demo page in a real headless Chromium (Debian's chromium, driven by
// playwright-core from npm, pinned in tests/e2e/browser/package-lock.json):
// clicking "Send 10 at once" against the embedded default draws 5 green
// (allowed) and 5 red (denied) squares, and the bucket picture drawn from
// /demo/state shows an empty bucket. The screenshot is kept as a build
// artifact (its path is printed). A missing chromium, node or npm, or an
// npm install that fails, is a failure, never a skip.
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

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

TEST(DemoBrowser, TenAtOnceShowsFiveAllowedFiveDeniedAndAnEmptyBucket) {
  ASSERT_EQ(::access("/usr/bin/chromium", X_OK), 0) << "chromium is required for the browser test";
  ASSERT_EQ(Shell("command -v node npm >/dev/null 2>&1").first, 0) << "node and npm are required";
  ASSERT_NO_FATAL_FAILURE(EnsureNodeModules());
  Daemon d({});
  ASSERT_TRUE(d.started()) << d.Log();
  const std::string artifacts = RL_ARTIFACTS_DIR;
  std::filesystem::create_directories(artifacts);
  const std::string shot = artifacts + "/demo.png";
  std::filesystem::remove(shot);
  const std::string url = "http://127.0.0.1:" + std::to_string(d.port()) + "/";
  const auto [rc, out] = Shell("cd '" + std::string(RL_E2E_BROWSER_DIR) + "' && node demo.cjs '" +
                               url + "' '" + shot + "' 2>&1");
  ASSERT_EQ(rc, 0) << out << "\n" << d.Log();
  const std::string line = out.substr(out.rfind('{') == std::string::npos ? 0 : out.find('{'));
  const nlohmann::json seen = nlohmann::json::parse(line, nullptr, false);
  ASSERT_FALSE(seen.is_discarded()) << out;
  EXPECT_EQ(seen["ok"], 5) << out;
  EXPECT_EQ(seen["denied"], 5) << out;
  ASSERT_EQ(seen["ids"].size(), 10u) << out;
  EXPECT_EQ(seen["ids"][9], "req-10");
  int retry_after = 0;
  for (const auto& t : seen["titles"]) {
    if (t.get<std::string>().find("retry-after=") != std::string::npos) ++retry_after;
  }
  EXPECT_EQ(retry_after, 5) << out;  // every red square says when to come back
  EXPECT_EQ(seen["bucket"], "0 / 5") << out;
  EXPECT_GT(seen["chartPixels"].get<int>(), 20) << "the bucket chart drew nothing: " << out;
  EXPECT_TRUE(seen["pageErrors"].empty()) << out;
  const nlohmann::json buttons = seen["buttons"];
  for (const char* b : {"Send 1", "Send 10 at once", "Send 1 per second for 8 s"}) {
    EXPECT_NE(std::find(buttons.begin(), buttons.end(), b), buttons.end()) << b;
  }
  ASSERT_TRUE(std::filesystem::exists(shot));
  EXPECT_GT(std::filesystem::file_size(shot), 1000u);
  std::cout << "demo screenshot: " << shot << std::endl;
}

}  // namespace
}  // namespace rltest
