// ratelimitd: flags -> config -> wiring. Everything else lives in src/server.
//
//   ratelimitd [--config FILE] [--listen HOST:PORT] [--redis URL]
//              [--failure-mode open|closed|local] [--admin-listen HOST:PORT]
//              [--user NAME [--group NAME]]
//   ratelimitd --check-config FILE
//   ratelimitd --help | --version
#include <csignal>
#include <cstdio>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>

#include "policy/config.h"
#include "policy/policy.h"
#include "server/json_log.h"
#include "server/privileges.h"
#include "server/server.h"
#include "server/store_factory.h"

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
  --check-config FILE         validate FILE, print OK or the error, exit 0 or 1
  --help                      this text
  --version                   the version
)";

struct Flags {
  std::optional<std::string> config, listen, redis, failure_mode, admin_listen, check_config, user,
      group;
  bool help = false, version = false;
};

// Returns an error message, or "" on success.
std::string ParseFlags(int argc, char** argv, Flags& f) {
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
    else
      return "unknown flag '" + std::string(arg) + "' (see --help)";
    if (!inline_value) {
      if (i + 1 >= argc) return "flag " + std::string(arg) + " needs a value";
      value = argv[++i];
    }
    *slot = std::string(value);
  }
  if (f.failure_mode) {
    // The HTTP faces have no answer for "error" (report the failure): not a flag value.
    ratelimit::StatusOr<FailureMode> m = ratelimit::ParseFailureMode(*f.failure_mode);
    if (!m.ok() || *m == FailureMode::kError) return "--failure-mode must be open, closed or local";
  }
  return "";
}

void ApplyOverrides(const Flags& f, Config& c) {
  if (f.listen) c.server.listen = *f.listen;
  if (f.admin_listen) c.server.admin_listen = *f.admin_listen;
  if (f.user) c.server.user = *f.user;
  if (f.group) c.server.group = *f.group;
  if (f.redis) {
    c.store.type = ratelimit::policy::StoreConfig::Type::kRedis;
    c.store.url = *f.redis;
  }
  if (f.failure_mode) {
    c.store.failure_mode = *ratelimit::ParseFailureMode(*f.failure_mode);  // checked above
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::signal(SIGPIPE, SIG_IGN);
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
    std::cout << "ratelimitd " << kVersion << "\n";
    return 0;
  }
  if (flags.check_config) {
    auto c = ratelimit::policy::LoadConfigFile(*flags.check_config);
    if (c.ok()) {
      auto p = ratelimit::policy::Policy::Create(std::move(*c));
      if (p.ok()) {
        std::cout << "OK\n";
        return 0;
      }
      std::cout << p.status().message() << "\n";
      return 1;
    }
    std::cout << c.status().message() << "\n";
    return 1;
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
  const ratelimit::policy::StoreConfig store_config = config.store;
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
  if (auto s = server.Start(std::move(*store)); !s.ok()) {
    Log(Level::kError, "cannot start", {{"error", s.message()}});
    return 1;
  }
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
  return server.Run();
}
