// Metering: a route whose cost is known only after the response (issue 21,
// RouteClass::metered, docs/configuration.md "Metered costs"). The gateway
// checks a request with its reserved cost (ReserveCost, SetRouteCost), and
// once the answer is done settles the difference actual - reserved on the
// same limits and client (Store::Settle, one atomic store call per group).
//
//   StatusOr<int64_t> reserved = ReserveCost(*route->metered, route->cost, req);  // 400 if bad
//   SetRouteCost(plan, reserved);  // before Enforce
//   ... allowed, upstream answered `r`:
//   MeterReply(enforcer, outcome, r);  // settles now, or wraps r.body_stream
//
// Where the actual cost comes from (MeteredCost::settle_from):
//   response_header   the header `field`, read as the answer's head arrives;
//   response_trailer  the chunked trailer field `field`, once the body ended;
//   sse_last_event    the JSON path `field` in the last `data:` event that
//                     carries it as a whole number (SseFieldReader: events may
//                     be split across pieces; the stream is relayed unchanged,
//                     piece by piece).
// A body settles when the session has written its last piece to the client
// (BodyStream::Delivered). For sse_last_event, an answer of Content-Type
// application/json (a non-streaming request) is read whole instead
// (JsonBodyReader, bounded). No usable value (absent, not a whole number
// >= 0), or a client gone before the end: on a route whose reservation the
// request names, the route's max when the upstream answered 2xx
// (SettleUnread), else the reservation stands; an upstream failing mid-body: the reservation
// stands. A request that never reached the upstream (the gateway's own reply before it was sent, a
// concurrency refusal, a held request turned away) settles at 0 (RefundUnforwarded). A degraded
// check (the failure mode decided) has nothing to settle: the enforcer charges no group of it (the
// decision API issues no reservation for one either). `max` caps the actual cost. Each
// outcome is counted (Metrics::Settlements, settled_debited/refunded).
//
// Thread-safety: SseFieldReader is a value type for one stream; the functions
// may be called from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "policy/config.h"
#include "policy/policy.h"
#include "ratelimit/store.h"
#include "server/enforcer.h"
#include "server/http.h"
#include "server/metrics.h"
#include "server/reply.h"

namespace ratelimit::server {

// A decimal whole number >= 0 (surrounding spaces allowed), or nullopt; one
// above INT64_MAX reads as INT64_MAX (a cost is capped where it is used).
std::optional<int64_t> ParseCostText(std::string_view text);
// The whole number >= 0 at `path` in `doc` (above INT64_MAX: INT64_MAX, as
// is a float above it), or nullopt.
std::optional<int64_t> JsonCost(const nlohmann::json& doc, const std::vector<std::string>& path);

// Reads a text/event-stream incrementally and keeps the value at a JSON path
// from the last event whose data carries it. Lines end with LF, CRLF or CR
// (also split across pieces); an event's data lines are joined with LF and
// the event ends at a blank line (and at Finish: a last event without its
// blank line still counts). Lines longer than kMaxLine are skipped; an
// event whose data grows beyond kMaxEvent is dropped (no value from it; the
// next events are read as ever).
class SseFieldReader {
 public:
  static constexpr size_t kMaxLine = 1 << 20;
  static constexpr size_t kMaxEvent = 1 << 20;

  explicit SseFieldReader(std::vector<std::string> path);
  // Reads `*path`, which must outlive the reader (a config's field_path).
  explicit SseFieldReader(const std::vector<std::string>* path) : path_(path) {}
  SseFieldReader(const SseFieldReader&) = delete;
  SseFieldReader& operator=(const SseFieldReader&) = delete;
  void Feed(std::string_view piece);
  void Finish();
  std::optional<int64_t> value() const { return value_; }
  // Bytes held now (a line not ended, the current event's data).
  size_t buffered() const { return line_.size() + data_.size(); }

 private:
  void Line(std::string_view line);
  void Dispatch();

  std::vector<std::string> owned_;
  const std::vector<std::string>* path_ = &owned_;
  std::string line_;  // a line not ended yet
  bool skip_line_ = false;
  bool after_cr_ = false;  // the last byte was a CR: a LF next ends nothing
  std::string data_;       // the current event's data
  bool has_data_ = false;
  bool skip_event_ = false;  // the current event grew beyond kMaxEvent
  std::optional<int64_t> value_;
};

// Whether a Content-Type names JSON (application/json, or a +json type).
bool IsJsonType(std::string_view content_type);

// A JSON answer read whole for sse_last_event (an answer to a non-streaming
// request is one JSON document, not a stream): up to kMaxBody bytes; a
// larger body gives no value.
class JsonBodyReader {
 public:
  static constexpr size_t kMaxBody = 1 << 20;
  void Feed(std::string_view piece);
  // The whole number >= 0 at `path` in the body read, or nullopt.
  std::optional<int64_t> Cost(const std::vector<std::string>& path) const;

 private:
  std::string body_;
  bool over_ = false;
};

// The reservation of a request on a metered route: the request header or
// JSON body value (capped at max) or, when that is absent, `reserve`.
// kInvalidArgument (a 400) when neither is there or the value is not a whole
// number >= 0. `route_cost` is the route's configured cost (the `reserve`).
StatusOr<int64_t> ReserveCost(const policy::MeteredCost& cost, int64_t route_cost,
                              const Request& request);
// Sets the cost of the route's limits in `plan` (every group) to `reserved`.
void SetRouteCost(policy::RequestPlan& plan, int64_t reserved);

// Settles `o.charged` (every group: one Store::Settle each) at actual cost
// `actual` (nullopt: the reservation stands), counting the outcome.
// The enforcer's store settles (none once it was released at shutdown).
void SettleCharged(Enforcer& enforcer, const Outcome& o, std::optional<int64_t> actual,
                   Metrics::SettleOutcome outcome);

// Settles `o.charged` whose actual cost was not read (`outcome` missing or
// disconnected) from an answer of `status`: on a route whose reservation the
// request names (from_request_*) and a 2xx answer, at the route's `max`,
// else its `reserve` when above the reservation; otherwise the reservation
// stands (counted all the same). An upstream's error answer (its own 429, a
// 400 for a bad request) did no metered work: the client is not charged
// the max for it.
void SettleUnread(Enforcer& enforcer, const Outcome& o, Metrics::SettleOutcome outcome,
                  unsigned status);

// An allowed request on a metered route that never reached the upstream
// (refused by the route's concurrency limit, a held request rejected or
// whose client left): settles at 0, counted as not_forwarded. Does nothing
// for other requests.
void RefundUnforwarded(Enforcer& enforcer, const Outcome& o);

// After the upstream answered `r` for an allowed request on a metered route
// (o.charged not empty): settles from the response header now, or wraps
// r.body_stream so that the end of the body settles; a reply the gateway
// made for a request it never sent (r.unsent) settles at 0. Does nothing
// for other requests.
void MeterReply(Enforcer& enforcer, Outcome o, Reply& r);

}  // namespace ratelimit::server
