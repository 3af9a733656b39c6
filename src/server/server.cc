#include "server/server.h"

#include <csignal>
#include <thread>
#include <vector>

#include "ratelimit/memory_store.h"
#include "server/enforcer.h"
#include "server/gateway.h"
#include "server/http.h"
#include "server/json_log.h"
#include "server/listener.h"
#include "server/policy_holder.h"
#include "server/router.h"
#include "server/session.h"

namespace ratelimit::server {

struct Server::Impl {
  Impl(std::shared_ptr<const policy::Policy> p, std::shared_ptr<Store> s, ServerOptions o)
      : options(std::move(o)),
        start_config(p->config()),
        policies(std::move(p)),
        store(std::move(s)),
        enforcer(store, start_config.store.max_keys),
        signals(ioc, SIGINT, SIGTERM, SIGHUP),
        sweep_timer(ioc),
        drain_timer(ioc) {}

  void WaitForSignal();
  void Reload();
  void Drain();
  void PollDrain();
  void ScheduleSweep();

  ServerOptions options;
  const policy::Config start_config;  // what needs a restart to change
  // Declared before the io_context: sessions still queued in it when it is
  // destroyed unregister themselves and may hold store callbacks.
  SessionRegistry registry;
  PolicyHolder policies;
  std::shared_ptr<Store> store;
  Enforcer enforcer;
  // Gateway operations still queued at exit refer to it. Its idle pool is
  // emptied (CloseIdle) at the end of Run, while the io_context still exists.
  std::unique_ptr<Gateway> gateway;
  net::io_context ioc;
  // Declared after the io_context: they own sockets and timers on it.
  std::unique_ptr<Router> router;
  std::shared_ptr<Listener> listener;
  net::signal_set signals;
  net::steady_timer sweep_timer;
  net::steady_timer drain_timer;
  std::chrono::steady_clock::time_point drain_deadline;
  bool draining = false;
};

Server::Server(std::shared_ptr<const policy::Policy> policy, std::shared_ptr<Store> store,
               ServerOptions options)
    : impl_(std::make_unique<Impl>(std::move(policy), std::move(store), std::move(options))) {}

Server::~Server() = default;

Status Server::Start() {
  Impl& s = *impl_;
  const policy::ServerConfig& sc = s.start_config.server;
  if (!sc.upstream.empty()) {
    GatewayOptions go;
    go.timeout = sc.read_timeout;
    StatusOr<std::unique_ptr<Gateway>> g = Gateway::Create(s.ioc, sc.upstream, go);
    if (!g.ok()) return g.status();
    s.gateway = std::move(*g);
  }
  s.router = std::make_unique<Router>(s.policies, s.enforcer, s.gateway.get(), sc.demo);
  StatusOr<tcp::endpoint> ep = ResolveListenAddress(s.ioc, sc.listen);
  if (!ep.ok()) return ep.status();
  SessionLimits limits{.max_header_bytes = sc.max_header_bytes,
                       .max_body_bytes = sc.max_body_bytes,
                       .read_timeout = sc.read_timeout,
                       .idle_timeout = sc.idle_timeout};
  s.listener =
      std::make_shared<Listener>(s.ioc, *ep, *s.router, limits, s.registry, sc.max_connections);
  if (Status st = s.listener->Open(); !st.ok()) return st;
  const tcp::endpoint bound = s.listener->local_endpoint();
  std::string addr = bound.address().to_string();
  if (bound.address().is_v6()) addr = "[" + addr + "]";
  addr += ":" + std::to_string(bound.port());
  Log(Level::kInfo, "listening",
      {{"addr", addr},
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
        {{"signal", sig == SIGTERM ? "SIGTERM" : "SIGINT"}, {"connections", registry.size()}});
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
    Log(Level::kError, "reload failed: keeping the old config",
        {{"file", options.config_path}, {"error", c.status().message()}});
    return;
  }
  if (options.apply_overrides) options.apply_overrides(*c);
  // Settings bound at start: note what a restart would change.
  const policy::StoreConfig& a = start_config.store;
  const policy::StoreConfig& b = c->store;
  std::string ignored;
  auto note = [&ignored](bool changed, std::string_view name) {
    if (!changed) return;
    if (!ignored.empty()) ignored += ", ";
    ignored += name;
  };
  note(a.type != b.type, "store.type");
  note(a.url != b.url, "store.url");
  note(a.deadline != b.deadline, "store.deadline");
  note(a.key_prefix != b.key_prefix, "store.key_prefix");
  note(a.time_source != b.time_source, "store.time_source");
  note(a.max_keys != b.max_keys, "store.max_keys");
  const policy::ServerConfig& x = start_config.server;
  const policy::ServerConfig& y = c->server;
  note(x.listen != y.listen, "server.listen");
  note(x.admin_listen != y.admin_listen, "server.admin_listen");
  note(x.upstream != y.upstream, "server.upstream");
  note(x.demo != y.demo, "server.demo");
  note(x.threads != y.threads, "server.threads");
  note(x.max_body_bytes != y.max_body_bytes || x.max_header_bytes != y.max_header_bytes ||
           x.max_connections != y.max_connections || x.read_timeout != y.read_timeout ||
           x.idle_timeout != y.idle_timeout,
       "server limits");
  StatusOr<std::shared_ptr<const policy::Policy>> p = policy::Policy::Create(std::move(*c));
  if (!p.ok()) {
    Log(Level::kError, "reload failed: keeping the old config",
        {{"file", options.config_path}, {"error", p.status().message()}});
    return;
  }
  policies.Set(std::move(*p));
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
  beast::error_code ignored;
  signals.cancel(ignored);
  sweep_timer.cancel();
  for (const auto& session : registry.Snapshot()) session->Shutdown();
  drain_deadline = std::chrono::steady_clock::now() + options.drain_timeout;
  PollDrain();
}

void Server::Impl::PollDrain() {
  const size_t left = registry.size();
  if (left == 0 || std::chrono::steady_clock::now() >= drain_deadline) {
    if (left > 0) Log(Level::kWarn, "drain timeout: closing", {{"connections", left}});
    Log(Level::kInfo, "stopped");
    ioc.stop();
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

void Server::Impl::ScheduleSweep() {
  sweep_timer.expires_after(options.sweep_interval);
  sweep_timer.async_wait([this](beast::error_code ec) {
    if (ec) return;
    if (auto* m = dynamic_cast<MemoryStore*>(store.get())) m->Sweep();
    enforcer.local_store().Sweep();
    ScheduleSweep();
  });
}

int Server::Run() {
  Impl& s = *impl_;
  s.listener->Run();
  s.WaitForSignal();
  s.ScheduleSweep();
  int n = s.start_config.server.threads;
  if (n <= 0) n = 2;
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(n - 1));
  for (int i = 1; i < n; ++i) threads.emplace_back([&s] { s.ioc.run(); });
  s.ioc.run();
  for (auto& t : threads) t.join();
  if (s.gateway) s.gateway->CloseIdle();
  return 0;
}

}  // namespace ratelimit::server
