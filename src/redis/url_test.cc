#include "redis/url.h"

#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>

#include "redis/client.h"
#include "redis/cluster_client.h"
#include "redis/endpoint.h"

namespace ratelimit::redis {
namespace {

TEST(ParseRedisUrl, GoodUrls) {
  struct Case {
    const char* url;
    const char* host;
    int port;
    const char* user;
    const char* password;
    int db;
    bool tls;
  };
  const Case cases[] = {
      {"redis://localhost", "localhost", 6379, "", "", 0, false},
      {"redis://127.0.0.1:6380", "127.0.0.1", 6380, "", "", 0, false},
      {"redis://127.0.0.1:6380/", "127.0.0.1", 6380, "", "", 0, false},
      {"redis://h:1/15", "h", 1, "", "", 15, false},
      {"redis://:secret@h:7000", "h", 7000, "", "secret", 0, false},
      {"redis://rl:secret@h:7000/2", "h", 7000, "rl", "secret", 2, false},
      {"redis://u%40x:p%3A%2F%40w@h", "h", 6379, "u@x", "p:/@w", 0, false},
      {"redis://u:p@ss@h", "h", 6379, "u", "p@ss", 0, false},
      {"redis://[::1]:6379", "::1", 6379, "", "", 0, false},
      {"redis://[::1]", "::1", 6379, "", "", 0, false},
      {"rediss://[fe80::1%25eth0]:6390/3", "fe80::1%25eth0", 6390, "", "", 3, true},
      {"rediss://redis.example.com", "redis.example.com", 6379, "", "", 0, true},
  };
  for (const Case& c : cases) {
    StatusOr<Options> o = ParseRedisUrl(c.url);
    ASSERT_TRUE(o.ok()) << c.url << ": " << o.status().message();
    EXPECT_EQ(o->host, c.host) << c.url;
    EXPECT_EQ(o->port, c.port) << c.url;
    EXPECT_EQ(o->user, c.user) << c.url;
    EXPECT_EQ(o->password, c.password) << c.url;
    EXPECT_EQ(o->db, c.db) << c.url;
    EXPECT_EQ(o->tls, c.tls) << c.url;
    EXPECT_TRUE(o->tls_verify) << c.url;
  }
}

TEST(ParseRedisUrl, QueryParameters) {
  StatusOr<Options> o = ParseRedisUrl(
      "rediss://h?insecure=1&tls_ca_file=/ca.pem&tls_cert_file=/c.pem&tls_key_file=/k.pem"
      "&connect_timeout_ms=500&command_timeout_ms=20&connections=4&max_pending=7");
  ASSERT_TRUE(o.ok()) << o.status().message();
  EXPECT_FALSE(o->tls_verify);
  EXPECT_EQ(o->tls_ca_file, "/ca.pem");
  EXPECT_EQ(o->tls_cert_file, "/c.pem");
  EXPECT_EQ(o->tls_key_file, "/k.pem");
  EXPECT_EQ(o->connect_timeout.count(), 500);
  EXPECT_EQ(o->command_timeout.count(), 20);
  EXPECT_EQ(o->connections, 4);
  EXPECT_EQ(o->max_pending, 7);
}

TEST(ParseRedisUrl, Defaults) {
  StatusOr<Options> o = ParseRedisUrl("redis://h");
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->connect_timeout.count(), 250);
  EXPECT_EQ(o->command_timeout.count(), 100);
  EXPECT_EQ(o->connections, 2);
  EXPECT_EQ(o->max_pending, 10000);
  EXPECT_EQ(o->reconnect_min_backoff.count(), 10);
  EXPECT_EQ(o->reconnect_max_backoff.count(), 1000);
}

TEST(ParseRedisUrl, BadUrls) {
  struct Case {
    const char* url;
    const char* expected_text;
  };
  const Case cases[] = {
      {"http://h:6379", "scheme must be redis:// or rediss://"},
      {"h:6379", "scheme"},
      {"redis://", "missing host"},
      {"redis://:6379", "missing host"},
      {"redis://h:", "empty port"},
      {"redis://h:0", "port '0'"},
      {"redis://h:65536", "port '65536'"},
      {"redis://h:63x", "port '63x'"},
      {"redis://h/x", "database 'x'"},
      {"redis://h/-1", "database '-1'"},
      {"redis://user@h", "without a password"},
      {"redis://u:@h", "empty password"},
      {"redis://u:p%zz@h", "percent-escape in password"},
      {"redis://u%4:p@h", "percent-escape in user"},
      {"redis://[::1:6379", "missing ']'"},
      {"redis://[::1]x", "expected ':port'"},
      {"redis://::1:6379", "[brackets]"},
      {"redis://h?foo=1", "unknown query parameter 'foo'"},
      {"redis://h?connections=0", "connections=0"},
      {"redis://h?insecure", "no '=value'"},
      {"redis://h?insecure=1", "use rediss://"},
      {"rediss://h?tls_cert_file=/c", "given together"},
  };
  for (const Case& c : cases) {
    StatusOr<Options> o = ParseRedisUrl(c.url);
    ASSERT_FALSE(o.ok()) << c.url;
    EXPECT_EQ(o.status().code(), StatusCode::kInvalidArgument) << c.url;
    EXPECT_NE(o.status().message().find(c.expected_text), std::string::npos)
        << c.url << " gave: " << o.status().message();
  }
}

TEST(RedactedUrl, NeverShowsThePassword) {
  StatusOr<Options> o = ParseRedisUrl("rediss://rl:hunter2@[::1]:6380/2");
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(RedactedUrl(*o), "rediss://rl:***@[::1]:6380/2");
  o = ParseRedisUrl("redis://:hunter2@h");
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(RedactedUrl(*o), "redis://:***@h:6379");
  EXPECT_EQ(RedactedUrl(*o).find("hunter2"), std::string::npos);
  o = ParseRedisUrl("redis://h:1");
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(RedactedUrl(*o), "redis://h:1");
}

// OpenEndpoint applies a store's tuning to every node, but a value the URL's
// query gives wins (docs/configuration.md): `?connections=4` means 4.
TEST(OpenEndpoint, AValueGivenInTheUrlWinsOverTheStores) {
  boost::asio::io_context io;  // never run: nothing connects
  const EndpointTuning store{
      .command_timeout = std::chrono::milliseconds(100), .connections = 2, .max_pending = 10'000};
  {
    auto e = OpenEndpoint(io.get_executor(),
                          "redis://127.0.0.1:1?connections=4&command_timeout_ms=700&max_pending=9",
                          store);
    ASSERT_TRUE(e.ok()) << e.status().message();
    const Options& o = dynamic_cast<Client&>(**e).options();
    EXPECT_EQ(o.connections, 4);
    EXPECT_EQ(o.command_timeout, std::chrono::milliseconds(700));
    EXPECT_EQ(o.max_pending, 9);
  }
  {
    // The URL's value wins even when it is Options' default.
    EndpointTuning five = store;
    five.connections = 5;
    auto e = OpenEndpoint(io.get_executor(), "redis+cluster://127.0.0.1:1?connections=2", five);
    ASSERT_TRUE(e.ok()) << e.status().message();
    const Options& o = dynamic_cast<ClusterClient&>(**e).options().node;
    EXPECT_EQ(o.connections, 2);
    EXPECT_EQ(o.command_timeout, std::chrono::milliseconds(100));  // not in the URL: the store's
    EXPECT_EQ(o.max_pending, 10'000);
  }
  {
    auto e = OpenEndpoint(io.get_executor(), "redis+cluster://127.0.0.1:1?connections=3",
                          {.connections = 8, .max_pending = 50});
    ASSERT_TRUE(e.ok()) << e.status().message();
    const Options& o = dynamic_cast<ClusterClient&>(**e).options().node;
    EXPECT_EQ(o.connections, 3);
    EXPECT_EQ(o.max_pending, 50);
  }
  {
    auto e = OpenEndpoint(io.get_executor(), "redis://127.0.0.1:1", store);
    ASSERT_TRUE(e.ok()) << e.status().message();
    const Options& o = dynamic_cast<Client&>(**e).options();
    EXPECT_EQ(o.connections, 2);
    EXPECT_EQ(o.max_pending, 10'000);
  }
}

}  // namespace
}  // namespace ratelimit::redis
