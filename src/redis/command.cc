#include "redis/command.h"

#include <charconv>

namespace ratelimit::redis {
namespace {

size_t Digits(size_t n) {
  size_t d = 1;
  while (n >= 10) {
    n /= 10;
    ++d;
  }
  return d;
}

void AppendHeader(std::string& out, char prefix, size_t n) {
  char buf[24];
  buf[0] = prefix;
  auto [end, ec] = std::to_chars(buf + 1, buf + sizeof(buf) - 2, n);
  (void)ec;
  *end++ = '\r';
  *end++ = '\n';
  out.append(buf, end);
}

}  // namespace

size_t EncodedCommandSize(std::span<const std::string_view> args) {
  size_t size = 3 + Digits(args.size());
  for (std::string_view a : args) size += 5 + Digits(a.size()) + a.size();
  return size;
}

void AppendCommand(std::string& out, std::span<const std::string_view> args) {
  AppendHeader(out, '*', args.size());
  for (std::string_view a : args) {
    AppendHeader(out, '$', a.size());
    out.append(a);
    out.append("\r\n", 2);
  }
}

std::string EncodeCommand(std::span<const std::string_view> args) {
  std::string out;
  out.reserve(EncodedCommandSize(args));
  AppendCommand(out, args);
  return out;
}

}  // namespace ratelimit::redis
