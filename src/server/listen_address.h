// ResolveListenAddress: a listen setting ("127.0.0.1:8080", "[::1]:8080",
// "localhost:8080", ":8080" for all of IPv4) to the endpoint to bind, or
// InvalidArgument saying what is wrong with it. Every listener of the daemon
// (HTTP, admin, gRPC) reads its address through this one function. Asio
// only, no Beast: the gRPC face includes it.
//
//   StatusOr<tcp::endpoint> ep = ResolveListenAddress(ioc, "127.0.0.1:0");
//
// Thread-safety: any thread (a resolver of its own per call).
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <string>

#include "ratelimit/status.h"

namespace ratelimit::server {

StatusOr<boost::asio::ip::tcp::endpoint> ResolveListenAddress(boost::asio::io_context& ioc,
                                                              const std::string& hostport);

}  // namespace ratelimit::server
