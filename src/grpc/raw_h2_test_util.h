// A raw HTTP/2 client's pieces for the gRPC server's tests: frames written
// byte by byte, so that a test can send what no real client would (a request
// that never ends, part of a preface).
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdint>
#include <string>

namespace ratelimit::grpcface::rawh2 {

// Raw TCP: what a non-gRPC client sends.
// `rcvbuf` > 0: the receive buffer's size, set before connecting.
inline int Connect(int port, int rcvbuf = 0) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (rcvbuf > 0) setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  timeval tv{.tv_sec = 5, .tv_usec = 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

// An HTTP/2 frame: 9-byte header (length, type, flags, stream), then payload.
inline std::string Frame(uint8_t type, uint8_t flags, uint32_t stream, const std::string& payload) {
  std::string f;
  const auto n = static_cast<uint32_t>(payload.size());
  f += static_cast<char>(n >> 16);
  f += static_cast<char>(n >> 8);
  f += static_cast<char>(n);
  f += static_cast<char>(type);
  f += static_cast<char>(flags);
  for (int shift = 24; shift >= 0; shift -= 8) f += static_cast<char>(stream >> shift);
  return f + payload;
}

inline std::string Be32(uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
          static_cast<char>(v)};
}

inline constexpr char kPreface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

// A request's HEADERS block (HPACK without its dynamic table): POST `path`,
// content-type application/grpc.
inline std::string RequestHeaders(const std::string& path) {
  std::string headers = "\x83\x86";  // :method POST, :scheme http (HPACK static table)
  headers += "\x01\x01x";            // :authority (index 1), literal value "x"
  headers += '\x04';                 // :path, literal value, not indexed
  headers += static_cast<char>(path.size());
  headers += path;
  headers += "\x0f\x10";  // content-type (static index 31), literal value
  headers += static_cast<char>(16);
  headers += "application/grpc";
  return headers;
}

// A gRPC message of `n` bytes with its 5-byte prefix.
inline std::string Framed(size_t n) {
  return std::string(1, '\0') + Be32(static_cast<uint32_t>(n)) + std::string(n, 'x');
}

inline bool SendAll(int fd, const std::string& bytes) {
  return send(fd, bytes.data(), bytes.size(), 0) == static_cast<ssize_t>(bytes.size());
}

}  // namespace ratelimit::grpcface::rawh2
