// ClusterClient against scripted fake nodes, for the cluster answers a real
// cluster cannot be made to give on demand (MOVED, ASK, TRYAGAIN, CLUSTERDOWN,
// redirection loops, malformed maps), plus the URL and reply parsers.
#include "redis/cluster_client.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>

#include <atomic>
#include <functional>
#include <future>
#include <mutex>
#include <optional>
#include <thread>

#include "redis/cluster_slots.h"
#include "redis/io_thread.h"
#include "redis/slot.h"
#include "support/fake_tcp_server.h"

namespace ratelimit::redis {
namespace {

using std::chrono::milliseconds;
using testing::FakeTcpServer;

// ---- parsers ----

TEST(ParseClusterUrl, Seeds) {
  StatusOr<ClusterOptions> c = ParseClusterUrl(
      "redis+cluster://rl:pw@10.0.0.1:7000,10.0.0.2:7001,[::1]:7002"
      "?command_timeout_ms=50&connections=3");
  ASSERT_TRUE(c.ok()) << c.status().message();
  ASSERT_EQ(c->seeds.size(), 3u);
  EXPECT_EQ(c->seeds[0], (NodeAddress{"10.0.0.1", 7000}));
  EXPECT_EQ(c->seeds[1], (NodeAddress{"10.0.0.2", 7001}));
  EXPECT_EQ(c->seeds[2], (NodeAddress{"::1", 7002}));
  EXPECT_EQ(c->seeds[2].ToString(), "[::1]:7002");
  EXPECT_EQ(c->node.user, "rl");
  EXPECT_EQ(c->node.password, "pw");
  EXPECT_EQ(c->node.command_timeout, milliseconds(50));
  EXPECT_EQ(c->node.connections, 3);
  EXPECT_FALSE(c->node.tls);
  StatusOr<ClusterOptions> tls = ParseClusterUrl("rediss+cluster://h:1?insecure=1");
  ASSERT_TRUE(tls.ok()) << tls.status().message();
  EXPECT_TRUE(tls->node.tls);
  EXPECT_FALSE(tls->node.tls_verify);
  EXPECT_TRUE(IsClusterUrl("redis+cluster://h:1"));
  EXPECT_FALSE(IsClusterUrl("redis://h:1"));
}

TEST(ParseClusterUrl, Errors) {
  for (const char* bad :
       {"redis://h:1", "redis+cluster://", "redis+cluster://h:1,,h:2", "redis+cluster://h:1/3",
        "redis+cluster://h:99999", "redis+cluster://h:1?nope=1"}) {
    StatusOr<ClusterOptions> c = ParseClusterUrl(bad);
    EXPECT_FALSE(c.ok()) << bad;
    if (!c.ok()) {
      EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << bad;
    }
  }
}

TEST(ParseRedirect, MovedAndAsk) {
  StatusOr<Redirect> m = ParseRedirect("MOVED 15495 127.0.0.1:7403", "x");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->kind, Redirect::kMoved);
  EXPECT_EQ(m->slot, 15495);
  EXPECT_EQ(m->to, (NodeAddress{"127.0.0.1", 7403}));
  StatusOr<Redirect> a = ParseRedirect("ASK 449 :7402", "10.1.1.1");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->kind, Redirect::kAsk);
  EXPECT_EQ(a->to, (NodeAddress{"10.1.1.1", 7402}));
  StatusOr<Redirect> v6 = ParseRedirect("MOVED 1 ::1:7000", "x");
  ASSERT_TRUE(v6.ok());
  EXPECT_EQ(v6->to, (NodeAddress{"::1", 7000}));
  for (const char* bad : {"MOVED", "MOVED 1", "MOVED x 1.2.3.4:5", "MOVED 16384 h:1", "MOVED 1 h:0",
                          "MOVED 1 h", "ASK -1 h:1", "MOVE 1 h:1"}) {
    StatusOr<Redirect> r = ParseRedirect(bad, "x");
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), StatusCode::kInternal) << bad;
    }
  }
}

