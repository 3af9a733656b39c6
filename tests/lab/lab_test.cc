// build/rl-lab against a real redis-server prints the lab's lines.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <memory>
#include <string>

#include "support/redis_server.h"

namespace {

std::string RunCommand(const std::string& cmd) {
  std::string out;
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(cmd.c_str(), "r"), pclose);
  std::array<char, 512> buf;
  while (pipe && fgets(buf.data(), buf.size(), pipe.get()) != nullptr) out += buf.data();
  return out;
}

TEST(Lab, PrintsTheSeedsLines) {
  ratelimit::testing::RedisServer redis;
  const std::string out =
      RunCommand("REDIS_ADDR=127.0.0.1:" + std::to_string(redis.port()) + " " RL_LAB_PATH " 2>&1");
  EXPECT_EQ(out,
            "first denial: remaining=0 retry_after=200ms\n"
            "burst of 12 across two instances: 10 allowed, 2 denied\n"
            "after one second at 5 tokens/s: 5 of 8 allowed\n"
            "another key is untouched: allowed=true remaining=9\n"
            "200 concurrent requests, capacity 10: 10 allowed\n"
            "redis down, failOpen=true  -> allowed=true (error reported: true)\n"
            "redis down, failOpen=false -> allowed=false (error reported: true)\n");
}

}  // namespace
