// How a listener goes on after a failed accept (EMFILE, ENFILE, ENOBUFS: the
// process or the system is out of descriptors or memory). The connection
// waits in the backlog, so the listening socket stays readable: accepting
// again at once fails again at once, and the loop spins a core while the
// connections whose close would free a descriptor wait for that core.
// Shared by the HTTP listener (server/listener.cc) and the gRPC one
// (grpc/h2_server.cc).
#pragma once

#include <chrono>

namespace ratelimit::core {

inline constexpr std::chrono::milliseconds kAcceptRetryDelay{50};

}  // namespace ratelimit::core
