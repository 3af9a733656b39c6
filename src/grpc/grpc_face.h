// GrpcFace: ratelimitd's gRPC listener. Serves Envoy's global rate limit
// service (envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit) on
// envoyproxy/ratelimit's YAML config directory, and grpc.health.v1.Health,
// deciding on the daemon's store through its own Enforcer (same store,
// deadline, breaker and failure modes as the HTTP faces). docs/envoy.md.
//
//   GrpcOptions o{.listen = "127.0.0.1:8081", .envoy_config_dir = "/etc/ratelimit"};
//   StatusOr<std::unique_ptr<GrpcFace>> face = GrpcFace::Start(o, store, ioc);
//   ... threads run ioc; at SIGTERM: face->Drain(), wait for connections() == 0 ...
//   (*face)->Shutdown();  // before the store goes
//
// It runs on the io_context it is given, whose owner runs and drains it: in
// ratelimitd the server's (server::Server::Context), on server.threads
// threads beside the HTTP faces. With one thread a Redis store's client runs
// there too, so a call, its Redis batch and its answer stay on one thread.
//
// The config directory is reloaded on SIGHUP and when a file in it changes
// (inotify; 100 ms after the last change), atomically: a broken file is
// logged and the config in use stays. The watch follows the configured
// path: a symlink on the way swapped (or the directory replaced) reloads
// from what the path names now.
//
// The gRPC server under it is ours (h2_server.h: nghttp2's HTTP/2 and gRPC's
// wire format on Asio), not gRPC C++: docs/envoy.md says why.
//
// Thread-safety: Start, Shutdown and the destructor from one thread; Drain
// and connections from any; calls are served on the io_context's threads,
// each call on its connection's strand, no thread per call.
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "grpc/decide.h"
#include "policy/config.h"
#include "policy/policy.h"
#include "ratelimit/status.h"
#include "ratelimit/store.h"

namespace boost::asio {
class io_context;
}  // namespace boost::asio

namespace ratelimit::envoy {
struct Config;
}

namespace ratelimit::grpcface {

struct GrpcOptions {
  std::string listen;            // host:port (port 0: any free port)
  std::string envoy_config_dir;  // "" = no domains: every descriptor is OK without limit
  FailureMode failure_mode = FailureMode::kOpen;
  policy::StoreConfig store;  // deadline and the local failure mode's numbers
  // When set (the daemon's current policy), each call takes the store
  // settings a reload changes from it: store.expected_instances and, unless
  // `own_failure_mode` (envoy.failure_mode was given: restart-bound, and
  // then `failure_mode`), store.failure_mode. Unset: `store` and
  // `failure_mode` as given.
  std::function<std::shared_ptr<const policy::Policy>()> current_policy;
  bool own_failure_mode = false;
  // response_headers_to_add for the descriptor closest to its limit (kNone:
  // off, as in envoyproxy/ratelimit).
  policy::HeaderDialect headers = policy::HeaderDialect::kNone;
};

class GrpcFace {
 public:
  // Loads the config directory (an error if it is broken), binds, and
  // serves on `ioc` (which must outlive the face) as its threads run it.
  static StatusOr<std::unique_ptr<GrpcFace>> Start(GrpcOptions options,
                                                   std::shared_ptr<Store> store,
                                                   boost::asio::io_context& ioc);
  ~GrpcFace();

  int port() const;
  // Reloads the config directory now (what SIGHUP and inotify do).
  Status Reload();
  std::shared_ptr<const envoy::Config> config() const;
  // The loaded domains and the last reload's result, for the admin API's
  // GET /v1/envoy/domains (docs/admin.md).
  nlohmann::json Describe() const;
  // Health turns NOT_SERVING (Watch calls hear it and end), the listener
  // closes, every connection gets GOAWAY: calls in flight finish, and a
  // connection closes when it has none. Does not block; idempotent.
  void Drain();
  // Open connections (the drain is over at 0).
  size_t connections() const;
  // Open health Watch calls (each is forgotten when its stream closes).
  size_t watchers() const;
  // Drain, and close the connections left, without waiting (the io_context
  // closes them if it still runs, or as it is destroyed). Idempotent.
  void Shutdown();

  struct Impl;

 private:
  explicit GrpcFace(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Validates an Envoy config directory (for --check-config): OK or the first
// error with its file:line.
Status CheckEnvoyConfig(const std::string& dir);

}  // namespace ratelimit::grpcface
