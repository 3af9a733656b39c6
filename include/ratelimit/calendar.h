// Calendar windows: the windows of a quota that follows the calendar of a
// time zone ("10,000 a month, reset at midnight on the 1st, Berlin time").
//
//   StatusOr<std::shared_ptr<const Calendar>> c = Calendar::Get(CalendarUnit::kMonth,
//                                                               "Europe/Berlin");
//   Calendar::Span s = (*c)->At(clock.NowMicros());   // [start, end) in us since the epoch
//
// A day starts at local midnight, a week on Monday 00:00 local, a month on
// the 1st at 00:00 local, a year on January 1st at 00:00 local. A window is
// as long as the calendar makes it: a day of a DST change lasts 23 or 25
// hours. A local midnight that does not exist (a zone that moves its clocks
// forward at midnight) starts the day at the first instant after the gap.
//
// Time zones come from the system's tzdata (TZif files under
// /usr/share/zoneinfo, or $TZDIR), read once per zone by TimeZone, a small
// reader of our own (docs/architecture.md, "Calendar quotas", says why).
// "UTC" needs no file.
//
// Thread-safety: TimeZone and Calendar are immutable once built, apart from
// Calendar's cache of the current window (one atomic word); Get() and
// TimeZone::Find() may be called from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ratelimit/status.h"

namespace ratelimit {

enum class CalendarUnit { kNone, kDay, kWeek, kMonth, kYear };

// "1d", "1w", "1mo", "1y" ("" for kNone), as the `window` field spells them.
std::string_view CalendarUnitName(CalendarUnit unit);
// The inverse; nullopt for anything else (multiples such as "2mo" included).
std::optional<CalendarUnit> ParseCalendarUnit(std::string_view window);

// Days since 1970-01-01 of a date of the proleptic Gregorian calendar
// (month 1..12, day 1..31): DaysFromCivil(2028, 2, 29) * 86400 is the Unix
// time of that day's 00:00 UTC.
int64_t DaysFromCivil(int64_t year, int64_t month, int64_t day);

class TimeZone {
 public:
  // The zone `name` (an IANA name: "Europe/Berlin", "America/New_York",
  // "UTC"), loaded from the tzdata directory on first use and shared after.
  static StatusOr<std::shared_ptr<const TimeZone>> Find(std::string_view name);
  // A zone from TZif data (RFC 8536, version 2 or later): for tests.
  static StatusOr<std::shared_ptr<const TimeZone>> FromTzif(std::string name,
                                                            std::string_view data);
  // The directory zones are read from: $TZDIR, else /usr/share/zoneinfo.
  static std::string Directory();

  const std::string& name() const { return name_; }
  // Seconds east of UTC at the instant `utc` (seconds since the epoch).
  int64_t OffsetAt(int64_t utc) const;
  // The first instant (UTC seconds) whose local time is `local` (seconds of
  // local time since 1970-01-01 00:00 local) or, when that local time falls
  // in a gap, the first instant after the gap. Of a local time that occurs
  // twice, the first.
  int64_t FirstInstantAt(int64_t local) const;

  // The POSIX TZ rule of the TZif footer ("CET-1CEST,M3.5.0,M10.5.0/3"),
  // used after the last transition. Public for the parser's tests.
  struct Rule {
    struct Date {
      char kind = 'M';  // 'M' month/week/day, 'J' Julian 1..365 (no Feb 29), 'N' 0..365
      int month = 0, week = 0, day = 0;
      int64_t time = 7200;  // seconds after local midnight (may be negative or > 24h)
    };
    int64_t std_offset = 0;  // seconds east of UTC
    bool has_dst = false;
    int64_t dst_offset = 0;
    Date start, end;  // of DST, in standard and in daylight time
  };
  static std::optional<Rule> ParseRule(std::string_view tz);

 private:
  TimeZone() = default;
  int64_t RuleOffsetAt(int64_t utc) const;

  std::string name_;
  std::vector<int64_t> transitions_;  // UTC seconds, ascending
  std::vector<int32_t> offsets_;      // offsets_[i]: from transitions_[i] on
  int32_t initial_offset_ = 0;        // before the first transition
  std::optional<Rule> rule_;          // after the last transition, if the footer has one
};

class Calendar {
 public:
  // [start, end) in microseconds since the epoch.
  struct Span {
    int64_t start = 0, end = 0;
    friend bool operator==(const Span&, const Span&) = default;
  };

  // The shared Calendar of (unit, zone): the same object for the same pair,
  // so Limits that use it compare equal. `zone` "" is UTC.
  // REQUIRES: unit != kNone.
  static StatusOr<std::shared_ptr<const Calendar>> Get(CalendarUnit unit, std::string_view zone);

  Calendar(CalendarUnit unit, std::shared_ptr<const TimeZone> zone);

  CalendarUnit unit() const { return unit_; }
  const TimeZone& zone() const { return *zone_; }

  // The window holding `now_us` (>= 0). Answers from a cache of the last
  // window computed, and computes (a time zone lookup) only when `now_us`
  // is outside it: once a window in the common case.
  Span At(int64_t now_us) const;
  // The window after `w` (a window of this calendar), cached the same way
  // in a second word: the Redis store sends both (docs/architecture.md).
  Span Next(const Span& w) const;
  // The same, computed afresh.
  Span Compute(int64_t now_us) const;
  // The nominal length (1d 24h, 1w 7d, 1mo 30d, 1y 365d): what the
  // RateLimit-Policy header's w= and the explain output give as the window.
  int64_t nominal_micros() const;

 private:
  CalendarUnit unit_;
  std::shared_ptr<const TimeZone> zone_;
  // A window, start in seconds (high 39 bits) and length in seconds (low 25
  // bits), or 0: the last one At() computed, and the last one Next() did.
  static Span Cached(std::atomic<uint64_t>& slot, int64_t t, const Calendar& c);
  mutable std::atomic<uint64_t> cache_{0}, next_cache_{0};
};

}  // namespace ratelimit
