// config_fuzzer: the YAML loader (src/policy/config.cc), the policy compiler
// (policy.cc) and the redacted dump (config_dump.cc) on arbitrary bytes.
//
// Invariants:
//   - ParseConfig never throws and fails only with kInvalidArgument;
//   - a config that loads compiles: Policy::Create succeeds (the loader
//     validates everything the compiler relies on) and resolves requests;
//   - a loaded config without API keys dumps to YAML that loads back and
//     dumps to the same text (the dump is in the loader's schema).
// `api_keys_file` is read relative to a folder that does not exist, so
// relative names fail fast (absolute ones are read).
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "fuzz/targets.h"
#include "policy/config.h"
#include "policy/policy.h"

namespace ratelimit::fuzz {
namespace {

constexpr std::string_view kSource = "fuzz.yaml";
const std::string kBaseDir = "/nonexistent/ratelimit-fuzz";

void Exercise(const policy::Policy& p) {
  static const char* const kTargets[] = {
      "/", "/api/ping", "/API/users/42/", "/login?x=1", "/a/b/c/d", "/%7Euser", "/..", "bad"};
  static const char* const kMethods[] = {"GET", "POST", "DELETE"};
  auto ip = policy::IpAddress::Parse("10.1.2.3");
  for (int i = 0; i < 8; ++i) {
    policy::RequestView req{
        .method = kMethods[i % 3],
        .target = kTargets[i],
        .peer = *ip,
        .header = [i](std::string_view name) -> std::optional<std::string_view> {
          if (i % 2 == 0) return std::nullopt;
          if (name == "X-Forwarded-For") return "198.51.100.7, 10.0.0.1";
          return "fuzz-key-1";
        }};
    StatusOr<policy::RequestPlan> plan = p.Resolve(req);
    if (!plan.ok()) continue;
    (void)p.LimitsFor(plan->identity);
    (void)p.PeekGroupsFor(plan->identity);
    for (const policy::CheckGroup& g : plan->groups) {
      RL_FUZZ_CHECK(!g.checks.empty(), "empty check group for " + g.key);
      for (const LimitCheck& c : g.checks) RL_FUZZ_CHECK(c.limit != nullptr, g.key);
    }
  }
}

}  // namespace

int FuzzConfig(const uint8_t* data, size_t size) {
  const std::string_view yaml(reinterpret_cast<const char*>(data), size);
  StatusOr<policy::Config> c = policy::ParseConfig(yaml, kSource, kBaseDir);
  if (!c.ok()) {
    RL_FUZZ_CHECK(c.status().code() == StatusCode::kInvalidArgument, c.status().ToString());
    RL_FUZZ_CHECK(std::string_view(c.status().message()).starts_with(kSource),
                  c.status().message());
    return 0;
  }
  const std::string dump = policy::DumpRedacted(*c);
  const bool has_keys = !c->api_keys.empty() || !c->api_keys_file.empty();

  StatusOr<std::shared_ptr<const policy::Policy>> p = policy::Policy::Create(*c);
  RL_FUZZ_CHECK(p.ok(), "loaded but does not compile: " + p.status().ToString());
  Exercise(**p);

  if (!has_keys) {
    StatusOr<policy::Config> again = policy::ParseConfig(dump, kSource, kBaseDir);
    RL_FUZZ_CHECK(again.ok(), "the dump does not load: " + again.status().ToString() + "\n" + dump);
    const std::string dump2 = policy::DumpRedacted(*again);
    RL_FUZZ_CHECK(dump2 == dump, "dump changed on reload:\n" + dump + "---\n" + dump2);
  }
  return 0;
}

}  // namespace ratelimit::fuzz
