// The demo page in a real headless Chromium: "Send 10 at once" (?auto=10)
// against the embedded default draws 5 green (ok) and 5 red (denied) squares.
#include <unistd.h>

#include <gtest/gtest.h>
#include <cstdio>

#include "harness.h"

namespace rltest {
namespace {

int Count(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

TEST(DemoBrowser, TenAtOnceShowsFiveAllowedFiveDenied) {
  ASSERT_EQ(::access("/usr/bin/chromium", X_OK), 0) << "chromium is required for the browser test";
  Daemon d({});
  ASSERT_TRUE(d.started()) << d.Log();
  const std::string dir = MakeTempDir();
  const std::string url = "http://127.0.0.1:" + std::to_string(d.port()) + "/?auto=10&key=browser";
  const std::string cmd =
      "/usr/bin/chromium --headless --no-sandbox --disable-gpu --user-data-dir=" + dir +
      " --virtual-time-budget=5000 --dump-dom '" + url + "' 2>/dev/null";
  FILE* p = ::popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string dom;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) dom.append(buf, n);
  ::pclose(p);
  ASSERT_NE(dom.find("id=\"grid\""), std::string::npos) << dom.substr(0, 500);
  EXPECT_EQ(Count(dom, "class=\"sq ok\""), 5) << dom;
  EXPECT_EQ(Count(dom, "class=\"sq denied\""), 5) << dom;
  EXPECT_NE(dom.find("id=\"req-10\""), std::string::npos);
  EXPECT_NE(dom.find("retry-after=1s"), std::string::npos);
}

}  // namespace
}  // namespace rltest
