#include "ratelimit/memory_store.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cassert>
#include <random>
#include <thread>
#include <unordered_map>
#include <vector>

#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core/algorithms.h"
#include "store/hash.h"
#include "store/shard_mutex.h"

namespace ratelimit {
namespace {

using core::CompactState;
using store::Hash64;
using store::Mix;

// ---- Readers without the lock, and when an old table may be freed.
//
// The common update (DecideOne on a bucket or a window without a block
// period) takes no lock: it finds its slot and changes the slot's state with
// one 16-byte compare-and-swap (8-byte for a bucket: DecideOnSlot). Whatever
// moves slots (a table rebuilt to grow or to drop expired keys) runs under
// the shard lock, and frees the old table only when no lock-free reader can
// still be in it (in batches: Garbage). A reader announces itself in its
// thread's record with plain stores; the rebuilder makes those stores
// visible with membarrier(2) (a barrier on every CPU running this process,
// paid by the rare writer, not by the reader), then waits for the readers it
// sees inside. Without membarrier (an old kernel, a sandbox; TSan, which does
// not model it) the reader pays a full fence instead.

// RL_STORE_TSAN: built with ThreadSanitizer (GCC names it __SANITIZE_THREAD__,
// Clang __has_feature(thread_sanitizer)), which models neither membarrier
// nor an inline cmpxchg16b.
#if defined(__SANITIZE_THREAD__)
#define RL_STORE_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define RL_STORE_TSAN 1
#endif
#endif

struct alignas(64) ReaderRecord {
  std::atomic<uint64_t> count{0};  // odd: inside a lock-free section
  std::atomic<bool> in_use{true};
  ReaderRecord* next = nullptr;
};
std::atomic<ReaderRecord*> g_records{nullptr};

bool Asymmetric() {
#if defined(RL_STORE_TSAN)
  return false;
#else
  static const bool ok =
      syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0;
  return ok;
#endif
}

// This thread's record: a free one (its thread ended) or a new one. Records
// are never freed: one per thread that ever decided, 64 bytes each.
struct RecordHolder {
  ReaderRecord* r = nullptr;
  RecordHolder() {
    for (ReaderRecord* p = g_records.load(std::memory_order_acquire); p != nullptr; p = p->next) {
      bool expected = false;
      if (!p->in_use.load(std::memory_order_relaxed) &&
          p->in_use.compare_exchange_strong(expected, true, std::memory_order_acquire)) {
        r = p;
        return;
      }
    }
    r = new ReaderRecord();
    r->next = g_records.load(std::memory_order_relaxed);
    while (!g_records.compare_exchange_weak(r->next, r, std::memory_order_release)) {
    }
  }
  ~RecordHolder() { r->in_use.store(false, std::memory_order_release); }
};

class ReadSection {
 public:
  ReadSection() : r_(Mine()), c_(r_.count.load(std::memory_order_relaxed)) {
    r_.count.store(c_ + 1, std::memory_order_relaxed);
    if (kAsym) {
      std::atomic_signal_fence(std::memory_order_seq_cst);
    } else {
      std::atomic_thread_fence(std::memory_order_seq_cst);
    }
  }
  ~ReadSection() { r_.count.store(c_ + 2, std::memory_order_release); }
  ReadSection(const ReadSection&) = delete;
  ReadSection& operator=(const ReadSection&) = delete;

  static inline const bool kAsym = Asymmetric();

