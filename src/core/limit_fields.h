// The fields that define a Limit, as the config and the admin API spell them:
// the one list both writers (the effective config's YAML, policy's
// config_dump.cc; an override's JSON, server's overrides.cc) take, so neither
// leaves a field out.
//
//   algorithm, the count (capacity | depth | limit), the rate
//   (refill_per_second | rate_per_second) or the window ("60s", "1mo"),
//   align: calendar + timezone (a calendar quota), prefetch (when set),
//   block_for (when set).
//
// Reading them back (the YAML loader, the decision API's inline limit with
// `prefetch` allowed) gives the same Limit.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ratelimit/limit.h"

namespace ratelimit::core {

struct LimitField {
  // A count, a rate, or a text (algorithm, durations, align, time zone).
  enum class Kind { kInteger, kNumber, kText };
  std::string_view key;
  Kind kind = Kind::kText;
  int64_t integer = 0;
  double number = 0;
  std::string text;
};

inline std::vector<LimitField> LimitFieldsOf(const Limit& l) {
  using Kind = LimitField::Kind;
  std::vector<LimitField> out;
  out.reserve(7);
  auto integer = [&out](std::string_view key, int64_t v) {
    out.push_back({.key = key, .kind = Kind::kInteger, .integer = v});
  };
  auto text = [&out](std::string_view key, std::string v) {
    out.push_back({.key = key, .kind = Kind::kText, .text = std::move(v)});
  };
  const auto [count_name, second_name] = SpecFieldNames(l.algorithm());
  text("algorithm", std::string(AlgorithmName(l.algorithm())));
  integer(count_name, l.limit());
  if (TakesRate(l.algorithm())) {
    out.push_back({.key = second_name, .kind = Kind::kNumber, .number = l.refill_per_second()});
  } else {
    text(second_name, WindowText(l));
    if (const Calendar* c = l.calendar()) {
      text("align", "calendar");
      text("timezone", c->zone().name());
    }
  }
  if (l.prefetch() > 0) integer("prefetch", l.prefetch());
  if (l.block_for().count() > 0) text("block_for", FormatDuration(l.block_for()));
  return out;
}

}  // namespace ratelimit::core
