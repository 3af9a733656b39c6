// Listener: accepts connections on one address and starts a Session for each.
//
// Beyond `max_connections` live sessions of this listener, or
// `max_per_address` from one client address (IPv6: per `v6_prefix`; peers in
// `exempt` are not capped), a new connection is closed at once: the clients
// already connected keep being served, and one address cannot take every
// slot (slowloris, connection floods). Each session gets its own strand on
// the shared io_context (none when the io_context has one thread).
//
//   auto l = std::make_shared<Listener>(ioc, endpoint, router, limits, registry,
//                                       ConnectionCaps{.max_connections = 10000});
//   if (Status s = l->Open(); !s.ok()) ...;  l->Run();
//
// Thread-safety: Run and Stop may be called from any thread (they post to the
// listener's strand).
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "policy/ip.h"

#include "ratelimit/status.h"
#include "ratelimit/thread_annotations.h"
#include "server/http.h"
#include "server/listen_address.h"
#include "server/policy_holder.h"
#include "server/session.h"

namespace ratelimit::server {

struct ConnectionCaps {
  size_t max_connections = 10'000;
  size_t max_per_address = 0;  // 0 = no cap
  int v6_prefix = 64;
  std::vector<policy::Cidr> exempt;  // trusted proxies: no per-address cap, no request pacing
  // When set, v6_prefix and exempt are not used: each accepted connection
  // reads them from the current policy (clients.ipv6_prefix and
  // clients.trusted_proxies), so a reload applies them as it does to the
  // client identity. The holder must outlive the listener.
  const PolicyHolder* policies = nullptr;
};

// Live connections of one listener, in total and per client address.
// Thread-safety: thread-safe; a slot may be released on any thread.
class ConnectionCounts {
 public:
  explicit ConnectionCounts(ConnectionCaps caps) : caps_(std::move(caps)) {}
  // A slot held while the connection lives, or nullptr when a cap is reached.
  // `exempt` (if given): whether the peer is exempt (as Exempt says, from
  // the same reading of the policy).
  static std::shared_ptr<void> Acquire(const std::shared_ptr<ConnectionCounts>& self,
                                       const policy::IpAddress& peer, bool* exempt = nullptr);
  bool Exempt(const policy::IpAddress& peer) const;

 private:
  // Gives its place back when the last reference goes.
  struct Slot {
    Slot(std::shared_ptr<ConnectionCounts> c, std::string k)
        : counts(std::move(c)), key(std::move(k)) {}
    ~Slot();
    std::shared_ptr<ConnectionCounts> counts;
    std::string key;  // "" = not counted per address
  };

  const ConnectionCaps caps_;
  Mutex mu_;
  size_t total_ RL_GUARDED_BY(mu_) = 0;
  std::unordered_map<std::string, size_t> by_peer_ RL_GUARDED_BY(mu_);
};

class Listener : public std::enable_shared_from_this<Listener> {
 public:
  // `one_thread`: the io_context is run by one thread only, so its executor
  // already runs every handler in turn and connections need no strand (a
  // strand per connection costs an allocation, a shared count and a queue).
  Listener(net::io_context& ioc, tcp::endpoint endpoint, RequestHandler& router,
           SessionLimits limits, SessionRegistry& registry, ConnectionCaps caps,
           bool one_thread = false);

  Status Open();
  // The bound address (after Open; the real port when 0 was asked).
  tcp::endpoint local_endpoint() const;
  void Run();
  void Stop();

 private:
  void Accept();

  net::io_context& ioc_;
  tcp::endpoint endpoint_;
  net::strand<net::io_context::executor_type> strand_;
  tcp::acceptor acceptor_;
  RequestHandler& router_;
  SessionLimits limits_;
  SessionRegistry& registry_;
  std::shared_ptr<ConnectionCounts> counts_;
  const bool one_thread_;
};

}  // namespace ratelimit::server
