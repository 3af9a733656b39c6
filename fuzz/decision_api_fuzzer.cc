// decision_api_fuzzer: POST /v1/check and /v1/check/batch bodies
// (src/server/decision_api.cc), through DecisionApi on a MemoryStore.
//
// The input is the request body; it is sent to both /v1/check and
// /v1/check/batch. Invariants (beyond CheckReply in server_fixture.h):
//   - each call answers exactly once, before returning (MemoryStore is synchronous);
//   - /v1/check answers 200, 429, 400 or the closed status; 200/429 bodies say
//     "allowed" accordingly and list one entry per requested limit;
//   - /v1/check/batch answers 400 or 200 with one result per check;
//   - FastParseCheck answers only bodies ParseBody + ParseCheck accept, and alike.
// The store holds at most 40 keys, so long batches also reach the failure mode.
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "fuzz/server_fixture.h"
#include "fuzz/targets.h"
#include "server/decision_api.h"

namespace ratelimit::fuzz {
namespace {

constexpr std::string_view kDecisionApiConfig = R"(
server:
  headers: structured
store:
  type: memory
  max_keys: 40
  max_key_length: 256
  failure_mode: local
  expected_instances: 3
limits:
  burst: {algorithm: token_bucket, capacity: 20, refill_per_second: 10}
  slow: {algorithm: token_bucket, capacity: 3, refill_per_second: 0.001}
  daily: {algorithm: fixed_window, limit: 10000, window: 1d}
  login: {algorithm: sliding_log, limit: 5, window: 15m}
  hourly: {algorithm: sliding_window, limit: 600, window: 1h}
  shape: {algorithm: leaky_bucket, depth: 4, rate_per_second: 2}
)";

}  // namespace

int FuzzDecisionApi(const uint8_t* data, size_t size) {
  static const std::shared_ptr<const policy::Policy> policy = CompilePolicy(kDecisionApiConfig);
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  ServerFixture f(policy);
  server::DecisionApi api(f.enforcer());

  int answers = 0;
  api.Check(policy, body, "/v1/check", [&](server::Reply r) {
    ++answers;
    CheckReply(r, "/v1/check");
    RL_FUZZ_CHECK(r.status == 200 || r.status == 429 || r.status == 400 || r.status == 503,
                  std::to_string(r.status));
    if (r.status == 200 || r.status == 429) {
      const nlohmann::json j = nlohmann::json::parse(r.body);
      RL_FUZZ_CHECK(j.at("allowed").is_boolean() && j.at("allowed") == (r.status == 200), r.body);
      RL_FUZZ_CHECK(j.at("limits").is_array() && !j.at("limits").empty(), r.body);
    }
  });
  RL_FUZZ_CHECK(answers == 1, "/v1/check answered " + std::to_string(answers) + " times");

  answers = 0;
  api.Batch(policy, body, "/v1/check/batch", [&](server::Reply r) {
    ++answers;
    CheckReply(r, "/v1/check/batch");
    RL_FUZZ_CHECK(r.status == 200 || r.status == 400, std::to_string(r.status));
    if (r.status == 200) {
      const nlohmann::json j = nlohmann::json::parse(r.body);
      const nlohmann::json req = nlohmann::json::parse(body);
      RL_FUZZ_CHECK(j.at("results").size() == req.at("checks").size(), r.body);
    }
  });
  RL_FUZZ_CHECK(answers == 1, "/v1/check/batch answered " + std::to_string(answers) + " times");

  // The pure parts on their own: ParseCheck on every value of the body (no policy too).
  StatusOr<nlohmann::json> j = server::ParseBody(body);
  // The fast path answers only what the full parser accepts, and the same way.
  if (std::optional<server::ParsedCheck> fast = server::FastParseCheck(body, policy.get(), 64)) {
    RL_FUZZ_CHECK(j.ok(), "the fast path accepted a body the full parser rejects");
    StatusOr<server::ParsedCheck> full = server::ParseCheck(*j, policy.get(), 64);
    RL_FUZZ_CHECK(full.ok(), "the fast path accepted a check the full parser rejects: " +
                                 full.status().message());
    RL_FUZZ_CHECK(*fast == *full, "the fast path parsed a check differently");
  }
  if (j.ok()) {
    (void)server::ParseCheck(*j, nullptr, 512);
    if (j->is_object() && j->contains("checks") && (*j)["checks"].is_array()) {
      for (const nlohmann::json& c : (*j)["checks"]) (void)server::ParseCheck(c, policy.get(), 64);
    }
  }
  return 0;
}

}  // namespace ratelimit::fuzz
