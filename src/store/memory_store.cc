#include "ratelimit/memory_store.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cassert>
#include <random>
#include <unordered_map>
#include <vector>

#include "core/algorithms.h"
#include "store/hash.h"
#include "store/shard_mutex.h"

namespace ratelimit {
namespace {

using core::CompactState;
using store::Hash64;
using store::Mix;

// One (key, limit) state. fp == 0 marks an empty slot. Aligned to its size so
// that no slot straddles two cache lines: a decision on a key that is not in
// cache costs one miss, not two.
struct alignas(32) Slot {
  uint64_t fp = 0;
  CompactState state;
  int64_t expires = 0;  // from then on the state equals the fresh state
};
static_assert(sizeof(Slot) == 32);

struct LogEntry {
  std::vector<int64_t> log;
  int64_t expires = 0;
};

// An open-addressing table with linear probing and backward-shift deletion.
// Capacity is any size >= 8; the home slot is the high bits of fp * capacity.
class Table {
 public:
  Table() : slots_(8) {}

  size_t size() const { return used_; }
  size_t capacity() const { return slots_.size(); }

  Slot* Find(uint64_t fp) {
    for (size_t i = Home(fp);; i = Next(i)) {
      Slot& s = slots_[i];
      if (s.fp == fp) return &s;
      if (s.fp == 0) return nullptr;
    }
  }

  // REQUIRES: fp not present, and HasRoom().
  Slot* Insert(uint64_t fp) {
    size_t i = Home(fp);
    while (slots_[i].fp != 0) i = Next(i);
    slots_[i].fp = fp;
    ++used_;
    return &slots_[i];
  }

  bool HasRoom() const { return (used_ + 1) * 8 <= slots_.size() * 7; }

  void Erase(Slot* slot) {
    size_t hole = static_cast<size_t>(slot - slots_.data());
    slots_[hole] = Slot{};
    --used_;
    // Shift back later entries of the cluster that may not be reachable any more.
    for (size_t i = Next(hole); slots_[i].fp != 0; i = Next(i)) {
      const size_t home = Home(slots_[i].fp);
      // Move i into the hole unless its home lies cyclically in (hole, i].
      const bool home_between = hole <= i ? (hole < home && home <= i) : (hole < home || home <= i);
      if (!home_between) {
        slots_[hole] = slots_[i];
        slots_[i] = Slot{};
        hole = i;
      }
    }
  }

  // Rebuilds the table with `capacity` slots, dropping entries expired at `now`.
  // Returns how many were dropped.
  size_t Rebuild(size_t capacity, int64_t now) {
    std::vector<Slot> old(std::max<size_t>(capacity, 8));
    old.swap(slots_);
    const size_t before = used_;
    used_ = 0;
    for (const Slot& s : old) {
      if (s.fp != 0 && s.expires > now) *Insert(s.fp) = s;
    }
    return before - used_;
  }

  size_t CountExpired(int64_t now) const {
    size_t n = 0;
    for (const Slot& s : slots_) n += (s.fp != 0 && s.expires <= now) ? 1 : 0;
    return n;
  }

 private:
  size_t Home(uint64_t fp) const {
    return static_cast<size_t>((static_cast<__uint128_t>(fp) * slots_.size()) >> 64);
  }
  size_t Next(size_t i) const { return i + 1 == slots_.size() ? 0 : i + 1; }

  std::vector<Slot> slots_;
  size_t used_ = 0;
};

struct alignas(64) Shard {
  store::ShardMutex mu;
  Table table RL_GUARDED_BY(mu);
  std::unordered_map<uint64_t, LogEntry> logs RL_GUARDED_BY(mu);  // sliding logs
  // Block periods (Limit::block_for): when each ends (us), by fingerprint.
  // Not counted as keys: a block needs a denial, which needs state.
  std::unordered_map<uint64_t, int64_t> blocks RL_GUARDED_BY(mu);
  // Settlements made once (SettleRequest::once): until when each is remembered.
  std::unordered_map<uint64_t, int64_t> settled RL_GUARDED_BY(mu);
};

// A limit with a block period: `d` (the limit's own answer) and `standing`
// (its state as it stands) become a block's answer while one is in force;
// a denial that is not a peek starts one. check.lua's blocking() does the same.
Decision ApplyBlock(Shard& shard, uint64_t fp, const Limit& limit, Decision d,
                    const Decision& standing, int64_t now, bool peek) RL_REQUIRES(shard.mu) {
  auto it = shard.blocks.find(fp);
  int64_t until = it != shard.blocks.end() && it->second > now ? it->second : 0;
  if (until == 0 && !d.allowed && !peek) {
    until = now + limit.block_for().count();
    shard.blocks[fp] = until;
  }
  if (until == 0) return d;
  d.allowed = false;
  d.remaining = 0;
  d.delay = std::chrono::microseconds(0);
  d.retry_after = std::chrono::microseconds(until - now);
  d.reset_after = std::max(standing.reset_after, d.retry_after);
  return d;
}

}  // namespace

namespace {
class ShardLocks;
}  // namespace

struct MemoryStore::Impl {
  explicit Impl(Options o)
      : opts(o),
        clock(o.clock != nullptr ? o.clock : &Clock::System()),
        seed(std::random_device{}() * 0x9E3779B97F4A7C15ULL ^ std::random_device{}()) {
    size_t n = 1;
    while (n < std::max<size_t>(opts.shards, 1)) n <<= 1;
    shard_mask = n - 1;
    shards = std::make_unique<Shard[]>(n);
  }