Reply Str(std::string s) { return Reply::String(std::move(s)); }
Reply Int(int64_t v) { return Reply::Integer(v); }
Reply Arr(std::vector<Reply> e) { return Reply::Array(std::move(e)); }

Reply Shard(std::vector<int64_t> slots, std::vector<Reply> nodes) {
  std::vector<Reply> s;
  for (int64_t v : slots) s.push_back(Int(v));
  return Arr({Str("slots"), Arr(std::move(s)), Str("nodes"), Arr(std::move(nodes))});
}
Reply ShardNode(const char* role, int64_t port, const char* endpoint = "127.0.0.1") {
  return Arr({Str("id"), Str("abc"), Str("port"), Int(port), Str("ip"), Str("127.0.0.1"),
              Str("endpoint"), Str(endpoint), Str("role"), Str(role), Str("health"),
              Str("online")});
}

TEST(ParseClusterShards, MastersAndRanges) {
  Reply r = Arr({Shard({0, 99, 200, 300}, {ShardNode("replica", 2), ShardNode("master", 1)}),
                 Shard({100, 199}, {ShardNode("master", 3, "?")}), Shard({}, {})});
  StatusOr<std::vector<SlotRange>> m = ParseClusterShards(r, false, "h");
  ASSERT_TRUE(m.ok()) << m.status().message();
  ASSERT_EQ(m->size(), 3u);
  EXPECT_EQ((*m)[0].first, 0);
  EXPECT_EQ((*m)[0].last, 99);
  EXPECT_EQ((*m)[0].master.port, 1);
  EXPECT_EQ((*m)[1].first, 200);
  EXPECT_EQ((*m)[2].master, (NodeAddress{"127.0.0.1", 3}));
}

// Redis >= 7.2 groups CLUSTER SHARDS by shard id. After a failover while the
// old master is down, its shard lists the old master (role "master", health
// "fail") before the promoted one (redis/redis#13414, #13422). The slots go
// to the online master.
Reply ShardNodeH(const char* role, int64_t port, const char* health) {
  return Arr({Str("id"), Str("abc"), Str("port"), Int(port), Str("ip"), Str("127.0.0.1"),
              Str("endpoint"), Str("127.0.0.1"), Str("role"), Str(role), Str("health"),
              Str(health)});
}
TEST(ParseClusterShards, AFailedOldMasterIsNotTheShardsMaster) {
  Reply r = Arr({Shard(
      {0, 16383}, {ShardNodeH("master", 7001, "fail"), ShardNodeH("master", 7002, "online")})});
  StatusOr<std::vector<SlotRange>> m = ParseClusterShards(r, false, "h");
  ASSERT_TRUE(m.ok()) << m.status().message();
  ASSERT_EQ(m->size(), 1u);
  EXPECT_EQ((*m)[0].master.port, 7002) << "slots mapped to the failed old master";
}

// A shard whose only master is not online (or that has no master) leaves its
// slots unmapped; the other shards' slots are still served. A node without a
// health field (an older server) counts as online.
TEST(ParseClusterShards, AShardWithNoOnlineMasterLeavesItsSlotsUnmapped) {
  Reply no_health =
      Arr({Str("port"), Int(7004), Str("ip"), Str("127.0.0.1"), Str("role"), Str("master")});
  Reply r = Arr({Shard({0, 99}, {ShardNodeH("master", 7001, "failed"),
                                 ShardNodeH("replica", 7003, "online")}),
                 Shard({100, 199}, {ShardNodeH("replica", 7005, "online")}),
                 Shard({200, 16383}, {no_health})});
  StatusOr<std::vector<SlotRange>> m = ParseClusterShards(r, false, "h");
  ASSERT_TRUE(m.ok()) << m.status().message();
  ASSERT_EQ(m->size(), 1u);
  EXPECT_EQ((*m)[0].first, 200);
  EXPECT_EQ((*m)[0].master.port, 7004);
  // Nothing served at all is still an error, so the next node is asked.
  Reply none = Arr({Shard({0, 16383}, {ShardNodeH("master", 7001, "fail")})});
  EXPECT_FALSE(ParseClusterShards(none, false, "h").ok());
}

