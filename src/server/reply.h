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

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ratelimit::server {

struct Reply {
  unsigned status = 200;
  std::string content_type;  // "" = no Content-Type header
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
  bool close = false;                // close the connection after writing
  bool keep_content_length = false;  // HEAD via the gateway: headers carry the length

  void Add(std::string_view name, std::string value) {
    headers.emplace_back(std::string(name), std::move(value));
  }
  // The first value of header `name` (case-insensitive), or nullptr.
  const std::string* Find(std::string_view name) const;
};

bool EqualsIgnoreCase(std::string_view a, std::string_view b);

}  // namespace ratelimit::server
