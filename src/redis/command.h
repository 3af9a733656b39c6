// RESP2 request encoding: turns an argument list into the bytes Redis expects.
//
//   std::string out;
//   AppendCommand(out, std::array<std::string_view, 3>{"SET", "k", "v"});
//   // out == "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n"
//
// Arguments are binary-safe. Thread-safety: pure functions.
#pragma once

#include <span>
#include <string>
#include <string_view>

namespace ratelimit::redis {

// Exact number of bytes AppendCommand will add for `args`.
size_t EncodedCommandSize(std::span<const std::string_view> args);

// Appends one RESP2 multi-bulk command (callers reserve EncodedCommandSize first
// when they care about growth). REQUIRES: !args.empty().
void AppendCommand(std::string& out, std::span<const std::string_view> args);

// One command as a new string.
std::string EncodeCommand(std::span<const std::string_view> args);

}  // namespace ratelimit::redis
