// ratelimitd: flags -> config -> wiring. Everything else lives in src/server.
//
//   ratelimitd [--config FILE] [--listen HOST:PORT] [--redis URL]
//              [--failure-mode open|closed|local] [--admin-listen HOST:PORT]
//              [--user NAME [--group NAME]]
//              [--grpc-listen HOST:PORT] [--envoy-config DIR]
//   ratelimitd --check-config FILE|DIR  (the config, every file it names, its Envoy directory)
//   ratelimitd [--config FILE] --explain 'GET /api/x' [-H 'Name: value']... [--peer ADDR]
//   ratelimitd --help | --version
#include <pthread.h>
#include <signal.h>

#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "grpc/grpc_face.h"
#include "policy/config.h"
#include "policy/policy.h"
#include "server/config_check.h"
#include "server/explain.h"
#include "server/json_log.h"
#include "server/privileges.h"
#include "server/server.h"
#include "server/store_factory.h"

#ifdef RL_JEMALLOC
#include <jemalloc/jemalloc.h>
#endif

namespace {

using ratelimit::policy::Config;
using ratelimit::policy::FailureMode;
using ratelimit::server::Level;
using ratelimit::server::Log;

constexpr std::string_view kVersion = "0.1.0";

constexpr std::string_view kUsage = R"(usage: ratelimitd [options]

Rate limiting daemon: decision API (POST /v1/check), gateway (server.upstream),
nginx auth_request (/v1/auth) and a demo page. Without --config it runs the
embedded default: memory store, demo page at /, /api/ping limited per client
(burst 5, then 1 per second).

options:
  --config FILE               load the YAML config (SIGHUP reloads it)
  --listen HOST:PORT          listen address (overrides server.listen)
  --redis URL                 use Redis at URL (overrides store.type and store.url)
  --failure-mode MODE         open, closed or local (overrides store.failure_mode)
  --admin-listen HOST:PORT    admin API address (overrides server.admin_listen; "" turns it off)
  --user NAME                 switch to this user once the listeners are bound (server.user);
                              the start fails rather than run on as root if that fails
  --group NAME                with --user: this group instead of the user's primary group
  --grpc-listen HOST:PORT     serve Envoy's rate limit service over gRPC (server.grpc_listen)
  --envoy-config DIR          envoyproxy/ratelimit's YAML config directory (envoy.config_dir)
  --check-config FILE|DIR     validate a config file and every file it names (admin token, API
                              keys, TLS files, the Envoy directory it names or --envoy-config's),
                              or an Envoy directory alone: print OK (warnings on stderr) or the
                              error, exit 0 or 1
  --explain 'METHOD TARGET'   print (JSON) the route, client, plan and limits the config
                              applies to this request, consuming nothing; exit 0, or 1
                              for a bad config, 2 for a bad request
  -H, --header 'Name: value'  with --explain: a request header (repeatable)
  --peer ADDR                 with --explain: the TCP peer's address (default 127.0.0.1)
  --help                      this text
  --version                   the version and the malloc in use
)";

// The malloc serving this process, for --version: "jemalloc 5.3.0-0-g..."
// when jemalloc is linked in (RL_ALLOCATOR, the default) and its counter of
// this thread's allocations moves when we allocate; "system" otherwise.
std::string Allocator() {
#ifdef RL_JEMALLOC
  const char* version = nullptr;
  size_t size = sizeof(version);
  if (mallctl("version", static_cast<void*>(&version), &size, nullptr, 0) != 0) return "system";
  const auto allocated = [] {
    uint64_t n = 0;
    size_t len = sizeof(n);
    return mallctl("thread.allocated", &n, &len, nullptr, 0) == 0 ? n : 0;
  };
  const uint64_t before = allocated();
  void* volatile p = std::malloc(4096);  // volatile: the call is not elided
  std::free(p);
  if (allocated() > before) return std::string("jemalloc ") + version;
  return std::string("system (jemalloc ") + version + " is linked but not serving malloc)";
#else
  return "system";
#endif
}

struct Flags {
  std::optional<std::string> config, listen, redis, failure_mode, admin_listen, check_config, user,
      group, explain, peer, grpc_listen, envoy_config;
  std::vector<std::string> headers;  // --explain's -H
  bool help = false, version = false;
};

// Returns an error message, or "" on success.
std::string ParseFlags(int argc, char** argv, Flags& f) {
  std::optional<std::string> header;  // one -H value, appended to f.headers
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    std::string_view value;
    bool inline_value = false;
    if (const size_t eq = arg.find('='); arg.starts_with("--") && eq != std::string_view::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      inline_value = true;
    }
    if (arg == "--help" || arg == "-h") {
      f.help = true;
      continue;
    }
    if (arg == "--version") {
      f.version = true;
      continue;
    }
    std::optional<std::string>* slot = nullptr;
    if (arg == "--config")
      slot = &f.config;
    else if (arg == "--listen")
      slot = &f.listen;
    else if (arg == "--redis")
      slot = &f.redis;
    else if (arg == "--failure-mode")
      slot = &f.failure_mode;
    else if (arg == "--admin-listen")
      slot = &f.admin_listen;
    else if (arg == "--check-config")
      slot = &f.check_config;
    else if (arg == "--user")
      slot = &f.user;
    else if (arg == "--group")
      slot = &f.group;
    else if (arg == "--explain")
      slot = &f.explain;
    else if (arg == "--peer")
      slot = &f.peer;
    else if (arg == "-H" || arg == "--header")
      slot = &header;
    else if (arg == "--grpc-listen")
      slot = &f.grpc_listen;
    else if (arg == "--envoy-config")
      slot = &f.envoy_config;
    else
      return "unknown flag '" + std::string(arg) + "' (see --help)";
    if (!inline_value) {
      if (i + 1 >= argc) return "flag " + std::string(arg) + " needs a value";
      value = argv[++i];
    }
    *slot = std::string(value);
    if (header) f.headers.push_back(*std::exchange(header, std::nullopt));
  }
  if (f.failure_mode) {
    // The HTTP faces have no answer for "error" (report the failure): not a flag value.
    ratelimit::StatusOr<FailureMode> m = ratelimit::ParseFailureMode(*f.failure_mode);
    if (!m.ok() || *m == FailureMode::kError) return "--failure-mode must be open, closed or local";
  }
  if (f.redis) {
    if (auto s = ratelimit::policy::CheckStoreUrlScheme(*f.redis); !s.ok()) {
      return "--redis " + s.message();
    }
  }
  return "";
}