 private:
  static ReaderRecord& Mine() {
    thread_local RecordHolder h;
    return *h.r;
  }
  ReaderRecord& r_;
  uint64_t c_;
};

// Returns when every lock-free section that may have seen what was unpublished
// before the call has ended.
void Synchronize() {
  if (ReadSection::kAsym) {
    syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0);
  } else {
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }
  for (ReaderRecord* p = g_records.load(std::memory_order_acquire); p != nullptr; p = p->next) {
    const uint64_t c = p->count.load(std::memory_order_acquire);
    if ((c & 1) == 0) continue;
    while (p->count.load(std::memory_order_acquire) == c) std::this_thread::yield();
  }
}

// ---- Slots.
//
// One (key, limit) state: a 64-bit fingerprint and 16 bytes changed by one
// compare-and-swap: the expiry time (from then on the state equals the fresh
// state) and the two counters of CompactState. CompactState's `t` follows
// from the expiry and the limit (Pack/Unpack). Aligned to its size, so that a
// decision on a key that is not in cache costs one miss, not two.
constexpr uint64_t kEmpty = 0;
constexpr uint64_t kTombstone = ~uint64_t{0};  // erased: probes go on past it
constexpr uint64_t kFrozen = ~uint64_t{0};     // as w0: being moved or changed under the lock

struct Words {
  uint64_t w0 = 0;  // expires (us)
  uint64_t w1 = 0;  // n0 | n1 << 32
};

struct alignas(32) Slot {
  alignas(16) uint64_t w[2] = {0, 0};
  std::atomic<uint64_t> fp{kEmpty};
};
static_assert(sizeof(Slot) == 32);

using Word128 = unsigned __int128 __attribute__((may_alias));

// A snapshot that may be torn (two 8-byte loads): a compare-and-swap from it
// succeeds only when it was the state indeed.
Words Load(const Slot& s) {
  return {__atomic_load_n(&s.w[0], __ATOMIC_RELAXED), __atomic_load_n(&s.w[1], __ATOMIC_RELAXED)};
}

#if defined(__x86_64__) && !defined(RL_STORE_TSAN)
// A bucket's decision changes the slot's first word alone with an 8-byte
// compare-and-swap (DecideOnSlot), which is atomic against the 16-byte one
// only where that one is a hardware instruction on the same line: here. Under
// TSan the 16-byte one is emulated behind a lock the 8-byte one does not take
// (so an admission could be lost inside a Freeze), and elsewhere it may be
// libatomic's lock: there a bucket takes the 16-byte path too.
constexpr bool kWordCas = true;
// cmpxchg16b inline (a __sync builtin needs -mcx16, and a function built with
// target("cx16") is not inlined into its callers). On failure the current
// value lands in `expected`.
inline bool Cas(Slot& s, Words& expected, Words desired) {
  bool ok;
  asm volatile("lock cmpxchg16b %1"
               : "=@ccz"(ok), "+m"(*reinterpret_cast<Word128*>(s.w)), "+a"(expected.w0),
                 "+d"(expected.w1)
               : "b"(desired.w0), "c"(desired.w1)
               : "memory");
  return ok;
}
#else
constexpr bool kWordCas = false;
#if defined(__x86_64__)
__attribute__((target("cx16")))
#endif
bool Cas(Slot& s, Words& expected, Words desired) {
  const unsigned __int128 e = (static_cast<unsigned __int128>(expected.w1) << 64) | expected.w0;
  const unsigned __int128 d = (static_cast<unsigned __int128>(desired.w1) << 64) | desired.w0;
  const unsigned __int128 old = __sync_val_compare_and_swap(reinterpret_cast<Word128*>(s.w), e, d);
  if (old == e) return true;
  expected = {static_cast<uint64_t>(old), static_cast<uint64_t>(old >> 64)};
  return false;
}
#endif

// Under the lock: takes the slot's state out of reach of the lock-free path
// (which then waits for the lock) and returns it.
Words Freeze(Slot& s) {
  Words cur = Load(s);
  while (!Cas(s, cur, {kFrozen, 0})) {
  }
  return cur;
}
void Unfreeze(Slot& s, Words next) {
  Words frozen{kFrozen, 0};
  const bool ok = Cas(s, frozen, next);
  assert(ok);
  (void)ok;
}

Words Pack(const Limit& limit, CompactState st) {
  return {static_cast<uint64_t>(core::ExpiresAt(limit, st)),
          static_cast<uint32_t>(st.n0) | (uint64_t{static_cast<uint32_t>(st.n1)} << 32)};
}
CompactState Unpack(const Limit& limit, Words w) {
  CompactState st{.n0 = static_cast<int32_t>(static_cast<uint32_t>(w.w1)),
                  .n1 = static_cast<int32_t>(static_cast<uint32_t>(w.w1 >> 32))};
  const int64_t expires = static_cast<int64_t>(w.w0);
  switch (limit.algorithm()) {
    case Algorithm::kTokenBucket:
    case Algorithm::kLeakyBucket: st.t = expires; break;
    case Algorithm::kFixedWindow:
      st.t = limit.calendar() != nullptr ? expires - int64_t{st.n0} * 1'000'000
                                         : expires / limit.window_micros() - 1;
      break;
    case Algorithm::kSlidingWindow: st.t = expires / limit.window_micros() - 2; break;
    case Algorithm::kSlidingLog: break;
  }
  return st;
}
// The state as a decision at `now` meets it.
CompactState StateAt(const Limit& limit, Words w, int64_t now) {
  return static_cast<int64_t>(w.w0) > now ? Unpack(limit, w) : CompactState{};
}

// One decision on a slot: load, evaluate, compare-and-swap, again if another
// thread changed the state in between. False when the slot is frozen (the
// caller takes the lock). A denial is confirmed by a compare-and-swap of the
// state with itself: it was decided on a snapshot that may be torn.
__attribute__((always_inline)) inline bool DecideOnSlot(Slot& slot, const Limit& limit, int64_t now,
                                                        int64_t cost, Decision& out) {
  if (kWordCas && limit.is_gcra()) {
    // A bucket's state is its first word alone (the counters stay 0: Pack of
    // a GCRA state), so one 8-byte load is a snapshot that cannot be torn: a
    // denial needs no compare-and-swap, and an admission an 8-byte one.
    uint64_t w0 = __atomic_load_n(&slot.w[0], __ATOMIC_RELAXED);
    for (;;) {
      if (w0 == kFrozen) return false;
      const core::Evaluation e = core::Evaluate(limit, StateAt(limit, {w0, 0}, now), now, cost);
      if (!e.decision.allowed ||
          __atomic_compare_exchange_n(&slot.w[0], &w0, Pack(limit, e.next).w0, false,
                                      __ATOMIC_SEQ_CST, __ATOMIC_RELAXED)) {
        out = e.decision;
        return true;
      }
    }
  }
  Words cur = Load(slot);
  for (;;) {
    if (cur.w0 == kFrozen) return false;
    const core::Evaluation e = core::Evaluate(limit, StateAt(limit, cur, now), now, cost);
    const Words next = e.decision.allowed ? Pack(limit, e.next) : cur;
    if (Cas(slot, cur, next)) {
      out = e.decision;
      return true;
    }
  }
}

struct LogEntry {
  std::vector<int64_t> log;
  int64_t expires = 0;
};

// A table's slots. Replaced whole (never resized in place) and freed after
// Synchronize().
struct Array {
  explicit Array(size_t n) : cap(n), slots(new Slot[n]) {}
  size_t cap;
  std::unique_ptr<Slot[]> slots;

