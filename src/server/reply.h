// Reply: what the server answers to one HTTP request, without Beast.
//
// The handlers (decision API, auth_request, demo, enforcer) build Replies;
// only the session turns them into Beast responses. Keeping Beast out of the
// handlers keeps them pure, fast to compile and easy to unit test.
//
//   Reply r;
//   r.status = 429;
//   r.Add("Retry-After", "2");
//
// Thread-safety: value type.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/ascii.h"

namespace ratelimit::server {

// A body that arrives while it is being sent (the gateway's upstream
// response). The session asks for one piece at a time and writes it before
// asking for the next, so at most one piece per connection is in memory.
class BodyStream {
 public:
  // ok=false: the source failed mid-body (the client connection is then
  // closed, as the status is already sent). `piece` stays valid until the
  // next call of Next; `last` marks the final piece (it may be empty).
  using Piece = std::function<void(bool ok, std::string_view piece, bool last)>;

  virtual ~BodyStream() = default;
  // Calls `piece` exactly once, on any thread.
  virtual void Next(Piece piece) = 0;
  // The body's length when the source announced it (Content-Length).
  virtual std::optional<uint64_t> content_length() const = 0;
  // After the last piece: the value of the chunked trailer field `name`, if
  // the source had one (the gateway's upstream answer).
  virtual std::optional<std::string> Trailer(std::string_view /*name*/) const {
    return std::nullopt;
  }
  // The session wrote the last piece to the client (called at most once; a
  // stream dropped without it did not reach its end at the client).
  virtual void Delivered() {}
};

struct Reply {
  unsigned status = 200;
  std::string content_type;  // "" = no Content-Type header
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
  bool close = false;                // close the connection after writing
  bool keep_content_length = false;  // HEAD via the gateway: headers carry the length
  // When set, the body is streamed from here and `body` is ignored.
  std::shared_ptr<BodyStream> body_stream;
  // The gateway's own answer to a request it never sent whole to the
  // upstream (no place, connection refused): a metered reservation is
  // given back (MeterReply).
  bool unsent = false;

  void Add(std::string_view name, std::string value) {
    headers.emplace_back(std::string(name), std::move(value));
  }
  // The first value of header `name` (case-insensitive), or nullptr.
  const std::string* Find(std::string_view name) const;
};

using core::EqualsIgnoreCase;  // header names are ASCII-case-insensitive

}  // namespace ratelimit::server
