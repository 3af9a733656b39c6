// http.h: the Beast vocabulary of the server (included only by the .cc files
// that speak HTTP on the wire: listener, session, router, gateway, server).
//
// Thread-safety: declarations only.
#pragma once

#include <charconv>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

namespace ratelimit::server {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using tcp = boost::asio::ip::tcp;

using Request = http::request<http::string_body>;
using Response = http::response<http::string_body>;

// A message rendered into one buffer (the session's answers, the gateway's
// upstream requests) rather than through Beast's serializer: `render(put)`
// calls put(std::string_view) for each piece in order, and is called twice,
// once to size `out` and once to fill it, each piece a plain copy. (Appending
// each piece checked the capacity every time: 16 appends were 4% of a gateway
// request's instructions, docs/performance.md section 4.) `out` is replaced.
template <typename Render>
void RenderInto(std::string& out, const Render& render) {
  size_t total = 0;
  render([&total](std::string_view piece) { total += piece.size(); });
  out.resize(total);
  char* at = out.data();
  render([&at](std::string_view piece) {
    if (!piece.empty()) std::memcpy(at, piece.data(), piece.size());
    at += piece.size();
  });
}

// A number's decimal digits, held in place, for a piece of RenderInto (a
// status code, a Content-Length).
class Decimal {
 public:
  explicit Decimal(uint64_t v)
      : size_(static_cast<size_t>(std::to_chars(digits_, digits_ + sizeof digits_, v).ptr -
                                  digits_)) {}
  std::string_view view() const { return {digits_, size_}; }

 private:
  char digits_[20];  // UINT64_MAX has 20
  size_t size_;
};

// One header field as it goes on the wire: "Name: value\r\n".
template <typename Put>
void PutField(const Put& put, std::string_view name, std::string_view value) {
  put(name);
  put(std::string_view(": ", 2));
  put(value);
  put(std::string_view("\r\n", 2));
}

}  // namespace ratelimit::server
