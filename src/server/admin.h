// AdminApi: the operators' HTTP API, served only on the admin listener
// (server.admin_listen, default 127.0.0.1:9090). docs/admin.md is its manual.
//
//   GET    /healthz                          the process is up (also while draining)
//   GET    /readyz                           the store can decide (or the failure mode can);
//                                            503 while draining (SIGTERM)
//   GET    /metrics                          Prometheus text format 0.0.4 (server/metrics.h)
//   GET    /v1/config                        the loaded config, secrets redacted
//   GET    /v1/clients/{client}/state        each limit's remaining/limit/reset/retry (Peek)
//   GET    /v1/clients/{client}/denials      this instance's recent denials of the client
//   POST   /v1/clients/{client}/reset        forget the client's state (also DELETE .../state)
//   GET    /v1/top-denied?n=10&window=5m     the clients denied most lately
//   POST   /v1/explain                       what the rules would do with a request (explain.h)
//   GET    <view>                            views other faces add (AddView): the gRPC
//                                            face's /v1/envoy/domains
//   GET    /v1/overrides?limit=&offset=      the per-client overrides, a page at a time
//   GET    /v1/overrides/{client}            one client's override
//   PUT    /v1/overrides/{client}            set it: {"limits": {...}, "plan": ..., "ttl": ...,
//                                            "expires_at": ..., "reason": ...} (overrides.h)
//   DELETE /v1/overrides/{client}            remove it
//
// {client} is the identity the policy forms ("k:<api key>", "u:<user>",
// "ip:<address>", percent-encoded in the path), an API key as answers show it
// ("k:demo***1f2e3d4c", when this instance knows the key), a decision-API
// caller's key ("d:<key>": the config's named limits), or "-" with exactly
// one of ?api_key=, ?user=, ?ip= to have it formed. Reading never creates
// state (Store::Peek); a client none of whose limits holds usage answers 404.
//
// With server.admin_token_file set, every path but /healthz and /readyz
// requires `Authorization: Bearer <token>` (compared in constant time; 401
// otherwise). The token is never logged or shown. Without one, those paths
// answer only a Host that is an IP literal, localhost or *.localhost (403
// otherwise): a browser page rebinding its own name to 127.0.0.1 sends that
// name, and would otherwise drive the API as a same-origin client.
//
// DemoState serves the public /demo/state (server.demo): the same view for
// the CALLER's own identity only.
//
// Thread-safety: all methods may be called from any thread; `done` runs on
// whatever thread the store answers on.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "policy/policy.h"
#include "ratelimit/status.h"
#include "ratelimit/store.h"
#include "ratelimit/thread_annotations.h"
#include "server/enforcer.h"
#include "server/http.h"
#include "server/reply.h"

namespace ratelimit::server {

class AdminApi {
 public:
  // `token`: "" = no token required. The store is the enforcer's (not owned
  // here: the server decides when the store goes away).
  AdminApi(Enforcer& enforcer, std::string token);

  // `peer`: who asked, for the log of override changes ("127.0.0.1:5123").
  void Handle(const Request& request, std::shared_ptr<const policy::Policy> policy,
              std::function<void(Reply&&)> done, std::string_view peer = {});

  // 200 with the state of `who` (a full bucket when nothing is stored).
  void DemoState(std::shared_ptr<const policy::Policy> policy, const policy::Identity& who,
                 std::function<void(Reply&&)> done);

  // SIGTERM: from now on /readyz answers 503 {"ready":false,"draining":true}
  // and /healthz 200 {"status":"draining"}, until the process exits.
  void StartDraining() { draining_.store(true, std::memory_order_relaxed); }

  // A read-only JSON view another face adds (GET `path`, behind the token
  // like the rest): the gRPC face's loaded Envoy domains. `view` runs on an
  // I/O thread for each request; a second view on one path replaces the first.
  void AddView(std::string path, std::function<nlohmann::json()> view);

  // The token in `path` (surrounding white space dropped). An empty or
  // unreadable file is an error (kInvalidArgument naming the path, never the content).
  static StatusOr<std::string> ReadTokenFile(const std::string& path);

  struct Client;  // whom {client} names (admin.cc)

 private:
  StatusOr<Client> ClientOf(const policy::Policy& policy, std::string_view client) const;
  // The client text ClientOf names, as store keys and overrides hold it:
  // "k:<the full key>", "u:..", "ip:..", or "d:<decision-API key>".
  StatusOr<std::string> ClientKeyOf(const policy::Policy& policy, std::string_view client) const;
  struct StateOp;
  void State(std::shared_ptr<const policy::Policy> policy, Client who, bool not_found_if_empty,
             std::string instance, std::function<void(Reply&&)> done);
  void PeekNext(std::shared_ptr<StateOp> op);
  struct ResetOp;
  void Reset(std::shared_ptr<const policy::Policy> policy, Client who, std::string instance,
             std::function<void(Reply&&)> done);
  void ResetNext(std::shared_ptr<ResetOp> op);
  // GET shows the client's block periods in force, DELETE lifts them (issue 21).
  struct BlocksOp;
  void Blocks(std::shared_ptr<const policy::Policy> policy, Client who, bool lift,
              std::string instance, std::function<void(Reply&&)> done);
  void BlocksNext(std::shared_ptr<BlocksOp> op);
  void Ready(std::shared_ptr<const policy::Policy> policy, std::function<void(Reply&&)> done);
  bool Authorized(const Request& request) const;
  // /v1/overrides and /v1/overrides/{client} (admin_overrides.cc).
  void OverridesPath(const Request& request, const policy::Policy& policy, std::string_view path,
                     const std::map<std::string, std::string>& params, std::string_view peer,
                     std::function<void(Reply&&)> done);

  Store& store() { return enforcer_.store(); }

  Enforcer& enforcer_;
  const std::string token_;
  std::atomic<bool> draining_{false};
  mutable Mutex views_mu_;
  std::map<std::string, std::function<nlohmann::json()>, std::less<>> views_
      RL_GUARDED_BY(views_mu_);
};

// A JSON answer of the admin API (never cached).
Reply AdminJsonReply(unsigned status, const nlohmann::json& body);
// 405 with its Allow header ("GET", "GET, PUT, DELETE").
Reply AdminMethodNotAllowed(std::string_view path, std::string_view allow);

}  // namespace ratelimit::server
