// build/rl-lab against a real redis-server prints the lab's lines.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <future>
#include <memory>
#include <string>
#include <thread>

#include "support/redis_server.h"

namespace {

struct LabRun {
  std::string out;  // stdout and stderr
  int exit_status = -1;
};

LabRun RunCommand(const std::string& cmd) {
  LabRun r;
  FILE* pipe = popen((cmd + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return r;
  std::array<char, 512> buf;
  while (fgets(buf.data(), buf.size(), pipe) != nullptr) r.out += buf.data();
  const int status = pclose(pipe);
  if (WIFEXITED(status)) r.exit_status = WEXITSTATUS(status);
  return r;
}

constexpr const char* kLines =
    "first denial: remaining=0 retry_after=200ms\n"
    "burst of 12 across two instances: 10 allowed, 2 denied\n"
    "after one second at 5 tokens/s: 5 of 8 allowed\n"
    "another key is untouched: allowed=true remaining=9\n"
    "200 concurrent requests, capacity 10: 10 allowed\n"
    "redis down, failOpen=true  -> allowed=true (error reported: true)\n"
    "redis down, failOpen=false -> allowed=false (error reported: true)\n";

// REDIS_ADDR as host:port (the seeds' form) or as a redis:// URL.
TEST(Lab, PrintsTheSeedsLines) {
  ratelimit::testing::RedisServer redis;
  const std::string addr = "127.0.0.1:" + std::to_string(redis.port());
  for (const std::string& form : {addr, "redis://" + addr}) {
    const LabRun run = RunCommand("REDIS_ADDR=" + form + " " RL_LAB_PATH);
    EXPECT_EQ(run.out, kLines) << form;
    EXPECT_EQ(run.exit_status, 0) << form;
  }
}

// A failed call would read as a denial in steps 2-4: the lab says so and
// exits 1 instead of printing figures that look like a limiter's. Redis dies
// during step 2's one-second sleep, after step 1 has run.
TEST(Lab, AFailedCallIsReportedNotCountedAsADenialSilently) {
  ratelimit::testing::RedisServer redis;
  auto run = std::async(std::launch::async, [port = redis.port()] {
    return RunCommand("REDIS_ADDR=127.0.0.1:" + std::to_string(port) + " " RL_LAB_PATH);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  redis.Kill();
  const LabRun r = run.get();
  EXPECT_NE(r.out.find("burst of 12 across two instances: 10 allowed"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("call(s) failed"), std::string::npos) << r.out;
  EXPECT_EQ(r.exit_status, 1) << r.out;
}

TEST(Lab, ArgumentsOrNoAddressAreAUsageError) {
  const LabRun run = RunCommand("REDIS_ADDR=127.0.0.1:1 " RL_LAB_PATH " --help");
  EXPECT_EQ(run.exit_status, 2);
  EXPECT_NE(run.out.find("usage: REDIS_ADDR=host:port"), std::string::npos) << run.out;
  EXPECT_EQ(RunCommand("env -u REDIS_ADDR " RL_LAB_PATH).exit_status, 2);
}

}  // namespace
