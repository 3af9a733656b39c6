#include "support/redis_cluster.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "support/subprocess.h"

namespace ratelimit::testing {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string part;
  while (std::getline(ss, part, sep)) {
    if (!part.empty()) out.push_back(part);
  }
  return out;
}

// One line of CLUSTER NODES.
struct NodeLine {
  std::string id;
  uint16_t port = 0;
  std::string flags;
  std::vector<std::string> slots;  // "0-5460", "5461", "[12->-id]" (migration marks)
  bool master() const { return flags.find("master") != std::string::npos; }
  bool failed() const { return flags.find("fail") != std::string::npos; }
  bool Serves(uint16_t slot) const {
    for (const std::string& r : slots) {
      if (r.starts_with("[")) continue;
      const size_t dash = r.find('-');
      const int first = std::stoi(r.substr(0, dash));
      const int last = dash == std::string::npos ? first : std::stoi(r.substr(dash + 1));
      if (slot >= first && slot <= last) return true;
    }
    return false;
  }
};

std::vector<NodeLine> ParseNodes(const std::string& text) {
  std::vector<NodeLine> out;
  for (const std::string& line : Split(text, '\n')) {
    std::vector<std::string> f = Split(line, ' ');
    if (f.size() < 8) continue;
    NodeLine n;
    n.id = f[0];
    const std::string& addr = f[1];  // ip:port@cport[,hostname]
    const size_t colon = addr.rfind(':', addr.find('@'));
    n.port = static_cast<uint16_t>(std::stoi(addr.substr(colon + 1, addr.find('@') - colon - 1)));
    n.flags = f[2];
    n.slots.assign(f.begin() + 8, f.end());
    out.push_back(std::move(n));
  }
  return out;
}

// A free port P with P + 10000 (the cluster bus port) free too, so P <= 55535.
uint16_t PickClusterPort() {
  for (int attempt = 0; attempt < 1000; ++attempt) {
    const uint16_t p = PickFreePort();
    if (p > 55535) continue;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(p + 10000));
    const bool bus_free = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    close(fd);
    if (bus_free) return p;
  }
  throw std::runtime_error("RedisCluster: no free port pair (P, P + 10000) found");
}

}  // namespace

RedisCluster::RedisCluster(RedisClusterOptions options) : options_(options) {
  if (FindExecutable("redis-cli").empty()) {
    throw std::runtime_error("redis-cli not found on PATH; the cluster tests need it");
  }
  const int total = options_.masters * (1 + options_.replicas_per_master);
  for (int i = 0; i < total; ++i) {
    nodes_.push_back(std::make_unique<RedisServer>(RedisServerOptions{
        .args = {"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                 "--cluster-node-timeout", std::to_string(options_.node_timeout.count()),
                 "--repl-diskless-sync-delay", "0"},
        .port = PickClusterPort()}));
  }
  std::vector<std::string> argv = {"redis-cli", "--cluster", "create"};
  for (const auto& n : nodes_) argv.push_back("127.0.0.1:" + std::to_string(n->port()));
  argv.insert(argv.end(), {"--cluster-replicas", std::to_string(options_.replicas_per_master),
                           "--cluster-yes"});
  std::string out;
  if (RunCommand(argv, &out) != 0) {
    throw std::runtime_error("redis-cli --cluster create failed:\n" + out);
  }
  WaitUntilHealthy();
}

RedisCluster::~RedisCluster() {
  for (auto& n : nodes_) n->Kill();
}

std::string RedisCluster::url() const {
  std::string u = "redis+cluster://";
  for (size_t i = 0; i < nodes_.size(); ++i) {
    u += (i > 0 ? ",127.0.0.1:" : "127.0.0.1:") + std::to_string(nodes_[i]->port());
  }
  return u;
}

size_t RedisCluster::IndexOfPort(uint16_t port) const {
  for (size_t i = 0; i < nodes_.size(); ++i) {
    if (nodes_[i]->port() == port) return i;
  }
  throw std::runtime_error("RedisCluster: no node on port " + std::to_string(port));
}

size_t RedisCluster::AnyRunningNode() const {
  for (size_t i = 0; i < nodes_.size(); ++i) {
    if (nodes_[i]->running()) return i;
  }
  throw std::runtime_error("RedisCluster: no node is running");
}

size_t RedisCluster::MasterOfSlot(uint16_t slot) {
  for (const NodeLine& n : ParseNodes(node(AnyRunningNode()).Cli("CLUSTER", "NODES"))) {
    if (n.master() && !n.failed() && n.Serves(slot)) return IndexOfPort(n.port);
  }
  throw std::runtime_error("RedisCluster: no live master serves slot " + std::to_string(slot));
}

