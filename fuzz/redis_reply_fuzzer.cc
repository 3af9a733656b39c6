// redis_reply_fuzzer: the RESP2 reply reader (src/redis/reply.cc on hiredis'
// redisReader) and the command encoder (src/redis/command.cc).
//
// The input is the byte stream a server sends. Invariants:
//   - feeding it whole and feeding it in small chunks (1, 2, 3, 5, 8, 13, ...
//     bytes) yields the same replies and the same final state (ok / error);
//   - every reply re-encodes to RESP that a fresh reader decodes to an equal reply;
//   - the strings found in a reply, sent as a command, encode to exactly
//     EncodedCommandSize bytes and decode to an array of those strings;
//   - an array header announcing more than kMaxArrayElements elements is a
//     protocol error, not an allocation: hiredis callocs 8 bytes per announced
//     element up front, so "*2147483647\r\n" (14 bytes from a hostile or
//     broken server) would cost 16 GiB. Each such header found in the input
//     is also fed on its own to a fresh reader.
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz/targets.h"
#include "redis/command.h"
#include "redis/reply.h"

namespace ratelimit::fuzz {
namespace {

using redis::Reply;
using redis::ReplyReader;

struct Outcome {
  std::vector<Reply> replies;
  bool failed = false;
};

constexpr size_t kMaxReplies = 4096;  // a stream of tiny replies: enough to compare
// Any bound the reader enforces up to this passes (2^24 elements: 128 MiB of pointers).
constexpr int64_t kMaxArrayElements = int64_t{1} << 24;

// Drains every complete reply; false once the reader failed.
bool Drain(ReplyReader& reader, Outcome& out) {
  while (out.replies.size() < kMaxReplies) {
    StatusOr<std::optional<Reply>> r = reader.Next();
    if (!r.ok()) return false;
    if (!r->has_value()) return true;
    out.replies.push_back(std::move(**r));
  }
  return true;
}

Outcome Read(std::string_view bytes, bool chunked) {
  static constexpr std::array<size_t, 8> kChunks = {1, 2, 3, 5, 8, 13, 21, 34};
  Outcome out;
  ReplyReader reader;
  size_t pos = 0;
  for (size_t i = 0; pos < bytes.size() && !out.failed; ++i) {
    const size_t n = chunked ? kChunks[i % kChunks.size()] : bytes.size();
    if (!reader.Feed(bytes.substr(pos, n)).ok()) out.failed = true;
    pos += n;
    if (!out.failed && !Drain(reader, out)) out.failed = true;
  }
  return out;
}

void Encode(const Reply& r, std::string& out) {
  switch (r.type) {
    case Reply::Type::kString:
      out += "$" + std::to_string(r.str.size()) + "\r\n" + r.str + "\r\n";
      break;
    case Reply::Type::kStatus: out += "+" + r.str + "\r\n"; break;
    case Reply::Type::kError: out += "-" + r.str + "\r\n"; break;
    case Reply::Type::kInteger: out += ":" + std::to_string(r.integer) + "\r\n"; break;
    case Reply::Type::kNil: out += "$-1\r\n"; break;
    case Reply::Type::kArray:
      out += "*" + std::to_string(r.elements.size()) + "\r\n";
      for (const Reply& e : r.elements) Encode(e, out);
      break;
  }
}

std::optional<Reply> DecodeOne(std::string_view bytes) {
  ReplyReader reader;
  if (!reader.Feed(bytes).ok()) return std::nullopt;
  StatusOr<std::optional<Reply>> r = reader.Next();
  if (!r.ok() || !r->has_value()) return std::nullopt;
  StatusOr<std::optional<Reply>> rest = reader.Next();
  if (!rest.ok() || rest->has_value()) return std::nullopt;  // exactly one reply
  return std::move(**r);
}

void CollectStrings(const Reply& r, std::vector<std::string_view>& out) {
  if (r.IsString() || r.IsStatus() || r.IsError()) out.push_back(r.str);
  for (const Reply& e : r.elements) CollectStrings(e, out);
}

// Every "*<digits>\r\n" in the input announcing more than kMaxArrayElements.
std::vector<std::string> HugeArrayHeaders(std::string_view bytes) {
  std::vector<std::string> out;
  for (size_t star = bytes.find('*'); star != std::string_view::npos && out.size() < 4;
       star = bytes.find('*', star + 1)) {
    size_t end = star + 1;
    int64_t n = 0;
    while (end < bytes.size() && bytes[end] >= '0' && bytes[end] <= '9' && n <= INT32_MAX) {
      n = n * 10 + (bytes[end++] - '0');
    }
    if (end > star + 1 && n > kMaxArrayElements && n <= INT32_MAX) {
      out.push_back(std::string(bytes.substr(star, end - star)) + "\r\n");
    }
  }
  return out;
}

}  // namespace

int FuzzRedisReply(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  for (const std::string& header : HugeArrayHeaders(bytes)) {
    ReplyReader reader;
    const bool refused = !reader.Feed(header).ok() || !reader.Next().ok();
    RL_FUZZ_CHECK(refused, "array header accepted: " + header);
  }
  const Outcome whole = Read(bytes, false);
  const Outcome chunked = Read(bytes, true);
  RL_FUZZ_CHECK(whole.failed == chunked.failed,
                whole.failed ? "only whole failed" : "only chunked failed");
  RL_FUZZ_CHECK(whole.replies == chunked.replies, "chunked replies differ");

  for (const Reply& r : whole.replies) {
    (void)r.DebugString();
    std::string encoded;
    Encode(r, encoded);
    std::optional<Reply> again = DecodeOne(encoded);
    RL_FUZZ_CHECK(again.has_value(), "re-encoded reply does not decode: " + r.DebugString());
    RL_FUZZ_CHECK(*again == r, r.DebugString() + " -> " + again->DebugString());

    std::vector<std::string_view> args;
    CollectStrings(r, args);
    if (args.empty()) continue;
    const std::string command = redis::EncodeCommand(args);
    RL_FUZZ_CHECK(command.size() == redis::EncodedCommandSize(args), command);
    std::optional<Reply> decoded = DecodeOne(command);
    RL_FUZZ_CHECK(
        decoded.has_value() && decoded->IsArray() && decoded->elements.size() == args.size(),
        command);
    for (size_t i = 0; i < args.size(); ++i) {
      RL_FUZZ_CHECK(decoded->elements[i].IsString() && decoded->elements[i].str == args[i],
                    command);
    }
  }
  return 0;
}

}  // namespace ratelimit::fuzz
