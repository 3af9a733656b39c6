#include "server/metering.h"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <memory>
#include <utility>

#include "server/json_log.h"

namespace ratelimit::server {

using policy::MeteredCost;
using SettleOutcome = Metrics::SettleOutcome;

std::optional<int64_t> ParseCostText(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t')) text.remove_suffix(1);
  if (text.empty() || text.front() < '0' || text.front() > '9') return std::nullopt;
  int64_t v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ptr != text.data() + text.size()) return std::nullopt;
  if (ec == std::errc::result_out_of_range) return INT64_MAX;  // capped where it is used
  if (ec != std::errc()) return std::nullopt;
  return v;
}

namespace {

// The value at `path` in `doc`, or nullptr.
const nlohmann::json* JsonFind(const nlohmann::json& doc, const std::vector<std::string>& path) {
  const nlohmann::json* at = &doc;
  for (const std::string& seg : path) {
    if (at->is_object()) {
      auto it = at->find(seg);
      if (it == at->end()) return nullptr;
      at = &*it;
    } else if (at->is_array()) {
      std::optional<int64_t> i = ParseCostText(seg);
      if (!i || static_cast<size_t>(*i) >= at->size()) return nullptr;
      at = &(*at)[static_cast<size_t>(*i)];
    } else {
      return nullptr;
    }
  }
  return at;
}

// A whole number of 0 or more (as a cost), else nullopt.
std::optional<int64_t> CostOf(const nlohmann::json* at) {
  if (at == nullptr) return std::nullopt;
  if (at->is_number_unsigned()) {
    const uint64_t v = at->get<uint64_t>();
    return v > static_cast<uint64_t>(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(v);
  }
  // A whole number above uint64's range is parsed as a float: still a
  // (very large) whole number, capped where it is used.
  if (at->is_number_float() && at->get<double>() >= 9223372036854775807.0) return INT64_MAX;
  if (at->is_number_integer()) {
    const int64_t v = at->get<int64_t>();
    if (v < 0) return std::nullopt;
    return v;
  }
  return std::nullopt;
}

}  // namespace

std::optional<int64_t> JsonCost(const nlohmann::json& doc, const std::vector<std::string>& path) {
  return CostOf(JsonFind(doc, path));
}

SseFieldReader::SseFieldReader(std::vector<std::string> path) : owned_(std::move(path)) {}

void SseFieldReader::Feed(std::string_view piece) {
  while (!piece.empty()) {
    if (after_cr_ && piece.front() == '\n') piece.remove_prefix(1);  // the LF of a CRLF
    after_cr_ = false;
    const size_t end = piece.find_first_of("\r\n");
    if (end == std::string_view::npos) {
      if (!skip_line_) {
        if (line_.size() + piece.size() > kMaxLine) {
          skip_line_ = true;
          line_.clear();
        } else {
          line_.append(piece);
        }
      }
      return;
    }
    if (!skip_line_) {
      if (line_.empty()) {
        Line(piece.substr(0, end));  // the usual case: a whole line in one piece
      } else if (line_.size() + end <= kMaxLine) {
        line_.append(piece.substr(0, end));
        Line(line_);
      }
    }
    line_.clear();
    skip_line_ = false;
    after_cr_ = piece[end] == '\r';
    piece.remove_prefix(end + 1);
  }
}

void SseFieldReader::Finish() {
  if (!line_.empty() && !skip_line_) Line(line_);
  line_.clear();
  Dispatch();
}

void SseFieldReader::Line(std::string_view line) {
  if (line.empty()) return Dispatch();
  constexpr std::string_view kData = "data";
  if (!line.starts_with(kData)) return;  // other fields and comments
  std::string_view value = line.substr(kData.size());
  if (!value.empty() && value.front() != ':') return;  // "database: ..." is another field
  if (!value.empty()) value.remove_prefix(1);
  if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  if (has_data_ && !skip_event_ && data_.size() + 1 + value.size() > kMaxEvent) {
    skip_event_ = true;  // it can give no value: dropped, not held
    data_.clear();
    data_.shrink_to_fit();
  }
  if (!skip_event_) {
    if (has_data_) data_.push_back('\n');
    data_.append(value);
  }
  has_data_ = true;
}

void SseFieldReader::Dispatch() {
  if (!has_data_) return;
  if (skip_event_) {
    skip_event_ = false;
    has_data_ = false;
    return;
  }
  // Parse only data that can carry the field (the last name of the path):
  // most events of a stream are content, and "[DONE]" is not JSON.
  if (!path_->empty() && data_.find(path_->back()) != std::string::npos) {
    nlohmann::json doc = nlohmann::json::parse(data_, nullptr, /*allow_exceptions=*/false);
    if (!doc.is_discarded()) {
      if (std::optional<int64_t> v = JsonCost(doc, *path_)) value_ = v;
    }
  }
  data_.clear();
  has_data_ = false;
}

bool IsJsonType(std::string_view content_type) {
  std::string_view type = content_type.substr(0, content_type.find(';'));
  while (!type.empty() && (type.back() == ' ' || type.back() == '\t')) type.remove_suffix(1);
  while (!type.empty() && (type.front() == ' ' || type.front() == '\t')) type.remove_prefix(1);
  constexpr std::string_view kJson = "application/json", kSuffix = "+json";
  return EqualsIgnoreCase(type, kJson) ||
         (type.size() > kSuffix.size() &&
          EqualsIgnoreCase(type.substr(type.size() - kSuffix.size()), kSuffix));
}

void JsonBodyReader::Feed(std::string_view piece) {
  if (over_) return;
  if (body_.size() + piece.size() > kMaxBody) {
    over_ = true;
    body_.clear();
    body_.shrink_to_fit();
    return;
  }
  body_.append(piece);
}

std::optional<int64_t> JsonBodyReader::Cost(const std::vector<std::string>& path) const {
  if (over_) return std::nullopt;
  nlohmann::json doc = nlohmann::json::parse(body_, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return std::nullopt;
  return JsonCost(doc, path);
}

StatusOr<int64_t> ReserveCost(const MeteredCost& cost, int64_t route_cost, const Request& request) {
  if (cost.source == MeteredCost::Source::kReserve) return route_cost;
  std::optional<int64_t> value;
  bool present = false;
  if (cost.source == MeteredCost::Source::kRequestHeader) {
    auto it = request.find(cost.request_field);
    present = it != request.end();
    if (present) value = ParseCostText(it->value());
  } else {
    nlohmann::json doc = nlohmann::json::parse(request.body(), nullptr, false);
    if (!doc.is_discarded()) {
      const nlohmann::json* at = JsonFind(doc, cost.request_path);  // split when loaded
      present = at != nullptr && !at->is_null();
      value = CostOf(at);
    }
  }
  if (value) return cost.max ? std::min(*value, *cost.max) : *value;
  const std::string what = cost.source == MeteredCost::Source::kRequestHeader
                               ? "request header " + cost.request_field
                               : "request body's JSON " + cost.request_field;
  if (present) return InvalidArgument("the " + what + " must be a whole number of 0 or more");
  if (cost.reserve) return *cost.reserve;
  return InvalidArgument("the " + what + " is required: it is this route's reserved cost");
}

void SetRouteCost(policy::RequestPlan& plan, int64_t reserved) {
  if (plan.route == nullptr) return;
  for (policy::CheckGroup& g : plan.groups) {
    for (LimitCheck& c : g.checks) {
      if (c.cost != plan.route->cost) continue;  // a plan or global limit of the same name
      for (const policy::RuleLimit& rl : plan.route->limits) {
        if (&rl.limit == c.limit) {
          c.cost = reserved;
          break;
        }
      }
    }
  }
}

namespace {

// What a request costs when its actual cost was not read (no usable value,
// or the client left before the end): on a route whose reservation the
// request names (from_request_*), the route's `max`, else its `reserve` when
// above the reservation: a client that names a small reservation must not
// pay only that by leaving early or by asking for an answer without usage.
// nullopt (the reservation stands) on a route with a fixed reservation, and
// for an upstream's answer other than 2xx (an error did no metered work).
std::optional<int64_t> UnreadCost(const Outcome& o, unsigned status) {
  const MeteredCost& m = *o.metered;
  if (m.source == MeteredCost::Source::kReserve || status / 100 != 2) return std::nullopt;
  const int64_t reserved = o.charged.front().checks.front().cost;
  const std::optional<int64_t> fallback = m.max ? m.max : m.reserve;
  if (!fallback || *fallback <= reserved) return std::nullopt;
  return *fallback;
}

}  // namespace

void SettleUnread(Enforcer& enforcer, const Outcome& o, SettleOutcome outcome, unsigned status) {
  if (o.charged.empty() || o.metered == nullptr) return;
  SettleCharged(enforcer, o, UnreadCost(o, status), outcome);
}

void SettleCharged(Enforcer& enforcer, const Outcome& o, std::optional<int64_t> actual,
                   SettleOutcome outcome) {
  Metrics& m = Metrics::Global();
  if (!actual || o.charged.empty() || o.metered == nullptr) {
    m.Settlements(outcome).Inc();
    return;
  }
  if (!enforcer.has_store()) {  // shutting down
    m.Settlements(SettleOutcome::kError).Inc();
    return;
  }
  const int64_t cost = o.metered->max ? std::min(*actual, *o.metered->max) : *actual;
  // One count per request, and its units once (every group settles the same
  // difference): the last group's answer gives them.
  struct Pending {
    std::atomic<size_t> groups;
    std::atomic<bool> failed{false};
    int64_t delta = 0;
  };
  auto pending = std::make_shared<Pending>();
  pending->groups = o.charged.size();
  pending->delta = std::min(cost - o.charged.front().checks.front().cost, kMaxSettleDelta);
  for (const ChargedGroup& g : o.charged) {
    std::vector<LimitSettle> settlements;
    settlements.reserve(g.checks.size());
    for (const LimitCheck& c : g.checks) {
      // A debit is at most what a store settles in one step (kMaxSettleDelta,
      // 2^31-1 units): a cost reported above it debits that much and is
      // settled, not refused as an error (the client would pay only its
      // reservation). Both are >= 0: no overflow.
      const int64_t delta = std::min(cost - c.cost, kMaxSettleDelta);
      if (delta != 0) settlements.push_back({c.limit, delta});
    }
    auto answered = [pending, outcome](bool ok) {
      Metrics& m = Metrics::Global();
      if (!ok) pending->failed.store(true);
      if (pending->groups.fetch_sub(1) != 1) return;
      if (pending->failed.load()) return m.Settlements(SettleOutcome::kError).Inc();
      m.Settlements(outcome).Inc();
      const int64_t delta = pending->delta;
      if (delta > 0) m.settled_debited.Inc(static_cast<uint64_t>(delta));
      if (delta < 0) m.settled_refunded.Inc(static_cast<uint64_t>(-delta));
    };
    if (settlements.empty()) {  // it cost what was reserved
      answered(true);
      continue;
    }
    const SettleRequest request{
        .key = g.key,
        .settlements = settlements,
        .on_failure = {.mode = g.failure_mode,
                       .expected_instances = o.charged_policy->config().store.expected_instances}};
    // The limits live in the policy (or the overrides) the callback holds.
    enforcer.store().Settle(request, [policy = o.charged_policy, overrides = o.overrides,
                                      answered = std::move(answered)](StatusOr<CheckResult> r) {
      if (!r.ok()) Log(Level::kWarn, "settlement failed", {{"detail", r.status().message()}});
      answered(r.ok());
    });
  }
}

namespace {

// The body of a metered answer: passes every piece on unchanged, reads the
// actual cost on the way (SSE, JSON) or at the end (trailer), and settles
// when the client has the last piece; dropped before that, as SettleUnread
// says.
class SettlingBody final : public BodyStream, public std::enable_shared_from_this<SettlingBody> {
 public:
  SettlingBody(std::shared_ptr<BodyStream> inner, Enforcer& enforcer, Outcome o, bool json,
               unsigned status)
      : inner_(std::move(inner)),
        enforcer_(enforcer),
        o_(std::move(o)),
        json_(json),
        status_(status) {
    if (!json_ && o_.metered->settle_from == MeteredCost::SettleFrom::kSseLastEvent) {
      sse_.emplace(&o_.metered->field_path);
    }
  }
  ~SettlingBody() override {
    if (settled_) return;
    if (failed_) {
      SettleCharged(enforcer_, o_, std::nullopt, SettleOutcome::kError);
    } else {
      SettleUnread(enforcer_, o_, SettleOutcome::kDisconnected, status_);
    }
  }

  void Next(Piece piece) override {
    inner_->Next([self = shared_from_this(), piece = std::move(piece)](bool ok, std::string_view p,
                                                                       bool last) mutable {
      if (!ok) {
        self->failed_ = true;
      } else {
        if (self->sse_) self->sse_->Feed(p);
        if (self->json_) self->json_body_.Feed(p);
        if (last) self->ReadActual();
      }
      piece(ok, p, last);
    });
  }
  std::optional<uint64_t> content_length() const override { return inner_->content_length(); }
  std::optional<std::string> Trailer(std::string_view name) const override {
    return inner_->Trailer(name);
  }
  void Delivered() override {
    inner_->Delivered();
    if (settled_ || !ended_) return;
    settled_ = true;
    if (!actual_) return SettleUnread(enforcer_, o_, SettleOutcome::kMissing, status_);
    SettleCharged(enforcer_, o_, actual_, SettleOutcome::kSettled);
  }

 private:
  void ReadActual() {
    ended_ = true;
    if (sse_) {
      sse_->Finish();
      actual_ = sse_->value();
    } else if (json_) {
      actual_ = json_body_.Cost(o_.metered->field_path);
    } else if (std::optional<std::string> t = inner_->Trailer(o_.metered->field)) {
      actual_ = ParseCostText(*t);
    }
  }

  std::shared_ptr<BodyStream> inner_;
  Enforcer& enforcer_;
  Outcome o_;
  std::optional<SseFieldReader> sse_;
  bool json_ = false;  // sse_last_event, but the answer is one JSON document
  unsigned status_;    // the upstream's
  JsonBodyReader json_body_;
  std::optional<int64_t> actual_;
  bool ended_ = false;
  bool failed_ = false;
  bool settled_ = false;
};

}  // namespace

void RefundUnforwarded(Enforcer& enforcer, const Outcome& o) {
  if (o.charged.empty() || o.metered == nullptr) return;
  SettleCharged(enforcer, o, 0, SettleOutcome::kNotForwarded);
}

void MeterReply(Enforcer& enforcer, Outcome o, Reply& r) {
  if (o.charged.empty() || o.metered == nullptr) return;
  if (r.unsent) return RefundUnforwarded(enforcer, o);
  const MeteredCost& m = *o.metered;
  std::optional<int64_t> actual;
  if (m.settle_from == MeteredCost::SettleFrom::kResponseHeader) {
    const std::string* v = r.Find(m.field);
    if (v != nullptr) actual = ParseCostText(*v);
  } else {
    const std::string* type = r.Find("Content-Type");
    const bool json = m.settle_from == MeteredCost::SettleFrom::kSseLastEvent && type != nullptr &&
                      IsJsonType(*type);
    if (r.body_stream != nullptr) {
      r.body_stream = std::make_shared<SettlingBody>(std::move(r.body_stream), enforcer,
                                                     std::move(o), json, r.status);
      return;
    }
    // The whole answer came at once (a small Content-Length body: no trailer).
    if (json) {
      JsonBodyReader reader;
      reader.Feed(r.body);
      actual = reader.Cost(m.field_path);
    } else if (m.settle_from == MeteredCost::SettleFrom::kSseLastEvent) {
      SseFieldReader reader(&m.field_path);
      reader.Feed(r.body);
      reader.Finish();
      actual = reader.value();
    }
  }
  if (!actual) return SettleUnread(enforcer, o, SettleOutcome::kMissing, r.status);
  SettleCharged(enforcer, o, actual, SettleOutcome::kSettled);
}

}  // namespace ratelimit::server
