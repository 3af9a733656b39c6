#include "ratelimit/calendar.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <fstream>
#include <map>
#include <utility>

#include "ratelimit/thread_annotations.h"

namespace ratelimit {
namespace {

constexpr int64_t kDay = 86'400;

struct Civil {
  int64_t y, m, d;
};

// The inverse of DaysFromCivil (the algorithms of H. Hinnant's
// "chrono-Compatible Low-Level Date Algorithms").
Civil CivilFromDays(int64_t z) {
  z += 719468;
  const int64_t era = (z >= 0 ? z : z - 146096) / 146097;
  const int64_t doe = z - era * 146097;
  const int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
  const int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
  const int64_t mp = (5 * doy + 2) / 153;
  const int64_t d = doy - (153 * mp + 2) / 5 + 1;
  const int64_t m = mp < 10 ? mp + 3 : mp - 9;
  return {yoe + era * 400 + (m <= 2 ? 1 : 0), m, d};
}

int64_t FloorDiv(int64_t a, int64_t b) {
  return a / b - ((a % b != 0 && (a < 0) != (b < 0)) ? 1 : 0);
}

bool IsLeap(int64_t y) { return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0; }

// Days since the epoch of a rule date in year `y`.
int64_t RuleDay(const TimeZone::Rule::Date& r, int64_t y) {
  const int64_t jan1 = DaysFromCivil(y, 1, 1);
  if (r.kind == 'J') return jan1 + r.day - 1 + ((IsLeap(y) && r.day >= 60) ? 1 : 0);
  if (r.kind == 'N') return jan1 + r.day;
  // Day r.day (0 = Sunday) of week r.week (5 = the last) of month r.month.
  const int64_t first = DaysFromCivil(y, r.month, 1);
  const int64_t first_wday = (first % 7 + 11) % 7;  // 1970-01-01 was a Thursday (4)
  int64_t day = first + (r.day - first_wday + 7) % 7 + 7 * (r.week - 1);
  const int64_t next_month =
      r.month == 12 ? DaysFromCivil(y + 1, 1, 1) : DaysFromCivil(y, r.month + 1, 1);
  while (day >= next_month) day -= 7;
  return day;
}

// A big-endian signed integer of `n` bytes.
int64_t BigEndian(std::string_view s, size_t at, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) v = (v << 8) | static_cast<unsigned char>(s[at + i]);
  if (n < 8 && (v >> (8 * n - 1)) != 0) v |= ~uint64_t{0} << (8 * n);  // sign-extend
  return static_cast<int64_t>(v);
}

// The POSIX TZ parser's cursor.
class TzText {
 public:
  explicit TzText(std::string_view s) : s_(s) {}
  bool done() const { return i_ == s_.size(); }
  bool Eat(char c) {
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  char Peek() const { return i_ < s_.size() ? s_[i_] : '\0'; }
  // A zone abbreviation: "CET" or "<+0330>".
  bool Name() {
    if (Eat('<')) {
      while (i_ < s_.size() && s_[i_] != '>') ++i_;
      return Eat('>');
    }
    const size_t start = i_;
    while (i_ < s_.size() && ((s_[i_] >= 'A' && s_[i_] <= 'Z') || (s_[i_] >= 'a' && s_[i_] <= 'z')))
      ++i_;
    return i_ - start >= 3;
  }
  std::optional<int64_t> Number() {
    const size_t start = i_;
    int64_t v = 0;
    while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9' && i_ - start < 6)
      v = v * 10 + (s_[i_++] - '0');
    if (i_ == start) return std::nullopt;
    return v;
  }
  // [+-]hh[:mm[:ss]] in seconds.
  std::optional<int64_t> Time() {
    int64_t sign = 1;
    if (Eat('-')) {
      sign = -1;
    } else {
      Eat('+');
    }
    std::optional<int64_t> h = Number();
    if (!h) return std::nullopt;
    int64_t v = *h * 3600;
    for (int64_t scale : {60, 1}) {
      if (!Eat(':')) break;
      std::optional<int64_t> part = Number();
      if (!part) return std::nullopt;
      v += *part * scale;
    }
    return sign * v;
  }
  std::optional<TimeZone::Rule::Date> Date() {
    TimeZone::Rule::Date d;
    if (Eat('M')) {
      std::optional<int64_t> m = Number(), w, wd;
      if (!m || !Eat('.') || !(w = Number()) || !Eat('.') || !(wd = Number())) return std::nullopt;
      if (*m < 1 || *m > 12 || *w < 1 || *w > 5 || *wd > 6) return std::nullopt;
      d.month = static_cast<int>(*m);
      d.week = static_cast<int>(*w);
      d.day = static_cast<int>(*wd);
    } else {
      d.kind = Eat('J') ? 'J' : 'N';
      std::optional<int64_t> n = Number();
      if (!n || *n > 365 || (d.kind == 'J' && *n < 1)) return std::nullopt;
      d.day = static_cast<int>(*n);
    }
    if (Eat('/')) {
      std::optional<int64_t> t = Time();
      if (!t) return std::nullopt;
      d.time = *t;
    }
    return d;
  }

 private:
  std::string_view s_;
  size_t i_ = 0;
};

bool ValidZoneName(std::string_view name) {
  if (name.empty() || name.size() > 255 || name.front() == '/') return false;
  if (name.find("..") != std::string_view::npos) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '/' ||
           c == '_' || c == '-' || c == '+';
  });
}

