#include "support/redis_sentinel.h"

#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "support/subprocess.h"

namespace ratelimit::testing {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::vector<std::string> Lines(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  std::string line;
  while (std::getline(in, line)) out.push_back(line);
  return out;
}

// SENTINEL MASTER's flat "key\nvalue\n..." as a map.
std::map<std::string, std::string> Fields(const std::string& s) {
  std::map<std::string, std::string> out;
  const std::vector<std::string> l = Lines(s);
  for (size_t i = 0; i + 1 < l.size(); i += 2) out[l[i]] = l[i + 1];
  return out;
}

}  // namespace

RedisSentinel::RedisSentinel(RedisSentinelOptions options) : options_(std::move(options)) {
  std::vector<std::string> auth;
  if (!options_.password.empty()) {
    auth = {"--requirepass", options_.password, "--masterauth", options_.password};
  }
  std::vector<std::string> node = {"--repl-diskless-sync-delay", "0"};
  node.insert(node.end(), auth.begin(), auth.end());
  data_.push_back(std::make_unique<RedisServer>(RedisServerOptions{.args = node}));
  std::vector<std::string> replica = node;
  replica.insert(replica.end(), {"--replicaof", "127.0.0.1", std::to_string(data_[0]->port())});
  data_.push_back(std::make_unique<RedisServer>(RedisServerOptions{.args = replica}));

  const std::string& name = options_.master_name;
  for (int i = 0; i < 3; ++i) {
    // The conf lives beside the sentinel's own directory; sentinels rewrite it.
    const std::string conf = data_[0]->dir() + "/sentinel-" + std::to_string(i) + ".conf";
    std::ofstream out(conf);
    out << "sentinel monitor " << name << " 127.0.0.1 " << data_[0]->port() << " 2\n"
        << "sentinel down-after-milliseconds " << name << " " << options_.down_after.count() << "\n"
        << "sentinel failover-timeout " << name << " 10000\n"
        << "sentinel parallel-syncs " << name << " 1\n";
    if (!options_.password.empty()) {
      out << "sentinel auth-pass " << name << " " << options_.password << "\n";
    }
    if (!options_.sentinel_password.empty()) {
      out << "requirepass " << options_.sentinel_password << "\n"
          << "sentinel sentinel-pass " << options_.sentinel_password << "\n";
    }
    out.close();
    sentinels_.push_back(std::make_unique<RedisServer>(
        RedisServerOptions{.args = {"--sentinel"}, .config_file = conf}));
  }
  WaitUntilReady();
}

RedisSentinel::~RedisSentinel() {
  for (auto& s : sentinels_) s->Kill();
  for (auto& d : data_) d->Kill();
}

std::string RedisSentinel::url() const {
  std::string u = "redis+sentinel://";
  if (!options_.password.empty()) u += ":" + options_.password + "@";
  for (size_t i = 0; i < sentinels_.size(); ++i) {
    u += (i > 0 ? ",127.0.0.1:" : "127.0.0.1:") + std::to_string(sentinels_[i]->port());
  }
  u += "/" + options_.master_name;
  if (!options_.sentinel_password.empty()) u += "?sentinel_password=" + options_.sentinel_password;
  return u;
}

std::string RedisSentinel::Cli(RedisServer& server, const std::vector<std::string>& args) const {
  bool is_sentinel = false;
  for (const auto& s : sentinels_) is_sentinel = is_sentinel || s.get() == &server;
  const std::string& password = is_sentinel ? options_.sentinel_password : options_.password;
  if (password.empty()) return server.CliArgs(args);
  std::vector<std::string> argv = {"redis-cli", "--raw",  "--no-auth-warning",
                                   "-a",        password, "-h",
                                   "127.0.0.1", "-p",     std::to_string(server.port())};
  argv.insert(argv.end(), args.begin(), args.end());
  std::string out;
  if (RunCommand(argv, &out) != 0) throw std::runtime_error("redis-cli failed: " + out);
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

size_t RedisSentinel::IndexOfPort(int port) const {
  for (size_t i = 0; i < data_.size(); ++i) {
    if (data_[i]->port() == port) return i;
  }
  throw std::runtime_error("RedisSentinel: no data node on port " + std::to_string(port));
}

size_t RedisSentinel::MasterIndex() {
  for (auto& s : sentinels_) {
    if (!s->running()) continue;
    const std::vector<std::string> a =
        Lines(Cli(*s, {"SENTINEL", "get-master-addr-by-name", options_.master_name}));
    if (a.size() == 2) return IndexOfPort(std::stoi(a[1]));
  }
  throw std::runtime_error("RedisSentinel: no live sentinel names a master");
}

bool RedisSentinel::IsMaster(size_t i) {
  if (!data_.at(i)->running()) return false;
  const std::vector<std::string> role = Lines(Cli(*data_[i], {"ROLE"}));
  return !role.empty() && role[0] == "master";
}

size_t RedisSentinel::WaitForNewMaster(size_t old, milliseconds timeout) {
  const auto end = Clock::now() + timeout;
  while (Clock::now() < end) {
    try {
      bool agreed = true;
      size_t named = old;
      for (auto& s : sentinels_) {
        if (!s->running()) continue;
        const std::vector<std::string> a =
            Lines(Cli(*s, {"SENTINEL", "get-master-addr-by-name", options_.master_name}));
        const size_t m = a.size() == 2 ? IndexOfPort(std::stoi(a[1])) : old;
        if (m == old || (named != old && m != named)) agreed = false;
        named = m;
      }
      if (agreed && named != old && IsMaster(named)) return named;
    } catch (const std::exception&) {
      // a node answering nothing yet: ask again
    }
    std::this_thread::sleep_for(milliseconds(20));
  }
  throw std::runtime_error("RedisSentinel: no new master within the timeout");
}

void RedisSentinel::WaitUntilReady(milliseconds timeout) {
  const auto end = Clock::now() + timeout;
  std::string why;
  while (Clock::now() < end) {
    why.clear();
    const size_t master = MasterIndex();
    for (size_t i = 0; i < data_.size() && why.empty(); ++i) {
      if (i == master || !data_[i]->running()) continue;
      if (Cli(*data_[i], {"INFO", "replication"}).find("master_link_status:up") ==
          std::string::npos) {
        why = "replica " + std::to_string(data_[i]->port()) + " is not in sync";
      }
    }
    for (auto& s : sentinels_) {
      if (!why.empty() || !s->running()) continue;
      auto f = Fields(Cli(*s, {"SENTINEL", "MASTER", options_.master_name}));
      if (f["num-slaves"] != "1" || f["num-other-sentinels"] != "2" || f["flags"] != "master") {
        why = "sentinel " + std::to_string(s->port()) + " sees flags=" + f["flags"] +
              " num-slaves=" + f["num-slaves"] + " num-other-sentinels=" + f["num-other-sentinels"];
      }
    }
    if (why.empty()) return;
    std::this_thread::sleep_for(milliseconds(50));
  }
  throw std::runtime_error("RedisSentinel: not ready: " + why);
}

}  // namespace ratelimit::testing
