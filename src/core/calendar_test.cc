// Calendar quotas on a manual clock: windows at local midnight across DST
// changes, month ends, a leap day and a year end; the TZif reader checked
// against the C library's reading of the same files.
#include "ratelimit/calendar.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <ctime>
#include <random>

#include "core/algorithms.h"
#include "ratelimit/clock.h"
#include "ratelimit/limit.h"

namespace ratelimit {
namespace {

using std::chrono::microseconds;

constexpr int64_t kS = 1'000'000;
constexpr int64_t kH = 3600 * kS;

// Microseconds since the epoch of a UTC date and time.
int64_t Utc(int y, int mo, int d, int h = 0, int mi = 0, int s = 0) {
  return ((DaysFromCivil(y, mo, d) * 24 + h) * 3600 + mi * 60 + s) * kS;
}

Limit MakeQuota(int64_t n, CalendarUnit unit, std::string_view zone) {
  StatusOr<Limit> l = Limit::CalendarQuota("q", n, unit, zone);
  EXPECT_TRUE(l.ok()) << l.status().message();
  return *l;
}

// One client's state under a manual clock, decided the way the memory store does.
class Quota {
 public:
  Quota(Limit limit, ManualClock& clock) : limit_(std::move(limit)), clock_(clock) {}
  Decision Take(int64_t cost = 1) {
    const int64_t now = clock_.NowMicros();
    const core::CompactState s =
        core::ExpiresAt(limit_, state_) > now ? state_ : core::CompactState{};
    core::Evaluation e = core::Evaluate(limit_, s, now, cost);
    if (e.decision.allowed) state_ = e.next;
    return e.decision;
  }
  int64_t ExpiresAt() const { return core::ExpiresAt(limit_, state_); }

 private:
  Limit limit_;
  ManualClock& clock_;
  core::CompactState state_;
};

Calendar::Span SpanOf(CalendarUnit unit, std::string_view zone, int64_t now) {
  StatusOr<std::shared_ptr<const Calendar>> c = Calendar::Get(unit, zone);
  EXPECT_TRUE(c.ok()) << c.status().message();
  return (*c)->Compute(now);
}

TEST(CalendarQuota, MonthlyInBerlinResetsAtLocalMidnightOnTheFirstAcrossMarchDst) {
  // DST starts on 2026-03-29: March is 31 days less an hour long, from
  // 2026-03-01 00:00 CET (Feb 28 23:00 UTC) to 2026-04-01 00:00 CEST (Mar 31 22:00 UTC).
  ManualClock clock(Utc(2026, 3, 10, 12));
  Quota q(MakeQuota(3, CalendarUnit::kMonth, "Europe/Berlin"), clock);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(q.Take().allowed);
  clock.Set(Utc(2026, 3, 31, 21, 59, 59));  // 23:59:59 CEST, still March
  Decision d = q.Take();
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.retry_after, microseconds(kS));
  EXPECT_EQ(d.reset_after, microseconds(kS));
  EXPECT_EQ(q.ExpiresAt(), Utc(2026, 3, 31, 22));
  clock.Set(Utc(2026, 3, 31, 22));  // April 1st, 00:00 CEST
  d = q.Take();
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.remaining, 2);
  EXPECT_EQ(d.reset_after, microseconds(Utc(2026, 4, 30, 22) - Utc(2026, 3, 31, 22)));
  EXPECT_EQ(SpanOf(CalendarUnit::kMonth, "Europe/Berlin", Utc(2026, 3, 29, 12)),
            (Calendar::Span{Utc(2026, 2, 28, 23), Utc(2026, 3, 31, 22)}));
}

