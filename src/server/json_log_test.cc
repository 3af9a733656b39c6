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

// Issue #16: the count of sampled-out lines used to appear only with the
// next line of the same kind (never, if none came). It is now due once their
// second has ended, and written by the next log line of any kind or by
// FlushSuppressed (the server's sweep timer, and at shutdown).
TEST(JsonLog, SuppressedCountIsFlushedWithoutAnotherLineOfItsKind) {
  ManualClock clock;
  LogSampler s(2, "test lines suppressed", &clock);
  int64_t suppressed = 0;
  int admitted = 0;
  for (int i = 0; i < 7; ++i) admitted += s.Admit(suppressed) ? 1 : 0;
  EXPECT_EQ(admitted, 2);
  EXPECT_EQ(s.TakeDue(), 0);  // the second they were dropped in still lasts
  testing::internal::CaptureStderr();
  FlushSuppressed();
  EXPECT_EQ(testing::internal::GetCapturedStderr().find("test lines suppressed"),
            std::string::npos);
  clock.Advance(std::chrono::seconds(1));
  // Any log line now writes the count first.
  testing::internal::CaptureStderr();
  Log(Level::kInfo, "something else");
  const std::string out = testing::internal::GetCapturedStderr();
  const size_t report = out.find(R"("msg":"test lines suppressed","count":5)");
  ASSERT_NE(report, std::string::npos) << out;
  EXPECT_LT(report, out.find("something else"));
  // Reported once: neither a flush nor the next admitted line repeats it.
  testing::internal::CaptureStderr();
  FlushSuppressed();
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
  ASSERT_TRUE(s.Admit(suppressed));
  EXPECT_EQ(suppressed, 0);
}

TEST(JsonLog, FlushSuppressedWritesTheDueCount) {
  ManualClock clock;
  LogSampler s(1, "flushed lines suppressed", &clock);
  int64_t suppressed = 0;
  for (int i = 0; i < 4; ++i) s.Admit(suppressed);
  clock.Advance(std::chrono::seconds(2));
  testing::internal::CaptureStderr();
  FlushSuppressed();
  EXPECT_NE(
      testing::internal::GetCapturedStderr().find(R"("msg":"flushed lines suppressed","count":3)"),
      std::string::npos);
}

}  // namespace
}  // namespace ratelimit::server