  size_t Home(uint64_t fp) const {
    return static_cast<size_t>((static_cast<__uint128_t>(fp) * cap) >> 64);
  }
  size_t Next(size_t i) const { return i + 1 == cap ? 0 : i + 1; }
  // Lock-free or locked: the slot holding fp, or nullptr.
  Slot* Find(uint64_t fp) const { return FindFrom(Home(fp), fp); }
  // The same from fp's home slot `home` (Home(fp)), computed by the caller.
  Slot* FindFrom(size_t home, uint64_t fp) const {
    for (size_t i = home;; i = Next(i)) {
      const uint64_t f = slots[i].fp.load(std::memory_order_acquire);
      if (f == fp) return &slots[i];
      if (f == kEmpty) return nullptr;
    }
  }
};

// A shard's tables replaced by rebuilds, freed in batches: one Synchronize()
// (a membarrier system call) per 64 KiB retired, not per rebuild (a churning
// shard of 8 slots rebuilds every few inserts), and at every sweep. One per
// shard: two threads rebuilding different shards do not meet here.
class Garbage {
 public:
  ~Garbage() { Free(); }
  void Retire(Array* a) {
    LockGuard lock(mu_);
    bytes_ += a->cap * sizeof(Slot);
    arrays_.emplace_back(a);
    if (bytes_ >= kBatchBytes) {
      Synchronize();
      Free();
    }
  }
  void Collect() {
    LockGuard lock(mu_);
    if (arrays_.empty()) return;
    Synchronize();
    Free();
  }

 private:
  static constexpr size_t kBatchBytes = size_t{64} << 10;
  void Free() RL_NO_THREAD_SAFETY_ANALYSIS {
    arrays_.clear();
    bytes_ = 0;
  }
  store::ShardMutex mu_;
  std::vector<std::unique_ptr<Array>> arrays_ RL_GUARDED_BY(mu_);
  size_t bytes_ RL_GUARDED_BY(mu_) = 0;
};

// An open-addressing table with linear probing. Erased slots become
// tombstones, reclaimed when the table is rebuilt: a slot never holds another
// key while a lock-free decision may hold it. Capacity is any size >= 8; the
// home slot is the high bits of fp * capacity. All but Find under the lock.
class Table {
 public:
  explicit Table(std::atomic<Array*>* published) : published_(published) {
    published_->store(new Array(8), std::memory_order_release);
  }
  ~Table() { delete Current(); }
  Table(const Table&) = delete;
  Table& operator=(const Table&) = delete;

  void set_garbage(Garbage* g) { garbage_ = g; }
  size_t size() const { return used_; }
  size_t capacity() const { return Current()->cap; }

  Slot* Find(uint64_t fp) const { return Current()->Find(fp); }

  // REQUIRES: fp not present, and HasRoom(). The state is in place before
  // the fingerprint is published.
  Slot* Insert(uint64_t fp, Words w) {
    Array& a = *Current();
    size_t i = a.Home(fp);
    while (a.slots[i].fp.load(std::memory_order_relaxed) != kEmpty) i = a.Next(i);
    Slot& s = a.slots[i];
    __atomic_store_n(&s.w[0], w.w0, __ATOMIC_RELAXED);
    __atomic_store_n(&s.w[1], w.w1, __ATOMIC_RELAXED);
    s.fp.store(fp, std::memory_order_release);
    ++used_;
    return &s;
  }

  bool HasRoom() const { return (used_ + 1) * 8 <= Current()->cap * 7; }

  // REQUIRES: the slot frozen (Freeze) by the caller.
  static void Erase(Slot& slot) { slot.fp.store(kTombstone, std::memory_order_release); }