  Options opts;
  const Clock* clock;
  uint64_t seed;
  size_t shard_mask;
  std::unique_ptr<Shard[]> shards;
  std::atomic<size_t> keys{0};  // live slots + logs, all shards
  std::atomic<int64_t> last_full_sweep{0};

  uint64_t Fingerprint(uint64_t key_hash, const Limit& limit) const {
    uint64_t fp = Mix(key_hash, limit.identity_hash() ^ 0x9E3779B97F4A7C15ULL);
    return fp == 0 ? 1 : fp;
  }
  Shard& ShardFor(uint64_t fp) { return shards[fp & shard_mask]; }

  // Admits `new_keys` more keys, or fails when the store is full even after
  // dropping the expired entries of `shard` (locked by the caller). Other
  // shards are swept by Sweep(), which the daemon calls periodically.
  Status Admit(Shard& shard, size_t new_keys, int64_t now) RL_REQUIRES(shard.mu) {
    if (keys.load(std::memory_order_relaxed) + new_keys <= opts.max_keys) return Status::Ok();
    keys.fetch_sub(shard.table.Rebuild(shard.table.capacity(), now), std::memory_order_relaxed);
    if (keys.load(std::memory_order_relaxed) + new_keys <= opts.max_keys) return Status::Ok();
    return ResourceExhausted("memory store is full (" + std::to_string(opts.max_keys) +
                             " keys); new keys are refused until old ones expire");
  }

  // Makes room in `shard`'s table for one more slot: grows it by half, unless
  // dropping the expired entries frees a quarter of it.
  void EnsureRoom(Shard& shard, int64_t now) RL_REQUIRES(shard.mu) {
    if (shard.table.HasRoom()) return;
    const size_t cap = shard.table.capacity();
    const size_t expired = shard.table.CountExpired(now);
    const size_t next = expired * 4 >= cap ? cap : cap + cap / 2;
    keys.fetch_sub(shard.table.Rebuild(next, now), std::memory_order_relaxed);
  }

  // fn(shard, fp) for the state of `key` and each limit, under its shard's lock.
  // (`fn` states RL_REQUIRES(shard.mu) itself: the analysis cannot follow
  // the call through the template.)
  template <typename Fn>
  void ForEachLocked(std::string_view key, std::span<const Limit* const> limits,
                     Fn fn) RL_NO_THREAD_SAFETY_ANALYSIS {
    const uint64_t key_hash = store::Hash64(key, seed);
    for (const Limit* limit : limits) {
      const uint64_t fp = Fingerprint(key_hash, *limit);
      Shard& shard = ShardFor(fp);
      LockGuard lock(shard.mu);
      fn(shard, fp);
    }
  }

  // The fingerprints of `key` with each item's limit, and their shards locked.
  template <typename Item>
  std::array<uint64_t, kMaxChecksPerRequest> LockAll(std::string_view key,
                                                     std::span<const Item> items,
                                                     ShardLocks& locks);

