// Client against a real redis-server child process (tests/support).
#include "redis/client.h"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <future>
#include <mutex>
#include <thread>

#include "redis/io_thread.h"
#include "redis/test_calls.h"
#include "support/redis_server.h"

namespace ratelimit::redis {
namespace {

using std::chrono::milliseconds;
using testing::RedisServer;
using Clock = std::chrono::steady_clock;
using test_calls::Call;
using test_calls::Since;

#if defined(RL_SANITIZED)           // ASan or TSan (CMakeLists.txt)
constexpr milliseconds kSlack{50};  // sanitizers slow everything down
#else
constexpr milliseconds kSlack{10};
#endif

Options OptionsFor(const RedisServer& server) {
  StatusOr<Options> o = ParseRedisUrl(server.url());
  EXPECT_TRUE(o.ok()) << o.status().message();
  return *o;
}

// Retries PING until it succeeds; returns how long that took (or `limit`).
milliseconds WaitUntilPingOk(Client& client, milliseconds limit) {
  const auto start = Clock::now();
  while (Since(start) < limit) {
    StatusOr<Reply> r = client.ExecuteSync({"PING"});
    if (r.ok() && r->str == "PONG") return Since(start);
    std::this_thread::sleep_for(milliseconds(5));
  }
  return limit;
}

class RedisClientTest : public ::testing::Test {
 protected:
  RedisServer server_;
  IoThread io_;
};

TEST_F(RedisClientTest, SetGetIncr) {
  Client client(io_.executor(), OptionsFor(server_));
  StatusOr<Reply> r = client.ExecuteSync({"SET", "greeting", "hello"});
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(*r, Reply::Status("OK"));
  r = client.ExecuteSync({"GET", "greeting"});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, Reply::String("hello"));
  r = client.ExecuteSync({"INCR", "n"});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, Reply::Integer(1));
  const std::vector<std::string> args = {"INCRBY", "n", "41"};
  std::promise<StatusOr<Reply>> p;
  client.Execute(args, [&p](StatusOr<Reply> r) { p.set_value(std::move(r)); });
  r = p.get_future().get();
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, Reply::Integer(42));
  EXPECT_EQ(server_.Cli("GET", "n"), "42");
}

TEST_F(RedisClientTest, ConcurrentIncrsArePipelinedAndMatchedInOrder) {
  Options options = OptionsFor(server_);
  options.connections = 2;
  options.command_timeout = milliseconds(10000);
  options.max_pending = 100000;  // all 10,800 calls may be in flight at once
  Client client(io_.executor(), options);
  ASSERT_TRUE(client.ExecuteSync({"PING"}).ok());

  constexpr int kThreads = 8;
  constexpr int kPerThread = 1250;
  std::mutex mu;
  std::condition_variable cv;
  int done = 0;
  std::atomic<int> failures{0};
  std::atomic<int> bad_order{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        client.Execute({"INCR", "counter"}, [&](StatusOr<Reply> r) {
          if (!r.ok() || !r->IsInteger()) {
            if (failures.fetch_add(1) == 0) {
              ADD_FAILURE() << (r.ok() ? r->DebugString() : r.status().message());
            }
          }
          std::lock_guard lock(mu);
          ++done;
          cv.notify_all();
        });
      }
      // Interleaved ECHOs with unique payloads: each must get its own text back.
      // With two connections the last ECHO sent is not the last one answered,
      // so the thread waits for all 100 (else pending() may still count some).
      std::promise<void> finished;
      auto echoed = std::make_shared<std::atomic<int>>(0);
      for (int i = 1; i <= 100; ++i) {
        std::string text = "t" + std::to_string(t) + "-" + std::to_string(i);
        client.Execute({"ECHO", text}, [&, echoed, text](StatusOr<Reply> r) {
          if (!r.ok() || r->str != text) bad_order.fetch_add(1);
          if (echoed->fetch_add(1) + 1 == 100) finished.set_value();
        });
      }
      finished.get_future().wait();
    });
  }
  for (auto& th : threads) th.join();
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(
        cv.wait_for(lock, std::chrono::seconds(30), [&] { return done == kThreads * kPerThread; }));
  }
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(bad_order.load(), 0);
  EXPECT_EQ(server_.Cli("GET", "counter"), "10000");
  EXPECT_EQ(client.pending(), 0);
}

TEST_F(RedisClientTest, ErrorRepliesAreRepliesNotStatuses) {
  Client client(io_.executor(), OptionsFor(server_));
  server_.Cli("SET", "text", "abc");
  StatusOr<Reply> r = client.ExecuteSync({"INCR", "text"});
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_TRUE(r->IsError());
  EXPECT_EQ(r->str, "ERR value is not an integer or out of range");
  r = client.ExecuteSync({"NOSUCHCOMMAND", "x"});
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->IsErrorWithPrefix("ERR unknown command")) << r->str;
  // The connection is still fine afterwards.
  r = client.ExecuteSync({"PING"});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->str, "PONG");
}

