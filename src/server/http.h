// http.h: the Beast vocabulary of the server (included only by the .cc files
// that speak HTTP on the wire: listener, session, router, gateway, server).
//
// Thread-safety: declarations only.
#pragma once

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

}  // namespace ratelimit::server
