#include "server/listener.h"

#include "server/json_log.h"

namespace ratelimit::server {

StatusOr<tcp::endpoint> ResolveListenAddress(net::io_context& ioc, const std::string& hostport) {
  std::string host, port;
  if (!hostport.empty() && hostport.front() == '[') {
    const size_t close = hostport.find(']');
    if (close == std::string::npos || close + 1 >= hostport.size() || hostport[close + 1] != ':') {
      return InvalidArgument("bad listen address '" + hostport + "' (want [v6]:port)");
    }
    host = hostport.substr(1, close - 1);
    port = hostport.substr(close + 2);
  } else {
    const size_t colon = hostport.rfind(':');
    if (colon == std::string::npos) {
      return InvalidArgument("bad listen address '" + hostport + "' (want HOST:PORT)");
    }
    host = hostport.substr(0, colon);
    port = hostport.substr(colon + 1);
  }
  if (host.empty()) host = "0.0.0.0";
  if (port.empty() || port.find_first_not_of("0123456789") != std::string::npos ||
      port.size() > 5 || std::stoi(port) > 65535) {
    return InvalidArgument("bad port in listen address '" + hostport + "'");
  }
  beast::error_code ec;
  tcp::resolver resolver(ioc);
  auto results = resolver.resolve(host, port, tcp::resolver::numeric_service, ec);
  if (ec || results.empty()) {
    return InvalidArgument("cannot resolve listen address '" + hostport + "': " + ec.message());
  }
  return results.begin()->endpoint();
}

Listener::Listener(net::io_context& ioc, tcp::endpoint endpoint, Router& router,
                   SessionLimits limits, SessionRegistry& registry, size_t max_connections)
    : ioc_(ioc),
      endpoint_(endpoint),
      strand_(net::make_strand(ioc)),
      acceptor_(strand_),
      router_(router),
      limits_(limits),
      registry_(registry),
      max_connections_(max_connections) {}

Status Listener::Open() {
  beast::error_code ec;
  acceptor_.open(endpoint_.protocol(), ec);
  if (!ec) acceptor_.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) acceptor_.bind(endpoint_, ec);
  if (!ec) acceptor_.listen(net::socket_base::max_listen_connections, ec);
  if (ec) {
    return Unavailable("cannot listen on " + endpoint_.address().to_string() + ":" +
                       std::to_string(endpoint_.port()) + ": " + ec.message());
  }
  return Status::Ok();
}

tcp::endpoint Listener::local_endpoint() const {
  beast::error_code ec;
  return acceptor_.local_endpoint(ec);
}

void Listener::Run() {
  net::dispatch(strand_, [self = shared_from_this()] { self->Accept(); });
}

void Listener::Stop() {
  net::post(strand_, [self = shared_from_this()] {
    beast::error_code ec;
    self->acceptor_.close(ec);
  });
}

void Listener::Accept() {
  acceptor_.async_accept(net::make_strand(ioc_), [self = shared_from_this()](beast::error_code ec,
                                                                             tcp::socket socket) {
    if (ec == net::error::operation_aborted || !self->acceptor_.is_open()) return;
    if (ec) {
      // EMFILE and friends: log, back off a little, keep accepting.
      Log(Level::kWarn, "accept failed", {{"error", ec.message()}});
      auto timer =
          std::make_shared<net::steady_timer>(self->strand_, std::chrono::milliseconds(50));
      timer->async_wait([self, timer](beast::error_code) { self->Accept(); });
      return;
    }
    if (self->registry_.size() >= self->max_connections_) {
      beast::error_code ignored;
      socket.close(ignored);  // over the cap: the connected clients keep their service
    } else {
      beast::error_code ignored;
      socket.set_option(tcp::no_delay(true), ignored);
      std::make_shared<Session>(std::move(socket), self->router_, self->limits_, self->registry_)
          ->Start();
    }
    self->Accept();
  });
}

}  // namespace ratelimit::server