void ApplyOverrides(const Flags& f, Config& c) {
  if (f.listen) c.server.listen = *f.listen;
  if (f.admin_listen) c.server.admin_listen = *f.admin_listen;
  if (f.user) c.server.user = *f.user;
  if (f.group) c.server.group = *f.group;
  if (f.grpc_listen) c.server.grpc_listen = *f.grpc_listen;
  if (f.envoy_config) c.envoy.config_dir = *f.envoy_config;
  if (f.redis) {
    c.store.type = ratelimit::policy::StoreConfig::Type::kRedis;
    c.store.url = *f.redis;
  }
  if (f.failure_mode) {
    c.store.failure_mode = *ratelimit::ParseFailureMode(*f.failure_mode);  // checked above
  }
}

// Redis down at start is no reason not to start (the failure mode decides
// meanwhile), but it must be said at once: one Peek, logged if it fails.
// (With one I/O thread the answer comes once the server runs.)
void WarnIfUnreachable(ratelimit::Store& store, const ratelimit::policy::StoreConfig& config) {
  static const ratelimit::Limit kProbe = *ratelimit::Limit::TokenBucket("start", 1, 1.0);
  static const ratelimit::LimitCheck kCheck[] = {{&kProbe, 0}};
  store.Peek({"ratelimitd:start", kCheck},
             [url = ratelimit::policy::RedactUrl(config.url),
              mode = std::string(ratelimit::policy::FailureModeName(config.failure_mode))](
                 ratelimit::StatusOr<ratelimit::CheckResult> r) {
               if (r.ok()) return;
               Log(Level::kWarn,
                   "the store cannot be reached: requests are decided by failure_mode",
                   {{"store", url}, {"error", r.status().message()}, {"failure_mode", mode}});
             });
}

}  // namespace