// Zones and calendars by zone name (and unit), read under a shared lock:
// an inline limit of the decision API looks its calendar up per request.
struct Registry {
  SharedMutex mu;
  std::map<std::string, std::shared_ptr<const TimeZone>, std::less<>> zones RL_GUARDED_BY(mu);
  std::map<std::string, std::array<std::shared_ptr<const Calendar>, 5>, std::less<>> calendars
      RL_GUARDED_BY(mu);
};

Registry& TheRegistry() {
  static Registry* r = new Registry;  // never destroyed: limits may outlive static destruction
  return *r;
}

}  // namespace

int64_t DaysFromCivil(int64_t y, int64_t m, int64_t d) {
  y -= m <= 2 ? 1 : 0;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const int64_t yoe = y - era * 400;
  const int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + doe - 719468;
}

std::string_view CalendarUnitName(CalendarUnit unit) {
  switch (unit) {
    case CalendarUnit::kDay: return "1d";
    case CalendarUnit::kWeek: return "1w";
    case CalendarUnit::kMonth: return "1mo";
    case CalendarUnit::kYear: return "1y";
    case CalendarUnit::kNone: break;
  }
  return "";
}

std::optional<CalendarUnit> ParseCalendarUnit(std::string_view window) {
  for (CalendarUnit u :
       {CalendarUnit::kDay, CalendarUnit::kWeek, CalendarUnit::kMonth, CalendarUnit::kYear}) {
    if (window == CalendarUnitName(u)) return u;
  }
  return std::nullopt;
}

std::optional<TimeZone::Rule> TimeZone::ParseRule(std::string_view tz) {
  TzText t(tz);
  Rule r;
  if (!t.Name()) return std::nullopt;
  std::optional<int64_t> std_west = t.Time();
  if (!std_west) return std::nullopt;
  r.std_offset = -*std_west;
  if (t.done()) return r;
  if (!t.Name()) return std::nullopt;
  r.has_dst = true;
  r.dst_offset = r.std_offset + 3600;
  if (t.Peek() != ',') {
    std::optional<int64_t> dst_west = t.Time();
    if (!dst_west) return std::nullopt;
    r.dst_offset = -*dst_west;
  }
  std::optional<Rule::Date> start, end;
  if (!t.Eat(',') || !(start = t.Date()) || !t.Eat(',') || !(end = t.Date()) || !t.done())
    return std::nullopt;  // a DST name without rules: unspecified, so unsupported
  r.start = *start;
  r.end = *end;
  return r;
}