  // Holds the shards of all of `req`'s limits at once (ShardLocks): a set
  // known at run time, which the analysis cannot follow.
  StatusOr<CheckResult> Run(const CheckRequest& req, bool peek) RL_NO_THREAD_SAFETY_ANALYSIS;
  // The same for a settlement: every limit's state changes under all the locks.
  StatusOr<CheckResult> Settle(const SettleRequest& req) RL_NO_THREAD_SAFETY_ANALYSIS;
};

namespace {

// Locks the distinct shards of a request in address order (no deadlock).
// Not visible to the thread-safety analysis (a run-time set of locks): the
// one user, Impl::Run, opts out of it.
class ShardLocks {
 public:
  void Add(Shard* s) {
    for (size_t i = 0; i < n_; ++i)
      if (shards_[i] == s) return;
    shards_[n_++] = s;
  }
  void LockAll() RL_NO_THREAD_SAFETY_ANALYSIS {
    std::sort(shards_.begin(), shards_.begin() + static_cast<ptrdiff_t>(n_));
    for (size_t i = 0; i < n_; ++i) shards_[i]->mu.lock();
  }
  ~ShardLocks() RL_NO_THREAD_SAFETY_ANALYSIS {
    for (size_t i = 0; i < n_; ++i) shards_[i]->mu.unlock();
  }

 private:
  std::array<Shard*, kMaxChecksPerRequest> shards_{};
  size_t n_ = 0;
};

}  // namespace

template <typename Item>
std::array<uint64_t, kMaxChecksPerRequest> MemoryStore::Impl::LockAll(std::string_view key,
                                                                      std::span<const Item> items,
                                                                      ShardLocks& locks) {
  std::array<uint64_t, kMaxChecksPerRequest> fps{};
  const uint64_t key_hash = Hash64(key, seed);
  for (size_t i = 0; i < items.size(); ++i) {
    fps[i] = Fingerprint(key_hash, *items[i].limit);
    locks.Add(&ShardFor(fps[i]));
  }
  locks.LockAll();
  return fps;
}

StatusOr<CheckResult> MemoryStore::Impl::Run(const CheckRequest& req, bool peek) {
  if (Status s = ValidateRequest(req, opts.max_key_length); !s.ok()) return s;
  const size_t n = req.checks.size();
  ShardLocks locks;
  const std::array<uint64_t, kMaxChecksPerRequest> fps = LockAll(req.key, req.checks, locks);
  const int64_t now = clock->NowMicros();

  CheckResult result;
  result.decisions.resize(n);
  std::array<CompactState, kMaxChecksPerRequest> state, next;
  std::array<const std::vector<int64_t>*, kMaxChecksPerRequest> logs{};
  bool all = true;
  size_t new_keys = 0;
  for (size_t i = 0; i < n; ++i) {
    const Limit& limit = *req.checks[i].limit;
    const int64_t cost = peek ? 0 : req.checks[i].cost;
    Shard& shard = ShardFor(fps[i]);
    if (limit.algorithm() == Algorithm::kSlidingLog) {
      auto it = shard.logs.find(fps[i]);
      static const std::vector<int64_t> kEmpty;
      logs[i] = it == shard.logs.end() ? &kEmpty : &it->second.log;
      result.decisions[i] = core::EvaluateLog(limit, *logs[i], now, cost);
      new_keys += it == shard.logs.end() ? 1 : 0;
    } else {
      Slot* slot = shard.table.Find(fps[i]);
      state[i] = (slot != nullptr && slot->expires > now) ? slot->state : CompactState{};
      core::Evaluation e = core::Evaluate(limit, state[i], now, cost);
      result.decisions[i] = e.decision;
      next[i] = e.next;
      new_keys += slot == nullptr ? 1 : 0;
    }
    if (limit.block_for().count() > 0) {
      const Decision standing = logs[i] != nullptr ? core::StandingLog(limit, *logs[i], now)
                                                   : core::Standing(limit, state[i], now);
      result.decisions[i] =
          ApplyBlock(shard, fps[i], limit, result.decisions[i], standing, now, peek);
    }
    all = all && result.decisions[i].allowed;
  }
  if (!all) {  // nothing is taken: the limits that would allow answer for their state as it stands
    for (size_t i = 0; i < n; ++i) {
      if (!result.decisions[i].allowed) continue;
      const Limit& limit = *req.checks[i].limit;
      result.decisions[i] = logs[i] != nullptr ? core::StandingLog(limit, *logs[i], now)
                                               : core::Standing(limit, state[i], now);
    }
  }
  result.overall = Combine(result.decisions);
  if (peek || !all) return result;

  // Commit every limit, or none: admit the new keys first.
  if (new_keys > 0) {
    if (Status s = Admit(ShardFor(fps[0]), new_keys, now); !s.ok()) return s;
  }
  for (size_t i = 0; i < n; ++i) {
    const Limit& limit = *req.checks[i].limit;
    Shard& shard = ShardFor(fps[i]);
    if (limit.algorithm() == Algorithm::kSlidingLog) {
      auto [it, inserted] = shard.logs.try_emplace(fps[i]);
      if (inserted) keys.fetch_add(1, std::memory_order_relaxed);
      core::ApplyLog(limit, it->second.log, now, req.checks[i].cost);
      it->second.expires =
          it->second.log.empty() ? now : it->second.log.back() + limit.window_micros();
      continue;
    }
    Slot* slot = shard.table.Find(fps[i]);
    if (slot == nullptr) {
      EnsureRoom(shard, now);
      slot = shard.table.Insert(fps[i]);
      keys.fetch_add(1, std::memory_order_relaxed);
    }
    slot->state = next[i];
    slot->expires = core::ExpiresAt(limit, next[i]);
  }
  return result;
}

StatusOr<CheckResult> MemoryStore::Impl::Settle(const SettleRequest& req) {
  if (Status s = ValidateSettle(req, opts.max_key_length); !s.ok()) return s;
  ShardLocks locks;
  const std::array<uint64_t, kMaxChecksPerRequest> fps = LockAll(req.key, req.settlements, locks);
  const int64_t now = clock->NowMicros();
  const size_t n = req.settlements.size();
  std::array<Slot*, kMaxChecksPerRequest> slots{};
  std::array<CompactState, kMaxChecksPerRequest> next;
  size_t new_keys = 0;
  for (size_t i = 0; i < n; ++i) {
    slots[i] = ShardFor(fps[i]).table.Find(fps[i]);
    const CompactState state =
        (slots[i] != nullptr && slots[i]->expires > now) ? slots[i]->state : CompactState{};
    next[i] = core::SettleState(*req.settlements[i].limit, state, now, req.settlements[i].delta);
    const bool fresh = core::ExpiresAt(*req.settlements[i].limit, next[i]) <= now;
    new_keys += (slots[i] == nullptr && !fresh) ? 1 : 0;
  }
  if (new_keys > 0) {
    if (Status s = Admit(ShardFor(fps[0]), new_keys, now); !s.ok()) return s;
  }
  if (!req.once.empty()) {  // remembered in the first limit's shard, locked above
    Shard& first = ShardFor(fps[0]);
    const uint64_t once_fp = Mix(Hash64(req.once, seed), fps[0]);
    auto [it, inserted] = first.settled.try_emplace(once_fp, now + req.once_ttl.count());
    if (!inserted && it->second > now) return CheckResult{.already_settled = true};
    it->second = now + req.once_ttl.count();
  }
  CheckResult result;
  result.decisions.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const Limit& limit = *req.settlements[i].limit;
    Shard& shard = ShardFor(fps[i]);
    const int64_t expires = core::ExpiresAt(limit, next[i]);
    Slot* slot = shard.table.Find(fps[i]);  // an Erase or a growth above may have moved it
    if (expires <= now) {                   // the fresh state: nothing to keep
      if (slot != nullptr) {
        shard.table.Erase(slot);
        keys.fetch_sub(1, std::memory_order_relaxed);
      }
    } else {
      if (slot == nullptr) {
        EnsureRoom(shard, now);
        slot = shard.table.Insert(fps[i]);
        keys.fetch_add(1, std::memory_order_relaxed);
      }
      slot->state = next[i];
      slot->expires = expires;
    }
    result.decisions[i] = core::Probe(limit, next[i], now);
  }
  result.overall = Combine(result.decisions);
  return result;
}

