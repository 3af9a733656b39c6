#include "server/listener.h"

#include "core/accept_retry.h"
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

namespace {

bool InAny(const std::vector<policy::Cidr>& cidrs, const policy::IpAddress& peer) {
  for (const policy::Cidr& c : cidrs) {
    if (c.Contains(peer)) return true;
  }
  return false;
}

}  // namespace

bool ConnectionCounts::Exempt(const policy::IpAddress& peer) const {
  if (caps_.policies == nullptr) return InAny(caps_.exempt, peer);
  const std::shared_ptr<const policy::Policy> p = caps_.policies->Get();
  return InAny(p->config().clients.trusted_proxies, peer);
}

std::shared_ptr<void> ConnectionCounts::Acquire(const std::shared_ptr<ConnectionCounts>& self,
                                                const policy::IpAddress& peer, bool* exempt) {
  ConnectionCounts& c = *self;
  bool is_exempt = false;
  int v6_prefix = c.caps_.v6_prefix;
  if (c.caps_.policies == nullptr) {
    is_exempt = InAny(c.caps_.exempt, peer);
  } else {  // the clients section in effect now (a reload changes it)
    const std::shared_ptr<const policy::Policy> p = c.caps_.policies->Get();
    is_exempt = InAny(p->config().clients.trusted_proxies, peer);
    v6_prefix = p->config().clients.ipv6_prefix;
  }
  if (exempt != nullptr) *exempt = is_exempt;
  // The slot keeps its key: one counted under an older prefix is given back
  // under that key.
  std::string key;
  if (c.caps_.max_per_address > 0 && !is_exempt) key = peer.KeyString(v6_prefix);
  LockGuard lock(c.mu_);
  if (c.total_ >= c.caps_.max_connections) return nullptr;
  if (!key.empty()) {
    size_t& n = c.by_peer_[key];
    if (n >= c.caps_.max_per_address) return nullptr;  // n > 0 here: the entry existed
    ++n;
  }
  ++c.total_;
  return std::make_shared<Slot>(self, std::move(key));
}

ConnectionCounts::Slot::~Slot() {
  LockGuard lock(counts->mu_);
  --counts->total_;
  if (key.empty()) return;
  auto it = counts->by_peer_.find(key);
  if (--it->second == 0) counts->by_peer_.erase(it);
}

Listener::Listener(net::io_context& ioc, tcp::endpoint endpoint, RequestHandler& router,
                   SessionLimits limits, SessionRegistry& registry, ConnectionCaps caps,
                   bool one_thread)
    : ioc_(ioc),
      endpoint_(std::move(endpoint)),
      strand_(net::make_strand(ioc)),
      acceptor_(strand_),
      router_(router),
      limits_(limits),
      registry_(registry),
      counts_(std::make_shared<ConnectionCounts>(std::move(caps))),
      one_thread_(one_thread) {}

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
  const net::any_io_executor executor = one_thread_ ? net::any_io_executor(ioc_.get_executor())
                                                    : net::any_io_executor(net::make_strand(ioc_));
  acceptor_.async_accept(
      executor, [self = shared_from_this()](beast::error_code ec, tcp::socket socket) {
        if (ec == net::error::operation_aborted || !self->acceptor_.is_open()) return;
        if (ec) {
          // EMFILE and friends: log, back off a little, keep accepting.
          Log(Level::kWarn, "accept failed", {{"error", ec.message()}});
          auto timer = std::make_shared<net::steady_timer>(self->strand_, core::kAcceptRetryDelay);
          timer->async_wait([self, timer](beast::error_code) { self->Accept(); });
          return;
        }
        beast::error_code ignored;
        socket.set_option(tcp::no_delay(true), ignored);
        auto session = std::make_shared<Session>(std::move(socket), self->router_, self->limits_,
                                                 self->registry_);
        // Over a cap: dropping the session closes the socket; the clients
        // already connected keep their service.
        bool exempt = false;
        if (std::shared_ptr<void> slot =
                ConnectionCounts::Acquire(self->counts_, session->peer(), &exempt)) {
          session->Start(std::move(slot), !exempt);
        }
        self->Accept();
      });
}

}  // namespace ratelimit::server