TEST_F(RedisClientTest, EveryReplyType) {
  Client client(io_.executor(), OptionsFor(server_));
  const std::string binary("a\0b\r\nc", 6);
  EXPECT_EQ(*client.ExecuteSync({"SET", "bin", binary}), Reply::Status("OK"));
  EXPECT_EQ(*client.ExecuteSync({"GET", "bin"}), Reply::String(binary));
  EXPECT_EQ(*client.ExecuteSync({"GET", "missing"}), Reply::Nil());
  EXPECT_EQ(*client.ExecuteSync({"RPUSH", "list", "x", "", "z"}), Reply::Integer(3));
  EXPECT_EQ(*client.ExecuteSync({"LRANGE", "list", "0", "-1"}),
            Reply::Array({Reply::String("x"), Reply::String(""), Reply::String("z")}));
  EXPECT_EQ(
      *client.ExecuteSync({"EVAL", "return {1, 'two', {3, false}, redis.status_reply('OK')}", "0"}),
      Reply::Array({Reply::Integer(1), Reply::String("two"),
                    Reply::Array({Reply::Integer(3), Reply::Nil()}), Reply::Status("OK")}));
  EXPECT_TRUE(client.ExecuteSync({"EVAL", "return redis.error_reply('MY failure')", "0"})
                  ->IsErrorWithPrefix("MY failure"));
  EXPECT_EQ(*client.ExecuteSync({"LRANGE", "missing", "0", "-1"}), Reply::Array({}));
}

TEST_F(RedisClientTest, EvalShaLoadsTheScriptAfterScriptFlush) {
  Client client(io_.executor(), OptionsFor(server_));
  static const Script kScript = Script::Create("return redis.call('INCRBY', KEYS[1], ARGV[1])");
  EXPECT_EQ(kScript.sha1.size(), 40u);
  auto eval = [&](std::string_view amount) {
    std::promise<StatusOr<Reply>> p;
    std::string_view keys[] = {"script:n"};
    std::string_view args[] = {amount};
    client.EvalScript(kScript, keys, args, [&p](StatusOr<Reply> r) { p.set_value(std::move(r)); });
    return p.get_future().get();
  };
  StatusOr<Reply> r = eval("5");  // not loaded yet: NOSCRIPT, load, retry
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(*r, Reply::Integer(5));
  EXPECT_EQ(server_.Cli("SCRIPT", "EXISTS", kScript.sha1), "1");
  r = eval("2");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, Reply::Integer(7));
  EXPECT_EQ(server_.Cli("SCRIPT", "FLUSH"), "OK");
  r = eval("3");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, Reply::Integer(10));
  // The sha is the one Redis computes.
  EXPECT_EQ(server_.Cli("SCRIPT", "LOAD", kScript.source), kScript.sha1);
}

TEST_F(RedisClientTest, ScriptThatDoesNotCompileGivesTheErrorReply) {
  Client client(io_.executor(), OptionsFor(server_));
  static const Script kBad = Script::Create("return +");
  std::promise<StatusOr<Reply>> p;
  client.EvalScript(kBad, {}, {}, [&p](StatusOr<Reply> r) { p.set_value(std::move(r)); });
  StatusOr<Reply> r = p.get_future().get();
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_TRUE(r->IsError());
  EXPECT_NE(r->str.find("Error compiling script"), std::string::npos) << r->str;
}

TEST_F(RedisClientTest, AuthWithAclUser) {
  ASSERT_EQ(server_.Cli("ACL", "SETUSER", "rl", "on", ">secret", "~*", "+@all"), "OK");
  Options options = OptionsFor(server_);
  options.user = "rl";
  options.password = "secret";
  Client client(io_.executor(), options);
  StatusOr<Reply> r = client.ExecuteSync({"ACL", "WHOAMI"});
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->str, "rl");
}

TEST_F(RedisClientTest, WrongPasswordIsUnavailableWithServerText) {
  ASSERT_EQ(server_.Cli("ACL", "SETUSER", "rl", "on", ">secret", "~*", "+@all"), "OK");
  Options options = OptionsFor(server_);
  options.user = "rl";
  options.password = "wrong";
  Client client(io_.executor(), options);
  StatusOr<Reply> r = client.ExecuteSync({"PING"});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(r.status().message().find("WRONGPASS"), std::string::npos) << r.status().message();
  EXPECT_EQ(r.status().message().find("wrong"), std::string::npos) << "password leaked";
  // It keeps failing (with backoff), with the reason.
  r = client.ExecuteSync({"PING"});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(r.status().message().find("WRONGPASS"), std::string::npos) << r.status().message();
}

TEST_F(RedisClientTest, SelectDb) {
  Options options = OptionsFor(server_);
  options.db = 3;
  Client client(io_.executor(), options);
  ASSERT_TRUE(client.ExecuteSync({"SET", "in-db-3", "yes"}).ok());
  StatusOr<Reply> info = client.ExecuteSync({"CLIENT", "INFO"});
  ASSERT_TRUE(info.ok());
  EXPECT_NE(info->str.find(" db=3 "), std::string::npos) << info->str;
  EXPECT_EQ(server_.Cli("EXISTS", "in-db-3"), "0");  // db 0
  EXPECT_EQ(server_.Cli("EVAL", "redis.call('SELECT', 3) return redis.call('GET', 'in-db-3')", "0"),
            "yes");
}

