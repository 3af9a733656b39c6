#include "server/json_log.h"
#include "ratelimit/thread_annotations.h"

#include <openssl/sha.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <mutex>
#include <utility>
#include <vector>

#include "core/hex.h"

namespace ratelimit::server {
namespace {

int64_t NowMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void AppendEscaped(std::string& out, std::string_view s) {
  out.push_back('"');
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else if (c >= 0x80) {
          // Logged text may come from clients: keep the line valid JSON and
          // ASCII by escaping every non-ASCII byte as a \u00XX (lossless enough to read).
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out.push_back(static_cast<char>(c));
        }
    }
  }
  out.push_back('"');
}

std::string_view LevelName(Level l) {
  switch (l) {
    case Level::kDebug: return "debug";
    case Level::kInfo: return "info";
    case Level::kWarn: return "warn";
    case Level::kError: return "error";
  }
  return "info";
}

void WriteLine(std::string line) {
  line.push_back('\n');
  const char* p = line.data();
  size_t n = line.size();
  while (n > 0) {
    ssize_t w = ::write(2, p, n);
    if (w <= 0) return;
    p += w;
    n -= static_cast<size_t>(w);
  }
}

}  // namespace

std::string FormatLogLine(int64_t ts_micros, Level level, std::string_view msg,
                          std::initializer_list<LogField> fields) {
  std::time_t secs = static_cast<std::time_t>(ts_micros / 1'000'000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char ts[96];
  std::snprintf(ts, sizeof ts, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<int>((ts_micros / 1000) % 1000));
  std::string out;
  out.reserve(128);
  out += "{\"ts\":\"";
  out += ts;
  out += "\",\"level\":\"";
  out += LevelName(level);
  out += "\",\"msg\":";
  AppendEscaped(out, msg);
  for (const LogField& f : fields) {
    out.push_back(',');
    AppendEscaped(out, f.name);
    out.push_back(':');
    if (auto* s = std::get_if<std::string_view>(&f.value)) {
      AppendEscaped(out, *s);
    } else if (auto* i = std::get_if<int64_t>(&f.value)) {
      out += std::to_string(*i);
    } else {
      out += std::get<bool>(f.value) ? "true" : "false";
    }
  }
  out.push_back('}');
  return out;
}

namespace {

// The samplers with a report line, and how many of them dropped lines that
// are not reported yet (Log's cheap test).
struct Samplers {
  Mutex mu;
  std::vector<LogSampler*> all RL_GUARDED_BY(mu);
  std::atomic<int> dropping{0};
};

Samplers& Registry() {
  static Samplers* s = new Samplers;  // never destroyed: samplers may outlive statics
  return *s;
}

}  // namespace

void Log(Level level, std::string_view msg, std::initializer_list<LogField> fields) {
  if (Registry().dropping.load(std::memory_order_relaxed) > 0) FlushSuppressed();
  WriteLine(FormatLogLine(NowMicros(), level, msg, fields));
}

void FlushSuppressed() {
  Samplers& r = Registry();
  LockGuard lock(r.mu);
  for (LogSampler* s : r.all) {
    const int64_t n = s->TakeDue();
    if (n > 0) {
      WriteLine(FormatLogLine(NowMicros(), Level::kWarn, s->suppressed_message(), {{"count", n}}));
    }
  }
}

LogSampler::LogSampler(int per_second, std::string suppressed_message, const Clock* clock)
    : per_second_(per_second),
      message_(std::move(suppressed_message)),
      clock_(clock != nullptr ? clock : &Clock::System()) {
  if (message_.empty()) return;
  LockGuard lock(Registry().mu);
  Registry().all.push_back(this);
}

LogSampler::~LogSampler() {
  if (message_.empty()) return;
  Samplers& r = Registry();
  LockGuard lock(r.mu);
  std::erase(r.all, this);
  LockGuard mine(mu_);
  if (suppressed_ > 0) r.dropping.fetch_sub(1, std::memory_order_relaxed);
}

bool LogSampler::AdmitAndReport() {
  int64_t suppressed = 0;
  if (!Admit(suppressed)) return false;
  if (suppressed > 0) Log(Level::kWarn, message_, {{"count", suppressed}});
  return true;
}

bool LogSampler::Admit(int64_t& suppressed) {
  const int64_t second = clock_->NowMicros() / 1'000'000;
  LockGuard lock(mu_);
  if (second != second_) {
    second_ = second;
    written_ = 0;
  }
  if (written_ >= per_second_) {
    if (suppressed_++ == 0 && !message_.empty()) {
      Registry().dropping.fetch_add(1, std::memory_order_relaxed);
    }
    return false;
  }
  ++written_;
  suppressed = suppressed_;
  if (suppressed_ > 0 && !message_.empty()) {
    Registry().dropping.fetch_sub(1, std::memory_order_relaxed);
  }
  suppressed_ = 0;
  return true;
}

int64_t LogSampler::TakeDue() {
  const int64_t second = clock_->NowMicros() / 1'000'000;
  LockGuard lock(mu_);
  if (suppressed_ == 0 || second == second_) return 0;
  const int64_t n = std::exchange(suppressed_, 0);
  if (!message_.empty()) Registry().dropping.fetch_sub(1, std::memory_order_relaxed);
  return n;
}

std::string RedactKey(std::string_view key) {
  if (key.size() > 2 && key.substr(0, 2) == "k:") {
    // The first 4 characters say which key it is to a reader; 32 bits of its
    // SHA-256 tell apart keys that share them ("demo-pro-key-0001" and
    // "demo-internal-0001"), and reveal no more of it than they do.
    unsigned char digest[SHA256_DIGEST_LENGTH];
    SHA256(reinterpret_cast<const unsigned char*>(key.data() + 2), key.size() - 2, digest);
    std::string out(key.substr(0, std::min<size_t>(key.size(), 6)));
    out += "***";
    core::AppendHex(out, std::span<const unsigned char>(digest, 4));
    return out;
  }
  return std::string(key);
}

DenialLog::DenialLog(int per_second) : sampler_(per_second, "denials suppressed") {}

void DenialLog::Record(std::string_view key, std::string_view limit, std::string_view path) {
  if (!sampler_.AdmitAndReport()) return;
  Log(Level::kInfo, "denied", {{"key", RedactKey(key)}, {"limit", limit}, {"path", path}});
}

}  // namespace ratelimit::server