TEST(CalendarQuota, MonthlyInBerlinResetsAtLocalMidnightOnTheFirstAcrossOctoberDst) {
  // DST ends on 2026-10-25: October is 31 days and an hour long, until
  // 2026-11-01 00:00 CET (Oct 31 23:00 UTC).
  ManualClock clock(Utc(2026, 10, 1, 8));
  Quota q(MakeQuota(2, CalendarUnit::kMonth, "Europe/Berlin"), clock);
  EXPECT_TRUE(q.Take(2).allowed);
  clock.Set(Utc(2026, 10, 31, 22, 30));  // 23:30 CET on Oct 31: an hour later than in summer
  Decision d = q.Take();
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.retry_after, microseconds(30 * 60 * kS));
  clock.Set(Utc(2026, 10, 31, 23));  // November 1st, 00:00 CET
  EXPECT_TRUE(q.Take().allowed);
  EXPECT_EQ(SpanOf(CalendarUnit::kMonth, "Europe/Berlin", Utc(2026, 10, 26)),
            (Calendar::Span{Utc(2026, 9, 30, 22), Utc(2026, 10, 31, 23)}));
}

TEST(CalendarQuota, DailyInNewYorkIs23HoursWhenDstStartsAnd25WhenItEnds) {
  const Calendar::Span spring = SpanOf(CalendarUnit::kDay, "America/New_York", Utc(2026, 3, 8, 12));
  EXPECT_EQ(spring.start, Utc(2026, 3, 8, 5));  // 00:00 EST
  EXPECT_EQ(spring.end, Utc(2026, 3, 9, 4));    // 00:00 EDT
  EXPECT_EQ(spring.end - spring.start, 23 * kH);
  const Calendar::Span autumn =
      SpanOf(CalendarUnit::kDay, "America/New_York", Utc(2026, 11, 1, 12));
  EXPECT_EQ(autumn.start, Utc(2026, 11, 1, 4));  // 00:00 EDT
  EXPECT_EQ(autumn.end, Utc(2026, 11, 2, 5));    // 00:00 EST
  EXPECT_EQ(autumn.end - autumn.start, 25 * kH);

  // The quota itself: used up just after midnight, it answers for 23 hours.
  ManualClock clock(Utc(2026, 3, 8, 5, 0, 1));
  Quota q(MakeQuota(1, CalendarUnit::kDay, "America/New_York"), clock);
  EXPECT_EQ(q.Take().reset_after, microseconds(23 * kH - kS));
  clock.Set(Utc(2026, 3, 9, 3, 59, 59));
  EXPECT_FALSE(q.Take().allowed);
  clock.Set(Utc(2026, 3, 9, 4));
  EXPECT_TRUE(q.Take().allowed);
}

TEST(CalendarQuota, LeapDayAndLeapYear) {
  // February 2028 has 29 days; the year 2028 has 366.
  EXPECT_EQ(SpanOf(CalendarUnit::kMonth, "UTC", Utc(2028, 2, 29, 23, 59, 59)),
            (Calendar::Span{Utc(2028, 2, 1), Utc(2028, 3, 1)}));
  EXPECT_EQ(SpanOf(CalendarUnit::kDay, "Europe/Berlin", Utc(2028, 2, 29, 12)),
            (Calendar::Span{Utc(2028, 2, 28, 23), Utc(2028, 2, 29, 23)}));
  const Calendar::Span year = SpanOf(CalendarUnit::kYear, "Europe/Berlin", Utc(2028, 2, 29, 12));
  EXPECT_EQ(year.start, Utc(2027, 12, 31, 23));
  EXPECT_EQ(year.end, Utc(2028, 12, 31, 23));
  EXPECT_EQ(year.end - year.start, 366 * 24 * kH);

  // A yearly quota used up on the leap day resets on January 1st, local time.
  ManualClock clock(Utc(2028, 2, 29, 12));
  Quota q(MakeQuota(5, CalendarUnit::kYear, "Europe/Berlin"), clock);
  EXPECT_TRUE(q.Take(5).allowed);
  clock.Set(Utc(2028, 12, 31, 22, 59, 59));  // 23:59:59 on New Year's Eve in Berlin
  Decision d = q.Take();
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.retry_after, microseconds(kS));
  clock.Set(Utc(2028, 12, 31, 23));
  EXPECT_TRUE(q.Take().allowed);
}

