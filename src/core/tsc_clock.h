// TscClock: a kernel clock's time read from a fast tick counter (the TSC on
// x86-64) and kept on that clock, the reference, by re-anchoring:
// CLOCK_REALTIME for Clock::System() (Unix time), CLOCK_MONOTONIC for
// core::SteadyClock (steady_clock's time; src/core/clock.cc).
//
// Why: a decision in the memory store costs tens of nanoseconds, and
// clock_gettime(CLOCK_REALTIME) cost 34 ns of it on the benchmark VM (vDSO,
// rdtscp and the kernel's conversion); CLOCK_REALTIME_COARSE is cheap but
// moves in 4 ms ticks there, which would make a 1000/s limit with a burst of
// one admit 250/s. A plain rdtsc plus a multiply is a third of the cost.
//
// How: now = anchor_ns + (ticks - anchor_ticks) * mult / 2^32. Every `period`
// a reader that finds the anchor old re-anchors (one at a time, the others
// keep extrapolating): it reads the reference, estimates
// the tick rate over the last period, and publishes a new anchor through a
// seqlock, so readers take no lock and write nothing shared.
//  - Behind the reference: step forward to it.
//  - Ahead of it by at most `max_slew_back`: hold the line (the new anchor is
//    the old extrapolation, never less) and run slower, at most 50%, until
//    the reference catches up: readings never go back.
//  - Ahead by more (the system clock was set back: CLOCK_REALTIME only):
//    follow it, as the reference does; holding still for longer would stop
//    every refill.
// A counter behind the anchor by more than a little (reset by a resume from
// suspend, or a CPU whose counter lags the anchoring one's) re-anchors at
// once too: it would otherwise read the anchor's time until it passed the
// anchor again, as long as the uptime before. A reader that finds the anchor
// old while another thread re-anchors reads at most a period past it.
// Readings never decrease within a thread, but for such a step (a
// per-thread floor covers the sub-nanosecond overlap of two anchors' lines); between re-anchors
// they stay within the rate's error (a few ppm of `period`) of the reference.
//
// Sources is a type with `uint64_t Ticks()` and `int64_t ReferenceNanos()`;
// tests inject fakes and drive both by hand.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>

namespace ratelimit::core {

template <typename Sources>
class TscClock {
 public:
  struct Options {
    int64_t period_ns = 10'000'000;         // re-anchor this often
    int64_t max_slew_back_ns = 50'000'000;  // ahead by more: step back
  };

  // `ticks_per_second`: the counter's rate as first measured (refined at
  // each re-anchor).
  TscClock(Sources sources, double ticks_per_second, Options options)
      : src_(sources), opts_(options) {
    const double mult = 1e9 / ticks_per_second * 4294967296.0;
    rate_ = static_cast<uint64_t>(mult);
    period_ticks_ =
        static_cast<uint64_t>(static_cast<double>(opts_.period_ns) * ticks_per_second / 1e9);
    behind_tolerance_ = period_ticks_ / 1000;
    const uint64_t t = src_.Ticks();
    const int64_t rt = src_.ReferenceNanos();
    ref_ticks_ = t;
    ref_ns_ = rt;
    Publish(t, rt, rate_);
  }

  int64_t NowNanos() {
    for (;;) {
      const uint32_t s1 = seq_.load(std::memory_order_acquire);
      const uint64_t a_ticks = anchor_ticks_.load(std::memory_order_relaxed);
      const int64_t a_ns = anchor_ns_.load(std::memory_order_relaxed);
      const uint64_t mult = mult_.load(std::memory_order_relaxed);
      std::atomic_thread_fence(std::memory_order_acquire);
      if ((s1 & 1) != 0 || seq_.load(std::memory_order_relaxed) != s1) continue;
      const uint64_t t = src_.Ticks();
      uint64_t d = t - a_ticks;  // ticks behind the anchor wrap to above any period
      if (d > period_ticks_) [[unlikely]] {
        // A period old, or behind the anchor: a counter that lags the
        // anchoring CPU's by a little reads as the anchor itself; by more (a
        // counter reset by a resume from suspend, or a CPU far out of step)
        // re-anchors, as an old anchor does, rather than read the anchor's
        // time until the counter passes it again. While another thread
        // re-anchors, at most a period on: a counter that jumped ahead of
        // the reference must not give a time far ahead once and go back
        // after.
        const bool behind = t < a_ticks;
        if (behind && a_ticks - t <= behind_tolerance_) {
          d = 0;
        } else if (Reanchor()) {
          continue;
        } else {
          d = behind ? 0 : period_ticks_;
        }
      }
      int64_t ns = a_ns + Scale(d, mult);
      // Within a thread, never below the last reading of this clock, but
      // for a deliberate step back (more than a microsecond).
      thread_local uint64_t owner = 0;
      thread_local int64_t last = 0;
      if (owner == id_ && ns < last && last - ns <= 1000) ns = last;
      owner = id_;
      last = ns;
      return ns;
    }
  }

