#include "envoy/describe.h"

#include <string>

namespace ratelimit::envoy {
namespace {

using json = nlohmann::json;

json RuleJson(const Rule& r) {
  json j;
  if (r.unlimited) {
    j["unlimited"] = true;
  } else {
    j["requests_per_unit"] = r.requests_per_unit;
    if (r.unit != Unit::kUnknown) j["unit"] = std::string(UnitName(r.unit));
    j["period"] = FormatDuration(r.period);
    j["algorithm"] = std::string(AlgorithmName(r.algorithm));
    if (r.burst > 0) j["burst"] = r.burst;
  }
  if (!r.name.empty()) j["name"] = r.name;
  if (!r.replaces.empty()) j["replaces"] = r.replaces;
  j["line"] = r.line;
  return j;
}

// Depth first, children in key order: one entry per level that has rules.
void Collect(const Node& node, json& out) {
  if (!node.rules.empty()) {
    json level = {{"path", node.metric_path}};
    if (node.shadow_mode) level["shadow_mode"] = true;
    if (node.detailed_metric) level["detailed_metric"] = true;
    json rules = json::array();
    for (const Rule& r : node.rules) rules.push_back(RuleJson(r));
    level["rules"] = std::move(rules);
    out.push_back(std::move(level));
  }
  for (const auto& [name, child] : node.children) Collect(child, out);
}

}  // namespace

json Describe(const Config& config) {
  json domains = json::array();
  for (const auto& [name, d] : config.domains) {
    json descriptors = json::array();
    Collect(d.root, descriptors);
    domains.push_back({{"domain", name}, {"file", d.file}, {"descriptors", descriptors}});
  }
  return {{"source", config.source}, {"domains", domains}};
}

}  // namespace ratelimit::envoy
