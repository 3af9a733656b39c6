// Listener: accepts connections on one address and starts a Session for each.
//
// Beyond `max_connections` live sessions a new connection is closed at once
// (the clients already connected keep being served). Each session gets its
// own strand on the shared io_context.
//
//   auto l = std::make_shared<Listener>(ioc, endpoint, router, limits, registry, 10000);
//   if (Status s = l->Open(); !s.ok()) ...;  l->Run();
//
// Thread-safety: Run and Stop may be called from any thread (they post to the
// listener's strand).
#pragma once

#include <memory>
#include <string>

#include "ratelimit/status.h"
#include "server/http.h"
#include "server/session.h"

namespace ratelimit::server {

// "127.0.0.1:8080", "[::1]:8080", "localhost:8080" (resolved), ":8080" (all v4).
StatusOr<tcp::endpoint> ResolveListenAddress(net::io_context& ioc, const std::string& hostport);

class Listener : public std::enable_shared_from_this<Listener> {
 public:
  Listener(net::io_context& ioc, tcp::endpoint endpoint, Router& router, SessionLimits limits,
           SessionRegistry& registry, size_t max_connections);

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
  Router& router_;
  SessionLimits limits_;
  SessionRegistry& registry_;
  size_t max_connections_;
};

}  // namespace ratelimit::server