 private:
  static int64_t Scale(uint64_t ticks, uint64_t mult) {
    return static_cast<int64_t>((static_cast<unsigned __int128>(ticks) * mult) >> 32);
  }

  void Publish(uint64_t ticks, int64_t ns, uint64_t mult) {
    const uint32_t s = seq_.load(std::memory_order_relaxed);
    seq_.store(s + 1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    anchor_ticks_.store(ticks, std::memory_order_relaxed);
    anchor_ns_.store(ns, std::memory_order_relaxed);
    mult_.store(mult, std::memory_order_relaxed);
    seq_.store(s + 2, std::memory_order_release);
  }

  // Returns false when another thread is re-anchoring (the caller goes on
  // with the anchor it has).
  bool Reanchor() {
    bool expected = false;
    if (busy_.load(std::memory_order_relaxed) ||
        !busy_.compare_exchange_strong(expected, true, std::memory_order_acquire)) {
      return false;
    }
    // The reference between two counter reads: a pair the OS split (a
    // preemption between the reads) does not measure the rate.
    const uint64_t ta = src_.Ticks();
    const int64_t rt = src_.ReferenceNanos();
    const uint64_t tb = src_.Ticks();
    const uint64_t t = ta + (tb - ta) / 2;
    const bool tight = tb - ta <= period_ticks_ / 1000;
    const uint64_t a_ticks = anchor_ticks_.load(std::memory_order_relaxed);
    const int64_t a_ns = anchor_ns_.load(std::memory_order_relaxed);
    const uint64_t mult = mult_.load(std::memory_order_relaxed);
    const int64_t predicted = a_ns + Scale(t > a_ticks ? t - a_ticks : 0, mult);
    const int64_t err = rt - predicted;  // > 0: this clock is behind
    // The rate over the last period, unless the reference jumped in it (more
    // than 2% off the last rate: a step, not the counter), averaged.
    const uint64_t dt = t - ref_ticks_;
    const int64_t dns = rt - ref_ns_;
    if (tight && t > ref_ticks_ && dns > 0) {  // not across a counter that went back
      const uint64_t measured =
          static_cast<uint64_t>((static_cast<unsigned __int128>(dns) << 32) / dt);
      if (measured > rate_ - rate_ / 50 && measured < rate_ + rate_ / 50) {
        rate_ = rate_ - rate_ / 4 + measured / 4;
      }
    }
    ref_ticks_ = t;
    ref_ns_ = rt;
    if (err >= 0 || -err > opts_.max_slew_back_ns) {
      Publish(t, rt, rate_);  // step to the reference
    } else {
      // Ahead: keep the line and run slower so that the reference catches
      // up within a period, at most at half speed.
      const int64_t ahead = -err;
      const uint64_t slow =
          ahead >= opts_.period_ns / 2
              ? rate_ / 2
              : rate_ - static_cast<uint64_t>(
                            (static_cast<unsigned __int128>(rate_) * static_cast<uint64_t>(ahead)) /
                            static_cast<uint64_t>(opts_.period_ns));
      Publish(t, predicted, slow);
    }
    busy_.store(false, std::memory_order_release);
    return true;
  }

  static uint64_t NextId() {
    static std::atomic<uint64_t> next{1};
    return next.fetch_add(1, std::memory_order_relaxed);
  }

  const uint64_t id_ = NextId();
  Sources src_;
  const Options opts_;
  uint64_t period_ticks_ = 0;
  // How far behind the anchor a counter may read as the anchor itself
  // (a thousandth of the period: 10 us by default), for CPUs whose counters
  // differ by a little.
  uint64_t behind_tolerance_ = 0;
  // The seqlock-protected anchor, read by every NowNanos.
  std::atomic<uint32_t> seq_{0};
  std::atomic<uint64_t> anchor_ticks_{0};
  std::atomic<int64_t> anchor_ns_{0};
  std::atomic<uint64_t> mult_{0};
  // The re-anchorer's own (under busy_).
  std::atomic<bool> busy_{false};
  uint64_t rate_ = 0;  // ns per tick, 32.32 fixed point
  uint64_t ref_ticks_ = 0;
  int64_t ref_ns_ = 0;
};

}  // namespace ratelimit::core