StatusOr<std::shared_ptr<const TimeZone>> TimeZone::FromTzif(std::string name,
                                                             std::string_view data) {
  const std::string what = "time zone '" + name + "': ";
  auto bad = [&](const std::string& why) { return InvalidArgument(what + why); };
  if (data.size() < 44 || data.substr(0, 4) != "TZif") return bad("not a TZif file");
  // Skips the version 1 block (32-bit times) to the version 2+ block.
  auto block_size = [&](size_t at, size_t time_size) -> std::optional<size_t> {
    if (data.size() < at + 44) return std::nullopt;
    const auto n = [&](int k) { return static_cast<size_t>(BigEndian(data, at + 20 + 4 * k, 4)); };
    const size_t isut = n(0), isstd = n(1), leap = n(2), time = n(3), type = n(4), chars = n(5);
    return 44 + time * time_size + time + type * 6 + chars + leap * (time_size + 4) + isstd + isut;
  };
  if (data[4] < '2') return bad("a version 1 TZif file (version 2 or later needed)");
  std::optional<size_t> v1 = block_size(0, 4);
  if (!v1 || data.size() < *v1 + 44 || data.substr(*v1, 4) != "TZif") return bad("truncated");
  const size_t at = *v1;
  std::optional<size_t> v2 = block_size(at, 8);
  if (!v2 || data.size() < at + *v2) return bad("truncated");
  const auto count = [&](int k) {
    return static_cast<size_t>(BigEndian(data, at + 20 + 4 * k, 4));
  };
  const size_t timecnt = count(3), typecnt = count(4);
  if (typecnt == 0) return bad("no local time types");
  std::shared_ptr<TimeZone> z(new TimeZone);
  z->name_ = std::move(name);
  size_t p = at + 44;
  std::vector<uint8_t> idx(timecnt);
  z->transitions_.resize(timecnt);
  for (size_t i = 0; i < timecnt; ++i, p += 8) z->transitions_[i] = BigEndian(data, p, 8);
  for (size_t i = 0; i < timecnt; ++i) idx[i] = static_cast<uint8_t>(data[p++]);
  std::vector<int32_t> type_offsets(typecnt);
  for (size_t i = 0; i < typecnt; ++i, p += 6)
    type_offsets[i] = static_cast<int32_t>(BigEndian(data, p, 4));
  z->initial_offset_ = type_offsets[0];
  z->offsets_.resize(timecnt);
  for (size_t i = 0; i < timecnt; ++i) {
    if (idx[i] >= typecnt) return bad("a transition names a missing type");
    if (i > 0 && z->transitions_[i] <= z->transitions_[i - 1]) return bad("unordered transitions");
    z->offsets_[i] = type_offsets[idx[i]];
  }
  // The footer: "\n<POSIX TZ>\n", the rule after the last transition.
  const size_t footer = at + *v2;
  if (footer < data.size() && data[footer] == '\n') {
    const size_t close = data.find('\n', footer + 1);
    if (close != std::string_view::npos) {
      z->rule_ = ParseRule(data.substr(footer + 1, close - footer - 1));
    }
  }
  return std::shared_ptr<const TimeZone>(std::move(z));
}

std::string TimeZone::Directory() {
  const char* dir = std::getenv("TZDIR");  // NOLINT(concurrency-mt-unsafe): read-only use
  return dir != nullptr && *dir != '\0' ? dir : "/usr/share/zoneinfo";
}

