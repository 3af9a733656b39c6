#include "server/json_log.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace ratelimit::server {
namespace {

TEST(JsonLog, OneObjectPerLine) {
  std::string line =
      FormatLogLine(1'700'000'000'123'000, Level::kInfo, "listening",
                    {{"addr", "127.0.0.1:8080"}, {"n", 3}, {"ok", true}, {"weird", "a\"b\n\xff"}});
  EXPECT_EQ(line.find('\n'), std::string::npos);
  auto j = nlohmann::json::parse(line);
  EXPECT_EQ(j["ts"], "2023-11-14T22:13:20.123Z");
  EXPECT_EQ(j["level"], "info");
  EXPECT_EQ(j["msg"], "listening");
  EXPECT_EQ(j["addr"], "127.0.0.1:8080");
  EXPECT_EQ(j["n"], 3);
  EXPECT_EQ(j["ok"], true);
}

TEST(JsonLog, RedactsApiKeys) {
  // sha256("supersecret") starts f75778f7.
  EXPECT_EQ(RedactKey("k:supersecret"), "k:supe***f75778f7");
  EXPECT_EQ(RedactKey("ip:127.0.0.1"), "ip:127.0.0.1");
  EXPECT_EQ(RedactKey("d:user:ada"), "d:user:ada");
  // Keys that share their first characters stay apart, and neither shows more.
  const std::string a = RedactKey("k:demo-pro-key-0001"), b = RedactKey("k:demo-internal-0001");
  EXPECT_NE(a, b);
  EXPECT_TRUE(a.starts_with("k:demo***")) << a;
  EXPECT_TRUE(b.starts_with("k:demo***")) << b;
  EXPECT_EQ(a.size(), std::string("k:demo***").size() + 8);
  EXPECT_EQ(a.find("pro"), std::string::npos);
}

TEST(JsonLog, SamplerCapsPerSecond) {
  LogSampler s(3);
  int admitted = 0;
  int64_t suppressed = 0;
  for (int i = 0; i < 100; ++i) admitted += s.Admit(suppressed) ? 1 : 0;
  EXPECT_GE(admitted, 3);
  EXPECT_LE(admitted, 6);  // a second boundary may fall inside the loop
}

}  // namespace
}  // namespace ratelimit::server
