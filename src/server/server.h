// Server: ratelimitd's running state. Owns the io_context and its threads,
// the listener, the Router and its faces, the current Policy, and the
// signal handling:
//   SIGTERM / SIGINT  stop accepting, let in-flight requests finish (at most
//                     drain_timeout), close idle connections, return 0. The
//                     admin listener serves on until the drain ends, /readyz
//                     answering 503 "draining". A face added with
//                     AddDrainHooks drains alongside. Then the store closes
//                     (Store::Shutdown: its calls in flight are answered)
//   SIGHUP            reload the config file: a new Policy is built fully and
//                     swapped in; a bad file is logged and the old policy keeps
//                     serving; changes that need a restart (store, listeners,
//                     threads, upstream) are logged as ignored
// A memory store is swept every few seconds.
//
//   Server server(policy, options);
//   auto store = MakeStore(config.store, server.SharedContext());
//   if (Status s = server.Start(*store); !s.ok()) return 1;
//   return server.Run();
//
// Thread-safety: Start and Run from one thread (main); everything else runs
// on the io_context threads.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "policy/config.h"
#include "policy/policy.h"
#include "ratelimit/status.h"
#include "ratelimit/store.h"

namespace boost::asio {
class io_context;
}  // namespace boost::asio

namespace ratelimit::server {

struct ServerOptions {
  std::string config_path;  // "" = embedded default (SIGHUP has nothing to reload)
  // Re-applied to every (re)loaded config: the command-line flags win over the file.
  std::function<void(policy::Config&)> apply_overrides;
  std::chrono::milliseconds drain_timeout{10'000};
  // Every state the store drops once expired is dropped within this; the
  // store is swept in 64 steps spread over it (Store::SweepPart).
  std::chrono::milliseconds sweep_interval{5'000};
};

// A face of the daemon on the server's io_context beside the HTTP ones (the
// gRPC face): the drain starts its own (begin), waits for its connections as
// for the HTTP faces' (until open() is 0), and at drain_timeout closes what
// is left (close). Each is called on an io_context thread.
struct DrainHooks {
  std::function<void()> begin;
  std::function<size_t()> open;
  std::function<void()> close;
};

class Server {
 public:
  Server(std::shared_ptr<const policy::Policy> policy, ServerOptions options);
  ~Server();

  // With one I/O thread (server.threads: 1), the io_context it runs: a
  // RedisStore's client may run there too (RedisStore::Options::io_context),
  // sparing a hand-off between threads each way per batch, as the server's
  // own Redis clients (concurrency leases, overrides) then do. The server
  // shuts the store down before it stops. nullptr with more threads.
  boost::asio::io_context* SharedContext();
  // The io_context the server's threads run (server.threads of them): another
  // face may serve on it (grpcface::GrpcFace), drained with the server's
  // (AddDrainHooks).
  boost::asio::io_context& Context();
  // Before Run.
  void AddDrainHooks(DrainHooks hooks);

  // Binds the listener and prepares the faces, deciding with `store`. Logs
  // "listening".
  Status Start(std::shared_ptr<Store> store);
  // The policy in effect (the last reload's): another face reads the
  // settings a reload changes from it per call. Any thread.
  std::shared_ptr<const policy::Policy> CurrentPolicy() const;
  // A read-only JSON view on the admin API (AdminApi::AddView), after Start.
  void AddAdminView(std::string path, std::function<nlohmann::json()> view);
  // Runs until SIGTERM/SIGINT and the drain; returns the exit code.
  int Run();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ratelimit::server