  // Rebuilds the table with `capacity` slots, dropping entries expired at `now`
  // and tombstones. Returns how many live entries were dropped.
  size_t Rebuild(size_t capacity, int64_t now) {
    Array* old = Current();
    auto* next = new Array(std::max<size_t>(capacity, 8));
    size_t dropped = 0;
    used_ = 0;
    for (size_t i = 0; i < old->cap; ++i) {
      Slot& s = old->slots[i];
      const uint64_t fp = s.fp.load(std::memory_order_relaxed);
      if (fp == kEmpty || fp == kTombstone) continue;
      const Words w = Freeze(s);  // a lock-free decision on it now waits for the lock
      if (static_cast<int64_t>(w.w0) > now) {
        size_t j = next->Home(fp);
        while (next->slots[j].fp.load(std::memory_order_relaxed) != kEmpty) j = next->Next(j);
        next->slots[j].w[0] = w.w0;  // not yet published: no one else sees it
        next->slots[j].w[1] = w.w1;
        next->slots[j].fp.store(fp, std::memory_order_relaxed);
        ++used_;
      } else {
        ++dropped;
      }
    }
    published_->store(next, std::memory_order_release);
    garbage_->Retire(old);  // freed when no lock-free decision can be in it
    return dropped;
  }

  // Entries expired at `now`, and tombstones: what a rebuild would reclaim.
  size_t CountReclaimable(int64_t now) const {
    const Array& a = *Current();
    size_t n = 0;
    for (size_t i = 0; i < a.cap; ++i) {
      const uint64_t fp = a.slots[i].fp.load(std::memory_order_relaxed);
      if (fp == kTombstone) {
        ++n;
      } else if (fp != kEmpty) {
        n += static_cast<int64_t>(__atomic_load_n(&a.slots[i].w[0], __ATOMIC_RELAXED)) <= now;
      }
    }
    return n;
  }

 private:
  Array* Current() const { return published_->load(std::memory_order_relaxed); }

  std::atomic<Array*>* published_;
  Garbage* garbage_ = nullptr;  // its shard's (set_garbage)
  size_t used_ = 0;             // slots that are not empty: live, expired, tombstones
};

struct alignas(64) Shard {
  store::ShardMutex mu;
  Garbage garbage;                         // before the table: destroyed after it
  std::atomic<Array*> published{nullptr};  // the table's slots, for the lock-free path
  Table table RL_GUARDED_BY(mu){&published};
  std::unordered_map<uint64_t, LogEntry> logs RL_GUARDED_BY(mu);  // sliding logs
  // Block periods (Limit::block_for): when each ends (us), by fingerprint.
  // Each counts as a key against max_keys until it ends and is dropped: a
  // block (up to 366 days) outlives the state whose denial started it.
  std::unordered_map<uint64_t, int64_t> blocks RL_GUARDED_BY(mu);
  // Settlements made once (SettleRequest::once): until when each is
  // remembered. Each counts as a key against max_keys until it ends and is
  // dropped, as a block does.
  std::unordered_map<uint64_t, int64_t> settled RL_GUARDED_BY(mu);
  // A full store: no new key here is admitted before this time (us), unless
  // another shard's keys went. See Admit.
  int64_t admit_retry_at RL_GUARDED_BY(mu) = 0;
};

// When the block on `fp` in force at `now` ends, or 0: none.
int64_t BlockedUntil(const Shard& shard, uint64_t fp, int64_t now) RL_REQUIRES(shard.mu) {
  const auto it = shard.blocks.find(fp);
  return it != shard.blocks.end() && it->second > now ? it->second : 0;
}

// A limit with a block period: `d` (the limit's own answer) and `standing`
// (its state as it stands) become the answer of a block until `until`,
// while one is in force; a denial that is not a peek starts one (Run).
// check.lua's blocking() does the same.
Decision Blocked(Decision d, const Decision& standing, int64_t until, int64_t now) {
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
    for (size_t i = 0; i < n; ++i) {
      LockGuard lock(shards[i].mu);
      shards[i].table.set_garbage(&shards[i].garbage);
    }
  }

  Options opts;
  const Clock* clock;
  uint64_t seed;
  size_t shard_mask;
  std::unique_ptr<Shard[]> shards;
  std::atomic<size_t> keys{0};  // live slots + logs + blocks + once marks, all shards
  std::atomic<int64_t> last_full_sweep{0};

  uint64_t Fingerprint(uint64_t key_hash, const Limit& limit) const {
    uint64_t fp = Mix(key_hash, limit.identity_hash() ^ 0x9E3779B97F4A7C15ULL);
    return fp == kEmpty || fp == kTombstone ? 1 : fp;
  }
  Shard& ShardFor(uint64_t fp) { return shards[fp & shard_mask]; }

  // Room for `new_keys` more keys without dropping expired ones (Admit's
  // first answer, which rebuilds nothing).
  bool HasKeysFor(size_t new_keys) const {
    return keys.load(std::memory_order_relaxed) + new_keys <= opts.max_keys;
  }

