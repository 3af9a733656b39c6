// ServerFixture: what the server-side fuzz targets (decision_api, http) share.
// A Policy compiled from a YAML string, a fresh MemoryStore on a ManualClock
// (so an input replays the same way every time), an Enforcer and a Router
// without an upstream; and CheckReply, the invariants of every answer.
//
//   ServerFixture f(kYaml);              // once per input: state starts empty
//   f.router().Handle(req, peer, "198.51.100.7", [&](server::Reply r) { CheckReply(r); });
//
// Thread-safety: one thread.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "fuzz/targets.h"
#include "policy/config.h"
#include "policy/policy.h"
#include "ratelimit/clock.h"
#include "ratelimit/memory_store.h"
#include "server/enforcer.h"
#include "server/http.h"
#include "server/policy_holder.h"
#include "server/reply.h"
#include "server/router.h"
#include "server/store_factory.h"

namespace ratelimit::fuzz {

// Compiles `yaml` once per process. REQUIRES: it is a valid config.
inline std::shared_ptr<const policy::Policy> CompilePolicy(std::string_view yaml) {
  StatusOr<policy::Config> c = policy::ParseConfig(yaml, "fuzz-fixture.yaml");
  RL_FUZZ_CHECK(c.ok(), c.status().ToString());
  StatusOr<std::shared_ptr<const policy::Policy>> p = policy::Policy::Create(std::move(*c));
  RL_FUZZ_CHECK(p.ok(), p.status().ToString());
  return *p;
}

class ServerFixture {
 public:
  explicit ServerFixture(std::shared_ptr<const policy::Policy> policy)
      : policy_(std::move(policy)),
        holder_(policy_),
        store_(std::make_shared<MemoryStore>(
            MemoryStore::Options{.shards = 4,
                                 .max_keys = policy_->config().store.max_keys,
                                 .max_key_length = server::StoreKeyLength(policy_->config().store),
                                 .clock = &clock_})),
        enforcer_(store_, policy_->config().store.max_keys),
        router_(holder_, enforcer_, /*gateway=*/nullptr, policy_->config().server.demo) {}

  const std::shared_ptr<const policy::Policy>& policy() const { return policy_; }
  server::PolicyHolder& holder() { return holder_; }
  server::Enforcer& enforcer() { return enforcer_; }
  server::Router& router() { return router_; }
  ManualClock& clock() { return clock_; }

 private:
  ManualClock clock_;
  std::shared_ptr<const policy::Policy> policy_;
  server::PolicyHolder holder_;
  std::shared_ptr<MemoryStore> store_;
  server::Enforcer enforcer_;
  server::Router router_;
};

// Feeds `in` to a Beast parser as a peer that sends `in` and then closes:
// when the parser needs more than is left, it gets EOF. Drops from `in` what
// the parser used (the rest may be a pipelined message). Returns the parse
// error, if any (on success the parser is done). Beast requires unconsumed
// bytes to come back only with more bytes after them, so after need_more
// this never presents the same bytes again.
template <class Parser>
server::beast::error_code FeedAndClose(Parser& parser, std::string_view& in) {
  server::beast::error_code ec;
  while (!parser.is_done()) {
    const size_t used = parser.put(server::net::buffer(in.data(), in.size()), ec);
    in.remove_prefix(used);
    if (ec == server::http::error::need_more || (!ec && used == 0)) {
      ec = {};
      // Nothing at all (put_eof asserts that some bytes came): the peer closed at once.
      if (!parser.got_some()) ec = server::http::error::partial_message;
      if (!ec) parser.put_eof(ec);
      break;
    }
    if (ec) break;
  }
  return ec;
}

inline bool IsTokenChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

// The invariants of every answer: a real status (never 500: that would be a
// bug answering), header names that are tokens and values without CR, LF or
// NUL (no header injection from request bytes), a JSON body whenever the
// content type says JSON, and a problem body that agrees with the status.
inline void CheckReply(const server::Reply& r, std::string_view context) {
  const std::string where = std::string(context) + ": status " + std::to_string(r.status);
  RL_FUZZ_CHECK(r.status >= 100 && r.status <= 599 && r.status != 500, where + "\n" + r.body);
  for (const auto& [name, value] : r.headers) {
    RL_FUZZ_CHECK(!name.empty(), where);
    for (char c : name) RL_FUZZ_CHECK(IsTokenChar(c), where + ": header name " + name);
    RL_FUZZ_CHECK(value.find_first_of(std::string_view("\r\n\0", 3)) == std::string::npos,
                  where + ": header " + name + ": " + value);
  }
  RL_FUZZ_CHECK(r.content_type.find_first_of(std::string_view("\r\n\0", 3)) == std::string::npos,
                where);
  if (r.content_type.find("json") != std::string::npos) {
    nlohmann::json j = nlohmann::json::parse(r.body, nullptr, /*allow_exceptions=*/false);
    RL_FUZZ_CHECK(!j.is_discarded(), where + ": body is not JSON: " + r.body);
    if (r.content_type == "application/problem+json") {
      RL_FUZZ_CHECK(j.is_object() && j.contains("status") && j["status"] == r.status,
                    where + ": " + r.body);
      RL_FUZZ_CHECK(j.contains("title") && j["title"].is_string(), where + ": " + r.body);
    }
  }
}

}  // namespace ratelimit::fuzz