StatusOr<std::shared_ptr<const TimeZone>> TimeZone::Find(std::string_view name) {
  Registry& r = TheRegistry();
  {
    SharedLockGuard lock(r.mu);
    if (auto it = r.zones.find(name); it != r.zones.end()) return it->second;
  }
  std::shared_ptr<const TimeZone> zone;
  if (name == "UTC" || name == "Etc/UTC") {
    std::shared_ptr<TimeZone> utc(new TimeZone);
    utc->name_ = std::string(name);
    zone = std::move(utc);
  } else {
    const std::string hint =
        " (an IANA time zone name such as Europe/Berlin, America/New_York or UTC, from " +
        Directory() + ")";
    if (!ValidZoneName(name))
      return InvalidArgument("unknown time zone '" + std::string(name) + "'" + hint);
    // A TZif file is a few KB; reading stops at 256 KB (a name is a
    // client's choice in the decision API, and the directory holds other files).
    std::ifstream in(Directory() + "/" + std::string(name), std::ios::binary);
    if (!in) {
      // No such zone, or no tzdata at all (a slim container image): then
      // every name fails, and the fix is not another name.
      if (!std::ifstream(Directory() + "/Etc/UTC")) {
        return InvalidArgument("unknown time zone '" + std::string(name) + "': no tzdata in " +
                               Directory() + ": install the tzdata package or set TZDIR");
      }
      return InvalidArgument("unknown time zone '" + std::string(name) + "'" + hint);
    }
    std::string data(256 * 1024, '\0');
    in.read(data.data(), static_cast<std::streamsize>(data.size()));
    data.resize(static_cast<size_t>(in.gcount()));
    if (data.empty())
      return InvalidArgument("unknown time zone '" + std::string(name) + "'" + hint);
    StatusOr<std::shared_ptr<const TimeZone>> z = FromTzif(std::string(name), data);
    // Not a zone (zone.tab, a directory, a corrupt file): the same answer.
    if (!z.ok()) return InvalidArgument("unknown time zone '" + std::string(name) + "'" + hint);
    zone = *std::move(z);
  }
  LockGuard lock(r.mu);
  return r.zones.try_emplace(std::string(name), std::move(zone)).first->second;
}

int64_t TimeZone::RuleOffsetAt(int64_t utc) const {
  const Rule& r = *rule_;
  if (!r.has_dst) return r.std_offset;
  const int64_t year = CivilFromDays(FloorDiv(utc + r.std_offset, kDay)).y;
  // DST starts at a standard local time and ends at a daylight local time.
  const int64_t start = RuleDay(r.start, year) * kDay + r.start.time - r.std_offset;
  const int64_t end = RuleDay(r.end, year) * kDay + r.end.time - r.dst_offset;
  const bool dst = start < end ? (utc >= start && utc < end) : !(utc >= end && utc < start);
  return dst ? r.dst_offset : r.std_offset;
}

int64_t TimeZone::OffsetAt(int64_t utc) const {
  if (transitions_.empty() || utc < transitions_.front()) {
    if (transitions_.empty() && rule_) return RuleOffsetAt(utc);
    return initial_offset_;
  }
  if (utc >= transitions_.back() && rule_) return RuleOffsetAt(utc);
  const auto it = std::upper_bound(transitions_.begin(), transitions_.end(), utc);
  return offsets_[static_cast<size_t>(it - transitions_.begin()) - 1];
}