TEST(CalendarQuota, YearEndMonthAndWeek) {
  // December ends at local midnight; the week of New Year 2027 starts on
  // Monday 2026-12-28.
  ManualClock clock(Utc(2027, 1, 1, 4, 59, 59));  // 23:59:59 EST on Dec 31
  Quota month(MakeQuota(1, CalendarUnit::kMonth, "America/New_York"), clock);
  EXPECT_EQ(month.Take().reset_after, microseconds(kS));
  EXPECT_FALSE(month.Take().allowed);
  clock.Set(Utc(2027, 1, 1, 5));
  EXPECT_TRUE(month.Take().allowed);
  EXPECT_EQ(SpanOf(CalendarUnit::kWeek, "UTC", Utc(2027, 1, 1, 12)),
            (Calendar::Span{Utc(2026, 12, 28), Utc(2027, 1, 4)}));
  EXPECT_EQ(SpanOf(CalendarUnit::kWeek, "UTC", Utc(2026, 12, 28)),
            (Calendar::Span{Utc(2026, 12, 28), Utc(2027, 1, 4)}));
  EXPECT_EQ(SpanOf(CalendarUnit::kWeek, "UTC", Utc(2026, 12, 27, 23, 59, 59)),
            (Calendar::Span{Utc(2026, 12, 21), Utc(2026, 12, 28)}));
  // A week in Berlin that holds the October DST change: 7 days and an hour.
  const Calendar::Span w = SpanOf(CalendarUnit::kWeek, "Europe/Berlin", Utc(2026, 10, 25, 12));
  EXPECT_EQ(w.start, Utc(2026, 10, 18, 22));
  EXPECT_EQ(w.end, Utc(2026, 10, 25, 23));
}

TEST(CalendarQuota, MidnightInADstGapStartsTheDayAfterTheGap) {
  // Santiago moves its clocks from 00:00 to 01:00 on 2026-09-06 (04:00 UTC).
  EXPECT_EQ(SpanOf(CalendarUnit::kDay, "America/Santiago", Utc(2026, 9, 6, 12)),
            (Calendar::Span{Utc(2026, 9, 6, 4), Utc(2026, 9, 7, 3)}));
  // ... and back from 24:00 to 23:00 on 2026-04-04: that Saturday has 25 hours.
  EXPECT_EQ(SpanOf(CalendarUnit::kDay, "America/Santiago", Utc(2026, 4, 5, 3, 30)),
            (Calendar::Span{Utc(2026, 4, 4, 3), Utc(2026, 4, 5, 4)}));
}

TEST(CalendarQuota, BeyondTheLastTransitionTheFooterRuleApplies) {
  // TZif files list transitions up to 2037; later years follow the POSIX rule.
  EXPECT_EQ(SpanOf(CalendarUnit::kMonth, "Europe/Berlin", Utc(2040, 3, 15)),
            (Calendar::Span{Utc(2040, 2, 29, 23), Utc(2040, 3, 31, 22)}));
  EXPECT_EQ(SpanOf(CalendarUnit::kDay, "America/New_York", Utc(2045, 11, 5, 12)),
            (Calendar::Span{Utc(2045, 11, 5, 4), Utc(2045, 11, 6, 5)}));
}

TEST(CalendarQuota, CachedWindowAgreesWithComputedOneWhereverTheClockJumps) {
  StatusOr<std::shared_ptr<const Calendar>> c =
      Calendar::Get(CalendarUnit::kDay, "America/New_York");
  ASSERT_TRUE(c.ok());
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<int64_t> step(-30 * kH, 30 * kH);
  int64_t t = Utc(2026, 3, 1);
  for (int i = 0; i < 20000; ++i) {
    t += step(rng) / 7;
    ASSERT_EQ((*c)->At(t), (*c)->Compute(t)) << t;
    const Calendar::Span s = (*c)->At(t);
    ASSERT_TRUE(s.start <= t && t < s.end);
    ASSERT_EQ((*c)->Next(s), (*c)->Compute(s.end)) << t;
  }
}

