// Client against peers that misbehave: nothing listening, garbage bytes,
// connections closed mid-reply, servers that never or slowly answer.
#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <thread>

#include "redis/client.h"
#include "redis/io_thread.h"
#include "redis/test_calls.h"
#include "support/fake_tcp_server.h"
#include "support/subprocess.h"

namespace ratelimit::redis {
namespace {

using std::chrono::milliseconds;
using testing::FakeTcpServer;
using Clock = std::chrono::steady_clock;
using test_calls::Call;
using test_calls::Since;

Options LocalOptions(uint16_t port) {
  Options o;
  o.host = "127.0.0.1";
  o.port = port;
  o.connections = 1;
  o.command_timeout = milliseconds(2000);
  return o;
}

TEST(ConnectionFaultTest, NothingListeningIsUnavailableQuickly) {
  IoThread io;
  Client client(io.executor(), LocalOptions(testing::PickFreePort()));
  auto start = Clock::now();
  StatusOr<Reply> r = client.ExecuteSync({"PING"});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(r.status().message().find("refused"), std::string::npos) << r.status().message();
  EXPECT_LT(Since(start), milliseconds(200));
  // Later calls fail fast with the reason, instead of queueing.
  start = Clock::now();
  r = client.ExecuteSync({"PING"});
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(r.status().message().find("refused"), std::string::npos) << r.status().message();
  EXPECT_LT(Since(start), milliseconds(200));
}

TEST(ConnectionFaultTest, GarbageRepliesAreAProtocolErrorAndReconnect) {
  FakeTcpServer fake([](int fd) {
    FakeTcpServer::ReadSome(fd);
    FakeTcpServer::WriteAll(fd, "this is not RESP\r\n");
    FakeTcpServer::WaitForClose(fd);  // the client must hang up by itself
  });
  IoThread io;
  Client client(io.executor(), LocalOptions(fake.port()));
  StatusOr<Reply> r = client.ExecuteSync({"PING"});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInternal);
  EXPECT_NE(r.status().message().find("protocol error"), std::string::npos) << r.status().message();
  // It reconnects on its own.
  const auto start = Clock::now();
  while (fake.accepted() < 2 && Since(start) < milliseconds(3000)) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  EXPECT_GE(fake.accepted(), 2);
}

TEST(ConnectionFaultTest, ClosedMidReplyIsUnavailable) {
  FakeTcpServer fake([](int fd) {
    FakeTcpServer::ReadSome(fd);
    FakeTcpServer::WriteAll(fd, "$10\r\nabc");  // then close
  });
  IoThread io;
  Client client(io.executor(), LocalOptions(fake.port()));
  StatusOr<Reply> r = client.ExecuteSync({"GET", "k"});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(r.status().message().find("closed by server"), std::string::npos)
      << r.status().message();
}

TEST(ConnectionFaultTest, ReplyWithNoCallWaitingIsAProtocolError) {
  FakeTcpServer fake([](int fd) {
    FakeTcpServer::ReadSome(fd);
    FakeTcpServer::WriteAll(fd, "+OK\r\n+EXTRA\r\n");
    FakeTcpServer::WaitForClose(fd);
  });
  IoThread io;
  Client client(io.executor(), LocalOptions(fake.port()));
  StatusOr<Reply> r = client.ExecuteSync({"PING"});
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->str, "OK");
  // The unexpected "+EXTRA" makes the client drop the connection and reconnect.
  const auto start = Clock::now();
  while (fake.accepted() < 2 && Since(start) < milliseconds(3000)) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  EXPECT_GE(fake.accepted(), 2);
}

TEST(ConnectionFaultTest, MaxPendingFailsFastWithResourceExhausted) {
  FakeTcpServer fake([](int fd) { FakeTcpServer::WaitForClose(fd, milliseconds(10000)); });
  IoThread io;
  Options options = LocalOptions(fake.port());
  options.max_pending = 10;
  options.connections = 2;
  options.command_timeout = milliseconds(10000);
  std::vector<std::future<StatusOr<Reply>>> held;
  {
    Client client(io.executor(), options);
    for (int i = 0; i < 10; ++i) {
      auto p = std::make_shared<std::promise<StatusOr<Reply>>>();
      held.push_back(p->get_future());
      client.Execute({"PING"}, [p](StatusOr<Reply> r) { p->set_value(std::move(r)); });
    }
    EXPECT_EQ(client.pending(), 10);
    const auto start = Clock::now();
    StatusOr<Reply> r = client.ExecuteSync({"PING"});
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status().message();
    EXPECT_LT(Since(start), milliseconds(100));
    // Close fails what is pending.
    client.Close();
    for (auto& f : held) {
      StatusOr<Reply> h = f.get();
      EXPECT_EQ(h.status().code(), StatusCode::kUnavailable) << h.status().message();
    }
    EXPECT_EQ(client.pending(), 0);
    r = client.ExecuteSync({"PING"});
    EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  }
}