TEST(ParseClusterShards, MalformedIsAnError) {
  const Reply cases[] = {
      Int(1),
      Arr({Int(1)}),
      Arr({Shard({0, 100}, {ShardNode("replica", 1)})}),   // no master: serves nothing
      Arr({Shard({0, 16384}, {ShardNode("master", 1)})}),  // slot out of range
      Arr({Shard({5, 4}, {ShardNode("master", 1)})}),      // reversed range
      Arr({Shard({0}, {ShardNode("master", 1)})}),         // odd slot list
      Arr({Shard({0, 1}, {ShardNode("master", 70000)})}),  // bad port
      Arr({Arr({Str("slots"), Int(3), Str("nodes"), Arr({})})}),
      Arr({}),  // serves nothing
  };
  for (const Reply& r : cases) {
    StatusOr<std::vector<SlotRange>> m = ParseClusterShards(r, false, "h");
    EXPECT_FALSE(m.ok()) << r.DebugString();
    if (!m.ok()) {
      EXPECT_EQ(m.status().code(), StatusCode::kInternal);
    }
  }
}

TEST(ParseClusterSlots, RangesAndErrors) {
  Reply good = Arr({Arr({Int(0), Int(8191), Arr({Str(""), Int(7000), Str("id")})}),
                    Arr({Int(8192), Int(16383), Arr({Str("10.0.0.2"), Int(7001)}),
                         Arr({Str("10.0.0.3"), Int(7002)})})});
  StatusOr<std::vector<SlotRange>> m = ParseClusterSlots(good, "10.0.0.1");
  ASSERT_TRUE(m.ok()) << m.status().message();
  ASSERT_EQ(m->size(), 2u);
  EXPECT_EQ((*m)[0].master, (NodeAddress{"10.0.0.1", 7000}));
  EXPECT_EQ((*m)[1].master, (NodeAddress{"10.0.0.2", 7001}));
  for (const Reply& bad : {Arr({Arr({Int(0), Int(1)})}), Arr({Arr({Int(0), Int(1), Int(2)})}),
                           Arr({Arr({Int(0), Int(20000), Arr({Str("h"), Int(1)})})}),
                           Arr({Arr({Str("x"), Int(1), Arr({Str("h"), Int(1)})})})}) {
    EXPECT_FALSE(ParseClusterSlots(bad, "h").ok()) << bad.DebugString();
  }
}

// ---- a scripted fake cluster node ----

std::optional<std::vector<std::string>> ParseCommand(std::string& buf) {
  size_t pos = 0;
  auto line = [&]() -> std::optional<std::string> {
    size_t end = buf.find("\r\n", pos);
    if (end == std::string::npos) return std::nullopt;
    std::string l = buf.substr(pos, end - pos);
    pos = end + 2;
    return l;
  };
  auto head = line();
  if (!head || head->empty() || (*head)[0] != '*') return std::nullopt;
  const int n = std::stoi(head->substr(1));
  std::vector<std::string> cmd;
  for (int i = 0; i < n; ++i) {
    auto len = line();
    if (!len) return std::nullopt;
    const size_t l = std::stoul(len->substr(1));
    if (buf.size() < pos + l + 2) return std::nullopt;
    cmd.push_back(buf.substr(pos, l));
    pos += l + 2;
  }
  buf.erase(0, pos);
  return cmd;
}

std::string Bulk(std::string_view s) {
  return "$" + std::to_string(s.size()) + "\r\n" + std::string(s) + "\r\n";
}

// CLUSTER SLOTS mapping every slot to `port`.
std::string AllSlotsTo(uint16_t port) {
  return "*1\r\n*3\r\n:0\r\n:16383\r\n*2\r\n" + Bulk("127.0.0.1") + ":" + std::to_string(port) +
         "\r\n";
}

class FakeNode {
 public:
  // Gets each command (ASKING is answered here and shows as `asking`) and
  // returns the raw RESP reply.
  using Responder = std::function<std::string(const std::vector<std::string>& cmd, bool asking)>;