TEST(CalendarQuota, TheSameUnitAndZoneIsOneSharedCalendar) {
  EXPECT_EQ(*Calendar::Get(CalendarUnit::kMonth, "Europe/Berlin"),
            *Calendar::Get(CalendarUnit::kMonth, "Europe/Berlin"));
  EXPECT_EQ(MakeQuota(10, CalendarUnit::kMonth, "Europe/Berlin"),
            MakeQuota(10, CalendarUnit::kMonth, "Europe/Berlin"));
  EXPECT_NE(MakeQuota(10, CalendarUnit::kMonth, "Europe/Berlin"),
            MakeQuota(10, CalendarUnit::kMonth, "Europe/Paris"));
  EXPECT_EQ(*Calendar::Get(CalendarUnit::kDay, ""), *Calendar::Get(CalendarUnit::kDay, "UTC"));
}

TEST(CalendarQuota, SpecRoundTripAndWindowFields) {
  Limit q = MakeQuota(10000, CalendarUnit::kMonth, "Europe/Berlin");
  EXPECT_EQ(*MakeLimit(SpecOf(q)), q);
  EXPECT_EQ(WindowText(q), "1mo");
  EXPECT_EQ(q.ToString(),
            "fixed_window(limit=10000, window=1mo, align=calendar, timezone=Europe/Berlin)");

  LimitSpec spec{.name = "monthly", .algorithm = Algorithm::kFixedWindow, .count = 10};
  ASSERT_TRUE(ApplyWindowFields(spec, "1mo", "calendar", std::nullopt).ok());
  EXPECT_EQ(spec.timezone, "UTC");  // the default
  EXPECT_EQ(MakeLimit(spec)->calendar()->zone().name(), "UTC");

  auto error = [](Algorithm a, std::string_view window, std::optional<std::string_view> align,
                  std::optional<std::string_view> zone) {
    LimitSpec s{.name = "x", .algorithm = a, .count = 10};
    Status st = ApplyWindowFields(s, window, align, zone);
    if (st.ok()) {
      StatusOr<Limit> l = MakeLimit(s);
      st = l.status();
    }
    return std::string(st.message());
  };
  const Algorithm fw = Algorithm::kFixedWindow;
  EXPECT_EQ(error(fw, "1d", std::nullopt, std::nullopt), "");  // epoch-aligned days, as before
  EXPECT_NE(error(fw, "1mo", std::nullopt, std::nullopt).find("needs align: calendar"),
            std::string::npos);
  EXPECT_NE(error(fw, "1w", "epoch", std::nullopt).find("needs align: calendar"),
            std::string::npos);
  EXPECT_NE(error(fw, "2mo", "calendar", std::nullopt).find("1d, 1w, 1mo or 1y"),
            std::string::npos);
  EXPECT_NE(error(fw, "24h", "calendar", std::nullopt).find("1d, 1w, 1mo or 1y"),
            std::string::npos);
  EXPECT_NE(error(Algorithm::kSlidingWindow, "1d", "calendar", std::nullopt)
                .find("align: calendar is for fixed_window only, not sliding_window"),
            std::string::npos);
  EXPECT_NE(error(fw, "60s", std::nullopt, "Europe/Berlin").find("timezone needs align: calendar"),
            std::string::npos);
  EXPECT_NE(error(fw, "1d", "sometimes", std::nullopt).find("align must be"), std::string::npos);
  EXPECT_NE(error(fw, "1d", "calendar", "Europe/Berln").find("unknown time zone 'Europe/Berln'"),
            std::string::npos);
  EXPECT_NE(error(fw, "1d", "calendar", "../../etc/passwd").find("unknown time zone"),
            std::string::npos);
  EXPECT_NE(error(fw, "1d", "calendar", "zone.tab").find("unknown time zone 'zone.tab'"),
            std::string::npos);
  EXPECT_NE(error(fw, "1d", "calendar", "Europe").find("unknown time zone 'Europe'"),
            std::string::npos);  // a directory
  EXPECT_NE(error(fw, "1d", "calendar", "tzdata.zi").find("unknown time zone 'tzdata.zi'"),
            std::string::npos);  // a big text file
}

