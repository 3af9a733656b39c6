#include "redis/reply.h"

#include <gtest/gtest.h>

namespace ratelimit::redis {
namespace {

std::vector<Reply> ReadAll(ReplyReader& reader) {
  std::vector<Reply> out;
  while (true) {
    auto next = reader.Next();
    EXPECT_TRUE(next.ok()) << next.status().message();
    if (!next.ok() || !next->has_value()) return out;
    out.push_back(std::move(**next));
  }
}

TEST(ReplyReader, EveryType) {
  ReplyReader reader;
  ASSERT_TRUE(reader
                  .Feed("+OK\r\n-ERR bad\r\n:-42\r\n$3\r\nabc\r\n$-1\r\n*-1\r\n"
                        "*3\r\n:1\r\n*1\r\n$0\r\n\r\n$-1\r\n")
                  .ok());
  std::vector<Reply> r = ReadAll(reader);
  ASSERT_EQ(r.size(), 7u);
  EXPECT_EQ(r[0], Reply::Status("OK"));
  EXPECT_EQ(r[1], Reply::Error("ERR bad"));
  EXPECT_TRUE(r[1].IsErrorWithPrefix("ERR"));
  EXPECT_EQ(r[2], Reply::Integer(-42));
  EXPECT_EQ(r[3], Reply::String("abc"));
  EXPECT_TRUE(r[4].IsNil());
  EXPECT_TRUE(r[5].IsNil());
  EXPECT_EQ(r[6],
            Reply::Array({Reply::Integer(1), Reply::Array({Reply::String("")}), Reply::Nil()}));
  EXPECT_EQ(r[6].DebugString(), "[1, [\"\"], (nil)]");
}

TEST(ReplyReader, ByteAtATime) {
  const std::string bytes = "*2\r\n$5\r\nhello\r\n:7\r\n";
  ReplyReader reader;
  for (size_t i = 0; i + 1 < bytes.size(); ++i) {
    ASSERT_TRUE(reader.Feed(bytes.substr(i, 1)).ok());
    auto next = reader.Next();
    ASSERT_TRUE(next.ok());
    EXPECT_FALSE(next->has_value()) << "complete after " << i + 1 << " bytes";
  }
  ASSERT_TRUE(reader.Feed(bytes.substr(bytes.size() - 1)).ok());
  auto next = reader.Next();
  ASSERT_TRUE(next.ok() && next->has_value());
  EXPECT_EQ(**next, Reply::Array({Reply::String("hello"), Reply::Integer(7)}));
}

TEST(ReplyReader, GarbageIsAProtocolError) {
  ReplyReader reader;
  ASSERT_TRUE(reader.Feed("hello world\r\n").ok());
  auto next = reader.Next();
  ASSERT_FALSE(next.ok());
  EXPECT_EQ(next.status().code(), StatusCode::kInternal);
  EXPECT_TRUE(next.status().message().starts_with("protocol error: ")) << next.status().message();
}

TEST(ReplyReader, BadLengthIsAProtocolError) {
  ReplyReader reader;
  ASSERT_TRUE(reader.Feed("$abc\r\n").ok());
  EXPECT_FALSE(reader.Next().ok());
}

// The texts Redis 7.0 sends (a script's error keeps the code of the command
// that failed in it, and adds where: "... script: <sha>, on @user_script:1.").
TEST(Reply, UnavailableErrorsAreTheNodesWordThatItCannotServeNow) {
  for (std::string_view e :
       {"LOADING Redis is loading the dataset in memory",
        "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSCRIPT.",
        "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
        "CLUSTERDOWN The cluster is down", "CLUSTERDOWN Hash slot not served",
        "READONLY You can't write against a read only replica.",
        "READONLY You can't write against a read only replica. script: 4f0b, on "
        "@user_script:12.",
        "BUSY", "OOM command not allowed when used memory > 'maxmemory'.",
        "MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist "
        "to disk.",
        "NOREPLICAS Not enough good replicas to write."}) {
    EXPECT_TRUE(Reply::Error(std::string(e)).IsUnavailableError()) << e;
  }
  for (std::string_view e :
       {"ERR Error running script", "WRONGTYPE Operation against a key holding the wrong kind",
        "NOSCRIPT No matching script. Please use EVAL.", "MOVED 15495 127.0.0.1:7403",
        "ASK 449 127.0.0.1:7402", "TRYAGAIN Multiple keys request during rehashing of slot",
        "BUSYKEY Target key name already exists.", "BUSYGROUP Consumer Group name already exists",
        "LOADINGX", "READONLYish", "", "ERR READONLY", "OOMX"}) {
    EXPECT_FALSE(Reply::Error(std::string(e)).IsUnavailableError()) << e;
  }
  // Only error replies: the same text as data is data.
  EXPECT_FALSE(Reply::String("LOADING").IsUnavailableError());
  EXPECT_FALSE(Reply::Status("BUSY").IsUnavailableError());
}

}  // namespace
}  // namespace ratelimit::redis