  explicit FakeNode(Responder r) : responder_(std::move(r)) {}
  ~FakeNode() { stop_ = true; }

  uint16_t port() const { return server_.port(); }
  // Commands received, as their first word(s) ("GET", "ASKING", "CLUSTER SLOTS", ...).
  std::vector<std::string> log() {
    std::lock_guard lock(mu_);
    return log_;
  }
  int count(std::string_view word) {
    int n = 0;
    for (const std::string& s : log()) n += s == word ? 1 : 0;
    return n;
  }
  // Connections accepted so far, and open now.
  int accepted() const { return server_.accepted(); }
  int open() const { return open_.load(); }

 private:
  void Serve(int fd) {
    ++open_;
    struct Closed {
      std::atomic<int>& n;
      ~Closed() { --n; }
    } closed{open_};
    std::string buf;
    bool asking = false;
    while (!stop_) {
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, 20) <= 0) continue;
      char tmp[4096];
      const ssize_t n = recv(fd, tmp, sizeof(tmp), 0);
      if (n <= 0) return;
      buf.append(tmp, static_cast<size_t>(n));
      while (std::optional<std::vector<std::string>> cmd = ParseCommand(buf)) {
        std::string name = (*cmd)[0];
        if (name == "CLUSTER" || name == "SCRIPT") name += " " + (*cmd)[1];
        {
          std::lock_guard lock(mu_);
          log_.push_back(name);
        }
        if (name == "ASKING") {
          asking = true;
          FakeTcpServer::WriteAll(fd, "+OK\r\n");
          continue;
        }
        FakeTcpServer::WriteAll(fd, responder_(*cmd, asking));
        asking = false;
      }
    }
  }

  Responder responder_;
  std::atomic<bool> stop_{false};
  std::atomic<int> open_{0};
  std::mutex mu_;
  std::vector<std::string> log_;
  FakeTcpServer server_{[this](int fd) { Serve(fd); }};
};

const char kShardsUnknown[] = "-ERR unknown subcommand 'SHARDS'\r\n";

class ClusterClientFakeTest : public ::testing::Test {
 protected:
  std::unique_ptr<ClusterClient> Connect(uint16_t seed) {
    ClusterOptions o;
    o.node.connections = 1;  // a FakeTcpServer serves one connection at a time
    o.seeds = {NodeAddress{"127.0.0.1", seed}};
    auto c = ClusterClient::Create(io_.executor(), o);
    EXPECT_TRUE(c.ok());
    return *std::move(c);
  }

  StatusOr<Reply> Get(ClusterClient& c, std::string_view key,
                      milliseconds timeout = milliseconds(500)) {
    std::promise<StatusOr<Reply>> p;
    std::string_view args[] = {"GET", key};
    c.Execute(
        args, [&p](StatusOr<Reply> r) { p.set_value(std::move(r)); }, timeout);
    return p.get_future().get();
  }

  IoThread io_;
};

// CLUSTER SHARDS naming `port` as the master of every slot.
std::string ShardsAllTo(uint16_t port) {
  return "*1\r\n*4\r\n" + Bulk("slots") + "*2\r\n:0\r\n:16383\r\n" + Bulk("nodes") +
         "*1\r\n*6\r\n" + Bulk("ip") + Bulk("127.0.0.1") + Bulk("port") + ":" +
         std::to_string(port) + "\r\n" + Bulk("role") + Bulk("master");
}

TEST_F(ClusterClientFakeTest, MalformedMapIsAFailedCallNotACrash) {
  FakeNode a([&](const std::vector<std::string>& cmd, bool) -> std::string {
    if (cmd[0] == "CLUSTER") return ShardsAllTo(0);  // port 0: malformed
    return Bulk("v");
  });
  auto client = Connect(a.port());
  StatusOr<Reply> r = Get(*client, "k");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable) << r.status().message();
  EXPECT_NE(r.status().message().find("malformed"), std::string::npos) << r.status().message();
  EXPECT_EQ(a.count("GET"), 0);
  EXPECT_FALSE(client->has_slot_map());
}

