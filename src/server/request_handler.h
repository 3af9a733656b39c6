// RequestHandler: what a Session hands each complete request to. The Router
// is the daemon's; a session unit test (session_test.cc) drives the framing
// with a fake one, without the policy, the enforcer or a store.
//
//   handler.Handle(request, peer, "203.0.113.7", [](Reply&& r) { ... }, holder);
//
// Thread-safety: Handle may be called from any thread; `done` may run on any
// thread, exactly once. The request must stay alive and unchanged until
// `done` runs.
#pragma once

#include <functional>
#include <string_view>

#include "policy/ip.h"
#include "server/hold.h"
#include "server/http.h"
#include "server/reply.h"

namespace ratelimit::server {

class RequestHandler {
 public:
  virtual ~RequestHandler() = default;
  // `holder` (may be null) holds shaped requests; it must outlive `done`.
  virtual void Handle(const Request& request, const policy::IpAddress& peer,
                      std::string_view peer_text, std::function<void(Reply&&)> done,
                      Holder* holder) = 0;
};

}  // namespace ratelimit::server