TEST(TimeZoneRule, ParsesPosixRules) {
  std::optional<TimeZone::Rule> r = TimeZone::ParseRule("CET-1CEST,M3.5.0,M10.5.0/3");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->std_offset, 3600);
  EXPECT_EQ(r->dst_offset, 7200);
  EXPECT_EQ(r->start.month, 3);
  EXPECT_EQ(r->start.week, 5);
  EXPECT_EQ(r->start.time, 7200);
  EXPECT_EQ(r->end.time, 3 * 3600);
  r = TimeZone::ParseRule("<-04>4<-03>,M9.1.6/24,M4.1.6/24");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->std_offset, -4 * 3600);
  EXPECT_EQ(r->start.time, 24 * 3600);
  r = TimeZone::ParseRule("<+0530>-5:30");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->std_offset, 5 * 3600 + 1800);
  EXPECT_FALSE(r->has_dst);
  r = TimeZone::ParseRule("<-02>2<-01>,M3.5.0/-1,M10.5.0/0");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->start.time, -3600);
  EXPECT_FALSE(TimeZone::ParseRule(""));
  EXPECT_FALSE(TimeZone::ParseRule("EST5EDT"));  // DST without rules
  EXPECT_FALSE(TimeZone::ParseRule("CET-1CEST,M13.5.0,M10.5.0"));
}

TEST(TimeZoneReader, AgreesWithTheCLibraryOnEveryZoneItReads) {
  // glibc reads the same TZif files (its own code, footer rules included):
  // every offset we compute over 1970-2060 must match its tm_gmtoff.
  const char* old_tz = std::getenv("TZ");  // NOLINT(concurrency-mt-unsafe): single-threaded test
  const std::string saved = old_tz != nullptr ? old_tz : "";
  for (const char* name : {"Europe/Berlin", "America/New_York", "America/Santiago",
                           "Australia/Lord_Howe", "Asia/Kolkata", "Pacific/Chatham",
                           "America/Sao_Paulo", "Africa/Casablanca", "Europe/Dublin"}) {
    StatusOr<std::shared_ptr<const TimeZone>> z = TimeZone::Find(name);
    ASSERT_TRUE(z.ok()) << z.status().message();
    setenv("TZ", name, 1);  // NOLINT(concurrency-mt-unsafe)
    tzset();
    for (int64_t t = 0; t < Utc(2060, 1, 1) / kS; t += 86'400 * 5 + 3'607) {
      const auto tt = static_cast<time_t>(t);
      std::tm tm{};
      localtime_r(&tt, &tm);
      ASSERT_EQ((*z)->OffsetAt(t), tm.tm_gmtoff) << name << " at " << t;
    }
  }
  if (old_tz != nullptr) {
    setenv("TZ", saved.c_str(), 1);  // NOLINT(concurrency-mt-unsafe)
  } else {
    unsetenv("TZ");  // NOLINT(concurrency-mt-unsafe)
  }
  tzset();
}

// Without tzdata (a slim container image) every zone name fails: the error
// says so, and how to fix it, rather than asking for a name like the one
// given. A directory with tzdata keeps the usual hint for a name it lacks.
TEST(TimeZoneReader, NoTzdataSaysSoAndHowToFixIt) {
  char dir[] = "/tmp/calendar_test_tzdir_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const char* old = std::getenv("TZDIR");  // NOLINT(concurrency-mt-unsafe)
  const std::string saved = old != nullptr ? old : "";
  setenv("TZDIR", dir, 1);  // NOLINT(concurrency-mt-unsafe)
  StatusOr<std::shared_ptr<const TimeZone>> none = TimeZone::Find("Antarctica/Troll");
  if (old != nullptr) {
    setenv("TZDIR", saved.c_str(), 1);  // NOLINT(concurrency-mt-unsafe)
  } else {
    unsetenv("TZDIR");  // NOLINT(concurrency-mt-unsafe)
  }
  rmdir(dir);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().message(), "unknown time zone 'Antarctica/Troll': no tzdata in " +
                                         std::string(dir) +
                                         ": install the tzdata package or set TZDIR");
  StatusOr<std::shared_ptr<const TimeZone>> unknown = TimeZone::Find("Mars/Olympus");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("an IANA time zone name such as Europe/Berlin"),
            std::string::npos)
      << unknown.status().message();
}

}  // namespace
}  // namespace ratelimit