MemoryStore::MemoryStore() : MemoryStore(Options{}) {}
MemoryStore::MemoryStore(Options options) : impl_(std::make_unique<Impl>(options)) {}
MemoryStore::~MemoryStore() = default;

StatusOr<CheckResult> MemoryStore::Decide(const CheckRequest& request) {
  return impl_->Run(request, /*peek=*/false);
}

void MemoryStore::Check(const CheckRequest& request, CheckCallback done) {
  done(impl_->Run(request, /*peek=*/false));
}

void MemoryStore::Peek(const CheckRequest& request, CheckCallback done) {
  done(impl_->Run(request, /*peek=*/true));
}

void MemoryStore::Settle(const SettleRequest& request, CheckCallback done) {
  done(impl_->Settle(request));
}

StatusOr<Decision> MemoryStore::DecideOne(std::string_view key, const Limit& limit, int64_t cost) {
  Impl& m = *impl_;
  if (key.empty() || key.size() > m.opts.max_key_length) {
    LimitCheck c{&limit, cost};
    return ValidateRequest({key, {&c, 1}}, m.opts.max_key_length);
  }
  if (cost < 0 || cost > limit.limit()) return limit.ValidateCost(cost);
  if (limit.algorithm() == Algorithm::kSlidingLog || limit.block_for().count() > 0) {
    LimitCheck c{&limit, cost};
    StatusOr<CheckResult> r = m.Run({key, {&c, 1}}, false);
    if (!r.ok()) return r.status();
    return r->overall;
  }
  const uint64_t fp = m.Fingerprint(Hash64(key, m.seed), limit);
  Shard& shard = m.ShardFor(fp);
  LockGuard lock(shard.mu);
  const int64_t now = m.clock->NowMicros();
  Slot* slot = shard.table.Find(fp);
  const CompactState state =
      (slot != nullptr && slot->expires > now) ? slot->state : CompactState{};
  core::Evaluation e = core::Evaluate(limit, state, now, cost);
  if (!e.decision.allowed) return e.decision;
  if (slot == nullptr) {
    if (Status s = m.Admit(shard, 1, now); !s.ok()) return s;
    m.EnsureRoom(shard, now);
    slot = shard.table.Insert(fp);
    m.keys.fetch_add(1, std::memory_order_relaxed);
  }
  slot->state = e.next;
  slot->expires = core::ExpiresAt(limit, e.next);
  return e.decision;
}

