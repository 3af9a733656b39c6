// TcpProxy: forwards the TCP connections it accepts on 127.0.0.1 to a port
// of 127.0.0.1, as a DNS name or a virtual IP in front of Redis does:
// SetTarget moves it to another port for the connections accepted after,
// while those accepted before keep their peer (a failover that moves the
// name leaves the old master's clients connected to it).
//
//   RedisServer x, y;
//   TcpProxy proxy(x.port());
//   options.url = "redis://127.0.0.1:" + std::to_string(proxy.port());
//   proxy.SetTarget(y.port());                      // new connections reach y
//
// Ownership: owns the listening socket, the forwarded connections and the
// thread that moves their bytes; the destructor joins it and closes them all.
// Thread-safety: port(), SetTarget() and accepted() from any thread.
#pragma once

#include <atomic>
#include <cstdint>

#include "support/fake_tcp_server.h"

namespace ratelimit::testing {

class TcpProxy {
 public:
  explicit TcpProxy(uint16_t target);
  TcpProxy(const TcpProxy&) = delete;
  TcpProxy& operator=(const TcpProxy&) = delete;

  uint16_t port() const { return listener_.port(); }
  void SetTarget(uint16_t target) { target_.store(target); }
  // Connections accepted so far.
  int accepted() const { return accepted_.load(); }

 private:
  void Run();

  std::atomic<uint16_t> target_;
  std::atomic<int> accepted_{0};
  LoopbackListener listener_{"TcpProxy"};  // last: its thread stops first
};

}  // namespace ratelimit::testing