  // Admits `new_keys` more keys, or fails when the store is full even after
  // dropping the expired entries of `shard` (locked by the caller). Other
  // shards are swept by SweepPart, which the daemon calls periodically.
  //
  // A full store looks for expired entries in a shard at most once per
  // kAdmitRetryUs: a flood of new keys at the bound would otherwise rebuild
  // the shard's table (every slot frozen and copied, a membarrier) for each
  // refused key, and the bound meant to protect the process would cost it a
  // table copy per request (the key-flood test ran at 10,500 requests/s,
  // 21% of its CPU in Rebuild and 26% in the membarrier's IPIs). A key that
  // expired meanwhile waits that long for its slot, or for the daemon's sweep.
  static constexpr int64_t kAdmitRetryUs = 10'000;
  Status Admit(Shard& shard, size_t new_keys, int64_t now) RL_REQUIRES(shard.mu) {
    if (HasKeysFor(new_keys)) return Status::Ok();
    if (now >= shard.admit_retry_at) {
      if (shard.table.CountReclaimable(now) > 0) {
        keys.fetch_sub(shard.table.Rebuild(shard.table.capacity(), now), std::memory_order_relaxed);
      }
      keys.fetch_sub(DropEndedBlocks(shard, now), std::memory_order_relaxed);
      keys.fetch_sub(DropEndedOnceMarks(shard, now), std::memory_order_relaxed);
      if (HasKeysFor(new_keys)) return Status::Ok();
      shard.admit_retry_at = now + kAdmitRetryUs;
    }
    return ResourceExhausted("memory store is full (" + std::to_string(opts.max_keys) +
                             " keys); new keys are refused until old ones expire");
  }

  // Blocks that ended by `now`, dropped; returns how many.
  static size_t DropEndedBlocks(Shard& shard, int64_t now) RL_REQUIRES(shard.mu) {
    return std::erase_if(shard.blocks, [now](const auto& b) { return b.second <= now; });
  }
  // Once-settlement marks that ended by `now`, dropped; returns how many.
  static size_t DropEndedOnceMarks(Shard& shard, int64_t now) RL_REQUIRES(shard.mu) {
    return std::erase_if(shard.settled, [now](const auto& s) { return s.second <= now; });
  }

  // Starts the block on `fp` that a denial of `limit` at `now` starts, and
  // returns when it ends; 0 when the store is full, even after dropping
  // what expired (Admit): the denial then stands without a block, never
  // refused as a new key would be (the failure mode could let an over-limit
  // request through) and never at the cost of another client's entry.
  // REQUIRES: no slot frozen (Admit may rebuild the table).
  int64_t StartBlock(Shard& shard, uint64_t fp, const Limit& limit, int64_t now)
      RL_REQUIRES(shard.mu) {
    const int64_t until = now + limit.block_for().count();
    auto it = shard.blocks.find(fp);
    if (it != shard.blocks.end()) {  // one that ended, not yet dropped: its entry is counted
      it->second = until;
      return until;
    }
    if (!Admit(shard, 1, now).ok()) return 0;
    shard.blocks.emplace(fp, until);
    keys.fetch_add(1, std::memory_order_relaxed);
    return until;
  }

