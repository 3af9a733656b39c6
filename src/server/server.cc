#include "server/server.h"

#include <algorithm>
#include <atomic>
#include <csignal>
#include <thread>
#include <vector>

#include "server/admin.h"
#include "server/concurrency_guard.h"
#include "server/demo.h"
#include "server/enforcer.h"
#include "server/gateway.h"
#include "server/http.h"
#include "server/in_turns.h"
#include "server/json_log.h"
#include "server/listener.h"
#include "server/metrics.h"
#include "server/policy_holder.h"
#include "server/router.h"
#include "server/session.h"
#include "server/store_factory.h"

namespace ratelimit::server {

struct Server::Impl {
  Impl(std::shared_ptr<const policy::Policy> p, ServerOptions o)
      : options(std::move(o)),
        start_config(p->config()),
        policies(std::move(p)),
        // One I/O thread: tell Asio, which then queues the handlers that
        // thread posts to itself without taking the scheduler's lock.
        ioc(OneThread() ? 1 : BOOST_ASIO_CONCURRENCY_HINT_DEFAULT),
        signals(ioc, SIGINT, SIGTERM, SIGHUP),
        sweep_timer(ioc),
        drain_timer(ioc) {}

  // The store goes first. A RedisStore's destructor closes its client and
  // completes the calls still pending, on its own I/O thread; their callbacks
  // run through the enforcer into sessions, the router and the io_context. So
  // it must run while all of those exist (the io_context is stopped by then:
  // what the callbacks post to it is dropped with it). Destroyed in member
  // order instead, the last reference (here) would go after all of them.
  ~Impl() {
    // The same for the concurrency store: its pending releases complete (and
    // answer their sessions) now, while the io_context exists; leases still
    // held by requests queued in the io_context are left to expire.
    if (limiter) limiter->DetachStore();
    concurrency_store.reset();
    if (enforcer) enforcer->SetOverrides(nullptr);
    overrides.reset();  // its timer is on the io_context
    std::shared_ptr<Store> last = enforcer ? enforcer->ReleaseStore() : nullptr;
    last.reset();
    store.reset();  // the last reference: a RedisStore closes and drains here
  }

  // server.threads is 1: that thread runs every handler in turn, so neither
  // client nor upstream connections need a strand.
  bool OneThread() const { return start_config.server.threads == 1; }

  void WaitForSignal();
  void Reload();
  void Drain();
  void PollDrain();
  // The public faces' (HTTP and those added with AddDrainHooks).
  size_t OpenConnections() const;
  void ScheduleSweep();
  void SweepLeases();

