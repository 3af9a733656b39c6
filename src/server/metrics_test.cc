#include "server/metrics.h"

#include <gtest/gtest.h>

namespace ratelimit::server {
namespace {

TEST(Metrics, CountsDecisionsPerLabelSetAndRendersThem) {
  Metrics m;
  DecisionCells& a = m.Decisions("search", "burst");
  EXPECT_EQ(&a, &m.Decisions("search", "burst"));  // one object per label set
  a.At(Face::kGateway, DecisionOutcome::kDenied).Inc();
  a.At(Face::kGateway, DecisionOutcome::kDenied).Inc();
  m.Decisions("", "daily").At(Face::kDecisionApi, DecisionOutcome::kAllowed).Inc();
  m.Degraded(FailureCause::kTimeout).Inc();
  m.store_latency.Observe(std::chrono::microseconds(300));
  m.store_latency.Observe(std::chrono::seconds(2));
  const std::string text = m.Render(nullptr);
  EXPECT_NE(text.find("ratelimit_decisions_total{face=\"gateway\",route=\"search\",limit=\"burst\","
                      "outcome=\"denied\"} 2\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("ratelimit_decisions_total{face=\"decision_api\",route=\"\",limit=\"daily\","
                      "outcome=\"allowed\"} 1\n"),
            std::string::npos);
  EXPECT_NE(text.find("ratelimit_degraded_decisions_total{cause=\"timeout\"} 1\n"),
            std::string::npos);
  EXPECT_NE(text.find("ratelimit_store_call_duration_seconds_bucket{le=\"0.0005\"} 1\n"),
            std::string::npos);
  EXPECT_NE(text.find("ratelimit_store_call_duration_seconds_bucket{le=\"+Inf\"} 2\n"),
            std::string::npos);
  EXPECT_NE(text.find("ratelimit_store_call_duration_seconds_count 2\n"), std::string::npos);
  EXPECT_EQ(text.find("ratelimit_store_breaker_state"), std::string::npos);  // Redis only
}

TEST(Metrics, ShapingDelaysHaveTheirOwnBuckets) {
  Metrics m;
  m.Delayed(Face::kGateway).Inc();
  m.delay.Observe(std::chrono::milliseconds(1800));
  m.delay.Observe(std::chrono::seconds(90));
  m.held.Add(3);
  const std::string text = m.Render(nullptr);
  EXPECT_NE(text.find("ratelimit_delayed_requests_total{face=\"gateway\"} 1\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("ratelimit_delayed_requests_total{face=\"auth_request\"} 0\n"),
            std::string::npos);
  EXPECT_NE(text.find("ratelimit_request_delay_seconds_bucket{le=\"1\"} 0\n"), std::string::npos);
  EXPECT_NE(text.find("ratelimit_request_delay_seconds_bucket{le=\"2.5\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("ratelimit_request_delay_seconds_bucket{le=\"60\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("ratelimit_request_delay_seconds_bucket{le=\"+Inf\"} 2\n"),
            std::string::npos);
  EXPECT_NE(text.find("ratelimit_held_requests 3\n"), std::string::npos);
  // The store latency keeps its own bounds.
  EXPECT_NE(text.find("ratelimit_store_call_duration_seconds_bucket{le=\"0.0001\"}"),
            std::string::npos);
}

TEST(Metrics, StageHistogramsCarryTheirStageLabel) {
  Metrics m;
  m.StageTime(Metrics::Stage::kParse).Observe(std::chrono::microseconds(7));
  m.StageTime(Metrics::Stage::kHandler).Observe(std::chrono::microseconds(300));
  m.StageTime(Metrics::Stage::kHandler).Observe(std::chrono::milliseconds(3));
  const std::string text = m.Render(nullptr);
  EXPECT_NE(text.find("# TYPE ratelimit_stage_seconds histogram\n"), std::string::npos) << text;
  EXPECT_NE(text.find("ratelimit_stage_seconds_bucket{stage=\"parse\",le=\"1e-05\"} 1\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("ratelimit_stage_seconds_bucket{stage=\"handler\",le=\"0.00025\"} 0\n"),
            std::string::npos);
  EXPECT_NE(text.find("ratelimit_stage_seconds_bucket{stage=\"handler\",le=\"0.0005\"} 1\n"),
            std::string::npos);
  EXPECT_NE(text.find("ratelimit_stage_seconds_bucket{stage=\"handler\",le=\"+Inf\"} 2\n"),
            std::string::npos);
  EXPECT_NE(text.find("ratelimit_stage_seconds_count{stage=\"handler\"} 2\n"), std::string::npos);
  EXPECT_NE(text.find("ratelimit_stage_seconds_sum{stage=\"handler\"} 0.0033\n"),
            std::string::npos);
  EXPECT_NE(text.find("ratelimit_stage_seconds_count{stage=\"write\"} 0\n"), std::string::npos);
  // The unlabelled histograms keep their form.
  EXPECT_NE(text.find("ratelimit_store_call_duration_seconds_count 0\n"), std::string::npos);
}

TEST(Metrics, SettlementsByOutcomeAndUnitsByDirection) {
  Metrics m;
  m.Settlements(Metrics::SettleOutcome::kSettled).Inc(3);
  m.Settlements(Metrics::SettleOutcome::kDisconnected).Inc();
  m.settled_debited.Inc(4000);
  m.settled_refunded.Inc(800);
  const std::string text = m.Render(nullptr);
  for (const char* line : {"ratelimit_settlements_total{outcome=\"settled\"} 3\n",
                           "ratelimit_settlements_total{outcome=\"missing\"} 0\n",
                           "ratelimit_settlements_total{outcome=\"disconnected\"} 1\n",
                           "ratelimit_settlements_total{outcome=\"error\"} 0\n",
                           "ratelimit_settled_units_total{direction=\"debited\"} 4000\n",
                           "ratelimit_settled_units_total{direction=\"refunded\"} 800\n"}) {
    EXPECT_NE(text.find(line), std::string::npos) << line << " not in:\n" << text;
  }
}

TEST(Metrics, LabelSetsAreBounded) {
  Metrics m;
  for (size_t i = 0; i < kMaxDecisionLabelSets + 10; ++i) {
    m.Decisions("r", "l" + std::to_string(i)).At(Face::kDemo, DecisionOutcome::kAllowed).Inc();
  }
  const std::string text = m.Render(nullptr);
  EXPECT_NE(text.find("route=\"~other\",limit=\"~other\",outcome=\"allowed\"} 10\n"),
            std::string::npos);
}

}  // namespace
}  // namespace ratelimit::server