TEST_F(ClusterClientFakeTest, ShardsMap) {
  std::atomic<uint16_t> self{0};
  FakeNode a([&](const std::vector<std::string>& cmd, bool) -> std::string {
    if (cmd[0] == "CLUSTER") return ShardsAllTo(self);
    return Bulk("v");
  });
  self = a.port();
  auto client = Connect(a.port());
  StatusOr<Reply> r = Get(*client, "k");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->str, "v");
  EXPECT_EQ(a.count("CLUSTER SLOTS"), 0);
  EXPECT_EQ(client->NodeName(client->NodeForSlot(123)), "127.0.0.1:" + std::to_string(a.port()));
}

TEST_F(ClusterClientFakeTest, SlotsFallbackWhenShardsIsUnknown) {
  std::atomic<uint16_t> self{0};
  FakeNode a([&](const std::vector<std::string>& cmd, bool) -> std::string {
    if (cmd[0] == "CLUSTER") return cmd[1] == "SHARDS" ? kShardsUnknown : AllSlotsTo(self);
    return Bulk("v");
  });
  self = a.port();
  auto client = Connect(a.port());
  StatusOr<Reply> r = Get(*client, "k");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->str, "v");
  EXPECT_GE(a.count("CLUSTER SLOTS"), 1);
}

TEST_F(ClusterClientFakeTest, MovedUpdatesTheMapAndRetries) {
  std::atomic<uint16_t> a_port{0}, b_port{0};
  std::atomic<bool> moved{false};
  FakeNode b([&](const std::vector<std::string>& cmd, bool) -> std::string {
    if (cmd[0] == "CLUSTER") return ShardsAllTo(b_port);
    return Bulk("from-b");
  });
  FakeNode a([&](const std::vector<std::string>& cmd, bool) -> std::string {
    if (cmd[0] == "CLUSTER") return ShardsAllTo(moved ? b_port : a_port);
    moved = true;
    return "-MOVED " + std::to_string(KeySlot(cmd[1])) + " 127.0.0.1:" + std::to_string(b_port) +
           "\r\n";
  });
  a_port = a.port();
  b_port = b.port();
  auto client = Connect(a.port());
  for (int i = 0; i < 3; ++i) {
    StatusOr<Reply> r = Get(*client, "k");
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_EQ(r->str, "from-b");
  }
  EXPECT_EQ(a.count("GET"), 1);  // later calls go straight to the new owner
  EXPECT_EQ(b.count("GET"), 3);
}

TEST_F(ClusterClientFakeTest, AskSendsAskingOnceOnTheSameConnection) {
  std::atomic<uint16_t> a_port{0}, b_port{0};
  FakeNode b([&](const std::vector<std::string>& cmd, bool asking) -> std::string {
    if (cmd[0] == "CLUSTER") return ShardsAllTo(a_port);
    if (!asking) {
      return "-MOVED " + std::to_string(KeySlot(cmd[1])) + " 127.0.0.1:" + std::to_string(a_port) +
             "\r\n";
    }
    return Bulk("imported");
  });
  FakeNode a([&](const std::vector<std::string>& cmd, bool) -> std::string {
    if (cmd[0] == "CLUSTER") return ShardsAllTo(a_port);
    return "-ASK " + std::to_string(KeySlot(cmd[1])) + " 127.0.0.1:" + std::to_string(b_port) +
           "\r\n";
  });
  a_port = a.port();
  b_port = b.port();
  auto client = Connect(a.port());
  for (int i = 0; i < 2; ++i) {
    StatusOr<Reply> r = Get(*client, "k");
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_EQ(r->str, "imported");
  }
  EXPECT_EQ(a.count("GET"), 2);  // ASK does not change the map
  std::vector<std::string> on_b;
  for (const std::string& c : b.log()) {
    if (!c.starts_with("CLUSTER")) on_b.push_back(c);
  }
  EXPECT_EQ(on_b, (std::vector<std::string>{"ASKING", "GET", "ASKING", "GET"}));
}

