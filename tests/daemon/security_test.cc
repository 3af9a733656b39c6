// The daemon's own security against the real binary: the privilege drop
// (--user/--group) and secrets (the Redis password, the admin token) kept out
// of the logs and the config dump.
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <string>

#include "harness.h"
#include "support/redis_server.h"

namespace rltest {
namespace {

using std::chrono::seconds;

// The "Uid:" or "Gid:" line of /proc/<pid>/status, tabs as spaces.
std::string StatusLine(pid_t pid, const std::string& field) {
  const std::string s = ReadFile("/proc/" + std::to_string(pid) + "/status");
  const size_t at = s.find("\n" + field + ":");
  if (at == std::string::npos) return "";
  std::string line = s.substr(at + 1, s.find('\n', at + 1) - at - 1);
  for (char& c : line) c = c == '\t' ? ' ' : c;
  return line;
}

TEST(PrivilegeDrop, UnknownUserIsAClearStartupError) {
  Daemon d({"--user", "no-such-user-rl9"});
  EXPECT_FALSE(d.started());
  EXPECT_TRUE(d.WaitForLog("unknown user 'no-such-user-rl9'", seconds(10))) << d.Log();
  EXPECT_EQ(d.Log().find("\"msg\":\"listening\""), std::string::npos) << "failed before binding";
}

TEST(PrivilegeDrop, UnknownGroupAndGroupWithoutUserAreErrors) {
  Daemon g({"--user", "nobody", "--group", "no-such-group-rl9"});
  EXPECT_FALSE(g.started());
  EXPECT_TRUE(g.WaitForLog("unknown group 'no-such-group-rl9'", seconds(10))) << g.Log();
  Daemon n({"--group", "nogroup"});
  EXPECT_FALSE(n.started());
  EXPECT_TRUE(n.WaitForLog("--group needs --user", seconds(10))) << n.Log();
}

TEST(PrivilegeDrop, SwitchesToNobodyAfterBinding) {
  if (geteuid() != 0) {
    // Not root: switching is impossible and must be refused, not ignored.
    Daemon d({"--user", "nobody"});
    EXPECT_FALSE(d.started());
    EXPECT_TRUE(d.WaitForLog("cannot switch user or group without root", seconds(10))) << d.Log();
    return;
  }
  // Root: bind, then run as nobody:nogroup with no supplementary groups.
  Daemon d({"--user", "nobody"});
  ASSERT_TRUE(d.started()) << d.Log();
  ASSERT_TRUE(d.WaitForLog("\"msg\":\"privileges dropped\"", seconds(10))) << d.Log();
  EXPECT_EQ(StatusLine(d.pid(), "Uid"), "Uid: 65534 65534 65534 65534");
  EXPECT_EQ(StatusLine(d.pid(), "Gid"), "Gid: 65534 65534 65534 65534");
  EXPECT_EQ(StatusLine(d.pid(), "Groups"), "Groups: 65534 ");
  // Every thread, the store's and the I/O threads included.
  const std::string tasks = "/proc/" + std::to_string(d.pid()) + "/task";
  int threads = 0;
  if (DIR* dir = ::opendir(tasks.c_str())) {
    while (dirent* e = ::readdir(dir)) {
      if (e->d_name[0] == '.') continue;
      ++threads;
      const std::string s = ReadFile(tasks + "/" + e->d_name + "/status");
      EXPECT_NE(s.find("\nUid:\t65534\t65534\t65534\t65534\n"), std::string::npos) << e->d_name;
    }
    ::closedir(dir);
  }
  EXPECT_GE(threads, 2);
  EXPECT_EQ(Http(d.port(), "GET", "/api/ping", {{"X-API-Key", "a"}}).status, 200);
  EXPECT_EQ(Http(d.admin_port(), "GET", "/healthz").status, 200);
}

TEST(Secrets, RedisPasswordNeverLoggedNorShown) {
  ratelimit::testing::RedisServer redis;
  const std::string password = "pw-Secret-7c1e";
  redis.Cli("CONFIG", "SET", "requirepass", password);
  const std::string port = std::to_string(redis.port());
  {
    Daemon d({"--redis", "redis://:" + password + "@127.0.0.1:" + port});
    ASSERT_TRUE(d.started()) << d.Log();
    HttpResponse r = Http(d.port(), "GET", "/api/ping", {{"X-API-Key", "a"}});
    EXPECT_EQ(r.status, 200);
    EXPECT_FALSE(r.Has("X-RateLimit-Degraded")) << "the password works";
    HttpResponse config = Http(d.admin_port(), "GET", "/v1/config");
    ASSERT_EQ(config.status, 200);
    EXPECT_NE(config.body.find("redis://:***@127.0.0.1:" + port), std::string::npos) << config.body;
    EXPECT_EQ(config.body.find(password), std::string::npos);
    d.Signal(SIGTERM);
    d.Wait(std::chrono::seconds(10));
    EXPECT_EQ(d.Log().find(password), std::string::npos) << d.Log();
  }
  {
    // A wrong password: the errors it causes are logged, the password is not.
    const std::string wrong = "wrong-Secret-91ad";
    Daemon d({"--redis", "redis://user1:" + wrong + "@127.0.0.1:" + port});
    ASSERT_TRUE(d.started()) << d.Log();
    HttpResponse r = Http(d.port(), "GET", "/api/ping", {{"X-API-Key", "a"}});
    EXPECT_EQ(r.Header("X-RateLimit-Degraded"), "true");
    HttpResponse ready = Http(d.admin_port(), "GET", "/readyz");
    EXPECT_EQ(Http(d.admin_port(), "GET", "/v1/config").body.find(wrong), std::string::npos);
    d.Signal(SIGTERM);
    d.Wait(std::chrono::seconds(10));
    EXPECT_EQ(d.Log().find(wrong), std::string::npos) << d.Log();
    EXPECT_EQ(ready.body.find(wrong), std::string::npos) << ready.body;
  }
}

}  // namespace
}  // namespace rltest