void MemoryStore::Reset(std::string_view key, std::span<const Limit* const> limits,
                        ResetCallback done) {
  Impl& m = *impl_;
  m.ForEachLocked(key, limits, [&m](Shard& shard, uint64_t fp) RL_REQUIRES(shard.mu) {
    if (Slot* slot = shard.table.Find(fp); slot != nullptr) {
      shard.table.Erase(slot);
      m.keys.fetch_sub(1, std::memory_order_relaxed);
    }
    if (shard.logs.erase(fp) > 0) m.keys.fetch_sub(1, std::memory_order_relaxed);
    shard.blocks.erase(fp);
  });
  done(Status::Ok());
}

void MemoryStore::Blocks(std::string_view key, std::span<const Limit* const> limits,
                         BlocksCallback done) {
  Impl& m = *impl_;
  std::vector<std::chrono::microseconds> out;
  m.ForEachLocked(key, limits, [&](Shard& shard, uint64_t fp) RL_REQUIRES(shard.mu) {
    const auto it = shard.blocks.find(fp);
    const int64_t now = m.clock->NowMicros();
    out.emplace_back(it != shard.blocks.end() ? std::max<int64_t>(0, it->second - now) : 0);
  });
  done(std::move(out));
}

void MemoryStore::Unblock(std::string_view key, std::span<const Limit* const> limits,
                          ResetCallback done) {
  impl_->ForEachLocked(
      key, limits, [](Shard& shard, uint64_t fp) RL_REQUIRES(shard.mu) { shard.blocks.erase(fp); });
  done(Status::Ok());
}

size_t MemoryStore::Sweep() {
  Impl& m = *impl_;
  const int64_t now = m.clock->NowMicros();
  size_t dropped = 0;
  for (size_t i = 0; i <= m.shard_mask; ++i) {
    Shard& shard = m.shards[i];
    LockGuard lock(shard.mu);
    size_t cap = shard.table.capacity();
    const size_t live = shard.table.size() - shard.table.CountExpired(now);
    // Shrink tables that are mostly empty after a flood went away.
    while (cap > 8 && live * 4 < cap) cap /= 2;
    size_t n = shard.table.Rebuild(cap, now);
    std::erase_if(shard.blocks, [now](const auto& b) { return b.second <= now; });
    std::erase_if(shard.settled, [now](const auto& b) { return b.second <= now; });
    for (auto it = shard.logs.begin(); it != shard.logs.end();) {
      if (it->second.expires <= now) {
        it = shard.logs.erase(it);
        ++n;
      } else {
        ++it;
      }
    }
    m.keys.fetch_sub(n, std::memory_order_relaxed);
    dropped += n;
  }
  return dropped;
}

size_t MemoryStore::size() const { return impl_->keys.load(std::memory_order_relaxed); }

size_t MemoryStore::MemoryUsage() const {
  Impl& m = *impl_;
  size_t bytes = sizeof(Shard) * (m.shard_mask + 1);
  for (size_t i = 0; i <= m.shard_mask; ++i) {
    Shard& shard = m.shards[i];
    LockGuard lock(shard.mu);
    bytes += shard.table.capacity() * sizeof(Slot);
    for (const auto& [fp, e] : shard.logs) bytes += 64 + e.log.capacity() * sizeof(int64_t);
  }
  return bytes;
}

}  // namespace ratelimit
