// JsonLog: structured logs, one JSON object per line on stderr.
//
//   Log(Level::kInfo, "listening", {{"addr", "127.0.0.1:8080"}});
//   -> {"ts":"2026-01-01T00:00:00.000Z","level":"info","msg":"listening","addr":"127.0.0.1:8080"}
//
// LogSampler caps a kind of line under floods: at most `per_second` lines a
// second. The lines it dropped are reported as one line of their own, e.g.
// {"msg":"denials suppressed","count":N}: before the next line of its kind,
// or, once the second they were dropped in has ended, before the next log
// line of any kind and at every FlushSuppressed() (the server calls it on its
// sweep timer and at shutdown), whichever comes first. So a flood's count is
// never lost because no further line of its kind comes.
//
//   LogSampler denials(20, "denials suppressed");
//   int64_t suppressed = 0;
//   if (denials.Admit(suppressed)) { if (suppressed) Log(...count...); Log(...); }
//
// Thread-safety: Log and DenialLog::Record may be called from any thread; each
// line is written with a single write(2).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <variant>

#include "ratelimit/clock.h"
#include "ratelimit/thread_annotations.h"

namespace ratelimit::server {

enum class Level { kDebug, kInfo, kWarn, kError };

struct LogField {
  std::string_view name;
  std::variant<std::string_view, int64_t, bool> value;
  LogField(std::string_view n, std::string_view v) : name(n), value(v) {}
  LogField(std::string_view n, const std::string& v) : name(n), value(std::string_view(v)) {}
  LogField(std::string_view n, const char* v) : name(n), value(std::string_view(v)) {}
  LogField(std::string_view n, int64_t v) : name(n), value(v) {}
  LogField(std::string_view n, int v) : name(n), value(static_cast<int64_t>(v)) {}
  LogField(std::string_view n, unsigned v) : name(n), value(static_cast<int64_t>(v)) {}
  LogField(std::string_view n, size_t v) : name(n), value(static_cast<int64_t>(v)) {}
  LogField(std::string_view n, bool v) : name(n), value(v) {}
};

// The line without the trailing newline (for tests). `ts_micros` is Unix time.
std::string FormatLogLine(int64_t ts_micros, Level level, std::string_view msg,
                          std::initializer_list<LogField> fields);

void Log(Level level, std::string_view msg, std::initializer_list<LogField> fields = {});

// At most `per_second` admitted events per second of `clock` (nullptr: the
// system clock). With a `suppressed_message`, the sampler is registered for
// FlushSuppressed (and unregistered when destroyed).
class LogSampler {
 public:
  explicit LogSampler(int per_second, std::string suppressed_message = {},
                      const Clock* clock = nullptr);
  ~LogSampler();
  LogSampler(const LogSampler&) = delete;
  LogSampler& operator=(const LogSampler&) = delete;

  // True when the line may be written; then `suppressed` is the number of
  // lines dropped since the last admitted one or report (log it first).
  bool Admit(int64_t& suppressed);
  // Admit, and when lines were dropped before this one, first logs
  // suppressed_message() with their count ({"count":n}, a warning).
  bool AdmitAndReport();
  // The lines dropped in seconds that have ended and not reported yet (0
  // while the second they were dropped in lasts); they count as reported.
  int64_t TakeDue();
  const std::string& suppressed_message() const { return message_; }

 private:
  const int per_second_;
  const std::string message_;
  const Clock* const clock_;
  Mutex mu_;
  int64_t second_ RL_GUARDED_BY(mu_) = 0;
  int written_ RL_GUARDED_BY(mu_) = 0;
  int64_t suppressed_ RL_GUARDED_BY(mu_) = 0;
};

// Writes the report line of every registered sampler that has one due
// (LogSampler::TakeDue). Log calls it before each line (cheaply: an atomic
// load when nothing was dropped); the server on its sweep timer and at exit.
void FlushSuppressed();

class DenialLog {
 public:
  explicit DenialLog(int per_second = 20);
  // Logs {"msg":"denied","key":...,"limit":...,"path":...} unless sampled out.
  // API keys are shortened ("k:abcd***<hash>") so that secrets do not reach the logs.
  void Record(std::string_view key, std::string_view limit, std::string_view path);

 private:
  LogSampler sampler_;
};

// "k:secret-api-key" -> "k:secr***1f2e3d4c" (the first 4 characters, then
// 8 hex digits of the key's SHA-256: keys that share a beginning stay
// apart); other keys unchanged.
std::string RedactKey(std::string_view key);

}  // namespace ratelimit::server
