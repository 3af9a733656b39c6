// Describe: a loaded Envoy config as JSON, for the admin API's
// GET /v1/envoy/domains (docs/admin.md): every domain, its file, and each
// configured rule by its descriptor path, as an operator reads them back.
//
//   nlohmann::json j = envoy::Describe(*config);
//   // {"source": "/etc/ratelimit", "domains": [{"domain": "another",
//   //   "file": ".../another.yaml", "rules": [{"path": "key2",
//   //   "requests_per_unit": 20, "unit": "MINUTE", "algorithm": "fixed_window", ...}]}]}
//
// Thread-safety: a pure function of an immutable Config.
#pragma once

#include <nlohmann/json.hpp>

#include "envoy/config.h"

namespace ratelimit::envoy {

nlohmann::json Describe(const Config& config);

}  // namespace ratelimit::envoy