TEST_F(ClusterClientFakeTest, AskThenNoscriptLoadsAndSendsAskingAgain) {
  std::atomic<uint16_t> a_port{0}, b_port{0};
  std::atomic<bool> loaded{false};
  FakeNode b([&](const std::vector<std::string>& cmd, bool asking) -> std::string {
    if (cmd[0] == "CLUSTER") return ShardsAllTo(a_port);
    if (cmd[0] == "SCRIPT") {
      loaded = true;
      return Bulk(cmd[2].empty() ? "" : Sha1Hex(cmd[2]));
    }
    if (!asking) return "-MOVED 1 127.0.0.1:" + std::to_string(a_port) + "\r\n";
    return loaded ? ":7\r\n" : "-NOSCRIPT No matching script. Please use EVAL.\r\n";
  });
  FakeNode a([&](const std::vector<std::string>& cmd, bool) -> std::string {
    if (cmd[0] == "CLUSTER") return ShardsAllTo(a_port);
    return "-ASK " + std::to_string(KeySlot(cmd[3])) + " 127.0.0.1:" + std::to_string(b_port) +
           "\r\n";
  });
  a_port = a.port();
  b_port = b.port();
  auto client = Connect(a.port());
  const Script script = Script::Create("return 7");
  std::promise<StatusOr<Reply>> p;
  std::string_view keys[] = {"{t}a", "{t}b"};
  std::string_view args[] = {"x"};
  client->EvalScript(
      script, keys, args, [&p](StatusOr<Reply> r) { p.set_value(std::move(r)); },
      milliseconds(500));
  StatusOr<Reply> r = p.get_future().get();
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->integer, 7);
  std::vector<std::string> on_b;
  for (const std::string& c : b.log()) {
    if (!c.starts_with("CLUSTER")) on_b.push_back(c);
  }
  EXPECT_EQ(on_b,
            (std::vector<std::string>{"ASKING", "EVALSHA", "SCRIPT LOAD", "ASKING", "EVALSHA"}));
}

TEST_F(ClusterClientFakeTest, TryAgainIsRetriedWithinTheDeadline) {
  std::atomic<uint16_t> self{0};
  std::atomic<int> gets{0};
  FakeNode a([&](const std::vector<std::string>& cmd, bool) -> std::string {
    if (cmd[0] == "CLUSTER") return ShardsAllTo(self);
    if (++gets <= 2) return "-TRYAGAIN Multiple keys request during rehashing of slot\r\n";
    return Bulk("v");
  });
  self = a.port();
  auto client = Connect(a.port());
  StatusOr<Reply> r = Get(*client, "k");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->str, "v");
  EXPECT_EQ(gets.load(), 3);
}

TEST_F(ClusterClientFakeTest, ClusterDownFailsWithinTheDeadline) {
  std::atomic<uint16_t> self{0};
  FakeNode a([&](const std::vector<std::string>& cmd, bool) -> std::string {
    if (cmd[0] == "CLUSTER") return ShardsAllTo(self);
    return "-CLUSTERDOWN The cluster is down\r\n";
  });
  self = a.port();
  auto client = Connect(a.port());
  ASSERT_TRUE(Get(*client, "warm-up").status().code() == StatusCode::kUnavailable);
  const auto start = std::chrono::steady_clock::now();
  StatusOr<Reply> r = Get(*client, "k", milliseconds(200));
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(r.status().message().find("CLUSTERDOWN"), std::string::npos);
  EXPECT_LT(took, milliseconds(400));
  EXPECT_GE(a.count("GET"), 3);  // retried with backoff, not once, not forever
}