std::vector<size_t> RedisCluster::Masters() {
  std::vector<size_t> out;
  for (const NodeLine& n : ParseNodes(node(AnyRunningNode()).Cli("CLUSTER", "NODES"))) {
    if (n.master() && !n.failed() && !n.slots.empty()) out.push_back(IndexOfPort(n.port));
  }
  std::sort(out.begin(), out.end());
  return out;
}

bool RedisCluster::IsMaster(size_t i) { return node(i).Cli("ROLE").starts_with("master"); }

std::string RedisCluster::NodeId(size_t i) { return node(i).Cli("CLUSTER", "MYID"); }

std::string RedisCluster::SlotSignature(size_t i) {
  std::vector<std::string> parts;
  for (const NodeLine& n : ParseNodes(node(i).Cli("CLUSTER", "NODES"))) {
    if (!n.master() || n.slots.empty()) continue;
    std::string p = (n.failed() ? "FAILED:" : "") + std::to_string(n.port) + ":";
    for (const std::string& s : n.slots) {
      if (!s.starts_with("[")) p += s + ",";
    }
    parts.push_back(p);
  }
  std::sort(parts.begin(), parts.end());
  std::string sig;
  for (const std::string& p : parts) sig += p + ";";
  return sig;
}

void RedisCluster::WaitUntilHealthy(milliseconds timeout) {
  const auto end = Clock::now() + timeout;
  std::string why;
  while (true) {
    why.clear();
    try {
      std::string signature;
      for (size_t i = 0; i < nodes_.size() && why.empty(); ++i) {
        if (!nodes_[i]->running()) continue;
        RedisServer& n = *nodes_[i];
        if (n.Cli("CLUSTER", "INFO").find("cluster_state:ok") == std::string::npos) {
          why = "node " + std::to_string(n.port()) + " is not cluster_state:ok";
          break;
        }
        const std::string sig = SlotSignature(i);
        if (sig.find("FAILED:") != std::string::npos) {
          why = "node " + std::to_string(n.port()) + " sees a failed master: " + sig;
        } else if (signature.empty()) {
          signature = sig;
        } else if (sig != signature) {
          why = "nodes disagree on the slot map: " + signature + " vs " + sig;
        }
        const std::string repl = n.Cli("INFO", "replication");
        if (repl.find("role:slave") != std::string::npos &&
            repl.find("master_link_status:up") == std::string::npos) {
          why = "replica " + std::to_string(n.port()) + " has no link to its master";
        }
      }
    } catch (const std::exception& e) {
      why = e.what();
    }
    if (why.empty()) return;
    if (Clock::now() >= end) throw std::runtime_error("RedisCluster not healthy in time: " + why);
    std::this_thread::sleep_for(milliseconds(20));
  }
}

void RedisCluster::BeginMigration(uint16_t slot, size_t from, size_t to) {
  const std::string s = std::to_string(slot);
  std::string r = node(to).Cli("CLUSTER", "SETSLOT", s, "IMPORTING", NodeId(from));
  if (r != "OK") throw std::runtime_error("SETSLOT IMPORTING: " + r);
  r = node(from).Cli("CLUSTER", "SETSLOT", s, "MIGRATING", NodeId(to));
  if (r != "OK") throw std::runtime_error("SETSLOT MIGRATING: " + r);
}

int RedisCluster::MigrateKeys(uint16_t slot, size_t from, size_t to) {
  int moved = 0;
  while (true) {
    std::vector<std::string> keys =
        Split(node(from).Cli("CLUSTER", "GETKEYSINSLOT", std::to_string(slot), "100"), '\n');
    if (keys.empty()) return moved;
    std::vector<std::string> args = {
        "MIGRATE", "127.0.0.1", std::to_string(node(to).port()), "", "0", "5000", "KEYS"};
    args.insert(args.end(), keys.begin(), keys.end());
    const std::string r = node(from).CliArgs(args);
    if (r != "OK" && r != "NOKEY") throw std::runtime_error("MIGRATE: " + r);
    moved += static_cast<int>(keys.size());
  }
}

void RedisCluster::FinishMigration(uint16_t slot, size_t to) {
  const std::string s = std::to_string(slot);
  const std::string id = NodeId(to);
  // The new owner first, then the others (as redis-cli --cluster reshard does).
  std::vector<size_t> order = {to};
  for (size_t m : Masters()) {
    if (m != to) order.push_back(m);
  }
  for (size_t m : order) {
    const std::string r = node(m).Cli("CLUSTER", "SETSLOT", s, "NODE", id);
    if (r != "OK") throw std::runtime_error("SETSLOT NODE on " + std::to_string(m) + ": " + r);
  }
}

}  // namespace ratelimit::testing