  ServerOptions options;
  const policy::Config start_config;  // what needs a restart to change
  // Declared before the io_context: sessions still queued in it when it is
  // destroyed unregister themselves and may hold store callbacks. The public
  // listener's sessions, drained on SIGTERM, and the admin listener's, which
  // keep being served until the drain ends (a load balancer sees /readyz
  // answer 503 "draining" meanwhile).
  SessionRegistry registry;
  SessionRegistry admin_registry;
  PolicyHolder policies;
  std::shared_ptr<Store> store;
  std::unique_ptr<Enforcer> enforcer;          // made in Start, with the store
  std::unique_ptr<AdminApi> admin;             // the admin API (and the demo's /demo/state)
  std::unique_ptr<DemoStateLimit> demo_limit;  // with server.demo
  // Gateway operations still queued at exit refer to it. Its idle pool is
  // emptied (CloseIdle) at the end of Run, while the io_context still exists.
  std::unique_ptr<Gateway> gateway;
  std::unique_ptr<ConcurrencyStore> concurrency_store;  // destroyed in ~Impl
  net::io_context ioc;
  std::unique_ptr<Overrides> overrides;         // destroyed in ~Impl (a timer on the io_context)
  std::unique_ptr<ConcurrencyLimiter> limiter;  // its timers run on the io_context
  // Declared after the io_context: they own sockets and timers on it.
  std::unique_ptr<Router> router;
  std::shared_ptr<Listener> listener;
  std::unique_ptr<Router> admin_router;
  std::shared_ptr<Listener> admin_listener;  // null when server.admin_listen is ""
  net::signal_set signals;
  net::steady_timer sweep_timer;
  static constexpr int kSweepParts = 64;  // MemoryStore's default shard count: one a step
  int sweep_part = 0;
  // Expired leases a sweep turn drops at most: about as long as a part of the
  // rate store's sweep takes at 1,000,000 keys (docs/performance.md).
  static constexpr size_t kLeaseSweepBudget = 64;
  std::atomic<bool> sweeping_leases{false};  // a SweepLeases is under way
  net::steady_timer drain_timer;
  std::chrono::steady_clock::time_point drain_deadline;
  bool draining = false;
  std::vector<DrainHooks> other_faces;  // AddDrainHooks
};

Server::Server(std::shared_ptr<const policy::Policy> policy, ServerOptions options)
    : impl_(std::make_unique<Impl>(std::move(policy), std::move(options))) {}

net::io_context* Server::SharedContext() { return impl_->OneThread() ? &impl_->ioc : nullptr; }

net::io_context& Server::Context() { return impl_->ioc; }

void Server::AddDrainHooks(DrainHooks hooks) { impl_->other_faces.push_back(std::move(hooks)); }

Server::~Server() = default;

Status Server::Start(std::shared_ptr<Store> store) {
  Impl& s = *impl_;
  s.store = std::move(store);
  s.enforcer = std::make_unique<Enforcer>(s.store, s.start_config.store.local_max_keys);
  const policy::ServerConfig& sc = s.start_config.server;
  if (!sc.upstream.empty()) {
    GatewayOptions go;
    go.timeout = sc.read_timeout;
    go.one_thread = s.OneThread();
    StatusOr<std::unique_ptr<Gateway>> g = Gateway::Create(s.ioc, sc.upstream, go);
    if (!g.ok()) return g.status();
    s.gateway = std::move(*g);
  }
  std::string token;
  if (!sc.admin_token_file.empty()) {
    StatusOr<std::string> t = AdminApi::ReadTokenFile(sc.admin_token_file);
    if (!t.ok()) return t.status();
    token = std::move(*t);
  }
  const bool have_token = !token.empty();
  // With one thread, every Redis client of the daemon runs on it.
  boost::asio::io_context* const shared = SharedContext();
  StatusOr<std::unique_ptr<ConcurrencyStore>> cs =
      MakeConcurrencyStore(s.start_config.store, shared);
  if (!cs.ok()) return cs.status();
  s.concurrency_store = std::move(*cs);
  s.limiter = std::make_unique<ConcurrencyLimiter>(
      s.ioc.get_executor(), *s.concurrency_store,
      ConcurrencyLimiter::Options{.max_key_length = StoreKeyLength(s.start_config.store),
                                  .local_max_keys = s.start_config.store.local_max_keys});
  StatusOr<std::unique_ptr<OverrideStore>> os = MakeOverrideStore(s.start_config.store, shared);
  if (!os.ok()) return os.status();
  s.overrides = std::make_unique<Overrides>(*std::move(os), Clock::System());
  // Another instance reset a client (or one may have while we did not
  // listen): our cached denials may be of the state it removed. (~Impl
  // destroys the overrides before the store.)
  s.overrides->OnReset([store = s.store.get()](std::string_view) { store->ForgetCached(); });
  // The overrides keep the fields given; they resolve over this policy,
  // and over each reload's (Reload).
  s.overrides->SetPolicy(s.policies.Get());
  s.overrides->Start(s.ioc.get_executor());
  s.enforcer->SetOverrides(s.overrides.get());
  s.admin = std::make_unique<AdminApi>(*s.enforcer, std::move(token));
  if (sc.demo) s.demo_limit = std::make_unique<DemoStateLimit>();
  s.router = std::make_unique<Router>(s.policies, *s.enforcer, s.gateway.get(), sc.demo,
                                      s.admin.get(), s.limiter.get(), s.demo_limit.get());
  StatusOr<tcp::endpoint> ep = ResolveListenAddress(s.ioc, sc.listen);
  if (!ep.ok()) return ep.status();
  SessionLimits limits{.max_header_bytes = sc.max_header_bytes,
                       .max_body_bytes = sc.max_body_bytes,
                       .read_timeout = sc.read_timeout,
                       .idle_timeout = sc.idle_timeout,
                       .max_requests_per_second = sc.max_requests_per_second_per_connection};
  // Each listener counts its own connections: a flood of the public port
  // leaves the admin API reachable.
  // The exemptions (clients.trusted_proxies) and the IPv6 prefix an address
  // is counted by (clients.ipv6_prefix) are the current policy's, read per
  // connection: a reload applies them here as to the client identity.
  const ConnectionCaps caps{.max_connections = sc.max_connections,
                            .max_per_address = sc.max_connections_per_ip,
                            .policies = &s.policies};
  s.listener =
      std::make_shared<Listener>(s.ioc, *ep, *s.router, limits, s.registry, caps, s.OneThread());
  if (Status st = s.listener->Open(); !st.ok()) return st;
  const tcp::endpoint bound = s.listener->local_endpoint();
  std::string addr = bound.address().to_string();
  if (bound.address().is_v6()) addr = "[" + addr + "]";
  addr += ":" + std::to_string(bound.port());
  std::string admin_addr;
  if (!sc.admin_listen.empty()) {
    StatusOr<tcp::endpoint> aep = ResolveListenAddress(s.ioc, sc.admin_listen);
    if (!aep.ok()) return aep.status();
    s.admin_router = Router::Admin(s.policies, *s.enforcer, *s.admin);
    s.admin_listener = std::make_shared<Listener>(s.ioc, *aep, *s.admin_router, limits,
                                                  s.admin_registry, caps, s.OneThread());
    if (Status st = s.admin_listener->Open(); !st.ok()) {
      // The usual cause: a second instance on this host with the default.
      return Status(st.code(), st.message() +
                                   " (server.admin_listen: each instance on a host needs its own, "
                                   "e.g. --admin-listen 127.0.0.1:9091, or --admin-listen \"\" "
                                   "for none)");
    }
    const tcp::endpoint abound = s.admin_listener->local_endpoint();
    admin_addr = abound.address().to_string();
    if (abound.address().is_v6()) admin_addr = "[" + admin_addr + "]";
    admin_addr += ":" + std::to_string(abound.port());
    if (!abound.address().is_loopback() && !have_token) {
      Log(Level::kWarn, "the admin API listens beyond loopback without a token",
          {{"admin", admin_addr}, {"hint", "set server.admin_token_file"}});
    }
  }
  Log(Level::kInfo, "listening",
      {{"addr", addr},
       {"admin", admin_addr},
       {"config", s.start_config.source},
       {"store",
        s.start_config.store.type == policy::StoreConfig::Type::kMemory ? "memory" : "redis"},
       {"upstream", sc.upstream},
       {"demo", sc.demo}});
  return Status::Ok();
}

void Server::Impl::WaitForSignal() {
  signals.async_wait([this](beast::error_code ec, int sig) {
    if (ec) return;
    if (sig == SIGHUP) {
      Reload();
      WaitForSignal();
      return;
    }
    Log(Level::kInfo, "draining",
        {{"signal", sig == SIGTERM ? "SIGTERM" : "SIGINT"}, {"connections", OpenConnections()}});
    Drain();
  });
}

void Server::Impl::Reload() {
  if (options.config_path.empty()) {
    Log(Level::kWarn, "reload ignored: running on the embedded default (no --config)");
    return;
  }
  StatusOr<policy::Config> c = policy::LoadConfigFile(options.config_path);
  if (!c.ok()) {
    Metrics::Global().reloads_failed.Inc();
    Log(Level::kError, "reload failed: keeping the old config",
        {{"file", options.config_path}, {"error", c.status().message()}});
    return;
  }
  if (options.apply_overrides) options.apply_overrides(*c);
  // Settings bound at start keep their running values, so that the policy
  // (and GET /v1/config) says what is in effect; the file's values wait.
  policy::KeepRestartBound(start_config, &*c);
  std::string ignored;
  for (const policy::PendingSetting& pending : c->pending_restart) {
    if (!ignored.empty()) ignored += ", ";
    ignored += pending.name;
  }
  StatusOr<std::shared_ptr<const policy::Policy>> p = policy::Policy::Create(std::move(*c));
  if (!p.ok()) {
    Metrics::Global().reloads_failed.Inc();
    Log(Level::kError, "reload failed: keeping the old config",
        {{"file", options.config_path}, {"error", p.status().message()}});
    return;
  }
  // The overrides first: a request that sees the new policy finds them
  // resolved over it (a request still on the old one may meet them too: a
  // limit whose algorithm changed is then left alone, ClientOverride::Replacing).
  if (overrides) overrides->SetPolicy(*p);
  policies.Set(std::move(*p));
  Metrics::Global().reloads_ok.Inc();
  if (!ignored.empty()) {
    Log(Level::kWarn, "reload: changes that need a restart were ignored", {{"settings", ignored}});
  }
  Log(Level::kInfo, "config reloaded", {{"file", options.config_path}});
}

void Server::Impl::Drain() {
  if (draining) return;
  draining = true;
  registry.draining.store(true);
  listener->Stop();
  // The admin listener stays up until the drain ends: /readyz says 503.
  admin->StartDraining();
  beast::error_code ignored;
  signals.cancel(ignored);
  sweep_timer.cancel();
  for (const auto& session : registry.Snapshot()) session->Shutdown();
  for (const DrainHooks& face : other_faces) face.begin();
  drain_deadline = std::chrono::steady_clock::now() + options.drain_timeout;
  PollDrain();
}

size_t Server::Impl::OpenConnections() const {
  size_t open = registry.size();
  for (const DrainHooks& face : other_faces) open += face.open();
  return open;
}

void Server::Impl::PollDrain() {
  const size_t left = OpenConnections();
  if (left == 0 || std::chrono::steady_clock::now() >= drain_deadline) {
    if (left > 0) Log(Level::kWarn, "drain timeout: closing", {{"connections", left}});
    for (const DrainHooks& face : other_faces) face.close();
    FlushSuppressed();
    if (admin_listener) admin_listener->Stop();
    Log(Level::kInfo, "stopped");
    // The store closes while the io_context still runs: a Redis client's
    // calls in flight fail and answer their callers (sessions, the gRPC
    // face's calls) while those exist; `done` may run on the store's thread.
    if (store != nullptr) {
      store->Shutdown([this] { ioc.stop(); });
    } else {
      ioc.stop();
    }
    return;
  }
  // Sessions that finished a request since the last poll close themselves;
  // idle ones were told to close. Check again shortly.
  for (const auto& session : registry.Snapshot()) session->Shutdown();
  drain_timer.expires_after(std::chrono::milliseconds(20));
  drain_timer.async_wait([this](beast::error_code ec) {
    if (!ec) PollDrain();
  });
}

// The store a part at a time: a MemoryStore of 1,000,000 keys holds the I/O
// thread for 7-19 ms when swept whole (BM_Sweep); a 64th of it for a 64th of
// that. The rest (concurrency leases, suppressed log lines) once per
// interval.
void Server::Impl::ScheduleSweep() {
  sweep_timer.expires_after(
      std::max(options.sweep_interval / kSweepParts, std::chrono::milliseconds(1)));
  sweep_timer.async_wait([this](beast::error_code ec) {
    if (ec) return;
    // The store's and its local fallback's.
    enforcer->store().SweepPart(static_cast<size_t>(sweep_part), kSweepParts);
    if (demo_limit) demo_limit->SweepPart(static_cast<size_t>(sweep_part), kSweepParts);
    if (++sweep_part == kSweepParts) {
      sweep_part = 0;
      if (!sweeping_leases.exchange(true)) SweepLeases();
      FlushSuppressed();  // sampled-out log lines: their count, without waiting for a next line
    }
    ScheduleSweep();
  });
}

// Expired concurrency leases, kLeaseSweepBudget a turn (InTurns): a mass
// expiry (1,000,000 leases: seconds of work) is dropped over many turns, with
// the requests queued meanwhile served between them. The server's store's
// first, then the limiter's local fallback's.
void Server::Impl::SweepLeases() {
  InTurns(ioc.get_executor(), [this] {
    ConcurrencyStore::SweepProgress p;
    if (concurrency_store) p = concurrency_store->SweepSome(kLeaseSweepBudget);
    if (!p.more && limiter) p = limiter->SweepSome(kLeaseSweepBudget);
    if (!p.more) sweeping_leases.store(false);
    return p.more;
  });
}

std::shared_ptr<const policy::Policy> Server::CurrentPolicy() const {
  return impl_->policies.Get();
}

void Server::AddAdminView(std::string path, std::function<nlohmann::json()> view) {
  if (impl_->admin) impl_->admin->AddView(std::move(path), std::move(view));
}

int Server::Run() {
  Impl& s = *impl_;
  s.listener->Run();
  if (s.admin_listener) s.admin_listener->Run();
  s.WaitForSignal();
  s.ScheduleSweep();
  const int n = policy::ThreadCount(s.start_config.server.threads);
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(n - 1));
  for (int i = 1; i < n; ++i) threads.emplace_back([&s] { s.ioc.run(); });
  s.ioc.run();
  for (auto& t : threads) t.join();
  if (s.limiter) s.limiter->Stop();
  if (s.gateway) s.gateway->CloseIdle();
  return 0;
}

}  // namespace ratelimit::server
