// Reservation: what POST /v1/check hands out when asked to reserve (issue
// 21), and what POST /v1/settle takes back. The id carries everything the
// settlement needs (the key, the reserved cost, the limits as the check
// named them, when it expires, a nonce), signed with HMAC-SHA256 under the
// store's shared secret (Store::SharedSecret): any instance that shares the
// store can settle it, and a caller can neither forge one nor change its
// cost. The nonce makes a settlement happen once (SettleRequest::once).
//
//   std::string id = SignReservation(r, secret);             // "r1.<payload>.<mac>"
//   StatusOr<Reservation> back = VerifyReservation(id, secret, max_length);
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "ratelimit/status.h"

namespace ratelimit::server {

struct Reservation {
  std::string key;
  int64_t cost = 0;
  int64_t expires_unix_ms = 0;
  std::string nonce;      // 32 hex digits
  nlohmann::json limits;  // as a check's "limits": names and inline objects
};

// The longest a reservation may be held, and the default.
inline constexpr int64_t kMaxReservationTtlMs = 3'600'000;
inline constexpr int64_t kDefaultReservationTtlMs = 300'000;

std::string NewReservationNonce();
std::string SignReservation(const Reservation& r, std::string_view secret);
// The length of the id SignReservation(r, secret) writes (the same under every secret).
size_t ReservationIdLength(const Reservation& r);
// The longest id a POST /v1/settle body of at most `max_body_bytes`
// (server.max_body_bytes) can carry: {"reservation":"<id>","cost":2147483647}.
// A check whose id would be longer is refused: its reservation could never
// be settled.
size_t MaxReservationIdLength(size_t max_body_bytes);
// kInvalidArgument for anything not signed by `secret` as SignReservation
// writes it, or longer than `max_length` (MaxReservationIdLength).
StatusOr<Reservation> VerifyReservation(std::string_view id, std::string_view secret,
                                        size_t max_length);

}  // namespace ratelimit::server
