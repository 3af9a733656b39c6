#include "server/problem.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace ratelimit::server {
namespace {

TEST(Problem, Body) {
  Reply r = ProblemReply(413, "request body exceeds 65536 bytes", "/v1/check");
  EXPECT_EQ(r.status, 413u);
  EXPECT_EQ(r.content_type, "application/problem+json");
  auto j = nlohmann::json::parse(r.body);
  EXPECT_EQ(j["type"], "about:blank");
  EXPECT_EQ(j["title"], "Content Too Large");
  EXPECT_EQ(j["status"], 413);
  EXPECT_EQ(j["detail"], "request body exceeds 65536 bytes");
  EXPECT_EQ(j["instance"], "/v1/check");
}

TEST(Problem, InvalidUtf8DoesNotThrow) {
  Reply r = ProblemReply(400, "bad \xff key", "");
  auto j = nlohmann::json::parse(r.body, nullptr, false);
  ASSERT_FALSE(j.is_discarded());
  EXPECT_FALSE(j.contains("instance"));
}

TEST(Reply, FindIgnoresCase) {
  Reply r;
  r.Add("Retry-After", "3");
  ASSERT_NE(r.Find("retry-after"), nullptr);
  EXPECT_EQ(*r.Find("RETRY-AFTER"), "3");
  EXPECT_EQ(r.Find("Retry"), nullptr);
}

}  // namespace
}  // namespace ratelimit::server