int main(int argc, char** argv) {
  std::signal(SIGPIPE, SIG_IGN);
  // SIGHUP waits until the server can reload: its default action would end
  // the daemon while it starts (a reload sent by a script or systemd's
  // ExecReload too early). Blocked here, so in every thread started before
  // the server runs; unblocked in this one just before (a SIGHUP that came
  // meanwhile is delivered then, as one reload). Unblocking also undoes a
  // mask inherited from the parent, under which reloads never arrived.
  sigset_t hup;
  sigemptyset(&hup);
  sigaddset(&hup, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &hup, nullptr);
  Flags flags;
  if (std::string err = ParseFlags(argc, argv, flags); !err.empty()) {
    std::cerr << "ratelimitd: " << err << "\n";
    return 2;
  }
  if (flags.help) {
    std::cout << kUsage;
    return 0;
  }
  if (flags.version) {
    std::cout << "ratelimitd " << kVersion << "\nmalloc: " << Allocator() << "\n";
    return 0;
  }
  if (flags.check_config) {
    // What the start checks before it binds anything; warnings go to stderr.
    std::string envoy_dir = flags.envoy_config.value_or("");
    std::vector<std::string> warnings;
    if (std::filesystem::is_directory(*flags.check_config)) {
      envoy_dir = *flags.check_config;  // an Envoy config directory alone
    } else {
      auto c = ratelimit::policy::LoadConfigFile(*flags.check_config);
      if (!c.ok()) {
        std::cout << c.status().message() << "\n";
        return 1;
      }
      auto checked = ratelimit::server::CheckConfig(*c);
      if (!checked.ok()) {
        std::cout << c->source << ": " << checked.status().message() << "\n";
        return 1;
      }
      // The run-as user and group, and the upstream's host, as the start
      // resolves them (on this machine).
      if (auto s = ratelimit::server::CheckOnThisMachine(*c); !s.ok()) {
        std::cout << c->source << ": " << s.message() << "\n";
        return 1;
      }
      warnings = std::move(*checked);
      for (const std::string& line : ratelimit::server::DescribeMeteredCosts(*c)) {
        std::cerr << line << "\n";
      }
      if (envoy_dir.empty()) envoy_dir = c->envoy.config_dir;
      auto p = ratelimit::policy::Policy::Create(std::move(*c));
      if (!p.ok()) {
        std::cout << p.status().message() << "\n";
        return 1;
      }
      // Nothing is connected to: a check neither needs Redis up nor waits
      // on it. The stored per-client overrides are the running daemons'
      // (GET /v1/overrides, --explain), not the config's.
    }
    if (!envoy_dir.empty()) {
      if (auto s = ratelimit::grpcface::CheckEnvoyConfig(envoy_dir); !s.ok()) {
        std::cout << s.message() << "\n";
        return 1;
      }
    }
    for (const std::string& w : warnings) std::cerr << "warning: " << w << "\n";
    std::cout << "OK\n";
    return 0;
  }

  Config config;
  if (flags.config) {
    auto c = ratelimit::policy::LoadConfigFile(*flags.config);
    if (!c.ok()) {
      Log(Level::kError, "bad config", {{"error", c.status().message()}});
      return 1;
    }
    config = std::move(*c);
  } else {
    config = ratelimit::policy::EmbeddedDefault();
  }
  ApplyOverrides(flags, config);
  if (flags.explain) {
    return ratelimit::server::ExplainCommand(std::move(config), *flags.explain, flags.headers,
                                             flags.peer.value_or(""));
  }
  if (config.server.user.empty() && !config.server.group.empty()) {
    Log(Level::kError, "cannot start", {{"error", "--group needs --user"}});
    return 1;
  }
  // Resolved before anything is bound or connected: a typo fails at once.
  std::optional<ratelimit::server::RunAs> run_as;
  if (!config.server.user.empty()) {
    auto who = ratelimit::server::ResolveRunAs(config.server.user, config.server.group);
    if (!who.ok()) {
      Log(Level::kError, "cannot start", {{"error", who.status().message()}});
      return 1;
    }
    run_as = std::move(*who);
  }
  if (auto warnings = ratelimit::server::CheckConfig(config); !warnings.ok()) {
    Log(Level::kError, "bad config",
        {{"error", config.source + ": " + warnings.status().message()}});
    return 1;
  } else {
    for (const std::string& w : *warnings) Log(Level::kWarn, "config", {{"warning", w}});
  }
  const ratelimit::policy::StoreConfig store_config = config.store;
  const ratelimit::policy::EnvoySection envoy_section = config.envoy;
  const std::string grpc_listen = config.server.grpc_listen;
  auto policy = ratelimit::policy::Policy::Create(std::move(config));
  if (!policy.ok()) {
    Log(Level::kError, "bad config", {{"error", policy.status().message()}});
    return 1;
  }
  ratelimit::server::ServerOptions options;
  options.config_path = flags.config.value_or("");
  options.apply_overrides = [flags](Config& c) { ApplyOverrides(flags, c); };
  ratelimit::server::Server server(std::move(*policy), std::move(options));
  // With one I/O thread, a Redis client runs on it too (Server::SharedContext).
  auto store = ratelimit::server::MakeStore(store_config, server.SharedContext());
  if (!store.ok()) {
    Log(Level::kError, "cannot create the store", {{"error", store.status().message()}});
    return 1;
  }
  if (store_config.type == ratelimit::policy::StoreConfig::Type::kRedis) {
    WarnIfUnreachable(**store, store_config);
  }
  std::shared_ptr<ratelimit::Store> shared_store = *store;
  if (auto s = server.Start(std::move(*store)); !s.ok()) {
    Log(Level::kError, "cannot start", {{"error", s.message()}});
    return 1;
  }
  // The gRPC face (Envoy's rate limit service), on the same store.
  std::unique_ptr<ratelimit::grpcface::GrpcFace> grpc;
  if (!grpc_listen.empty()) {
    ratelimit::grpcface::GrpcOptions go{.listen = grpc_listen,
                                        .envoy_config_dir = envoy_section.config_dir,
                                        .store = store_config,
                                        .headers = envoy_section.headers};
    go.failure_mode = store_config.failure_mode;
    if (!envoy_section.failure_mode.empty()) {
      go.failure_mode = *ratelimit::ParseFailureMode(envoy_section.failure_mode);
      go.own_failure_mode = true;
    }
    // store.failure_mode and expected_instances follow a reload, per call.
    go.current_policy = [&server] { return server.CurrentPolicy(); };
    // On the server's threads (and, with one, the Redis client's): a call,
    // its batch and its answer need no hand-off between threads.
    auto g = ratelimit::grpcface::GrpcFace::Start(std::move(go), shared_store, server.Context());
    if (!g.ok()) {
      Log(Level::kError, "cannot start the gRPC face", {{"error", g.status().message()}});
      return 1;
    }
    grpc = std::move(*g);
    server.AddDrainHooks({.begin = [face = grpc.get()] { face->Drain(); },
                          .open = [face = grpc.get()] { return face->connections(); },
                          .close = [face = grpc.get()] { face->Shutdown(); }});
    server.AddAdminView("/v1/envoy/domains", [face = grpc.get()] { return face->Describe(); });
  }
  shared_store.reset();
  if (run_as) {
    // The listeners are bound; nothing else needs root. Running on with the
    // privileges the operator asked to give up is worse than not running.
    if (auto s = ratelimit::server::DropPrivileges(*run_as); !s.ok()) {
      Log(Level::kError, "cannot drop privileges: stopping", {{"error", s.message()}});
      return 1;
    }
    Log(Level::kInfo, "privileges dropped",
        {{"user", run_as->user},
         {"uid", static_cast<int64_t>(run_as->uid)},
         {"group", run_as->group},
         {"gid", static_cast<int64_t>(run_as->gid)}});
  }
  pthread_sigmask(SIG_UNBLOCK, &hup, nullptr);  // the server's signal_set handles it now
  const int code = server.Run();
  if (grpc) grpc->Shutdown();  // drained by the server's drain (AddDrainHooks)
  return code;
}