// A call that timed out after it was sent keeps its place in the FIFO, so the
// late reply is thrown away and the next call gets its own reply.
TEST(ConnectionFaultTest, LateReplyOfTimedOutCallIsDiscarded) {
  FakeTcpServer fake([](int fd) {
    if (FakeTcpServer::ReadSome(fd).empty()) return;
    std::this_thread::sleep_for(milliseconds(150));
    FakeTcpServer::WriteAll(fd, ":1\r\n");
    if (FakeTcpServer::ReadSome(fd).empty()) return;
    FakeTcpServer::WriteAll(fd, ":2\r\n");
    FakeTcpServer::WaitForClose(fd);
  });
  IoThread io;
  Client client(io.executor(), LocalOptions(fake.port()));
  StatusOr<Reply> first = Call(client, {"INCR", "a"}, milliseconds(100));
  ASSERT_FALSE(first.ok());
  EXPECT_EQ(first.status().code(), StatusCode::kDeadlineExceeded);
  StatusOr<Reply> second = Call(client, {"INCR", "a"}, milliseconds(2000));
  ASSERT_TRUE(second.ok()) << second.status().message();
  EXPECT_EQ(*second, Reply::Integer(2));
  EXPECT_EQ(fake.accepted(), 1);
}

// After a NOSCRIPT, the SCRIPT LOAD and the retried EVALSHA get what is left
// of the call's timeout, not a fresh one each: a server that answers each
// step in 150 ms (under the 200 ms asked for) must not make the call take
// 450 ms. It fails at its deadline instead.
TEST(ConnectionFaultTest, NoScriptRetryKeepsTheCallsDeadline) {
  std::atomic<int> evalshas{0}, loads{0};
  FakeTcpServer fake([&](int fd) {
    for (;;) {
      const std::string got = FakeTcpServer::ReadSome(fd, milliseconds(2000));
      if (got.empty()) return;
      if (got.find("LOAD") != std::string::npos) loads++;
      std::this_thread::sleep_for(milliseconds(150));
      if (got.find("EVALSHA") != std::string::npos) {
        FakeTcpServer::WriteAll(fd,
                                evalshas++ == 0 ? "-NOSCRIPT No matching script.\r\n" : ":1\r\n");
      } else if (got.find("LOAD") != std::string::npos) {
        FakeTcpServer::WriteAll(fd, "$3\r\nsha\r\n");
      } else {
        FakeTcpServer::WriteAll(fd, "+OK\r\n");
      }
    }
  });
  IoThread io;
  Client client(io.executor(), LocalOptions(fake.port()));
  const Script script = Script::Create("return 1");
  std::promise<StatusOr<Reply>> done;
  const auto start = Clock::now();
  const std::string_view keys[] = {"k"};
  client.EvalScript(
      script, keys, {}, [&done](StatusOr<Reply> r) { done.set_value(std::move(r)); },
      milliseconds(200));
  StatusOr<Reply> r = done.get_future().get();
  const milliseconds took = Since(start);
  ASSERT_FALSE(r.ok()) << "answered after " << took.count() << " ms";
  EXPECT_EQ(r.status().code(), StatusCode::kDeadlineExceeded) << r.status().message();
  EXPECT_GE(took, milliseconds(190));
  EXPECT_LT(took, milliseconds(280)) << r.status().message();
  EXPECT_EQ(loads.load(), 1);  // the load was sent, with the 50 ms left
}

// Calls queued during the first connect that expire before it completes are
// dropped unsent (their outcome is known: not executed).
TEST(ConnectionFaultTest, CallsQueuedDuringFirstConnectHonourTheirDeadline) {
  IoThread io;
  Options options = LocalOptions(9);  // the port does not matter: the host never answers
  options.host = "192.0.2.1";  // TEST-NET-1: connects hang (or fail on hosts without a route)
  options.connect_timeout = milliseconds(300);
  Client client(io.executor(), options);
  const auto start = Clock::now();
  StatusOr<Reply> r = Call(client, {"PING"}, milliseconds(50));
  ASSERT_FALSE(r.ok());
  if (r.status().code() == StatusCode::kDeadlineExceeded) {
    EXPECT_NE(r.status().message().find("before it was sent"), std::string::npos)
        << r.status().message();
    EXPECT_LT(Since(start), milliseconds(250));
  } else {
    EXPECT_EQ(r.status().code(), StatusCode::kUnavailable) << r.status().message();
  }
}

TEST(ConnectionFaultTest, CallbacksMayCallTheClientAgain) {
  FakeTcpServer fake([](int fd) {
    std::string got;
    int answered = 0;
    while (answered < 3) {
      std::string chunk = FakeTcpServer::ReadSome(fd);
      if (chunk.empty()) return;
      got += chunk;
      // One "*1\r\n$4\r\nPING\r\n" per call.
      size_t pos = 0;
      int calls = 0;
      while ((pos = got.find("PING", pos)) != std::string::npos) {
        ++calls;
        pos += 4;
      }
      for (; answered < calls; ++answered) FakeTcpServer::WriteAll(fd, "+PONG\r\n");
    }
    FakeTcpServer::WaitForClose(fd);
  });
  IoThread io;
  Client client(io.executor(), LocalOptions(fake.port()));
  std::promise<int> done;
  client.Execute({"PING"}, [&](StatusOr<Reply> r1) {
    client.Execute({"PING"}, [&, ok1 = r1.ok()](StatusOr<Reply> r2) {
      client.Execute({"PING"}, [&, ok = ok1 && r2.ok()](StatusOr<Reply> r3) {
        done.set_value(ok && r3.ok() ? 3 : 0);
      });
    });
  });
  EXPECT_EQ(done.get_future().get(), 3);
}

}  // namespace
}  // namespace ratelimit::redis