  // Makes room in `shard`'s table for one more slot: grows it by half, unless
  // dropping the expired entries frees a quarter of it.
  void EnsureRoom(Shard& shard, int64_t now) RL_REQUIRES(shard.mu) {
    if (shard.table.HasRoom()) return;
    const size_t cap = shard.table.capacity();
    const size_t expired = shard.table.CountReclaimable(now);
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
  // One bucket or window limit without a block period: lock-free when the
  // key has a slot (see ReadSection).
  StatusOr<Decision> DecideFast(std::string_view key, const Limit& limit, int64_t cost);
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

// The slots of a request's bucket and window limits, frozen for the time of
// a decision under the shard locks: a lock-free decision on one of them waits
// for the locks (it finds the slot frozen and takes the lock), so a decision
// over several limits sees and changes all of their states at once. Thawed
// with the new state or, when nothing is taken, the old one.
class FrozenSlots {
 public:
  // Freezes `slot` (may be null: no state yet) and returns its state.
  Words Freeze(size_t i, Slot* slot) {
    slots_[i] = slot;
    if (slot == nullptr) return {};
    for (size_t j = 0; j < i; ++j) {  // one slot twice: a fingerprint collision
      if (slots_[j] == slot) return words_[i] = words_[j];
    }
    return words_[i] = ratelimit::Freeze(*slot);
  }
  Slot* slot(size_t i) const { return slots_[i]; }
  // Thaws slot i with `next` (each slot once: the first of duplicates).
  void Thaw(size_t i, Words next) {
    if (slots_[i] == nullptr) return;
    for (size_t j = 0; j < i; ++j) {
      if (slots_[j] == slots_[i]) return;
    }
    Unfreeze(*slots_[i], next);
    slots_[i] = nullptr;
  }
  // Thaws every slot still frozen with the state it had.
  void ThawAll(size_t n) {
    for (size_t i = n; i-- > 0;) {
      if (slots_[i] != nullptr) Thaw(i, words_[i]);
    }
  }
  // Forgets slot i (erased: it stays frozen).
  void Drop(size_t i) { slots_[i] = nullptr; }

 private:
  std::array<Slot*, kMaxChecksPerRequest> slots_{};
  std::array<Words, kMaxChecksPerRequest> words_{};
};

StatusOr<CheckResult> MemoryStore::Impl::Run(const CheckRequest& req, bool peek) {
  if (Status s = ValidateRequest(req, opts.max_key_length); !s.ok()) return s;
  const size_t n = req.checks.size();
  if (const Limit& l = *req.checks[0].limit;
      n == 1 && !peek && l.algorithm() != Algorithm::kSlidingLog && l.block_for().count() == 0) {
    StatusOr<Decision> d = DecideFast(req.key, l, req.checks[0].cost);
    if (!d.ok()) return d.status();
    CheckResult result;
    result.decisions.push_back(*d);
    result.overall = Combine(result.decisions);
    return result;
  }
  ShardLocks locks;
  const std::array<uint64_t, kMaxChecksPerRequest> fps = LockAll(req.key, req.checks, locks);
  const int64_t now = clock->NowMicros();

  CheckResult result;
  result.decisions.resize(n);
  std::array<CompactState, kMaxChecksPerRequest> state, next;
  std::array<const std::vector<int64_t>*, kMaxChecksPerRequest> logs{};
  std::array<Decision, kMaxChecksPerRequest> standing;
  std::array<bool, kMaxChecksPerRequest> starts_block{};
  bool admitted = false;
  for (;;) {
    FrozenSlots frozen;
    bool all = true;
    size_t new_keys = 0;
    for (size_t i = 0; i < n; ++i) {
      const Limit& limit = *req.checks[i].limit;
      const int64_t cost = peek ? 0 : req.checks[i].cost;
      Shard& shard = ShardFor(fps[i]);
      if (limit.algorithm() == Algorithm::kSlidingLog) {
        auto it = shard.logs.find(fps[i]);
        static const std::vector<int64_t> kEmptyLog;
        logs[i] = it == shard.logs.end() ? &kEmptyLog : &it->second.log;
        result.decisions[i] = core::EvaluateLog(limit, *logs[i], now, cost);
        new_keys += it == shard.logs.end() ? 1 : 0;
      } else {
        Slot* slot = shard.table.Find(fps[i]);
        state[i] = StateAt(limit, frozen.Freeze(i, slot), now);
        core::Evaluation e = core::Evaluate(limit, state[i], now, cost);
        result.decisions[i] = e.decision;
        next[i] = e.next;
        new_keys += slot == nullptr ? 1 : 0;
      }
      starts_block[i] = false;
      if (limit.block_for().count() > 0) {
        standing[i] = logs[i] != nullptr ? core::StandingLog(limit, *logs[i], now)
                                         : core::Standing(limit, state[i], now);
        if (const int64_t until = BlockedUntil(shard, fps[i], now); until > 0) {
          result.decisions[i] = Blocked(result.decisions[i], standing[i], until, now);
        } else {
          starts_block[i] = !result.decisions[i].allowed && !peek;
        }
      }
      all = all && result.decisions[i].allowed;
    }
    if (!all) {  // nothing is taken: the limits that would allow answer for their state as it
                 // stands
      for (size_t i = 0; i < n; ++i) {
        if (!result.decisions[i].allowed) continue;
        const Limit& limit = *req.checks[i].limit;
        result.decisions[i] = logs[i] != nullptr ? core::StandingLog(limit, *logs[i], now)
                                                 : core::Standing(limit, state[i], now);
      }
    }
    if (peek || !all) {
      frozen.ThawAll(n);
      // Blocks start once the slots are thawed: one may need room (StartBlock).
      for (size_t i = 0; i < n; ++i) {
        if (!starts_block[i]) continue;
        if (const int64_t until = StartBlock(ShardFor(fps[i]), fps[i], *req.checks[i].limit, now)) {
          result.decisions[i] = Blocked(result.decisions[i], standing[i], until, now);
        }
      }
      result.overall = Combine(result.decisions);
      return result;
    }
    result.overall = Combine(result.decisions);
    // Commit every limit, or none: admit the new keys first. In a full store
    // admitting rebuilds a table (dropping expired keys), which freezes every
    // slot itself: thaw ours first, and decide again on what the lock-free
    // path did meanwhile.
    if (new_keys > 0 && !admitted) {
      admitted = true;
      if (!HasKeysFor(new_keys)) {
        frozen.ThawAll(n);
        if (Status s = Admit(ShardFor(fps[0]), new_keys, now); !s.ok()) return s;
        continue;
      }
    }
    // Existing slots first (thawed with their new state), then new ones
    // (inserting may rebuild a table).
    for (size_t i = 0; i < n; ++i) {
      if (frozen.slot(i) != nullptr) frozen.Thaw(i, Pack(*req.checks[i].limit, next[i]));
    }
    break;
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
    if (shard.table.Find(fps[i]) == nullptr) {
      EnsureRoom(shard, now);
      shard.table.Insert(fps[i], Pack(limit, next[i]));
      keys.fetch_add(1, std::memory_order_relaxed);
    }
  }
  return result;
}

StatusOr<CheckResult> MemoryStore::Impl::Settle(const SettleRequest& req) {
  if (Status s = ValidateSettle(req, opts.max_key_length); !s.ok()) return s;
  ShardLocks locks;
  const std::array<uint64_t, kMaxChecksPerRequest> fps = LockAll(req.key, req.settlements, locks);
  const int64_t now = clock->NowMicros();
  const size_t n = req.settlements.size();
  std::array<CompactState, kMaxChecksPerRequest> next;
  bool admitted = false;
  FrozenSlots frozen;
  // The once mark lives in the first limit's shard, locked above; a new one
  // is a key (an ended one not dropped yet is counted already).
  Shard& first = ShardFor(fps[0]);
  const uint64_t once_fp = req.once.empty() ? 0 : Mix(Hash64(req.once, seed), fps[0]);
  if (!req.once.empty()) {
    const auto it = first.settled.find(once_fp);
    if (it != first.settled.end() && it->second > now) return CheckResult{.already_settled = true};
  }
  for (;;) {
    size_t new_keys = !req.once.empty() && !first.settled.contains(once_fp) ? 1 : 0;
    for (size_t i = 0; i < n; ++i) {
      const Limit& limit = *req.settlements[i].limit;
      Slot* slot = ShardFor(fps[i]).table.Find(fps[i]);
      const CompactState state = StateAt(limit, frozen.Freeze(i, slot), now);
      next[i] = core::SettleState(limit, state, now, req.settlements[i].delta);
      const bool fresh = core::ExpiresAt(limit, next[i]) <= now;
      new_keys += (slot == nullptr && !fresh) ? 1 : 0;
    }
    if (new_keys == 0 || admitted || HasKeysFor(new_keys)) break;
    frozen.ThawAll(n);  // Admit may rebuild the table (see Run)
    if (Status s = Admit(ShardFor(fps[0]), new_keys, now); !s.ok()) return s;
    admitted = true;
  }
  if (!req.once.empty()) {
    auto [it, inserted] = first.settled.try_emplace(once_fp, now + req.once_ttl.count());
    if (inserted) keys.fetch_add(1, std::memory_order_relaxed);
    it->second = now + req.once_ttl.count();
  }
  CheckResult result;
  result.decisions.resize(n);
  // Existing slots first: erased (the fresh state: nothing to keep) or thawed
  // with the new state; then new ones (inserting may rebuild a table).
  for (size_t i = 0; i < n; ++i) {
    const Limit& limit = *req.settlements[i].limit;
    Slot* slot = frozen.slot(i);
    if (slot == nullptr) continue;
    if (core::ExpiresAt(limit, next[i]) <= now) {
      Table::Erase(*slot);
      frozen.Drop(i);
      keys.fetch_sub(1, std::memory_order_relaxed);
    } else {
      frozen.Thaw(i, Pack(limit, next[i]));
    }
  }
  for (size_t i = 0; i < n; ++i) {
    const Limit& limit = *req.settlements[i].limit;
    Shard& shard = ShardFor(fps[i]);
    if (core::ExpiresAt(limit, next[i]) > now && shard.table.Find(fps[i]) == nullptr) {
      EnsureRoom(shard, now);
      shard.table.Insert(fps[i], Pack(limit, next[i]));
      keys.fetch_add(1, std::memory_order_relaxed);
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
  return m.DecideFast(key, limit, cost);
}

StatusOr<Decision> MemoryStore::Impl::DecideFast(std::string_view key, const Limit& limit,
                                                 int64_t cost) {
  const uint64_t fp = Fingerprint(Hash64(key, seed), limit);
  Shard& shard = ShardFor(fp);
  int64_t now;
  Decision d;
  {  // The common case: the key has a slot. No lock; one compare-and-swap.
    ReadSection section;
    const Array& a = *shard.published.load(std::memory_order_acquire);
    // The slot's line is asked for before the clock is read, so that a key
    // not in cache (most of them, with many clients) waits for its miss
    // during the clock read rather than after it: 58-62 -> 55-58 ns with
    // 100,000 held keys (BM_MemoryStoreDecideHeld, docs/performance.md).
    const size_t home = a.Home(fp);
    __builtin_prefetch(&a.slots[home], 1);  // for writing: the compare-and-swap
    now = clock->NowMicros();
    Slot* slot = a.FindFrom(home, fp);
    if (slot != nullptr && DecideOnSlot(*slot, limit, now, cost, d)) return d;
  }
  // A new key, or a slot being moved or changed under the lock.
  LockGuard lock(shard.mu);
  if (Slot* slot = shard.table.Find(fp); slot != nullptr) {
    const bool done = DecideOnSlot(*slot, limit, now, cost, d);
    assert(done);  // under the lock, the slots of the current table are not frozen
    (void)done;
    return d;
  }
  const core::Evaluation e = core::Evaluate(limit, CompactState{}, now, cost);
  if (!e.decision.allowed) return e.decision;
  if (Status s = Admit(shard, 1, now); !s.ok()) return s;
  EnsureRoom(shard, now);
  shard.table.Insert(fp, Pack(limit, e.next));
  keys.fetch_add(1, std::memory_order_relaxed);
  return e.decision;
}

void MemoryStore::Reset(std::string_view key, std::span<const Limit* const> limits,
                        ResetCallback done) {
  Impl& m = *impl_;
  m.ForEachLocked(key, limits, [&m](Shard& shard, uint64_t fp) RL_REQUIRES(shard.mu) {
    if (Slot* slot = shard.table.Find(fp); slot != nullptr) {
      Freeze(*slot);
      Table::Erase(*slot);
      m.keys.fetch_sub(1, std::memory_order_relaxed);
    }
    if (shard.logs.erase(fp) > 0) m.keys.fetch_sub(1, std::memory_order_relaxed);
    if (shard.blocks.erase(fp) > 0) m.keys.fetch_sub(1, std::memory_order_relaxed);
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
  Impl& m = *impl_;
  m.ForEachLocked(key, limits, [&m](Shard& shard, uint64_t fp) RL_REQUIRES(shard.mu) {
    if (shard.blocks.erase(fp) > 0) m.keys.fetch_sub(1, std::memory_order_relaxed);
  });
  done(Status::Ok());
}

size_t MemoryStore::SweepPart(size_t part, size_t parts) {
  Impl& m = *impl_;
  const int64_t now = m.clock->NowMicros();
  size_t dropped = 0;
  for (size_t i = part; i <= m.shard_mask; i += std::max<size_t>(parts, 1)) {
    Shard& shard = m.shards[i];
    LockGuard lock(shard.mu);
    size_t cap = shard.table.capacity();
    const size_t reclaimable = shard.table.CountReclaimable(now);
    const size_t live = shard.table.size() - reclaimable;
    // Shrink tables that are mostly empty after a flood went away: under a
    // sixteenth live, to a quarter or more. Not at a quarter already: a
    // shard whose clients come and go holds, besides its live keys, those
    // gone since its last rebuild, and a table cut to four times its live
    // keys grew back by rebuilds on the request path (docs/performance.md,
    // the memory store's sweep).
    if (live * 16 < cap) {
      while (cap > 8 && live * 4 < cap) cap /= 2;
    }
    // (A rebuild freezes every slot and waits for the lock-free readers:
    // only when it reclaims something.)
    size_t n = reclaimable > 0 || cap != shard.table.capacity() ? shard.table.Rebuild(cap, now) : 0;
    n += Impl::DropEndedBlocks(shard, now);
    n += Impl::DropEndedOnceMarks(shard, now);
    for (auto it = shard.logs.begin(); it != shard.logs.end();) {
      if (it->second.expires <= now) {
        it = shard.logs.erase(it);
        ++n;
      } else {
        ++it;
      }
    }
    shard.garbage.Collect();  // the tables this sweep and the rebuilds since the last one replaced
    m.keys.fetch_sub(n, std::memory_order_relaxed);
    dropped += n;
  }
  return dropped;
}

size_t MemoryStore::size() const { return impl_->keys.load(std::memory_order_relaxed); }

namespace {
// An unordered_map of 8-byte keys and values (libstdc++): a 32-byte heap
// node per entry (the link and the pair, as malloc rounds 24 up) and its
// bucket array (none while it has one bucket, kept inside the map).
size_t MapBytes(const std::unordered_map<uint64_t, int64_t>& m) {
  return m.size() * 32 + (m.bucket_count() > 1 ? m.bucket_count() * sizeof(void*) : 0);
}
}  // namespace

size_t MemoryStore::MemoryUsage() const {
  Impl& m = *impl_;
  size_t bytes = sizeof(Shard) * (m.shard_mask + 1);
  for (size_t i = 0; i <= m.shard_mask; ++i) {
    Shard& shard = m.shards[i];
    LockGuard lock(shard.mu);
    bytes += shard.table.capacity() * sizeof(Slot);
    for (const auto& [fp, e] : shard.logs) bytes += 64 + e.log.capacity() * sizeof(int64_t);
    bytes += MapBytes(shard.blocks) + MapBytes(shard.settled);
  }
  return bytes;
}

}  // namespace ratelimit
