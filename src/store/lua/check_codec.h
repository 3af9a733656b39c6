// The typed codec of check.lua: a batch of checks as C++ values, and the one
// place that writes them as the script's arguments and reads its reply.
//
// A check is its limits (each an algorithm code and three numbers, see
// check.lua's header) with a cost each, a key each, and whether it peeks.
// Encode() writes a batch: every distinct limit once, then per check either
// one packed number (one limit, consumed: the common case) or a head ("c2",
// "p1") and per limit its index and cost. Decode() turns the reply (4
// integers per limit) into Decisions, or into the failed Status of the whole
// call for every malformed or error reply.
//
//   CheckCall call = {.keys = {"rl:{ip:1.2.3.4}burst"}, .limits = {{WireOf(burst), 1}}};
//   (with burst.block_for(): .keys = {"rl:{ip:1.2.3.4}burst", "rl:{ip:1.2.3.4}burst!b"})
//   EncodedCall e = Encode(std::nullopt, {{&call, 1}});   // e.keys, e.args -> EVALSHA
//   StatusOr<std::vector<CheckAnswer>> a = Decode(reply, {{&call, 1}});
//
// Thread-safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ratelimit/decision.h"
#include "ratelimit/limit.h"
#include "ratelimit/status.h"
#include "ratelimit/store.h"

namespace ratelimit::redis {
struct Reply;
}

namespace ratelimit::store::lua {

// How check.lua evaluates a limit: 't' token bucket, 'k' leaky bucket, 'f'
// fixed window, 's' sliding window, 'l' sliding log, 'T' a token bucket that
// takes up to `cost` tokens at once (a token prefetch), 'c' a calendar quota
// (a fixed window whose boundaries the caller sends, CalendarCallOf).
struct WireLimit {
  char code = 't';
  int64_t limit = 0;
  int64_t window = 0;    // us; token and leaky bucket: capacity (depth) x interval;
                         // 'c': the end of the current window (us since the epoch)
  int64_t interval = 0;  // us; token and leaky bucket only; 'c': the end of the next window
  int64_t block = 0;     // us; Limit::block_for (sent as "<code>/<block>"), 0: none
  friend bool operator==(const WireLimit&, const WireLimit&) = default;
};

// REQUIRES: not a calendar quota (CalendarCallOf).
WireLimit WireOf(const Limit& limit);

// The keys check.lua reads for a limit: two for a calendar quota (its current
// window's, then the next one's), one for the others; then, with a block
// period, one more: its block key (RedisKeys::Block). check.lua touches no
// key but these, so that Redis Cluster routes the call by all of them.
size_t KeysPerLimit(const WireLimit& spec);

struct LimitCall {
  WireLimit spec;
  int64_t cost = 1;  // 'T': the most tokens to take
  friend bool operator==(const LimitCall&, const LimitCall&) = default;
};

// A calendar quota's limit call as of `now_us` (the caller's clock): the
// current window [start, next_start) and the next one, whose keys (named by
// their starts, RedisKeys::Window) follow each other in the check's keys.
// check.lua picks one of the two by its own clock. REQUIRES: limit.calendar().
struct CalendarCall {
  LimitCall call;
  int64_t start = 0, next_start = 0;  // us since the epoch
};
CalendarCall CalendarCallOf(const Limit& limit, int64_t now_us, int64_t cost);

// One check of a batch. REQUIRES: limits.size() >= 1, and keys holds
// KeysPerLimit keys for each limit, in order (its state's, then its block's).
struct CheckCall {
  bool peek = false;  // never writes; costs are sent as 0
  std::vector<std::string> keys;
  std::vector<LimitCall> limits;

  // A single token-bucket limit: take up to `tokens` at once ('T') when > 1,
  // else one token ('t').
  void SetPrefetch(int64_t tokens);
};

// The keys and arguments of one script call; the views point into the
// checks given to Encode (which must outlive it) and into `text`.
struct EncodedCall {
  std::vector<std::string_view> keys, args;
  std::deque<std::string> text;  // numbers made for this call
  EncodedCall() = default;
  EncodedCall(EncodedCall&&) = default;  // deque keeps its strings where they are
};

// `now_us`: the caller's clock (time_source: local), or nullopt for Redis TIME.
EncodedCall Encode(std::optional<int64_t> now_us, std::span<const CheckCall* const> checks);

// What the script answered for one check.
struct CheckAnswer {
  CheckResult result;        // decisions (limit, leaky delay filled in) and overall
  int64_t tokens_taken = 0;  // a 'T' check: the tokens taken (0: denied)
};

// The reply of the call Encode made for `checks`, or why the whole call failed:
// the transport's status as is, kInternal for a script error reply, a reply
// that is not an array of 4 integers per limit.
StatusOr<std::vector<CheckAnswer>> Decode(const StatusOr<redis::Reply>& reply,
                                          std::span<const CheckCall* const> checks);

// A settlement (check.lua's "S" call): per limit its key, spec and the
// difference to apply (LimitCall::cost, negative for a refund).
// REQUIRES: keys.size() == limits.size() >= 1; no sliding log.
struct SettleCall {
  std::vector<std::string> keys;
  std::vector<LimitCall> limits;
  std::string once_key;     // "": none (SettleRequest::once)
  int64_t once_ttl_ms = 0;  // > 0 with a once key
};
EncodedCall EncodeSettle(std::optional<int64_t> now_us, const SettleCall& call);
// The state after the settlement (core::Probe's numbers; already_settled for
// a once key seen before), or why the call failed.
StatusOr<CheckResult> DecodeSettle(const StatusOr<redis::Reply>& reply, const SettleCall& call);

}  // namespace ratelimit::store::lua