TEST_F(ClusterClientFakeTest, RedirectionLoopIsBounded) {
  std::atomic<uint16_t> a_port{0}, b_port{0};
  auto ask_to = [](std::atomic<uint16_t>& to) {
    return [&to](const std::vector<std::string>& cmd, bool) -> std::string {
      if (cmd[0] == "CLUSTER") return ShardsAllTo(to);
      return "-ASK 5 127.0.0.1:" + std::to_string(to) + "\r\n";
    };
  };
  FakeNode a(ask_to(b_port));
  FakeNode b(ask_to(a_port));
  a_port = a.port();
  b_port = b.port();
  auto client = Connect(a.port());
  StatusOr<Reply> r = Get(*client, "k");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(r.status().message().find("redirections"), std::string::npos) << r.status().message();
}

TEST_F(ClusterClientFakeTest, MalformedRedirectionIsInternal) {
  std::atomic<uint16_t> self{0};
  FakeNode a([&](const std::vector<std::string>& cmd, bool) -> std::string {
    if (cmd[0] == "CLUSTER") return ShardsAllTo(self);
    return "-MOVED nonsense\r\n";
  });
  self = a.port();
  auto client = Connect(a.port());
  StatusOr<Reply> r = Get(*client, "k");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInternal);
}

TEST_F(ClusterClientFakeTest, UnreachableSeedFailsWithinTheDeadline) {
  uint16_t dead_port;
  {
    FakeNode gone([](const std::vector<std::string>&, bool) { return std::string(); });
    dead_port = gone.port();
  }
  auto client = Connect(dead_port);
  const auto start = std::chrono::steady_clock::now();
  StatusOr<Reply> r = Get(*client, "k", milliseconds(150));
  EXPECT_FALSE(r.ok());
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(400));
}

// A node the slot maps stop naming (pod churn) is dropped after 3 maps: its
// connections close and it is not dialled again; a later map naming its
// address revives it under the same id.
TEST_F(ClusterClientFakeTest, ANodeAbsentFromThreeMapsIsDropped) {
  std::atomic<uint16_t> owner{0};
  auto responder = [&](const std::vector<std::string>& cmd, bool) -> std::string {
    if (cmd[0] == "CLUSTER") return ShardsAllTo(owner.load());
    return Bulk("v");
  };
  FakeNode b(responder);
  FakeNode a(responder);
  owner = b.port();
  auto client = Connect(a.port());
  ASSERT_TRUE(Get(*client, "k").ok());
  const int b_id = client->NodeForSlot(0);
  EXPECT_EQ(client->live_node_count(), 2);
  EXPECT_EQ(b.open(), 1);
  std::vector<int> dropped;
  std::mutex dropped_mu;
  client->OnNodeDropped([&](int node) {
    std::lock_guard lock(dropped_mu);
    dropped.push_back(node);
  });
  auto refresh = [&] {
    const uint64_t n = client->refreshes();
    client->RequestRefresh();
    for (int i = 0; i < 200 && client->refreshes() == n; ++i) {
      std::this_thread::sleep_for(milliseconds(5));
    }
    ASSERT_GT(client->refreshes(), n);
  };
  owner = a.port();  // b is gone from the cluster
  refresh();
  refresh();
  EXPECT_EQ(client->live_node_count(), 2) << "dropped after 2 maps";
  refresh();
  EXPECT_EQ(client->live_node_count(), 1);
  for (int i = 0; i < 100 && b.open() > 0; ++i) std::this_thread::sleep_for(milliseconds(5));
  EXPECT_EQ(b.open(), 0) << "the dropped node's connection is still open";
  const int accepted = b.accepted();
  std::this_thread::sleep_for(milliseconds(300));  // past the reconnect backoff (250 ms)
  EXPECT_EQ(b.accepted(), accepted) << "the dropped node is dialled again";
  {
    std::lock_guard lock(dropped_mu);
    EXPECT_EQ(dropped, std::vector<int>{b_id});
  }
  owner = b.port();  // back
  refresh();
  EXPECT_EQ(client->NodeForSlot(0), b_id);
  EXPECT_EQ(client->live_node_count(), 2);
  ASSERT_TRUE(Get(*client, "k").ok());
  EXPECT_EQ(b.open(), 1);
  EXPECT_EQ(client->node_count(), 2);
}

}  // namespace
}  // namespace ratelimit::redis
