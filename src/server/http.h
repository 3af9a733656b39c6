// http.h: the Beast vocabulary of the server (included only by the .cc files
// that speak HTTP on the wire: listener, session, router, gateway, server).
//
// Thread-safety: declarations only.
#pragma once

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

// Appends one header field as it goes on the wire: "Name: value\r\n". For
// messages rendered into one buffer (the session's answers, the gateway's
// upstream requests) rather than through Beast's serializer.
// (Literals with their lengths: append(const char*) measures each with strlen.)
inline void AppendField(std::string& out, std::string_view name, std::string_view value) {
  out.append(name).append(": ", 2).append(value).append("\r\n", 2);
}

}  // namespace ratelimit::server
