#include "grpc/should_rate_limit.h"

#include <algorithm>
#include <mutex>
#include <utility>
#include <vector>

#include "envoy/plan.h"
#include "envoy/service/ratelimit/v3/rls.pb.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/stubs/logging.h"
#include "grpc/decide.h"
#include "server/enforcer.h"
#include "server/headers.h"
#include "server/json_log.h"
#include "server/metrics.h"

namespace ratelimit::grpcface {

namespace pb = ::envoy::service::ratelimit::v3;

namespace {

envoy::Request FromProto(const pb::RateLimitRequest& in) {
  envoy::Request r;
  r.domain = in.domain();
  r.hits_addend = in.hits_addend();
  r.descriptors.resize(in.descriptors_size());
  for (int i = 0; i < in.descriptors_size(); ++i) {
    const auto& d = in.descriptors(i);
    envoy::Descriptor& out = r.descriptors[i];
    out.entries.reserve(d.entries_size());
    for (const auto& e : d.entries()) out.entries.push_back({e.key(), e.value()});
    if (d.has_limit()) {
      const int unit = d.limit().unit();
      out.limit = envoy::Descriptor::Override{
          .requests_per_unit = d.limit().requests_per_unit(),
          .unit = unit >= 1 && unit <= 7 ? static_cast<envoy::Unit>(unit) : envoy::Unit::kUnknown};
    }
    if (d.has_hits_addend()) out.hits_addend = d.hits_addend().value();
  }
  return r;
}

void ToProto(const envoy::Response& in, pb::RateLimitResponse* out) {
  out->set_overall_code(static_cast<pb::RateLimitResponse::Code>(in.overall));
  for (const envoy::DescriptorStatus& s : in.statuses) {
    auto* st = out->add_statuses();
    st->set_code(static_cast<pb::RateLimitResponse::Code>(s.code));
    if (s.has_limit) {
      auto* cl = st->mutable_current_limit();
      cl->set_requests_per_unit(s.requests_per_unit);
      cl->set_unit(static_cast<pb::RateLimitResponse::RateLimit::Unit>(s.unit));
      cl->set_name(s.name);
    }
    st->set_limit_remaining(s.limit_remaining);
    if (s.has_limit) {
      const int64_t us = s.duration_until_reset.count();
      auto* d = st->mutable_duration_until_reset();
      d->set_seconds(us / 1'000'000);
      d->set_nanos(static_cast<int32_t>(us % 1'000'000) * 1000);
    }
  }
}

// Per domain and descriptor: route "envoy:<domain>", limit its config path.
void Count(const envoy::RequestPlan& plan, const envoy::Response& resp, bool degraded) {
  server::Metrics& m = server::Metrics::Global();
  const std::string& route = plan.store_key;  // "envoy:<domain>"
  for (size_t i = 0; i < plan.descriptors.size(); ++i) {
    const envoy::DescriptorPlan& p = plan.descriptors[i];
    if (p.kind != envoy::DescriptorPlan::Kind::kLimited) continue;
    server::DecisionOutcome o = server::DecisionOutcome::kAllowed;
    if (degraded) {
      o = server::DecisionOutcome::kDegraded;
    } else if (resp.statuses[i].code == envoy::Code::kOverLimit) {
      o = server::DecisionOutcome::kDenied;
    } else if (p.shadow && resp.statuses[i].limit_remaining == 0) {
      o = server::DecisionOutcome::kShadowDenied;
    } else if (const envoy::DescriptorStatus& st = resp.statuses[i];
               st.requests_per_unit > 0 &&
               st.requests_per_unit - std::min(st.limit_remaining, st.requests_per_unit) >
                   st.requests_per_unit * 4 / 5) {
      // envoyproxy/ratelimit's near_limit: past 80% of the limit after this hit.
      o = server::DecisionOutcome::kNearLimit;
    }
    m.Decisions(route, p.metric_path).At(server::Face::kEnvoy, o).Inc();
  }
}

// The headers of the enforcing limit closest to its limit (the Combine),
// or of the descriptor the plan found over (envoy::HeaderSourceOf).
void AddHeaders(policy::HeaderDialect dialect, const envoy::RequestPlan& plan,
                const CheckResult& result, const envoy::Response& answer, bool degraded,
                pb::RateLimitResponse* response) {
  const envoy::HeaderSource source = envoy::HeaderSourceOf(plan, result, answer);
  if (source.limit == nullptr) return;
  server::HeaderList headers;
  server::AddRateLimitHeaders(dialect,
                              server::RateLimitInfo{.decision = source.decision,
                                                    .name = "default",
                                                    .window = source.limit->window(),
                                                    .degraded = degraded},
                              headers);
  for (auto& [k, v] : headers) {
    auto* h = response->add_response_headers_to_add();
    h->set_key(k);
    h->set_value(v);
  }
}

}  // namespace

namespace {

// Walks the bytes of a message as the parse does and calls `each(payload)`
// for every length-delimited field `field` at its top level, until `each`
// returns false. A group is an unknown field to the parse (none of these
// messages' fields is one), skipped whole with what it holds, nested up to
// its recursion limit. Bytes that do not parse end the walk (the parse then
// refuses them).
template <typename Each>
void ForEachField(std::string_view bytes, uint32_t field, Each each) {
  constexpr size_t kMaxGroupDepth = 100;  // CodedInputStream's default recursion limit
  const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
  google::protobuf::io::CodedInputStream in(data, static_cast<int>(bytes.size()));
  std::vector<uint32_t> groups;  // the field numbers of the groups open
  for (uint32_t tag; (tag = in.ReadTag()) != 0;) {
    switch (tag & 7) {
      case 0: {  // varint
        uint64_t v = 0;
        if (!in.ReadVarint64(&v)) return;
        break;
      }
      case 1:  // fixed64
        if (!in.Skip(8)) return;
        break;
      case 5:  // fixed32
        if (!in.Skip(4)) return;
        break;
      case 2: {  // length-delimited
        uint32_t len = 0;
        if (!in.ReadVarint32(&len) || len > bytes.size()) return;
        const int at = in.CurrentPosition();
        if (!in.Skip(static_cast<int>(len))) return;
        if (tag >> 3 == field && groups.empty() &&
            !each(bytes.substr(static_cast<size_t>(at), len))) {
          return;
        }
        break;
      }
      case 3:  // start group
        if (groups.size() == kMaxGroupDepth) return;
        groups.push_back(tag >> 3);
        break;
      case 4:  // end group: of the innermost open one, or the parse fails
        if (groups.empty() || groups.back() != tag >> 3) return;
        groups.pop_back();
        break;
      default: return;
    }
  }
}

}  // namespace

// Counted before the parse because a parsed descriptor costs a hundred
// times its size on the wire or more (an empty one is 2 bytes), and an entry
// 56 times (kMaxEntriesPerRequest).
size_t DescriptorsIn(std::string_view bytes, size_t stop) {
  size_t n = 0;
  ForEachField(bytes, 2, [&](std::string_view) { return ++n <= stop; });
  return n;
}

size_t EntriesIn(std::string_view bytes, size_t stop) {
  size_t n = 0;
  ForEachField(bytes, 2, [&](std::string_view descriptor) {
    ForEachField(descriptor, 1, [&](std::string_view) { return ++n <= stop; });
    return n <= stop;
  });
  return n;
}

void ShouldRateLimit(std::string_view bytes, RlsContext context,
                     std::function<void(RlsAnswer)> done) {
  // Refused before the parse, which would allocate for each descriptor.
  if (DescriptorsIn(bytes, envoy::kMaxDescriptorsPerRequest) > envoy::kMaxDescriptorsPerRequest) {
    return done({GrpcCode::kInvalidArgument, envoy::TooManyDescriptors().message()});
  }
  if (EntriesIn(bytes, envoy::kMaxEntriesPerRequest) > envoy::kMaxEntriesPerRequest) {
    return done({GrpcCode::kInvalidArgument, envoy::TooManyEntries().message()});
  }
  pb::RateLimitRequest request;
  if (!request.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())))
    return done({GrpcCode::kInternal, "cannot parse the RateLimitRequest"});
  struct Pending {
    RlsContext context;
    envoy::Request request;
    envoy::RequestPlan plan;
  };
  auto p = std::make_shared<Pending>();
  p->context = std::move(context);
  p->request = FromProto(request);
  StatusOr<envoy::RequestPlan> plan = envoy::MakePlan(*p->context.config, p->request);
  if (!plan.ok()) return done({GrpcCode::kInvalidArgument, plan.status().message()});
  p->plan = std::move(*plan);
  const RlsContext& c = p->context;
  DecideEnvoy(
      *c.enforcer, p->plan, c.failure_mode, *c.store, [p, done = std::move(done)](EnvoyDecided d) {
        if (d.unavailable) {
          return done(
              {GrpcCode::kUnavailable, "the rate limit store cannot decide: " + d.error.message()});
        }
        if (!d.error.ok()) return done({GrpcCode::kInvalidArgument, d.error.message()});
        const envoy::Response r =
            envoy::Respond(p->plan, d.result ? &*d.result : nullptr,
                           d.shadow ? &*d.shadow : nullptr, p->context.clock->NowMicros());
        pb::RateLimitResponse response;
        ToProto(r, &response);
        Count(p->plan, r, d.degraded);
        if (p->context.headers != policy::HeaderDialect::kNone && d.result) {
          AddHeaders(p->context.headers, p->plan, *d.result, r, d.degraded, &response);
        }
        done({GrpcCode::kOk, response.SerializeAsString()});
      });
}

void LogProtobufThroughJsonLog() {
  // protobuf 22 and later log through Abseil and have no SetLogHandler;
  // Debian 12's is 3.21.
#if GOOGLE_PROTOBUF_VERSION < 4022000
  static std::once_flag once;
  std::call_once(once, [] {
    google::protobuf::SetLogHandler([](google::protobuf::LogLevel level, const char* file, int line,
                                       const std::string& message) {
      static server::LogSampler sampler(5, "protobuf log lines suppressed");
      if (level < google::protobuf::LOGLEVEL_FATAL && !sampler.AdmitAndReport()) return;
      const server::Level ours = level >= google::protobuf::LOGLEVEL_ERROR ? server::Level::kError
                                 : level == google::protobuf::LOGLEVEL_WARNING
                                     ? server::Level::kWarn
                                     : server::Level::kInfo;
      server::Log(ours, "protobuf", {{"detail", message}, {"file", file}, {"line", line}});
    });
  });
#endif
}

}  // namespace ratelimit::grpcface