int64_t TimeZone::FirstInstantAt(int64_t local) const {
  // The offsets in force two days either side (as UTC times: enough for any
  // offset); a local time is valid under an offset if that offset is the one
  // in force at the instant it names.
  const int64_t before = OffsetAt(local - 2 * kDay);
  const int64_t after = OffsetAt(local + 2 * kDay);
  std::optional<int64_t> best;
  for (int64_t o : {before, after}) {
    const int64_t u = local - o;
    if (OffsetAt(u) == o && (!best || u < *best)) best = u;
  }
  if (best) return *best;
  // A gap: the first instant whose local time is past `local`. Local time
  // rises monotonically across a gap, so bisect.
  int64_t lo = local - std::max(before, after), hi = local - std::min(before, after);
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (mid + OffsetAt(mid) >= local) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

Calendar::Calendar(CalendarUnit unit, std::shared_ptr<const TimeZone> zone)
    : unit_(unit), zone_(std::move(zone)) {}

StatusOr<std::shared_ptr<const Calendar>> Calendar::Get(CalendarUnit unit, std::string_view zone) {
  if (unit == CalendarUnit::kNone) return InvalidArgument("no calendar unit");
  if (zone.empty()) zone = "UTC";
  Registry& r = TheRegistry();
  const auto u = static_cast<size_t>(unit);
  {
    SharedLockGuard lock(r.mu);
    if (auto it = r.calendars.find(zone); it != r.calendars.end() && it->second[u] != nullptr)
      return it->second[u];
  }
  StatusOr<std::shared_ptr<const TimeZone>> z = TimeZone::Find(zone);
  if (!z.ok()) return z.status();
  auto made = std::make_shared<const Calendar>(unit, *std::move(z));
  LockGuard lock(r.mu);
  std::shared_ptr<const Calendar>& slot = r.calendars[std::string(zone)][u];
  if (slot == nullptr) slot = std::move(made);
  return slot;
}

Calendar::Span Calendar::Compute(int64_t now_us) const {
  const int64_t t = FloorDiv(now_us, 1'000'000);
  const int64_t day = FloorDiv(t + zone_->OffsetAt(t), kDay);  // the local date
  const Civil c = CivilFromDays(day);
  int64_t first = day, next = day + 1;
  switch (unit_) {
    case CalendarUnit::kWeek:
      first = day - ((day + 3) % 7 + 7) % 7;  // Monday (1970-01-01, day 0, was a Thursday)
      next = first + 7;
      break;
    case CalendarUnit::kMonth:
      first = DaysFromCivil(c.y, c.m, 1);
      next = c.m == 12 ? DaysFromCivil(c.y + 1, 1, 1) : DaysFromCivil(c.y, c.m + 1, 1);
      break;
    case CalendarUnit::kYear:
      first = DaysFromCivil(c.y, 1, 1);
      next = DaysFromCivil(c.y + 1, 1, 1);
      break;
    default: break;
  }
  int64_t start = zone_->FirstInstantAt(first * kDay);
  int64_t end = zone_->FirstInstantAt(next * kDay);
  // A clock set back across midnight shows yesterday's date after today
  // began: such an instant belongs to the window it is in by the timeline.
  if (end <= t) {
    start = end;
    end = zone_->FirstInstantAt((next + (next - first)) * kDay);
  }
  start = std::min(start, t);
  return {.start = start * 1'000'000, .end = end * 1'000'000};
}

Calendar::Span Calendar::At(int64_t now_us) const { return Cached(cache_, now_us, *this); }

Calendar::Span Calendar::Next(const Span& w) const { return Cached(next_cache_, w.end, *this); }

Calendar::Span Calendar::Cached(std::atomic<uint64_t>& slot, int64_t now_us, const Calendar& cal) {
  constexpr int kLengthBits = 25;
  const uint64_t c = slot.load(std::memory_order_relaxed);
  if (c != 0) {
    const auto start = static_cast<int64_t>(c >> kLengthBits) * 1'000'000;
    const auto end =
        start + static_cast<int64_t>(c & ((uint64_t{1} << kLengthBits) - 1)) * 1'000'000;
    if (now_us >= start && now_us < end) return {.start = start, .end = end};
  }
  const Span s = cal.Compute(now_us);
  const int64_t start_s = s.start / 1'000'000, length_s = (s.end - s.start) / 1'000'000;
  if (start_s >= 0 && start_s < (int64_t{1} << (64 - kLengthBits)) && length_s > 0 &&
      length_s < (int64_t{1} << kLengthBits) && s.start % 1'000'000 == 0) {
    slot.store((static_cast<uint64_t>(start_s) << kLengthBits) | static_cast<uint64_t>(length_s),
               std::memory_order_relaxed);
  }
  return s;
}

int64_t Calendar::nominal_micros() const {
  constexpr int64_t kDayUs = kDay * 1'000'000;
  switch (unit_) {
    case CalendarUnit::kWeek: return 7 * kDayUs;
    case CalendarUnit::kMonth: return 30 * kDayUs;
    case CalendarUnit::kYear: return 365 * kDayUs;
    default: return kDayUs;
  }
}

}  // namespace ratelimit
