// The redis+sentinel:// URL form (src/redis/url.h): every part and every error.
#include <gtest/gtest.h>

#include "redis/url.h"

namespace ratelimit::redis {
namespace {

using std::chrono::milliseconds;

TEST(ParseSentinelUrl, EveryPart) {
  StatusOr<SentinelOptions> s = ParseSentinelUrl(
      "redis+sentinel://rl:p%40ss@10.0.0.1:26380,[::1]:26381,sentinel.example/my%2Dmaster"
      "?sentinel_password=s%26cret&db=3&command_timeout_ms=50&sentinel_user=sen&connections=3");
  ASSERT_TRUE(s.ok()) << s.status().message();
  ASSERT_EQ(s->sentinels.size(), 3u);
  EXPECT_EQ(s->sentinels[0], (NodeAddress{"10.0.0.1", 26380}));
  EXPECT_EQ(s->sentinels[1], (NodeAddress{"::1", 26381}));
  EXPECT_EQ(s->sentinels[2], (NodeAddress{"sentinel.example", 26379}));  // sentinels' default
  EXPECT_EQ(s->master_name, "my-master");
  // Data nodes: the URL's user and password, db, and the shared query keys.
  EXPECT_EQ(s->node.user, "rl");
  EXPECT_EQ(s->node.password, "p@ss");
  EXPECT_EQ(s->node.db, 3);
  EXPECT_EQ(s->node.command_timeout, milliseconds(50));
  EXPECT_EQ(s->node.connections, 3);
  EXPECT_FALSE(s->node.tls);
  // Sentinels: their own user and password, db 0, the same shared keys.
  EXPECT_EQ(s->sentinel.user, "sen");
  EXPECT_EQ(s->sentinel.password, "s&cret");
  EXPECT_EQ(s->sentinel.db, 0);
  EXPECT_EQ(s->sentinel.command_timeout, milliseconds(50));
  EXPECT_EQ(RedactedUrl(*s),
            "redis+sentinel://rl:***@10.0.0.1:26380,[::1]:26381,sentinel.example:26379/"
            "my-master?db=3");
}

TEST(ParseSentinelUrl, MinimalAndTls) {
  StatusOr<SentinelOptions> s = ParseSentinelUrl("redis+sentinel://h:1/m");
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->sentinels, (std::vector<NodeAddress>{{"h", 1}}));
  EXPECT_EQ(s->node.password, "");
  EXPECT_EQ(s->sentinel.password, "");
  EXPECT_EQ(s->node.db, 0);
  EXPECT_EQ(RedactedUrl(*s), "redis+sentinel://h:1/m");

  StatusOr<SentinelOptions> tls =
      ParseSentinelUrl("rediss+sentinel://:pw@h:1,h:2/m?tls_ca_file=/ca.pem&insecure=0");
  ASSERT_TRUE(tls.ok()) << tls.status().message();
  EXPECT_TRUE(tls->node.tls);
  EXPECT_TRUE(tls->sentinel.tls);
  EXPECT_EQ(tls->sentinel.tls_ca_file, "/ca.pem");
  EXPECT_EQ(tls->node.password, "pw");
  EXPECT_EQ(tls->sentinel.password, "");  // the data nodes' password is not the sentinels'
  EXPECT_EQ(RedactedUrl(*tls), "rediss+sentinel://:***@h:1,h:2/m");

  EXPECT_TRUE(IsSentinelUrl("redis+sentinel://h:1/m"));
  EXPECT_TRUE(IsSentinelUrl("rediss+sentinel://h:1/m"));
  EXPECT_FALSE(IsSentinelUrl("redis://h:1"));
  EXPECT_FALSE(IsSentinelUrl("redis+cluster://h:1"));
}

TEST(ParseSentinelUrl, Errors) {
  struct Case {
    const char* url;
    const char* message;  // a part of the error
  };
  const Case cases[] = {
      {"redis://h:1/m", "scheme must be redis+sentinel://"},
      {"redis+sentinel://h:1", "names the master"},
      {"redis+sentinel://h:1/", "names the master"},
      {"redis+sentinel:///m", "empty host"},
      {"redis+sentinel://h:1,,h:2/m", "empty host"},
      {"redis+sentinel://h:1/a/b", "has a '/'"},
      {"redis+sentinel://h:1/a%2", "percent-escape"},
      {"redis+sentinel://h:99999/m", "port"},
      {"redis+sentinel://h:1/m?db=-1", "db=-1"},
      {"redis+sentinel://h:1/m?db=x", "db=x"},
      {"redis+sentinel://h:1/m?sentinel_password=", "is empty"},
      {"redis+sentinel://h:1/m?sentinel_user=u", "sentinel_user given without"},
      {"redis+sentinel://h:1/m?nope=1", "unknown query parameter"},
      {"redis+sentinel://h:1/m?insecure=1", "TLS parameters"},
      {"redis+sentinel://user@h:1/m", "without a password"},
  };
  for (const Case& c : cases) {
    StatusOr<SentinelOptions> s = ParseSentinelUrl(c.url);
    ASSERT_FALSE(s.ok()) << c.url;
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument) << c.url;
    EXPECT_NE(s.status().message().find(c.message), std::string::npos)
        << c.url << ": " << s.status().message();
  }
}

}  // namespace
}  // namespace ratelimit::redis
