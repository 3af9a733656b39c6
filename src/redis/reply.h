// Reply: one decoded RESP2 reply from a Redis server, as a plain value tree.
//
// A Reply is produced by ReplyReader (below) from the bytes a server sends.
// An error reply ("-ERR ...") is a Reply of type kError, not a failed Status:
// the server answered. Statuses are reserved for "no answer" (see connection.h).
//
//   ReplyReader reader;
//   reader.Feed("+OK\r\n:42\r\n");
//   std::optional<Reply> r;
//   while ((r = reader.Next().value())) use(*r);   // kStatus "OK", then kInteger 42
//
// Ownership: Reply owns its strings and elements. ReplyReader owns a hiredis
// redisReader. Thread-safety: Reply is a value type; ReplyReader is not
// thread-safe (one per connection, used from that connection's strand).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ratelimit/status.h"

struct redisReply;
struct redisReader;

namespace ratelimit::redis {

struct Reply {
  enum class Type { kString, kStatus, kError, kInteger, kNil, kArray };

  Type type = Type::kNil;
  std::string str;              // kString, kStatus, kError
  int64_t integer = 0;          // kInteger
  std::vector<Reply> elements;  // kArray

  bool IsError() const { return type == Type::kError; }
  bool IsNil() const { return type == Type::kNil; }
  bool IsString() const { return type == Type::kString; }
  bool IsStatus() const { return type == Type::kStatus; }
  bool IsInteger() const { return type == Type::kInteger; }
  bool IsArray() const { return type == Type::kArray; }
  // True iff this is an error reply whose text starts with `prefix` (e.g. "NOSCRIPT").
  bool IsErrorWithPrefix(std::string_view prefix) const;
  // True iff this is an error reply by which the node says that it cannot
  // serve calls now, and did not run this one: its error code (the first
  // word) is LOADING (loading its dataset), BUSY (a script or function runs
  // past busy-reply-threshold), MASTERDOWN (a replica cut off from its master
  // with replica-serve-stale-data no), CLUSTERDOWN or READONLY (a replica: a
  // failover demoted it), or a write refused: OOM (maxmemory reached with
  // noeviction), MISCONF (snapshots failing with stop-writes-on-bgsave-error),
  // NOREPLICAS (min-replicas-to-write not met). A call that gets one is a failed call, as a timeout
  // is (RedisBackend::Report, docs/reliability.md). Not MOVED, ASK or
  // TRYAGAIN (ClusterClient follows them) nor BUSYKEY, BUSYGROUP or any other
  // answer about the call itself.
  bool IsUnavailableError() const;

  // Human-readable rendering for logs and test failures, e.g. `[1, "a", (nil)]`.
  std::string DebugString() const;

  static Reply String(std::string s) { return Reply{Type::kString, std::move(s), 0, {}}; }
  static Reply Status(std::string s) { return Reply{Type::kStatus, std::move(s), 0, {}}; }
  static Reply Error(std::string s) { return Reply{Type::kError, std::move(s), 0, {}}; }
  static Reply Integer(int64_t v) { return Reply{Type::kInteger, {}, v, {}}; }
  static Reply Nil() { return Reply{}; }
  static Reply Array(std::vector<Reply> e) { return Reply{Type::kArray, {}, 0, std::move(e)}; }

  friend bool operator==(const Reply&, const Reply&) = default;
};

std::string_view ReplyTypeName(Reply::Type type);

// Deep-copies a hiredis reply tree. REQUIRES: r != nullptr.
Reply FromHiredis(const redisReply* r);

// Incremental RESP2 decoder over hiredis' redisReader.
class ReplyReader {
 public:
  ReplyReader();
  ~ReplyReader();
  ReplyReader(const ReplyReader&) = delete;
  ReplyReader& operator=(const ReplyReader&) = delete;

  // Appends received bytes. Returns kInternal after a protocol error.
  Status Feed(std::string_view bytes);
  // The next complete reply, std::nullopt if more bytes are needed, or
  // kInternal "protocol error: ..." for malformed input. After an error the
  // reader stays failed; create a new one for a new connection.
  StatusOr<std::optional<Reply>> Next();

 private:
  redisReader* reader_;
};

}  // namespace ratelimit::redis