TEST_F(RedisClientTest, DeadlineWhenServerIsPausedThenRecovers) {
  Options options = OptionsFor(server_);
  options.command_timeout = milliseconds(100);
  Client client(io_.executor(), options);
  ASSERT_TRUE(client.ExecuteSync({"PING"}).ok());

  server_.Pause();
  auto start = Clock::now();
  StatusOr<Reply> r = client.ExecuteSync({"PING"});
  milliseconds took = Since(start);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(r.status().message().find("outcome unknown"), std::string::npos);
  EXPECT_GE(took, milliseconds(100));
  EXPECT_LE(took, milliseconds(100) + kSlack);

  // A per-call timeout overrides the default.
  start = Clock::now();
  r = Call(client, {"PING"}, milliseconds(30));
  took = Since(start);
  EXPECT_EQ(r.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_GE(took, milliseconds(30));
  EXPECT_LE(took, milliseconds(30) + kSlack);

  // Stay paused past 2x the timeout: the client gives up on the connection.
  std::this_thread::sleep_for(milliseconds(250));
  server_.Resume();
  EXPECT_LT(WaitUntilPingOk(client, milliseconds(3000)), milliseconds(3000));
  StatusOr<Reply> after = client.ExecuteSync({"INCR", "after-pause"});
  ASSERT_TRUE(after.ok()) << after.status().message();
  EXPECT_TRUE(after->IsInteger());
}

TEST_F(RedisClientTest, ServerKilledFailsFastThenReconnectsAfterRestart) {
  Options options = OptionsFor(server_);
  options.command_timeout = milliseconds(2000);
  Client client(io_.executor(), options);
  ASSERT_TRUE(client.ExecuteSync({"PING"}).ok());

  server_.Kill();
  auto start = Clock::now();
  StatusOr<Reply> r = client.ExecuteSync({"PING"});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable) << r.status().message();
  EXPECT_LT(Since(start), milliseconds(200));
  // Calls while it is down fail fast too.
  for (int i = 0; i < 5; ++i) {
    start = Clock::now();
    r = client.ExecuteSync({"PING"});
    EXPECT_EQ(r.status().code(), StatusCode::kUnavailable) << r.status().message();
    EXPECT_LT(Since(start), milliseconds(200));
  }

  server_.Restart();
  EXPECT_LT(WaitUntilPingOk(client, milliseconds(3000)), milliseconds(1000) + 10 * kSlack);
}

TEST(RedisTlsTest, TlsWithCertificatesMadeAtTestTime) {
  RedisServer server({.tls = true});
  IoThread io;
  {
    Client client(io.executor(), OptionsFor(server));
    StatusOr<Reply> r = client.ExecuteSync({"SET", "over-tls", "1"});
    ASSERT_TRUE(r.ok()) << r.status().message();
    std::string big(200 * 1024, 'x');  // more than one TLS record
    ASSERT_TRUE(client.ExecuteSync({"SET", "big", big}).ok());
    EXPECT_EQ(*client.ExecuteSync({"GET", "big"}), Reply::String(big));
  }
  EXPECT_EQ(server.Cli("GET", "over-tls"), "1");
  {
    // Mutual TLS: a client certificate signed by the CA.
    Options options = OptionsFor(server);
    options.tls_cert_file = server.certificates().client_cert;
    options.tls_key_file = server.certificates().client_key;
    Client client(io.executor(), options);
    StatusOr<Reply> r = client.ExecuteSync({"PING"});
    ASSERT_TRUE(r.ok()) << r.status().message();
  }
  {
    // Without our CA the server certificate is not trusted.
    Options options = OptionsFor(server);
    options.tls_ca_file.clear();
    Client client(io.executor(), options);
    StatusOr<Reply> r = client.ExecuteSync({"PING"});
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
    EXPECT_NE(r.status().message().find("TLS handshake failed"), std::string::npos)
        << r.status().message();
  }
  {
    // ... unless verification is off.
    Options options = OptionsFor(server);
    options.tls_ca_file.clear();
    options.tls_verify = false;
    Client client(io.executor(), options);
    StatusOr<Reply> r = client.ExecuteSync({"PING"});
    ASSERT_TRUE(r.ok()) << r.status().message();
  }
  {
    // A plain-text client against the TLS port fails cleanly.
    Options options = OptionsFor(server);
    options.tls = false;
    options.command_timeout = milliseconds(300);
    Client client(io.executor(), options);
    StatusOr<Reply> r = client.ExecuteSync({"PING"});
    EXPECT_FALSE(r.ok());
  }
}

TEST(RedisClientOptionsTest, BadCaFileIsReportedByCreate) {
  IoThread io;
  Options options;
  options.tls = true;
  options.tls_ca_file = "/nonexistent/ca.pem";
  auto client = Client::Create(io.executor(), options);
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(client.status().message().find("/nonexistent/ca.pem"), std::string::npos);
}

}  // namespace
}  // namespace ratelimit::redis
