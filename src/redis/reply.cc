#include "redis/reply.h"

#include <hiredis/hiredis.h>

#include <new>

namespace ratelimit::redis {

bool Reply::IsErrorWithPrefix(std::string_view prefix) const {
  return type == Type::kError && std::string_view(str).substr(0, prefix.size()) == prefix;
}

bool Reply::IsUnavailableError() const {
  if (type != Type::kError) return false;
  const std::string_view code = std::string_view(str).substr(0, str.find(' '));
  for (std::string_view unavailable : {"LOADING", "BUSY", "MASTERDOWN", "CLUSTERDOWN", "READONLY",
                                       "OOM", "MISCONF", "NOREPLICAS"}) {
    if (code == unavailable) return true;
  }
  return false;
}

std::string_view ReplyTypeName(Reply::Type type) {
  switch (type) {
    case Reply::Type::kString: return "string";
    case Reply::Type::kStatus: return "status";
    case Reply::Type::kError: return "error";
    case Reply::Type::kInteger: return "integer";
    case Reply::Type::kNil: return "nil";
    case Reply::Type::kArray: return "array";
  }
  return "unknown";
}

std::string Reply::DebugString() const {
  switch (type) {
    case Type::kString: return "\"" + str + "\"";
    case Type::kStatus: return str;
    case Type::kError: return "(error) " + str;
    case Type::kInteger: return std::to_string(integer);
    case Type::kNil: return "(nil)";
    case Type::kArray: {
      std::string out = "[";
      for (size_t i = 0; i < elements.size(); ++i) {
        if (i > 0) out += ", ";
        out += elements[i].DebugString();
      }
      return out + "]";
    }
  }
  return "?";
}

Reply FromHiredis(const redisReply* r) {
  Reply out;
  switch (r->type) {
    case REDIS_REPLY_STRING:
      out.type = Reply::Type::kString;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_STATUS:
      out.type = Reply::Type::kStatus;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_ERROR:
      out.type = Reply::Type::kError;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_INTEGER:
      out.type = Reply::Type::kInteger;
      out.integer = r->integer;
      break;
    case REDIS_REPLY_ARRAY:
      out.type = Reply::Type::kArray;
      out.elements.reserve(r->elements);
      for (size_t i = 0; i < r->elements; ++i) out.elements.push_back(FromHiredis(r->element[i]));
      break;
    default:  // REDIS_REPLY_NIL (also a nil array "*-1")
      out.type = Reply::Type::kNil;
      break;
  }
  return out;
}

namespace {

// hiredis 0.14 allocates 8 bytes per announced array element as soon as it
// reads an array header, so a 12-byte reply "*2147483647\r\n" would cost
// 16 GiB. Arrays longer than this are refused: the reader then fails with
// its out-of-memory error, which Next() reports as a protocol error.
constexpr int kMaxArrayElements = 1 << 20;

void* (*g_create_array)(const redisReadTask*, int) = nullptr;

void* BoundedCreateArray(const redisReadTask* task, int elements) {
  if (elements < 0 || elements > kMaxArrayElements) return nullptr;
  return g_create_array(task, elements);
}

redisReplyObjectFunctions* BoundedFunctions(const redisReplyObjectFunctions* defaults) {
  static redisReplyObjectFunctions fns = [&] {
    redisReplyObjectFunctions f = *defaults;
    g_create_array = f.createArray;
    f.createArray = BoundedCreateArray;
    return f;
  }();
  return &fns;
}

}  // namespace

ReplyReader::ReplyReader() : reader_(redisReaderCreate()) {
  if (reader_ == nullptr) throw std::bad_alloc();
  reader_->fn = BoundedFunctions(reader_->fn);
}

ReplyReader::~ReplyReader() { redisReaderFree(reader_); }

Status ReplyReader::Feed(std::string_view bytes) {
  if (redisReaderFeed(reader_, bytes.data(), bytes.size()) != REDIS_OK) {
    return Internal(std::string("protocol error: ") + reader_->errstr);
  }
  return Status::Ok();
}

StatusOr<std::optional<Reply>> ReplyReader::Next() {
  void* raw = nullptr;
  if (redisReaderGetReply(reader_, &raw) != REDIS_OK) {
    return Internal(
        std::string("protocol error: ") + reader_->errstr +
        (reader_->err == REDIS_ERR_OOM ? " (or an array longer than 1048576 elements)" : ""));
  }
  if (raw == nullptr) return std::optional<Reply>();
  Reply reply = FromHiredis(static_cast<const redisReply*>(raw));
  freeReplyObject(raw);
  return std::optional<Reply>(std::move(reply));
}

}  // namespace ratelimit::redis
