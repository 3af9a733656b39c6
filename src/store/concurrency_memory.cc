// ConcurrencyStore's shared functions and MemoryConcurrencyStore.
#include <openssl/rand.h>

#include <algorithm>
#include <atomic>
#include <compare>
#include <future>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <unordered_map>
#include <utility>

#include "core/hex.h"
#include "ratelimit/concurrency.h"
#include "ratelimit/limit.h"
#include "ratelimit/thread_annotations.h"

namespace ratelimit {

StatusOr<AcquireResult> ConcurrencyStore::AcquireSync(const AcquireRequest& request) {
  std::promise<StatusOr<AcquireResult>> p;
  auto f = p.get_future();
  Acquire(request, [&p](StatusOr<AcquireResult> r) { p.set_value(std::move(r)); });
  return f.get();
}

StatusOr<bool> ConcurrencyStore::ReleaseSync(std::string_view key, std::string_view name,
                                             std::string_view lease_id) {
  std::promise<StatusOr<bool>> p;
  auto f = p.get_future();
  Release(key, name, lease_id, [&p](StatusOr<bool> r) { p.set_value(std::move(r)); });
  return f.get();
}

StatusOr<bool> ConcurrencyStore::RenewSync(std::string_view key, std::string_view name,
                                           std::string_view lease_id,
                                           std::chrono::microseconds ttl) {
  std::promise<StatusOr<bool>> p;
  auto f = p.get_future();
  Renew(key, name, lease_id, ttl, [&p](StatusOr<bool> r) { p.set_value(std::move(r)); });
  return f.get();
}

Status ValidateAcquire(const AcquireRequest& request, size_t max_key_length) {
  if (Status s = ValidateKey(request.key, max_key_length); !s.ok()) return s;
  if (Status s = ValidateLimitName(request.name); !s.ok()) return s;
  if (request.max_in_flight < 1 || request.max_in_flight > kMaxInFlight) {
    return InvalidArgument("max_in_flight must be in [1, " + std::to_string(kMaxInFlight) +
                           "], got " + std::to_string(request.max_in_flight));
  }
  if (request.lease_ttl < std::chrono::milliseconds(1) || request.lease_ttl > kMaxLeaseTtl) {
    return InvalidArgument("lease_ttl must be between 1ms and 24h");
  }
  return Status::Ok();
}

Status ValidateLeaseId(std::string_view lease_id) {
  if (lease_id.empty() || lease_id.size() > 64) {
    return InvalidArgument("a lease id is 1..64 characters long");
  }
  for (char c : lease_id) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '-';
    if (!ok) return InvalidArgument("a lease id holds only letters, digits, '_' and '-'");
  }
  return Status::Ok();
}

namespace {

// The 128 random bits of a lease id.
void NewLeaseIdBytes(unsigned char (&bytes)[16]) {
  if (RAND_bytes(bytes, sizeof bytes) != 1) {
    // The CSPRNG failed (practically never): fall back to a per-process
    // random seed and a counter, still unique within the process.
    static std::atomic<uint64_t> counter{0};
    static const uint64_t seed = std::random_device{}() * 0x9e3779b97f4a7c15ULL;
    const uint64_t a = seed, b = counter.fetch_add(1) + 1;
    for (int i = 0; i < 8; ++i) {
      bytes[i] = static_cast<unsigned char>(a >> (8 * i));
      bytes[8 + i] = static_cast<unsigned char>(b >> (8 * i));
    }
  }
}

// The id the next lease admitted on this thread takes. Drawn before the
// store's lock is taken (RAND_bytes takes about 2 us, longer than the rest
// of an acquire), and drawn again only once taken: refusals, what a flood of
// acquires mostly gets, draw none.
struct NextLeaseId {
  unsigned char bytes[16];
  bool drawn = false;
};
thread_local NextLeaseId next_lease_id;

}  // namespace

std::string NewLeaseId() {
  unsigned char bytes[16];
  NewLeaseIdBytes(bytes);
  return core::Hex(bytes);
}

// The leases are indexed three ways, each O(log n) or O(1) a lease: all of
// them by expiry (reclaims expired leases oldest first, a bounded number per
// call, so no call walks the table), each key's by expiry (its count after
// dropping its own expired ones, and its earliest expiry for retry_after),
// and all of them by id (Release; ids are unique across keys). A lease id
// is kept as its 16 bytes, not its 32 hex digits.
struct MemoryConcurrencyStore::Impl {
  // Expired leases an Acquire reclaims from other keys: enough to keep ahead
  // of a store where every lease expires unreleased (one taken, up to 32
  // freed), few enough to keep the lock short.
  static constexpr size_t kReclaimPerAcquire = 32;
  // Leases Sweep drops per lock hold.
  static constexpr size_t kSweepChunk = 1024;

  struct LeaseId {
    uint64_t hi = 0, lo = 0;
    // (Not a defaulted <=>: clang-tidy's modernize-use-nullptr misreads it.)
    friend bool operator==(const LeaseId&, const LeaseId&) = default;
    friend bool operator<(const LeaseId& a, const LeaseId& b) {
      return a.hi != b.hi ? a.hi < b.hi : a.lo < b.lo;
    }
  };
  // The id whose NewLeaseId text is the hex of `bytes` (as ParseLeaseId reads it).
  static LeaseId IdOf(const unsigned char (&bytes)[16]) {
    LeaseId id;
    for (size_t i = 0; i < 8; ++i) {
      id.hi = (id.hi << 8) | bytes[i];
      id.lo = (id.lo << 8) | bytes[8 + i];
    }
    return id;
  }
  struct LeaseIdHash {
    size_t operator()(const LeaseId& id) const { return id.hi ^ (id.lo * 0x9e3779b97f4a7c15ULL); }
  };
  using Expiry = std::pair<int64_t, LeaseId>;  // micros; ordered by time, then id
  struct Entry {                               // one (key, name)
    const std::string* map_key = nullptr;      // its key in `entries`
    std::set<Expiry> by_expiry;                // its leases; never empty: it goes with its last
  };
  struct Held {
    Entry* entry;  // a node of `entries`: stable, erased only with its last lease
    int64_t expires_at;
  };

  Options opts;
  const Clock* clock;
  Mutex mu;
  // key + '\0' + name -> its leases.
  std::unordered_map<std::string, Entry> entries RL_GUARDED_BY(mu);
  // Every held lease (expired ones until reclaimed): by id, and by expiry,
  // earliest first. Their size is what max_keys bounds.
  std::unordered_map<LeaseId, Held, LeaseIdHash> by_id RL_GUARDED_BY(mu);
  std::set<Expiry> all_by_expiry RL_GUARDED_BY(mu);

  static std::string MapKey(std::string_view key, std::string_view name) {
    std::string k;
    k.reserve(key.size() + name.size() + 1);
    k.append(key);
    k.push_back('\0');
    k.append(name);
    return k;
  }

  // The 16 bytes of a NewLeaseId (32 lower-case hex digits); nullopt for
  // anything else, which this store never gave out.
  static std::optional<LeaseId> ParseLeaseId(std::string_view hex) {
    if (hex.size() != 32) return std::nullopt;
    LeaseId id;
    for (size_t i = 0; i < 32; ++i) {
      const char c = hex[i];
      uint64_t digit;
      if (c >= '0' && c <= '9') {
        digit = static_cast<uint64_t>(c - '0');
      } else if (c >= 'a' && c <= 'f') {
        digit = static_cast<uint64_t>(c - 'a') + 10;
      } else {
        return std::nullopt;
      }
      uint64_t& half = i < 16 ? id.hi : id.lo;
      half = (half << 4) | digit;
    }
    return id;
  }

  Entry& FindOrAdd(std::string map_key) RL_REQUIRES(mu) {
    auto [it, added] = entries.try_emplace(std::move(map_key));
    if (added) it->second.map_key = &it->first;
    return it->second;
  }

  void Add(Entry& e, LeaseId id, int64_t expires_at) RL_REQUIRES(mu) {
    e.by_expiry.emplace(expires_at, id);
    by_id.emplace(id, Held{&e, expires_at});
    all_by_expiry.emplace(expires_at, id);
  }

  // Removes one lease of `e`; erases `e` too when it was the last one.
  void Remove(Entry& e, LeaseId id, int64_t expires_at) RL_REQUIRES(mu) {
    e.by_expiry.erase({expires_at, id});
    by_id.erase(id);
    all_by_expiry.erase({expires_at, id});
    if (e.by_expiry.empty()) entries.erase(*e.map_key);
  }

  // The lease `id` if it was taken for (key, name), else nullptr: a lease
  // is released or renewed only by the key and name it was taken for.
  Held* Find(LeaseId id, std::string_view key, std::string_view name) RL_REQUIRES(mu) {
    auto l = by_id.find(id);
    if (l == by_id.end() || *l->second.entry->map_key != MapKey(key, name)) return nullptr;
    return &l->second;
  }

  // Moves one held lease's expiry in both expiry indexes (not Remove + Add:
  // Remove erases the entry with its last lease).
  void MoveExpiry(Held& h, LeaseId id, int64_t expires_at) RL_REQUIRES(mu) {
    h.entry->by_expiry.erase({h.expires_at, id});
    all_by_expiry.erase({h.expires_at, id});
    h.expires_at = expires_at;
    h.entry->by_expiry.emplace(expires_at, id);
    all_by_expiry.emplace(expires_at, id);
  }

  // Drops the expired leases of `e` (all of them: its count must be exact);
  // false when that emptied and erased it.
  bool DropExpired(Entry& e, int64_t now) RL_REQUIRES(mu) {
    while (!e.by_expiry.empty() && e.by_expiry.begin()->first <= now) {
      const auto [expires_at, id] = *e.by_expiry.begin();
      const bool last = e.by_expiry.size() == 1;
      Remove(e, id, expires_at);
      if (last) return false;
    }
    return true;
  }

  bool AnyExpired(int64_t now) const RL_REQUIRES(mu) {
    return !all_by_expiry.empty() && all_by_expiry.begin()->first <= now;
  }

  // Drops up to `max` expired leases of any key, earliest first; how many.
  size_t Reclaim(int64_t now, size_t max) RL_REQUIRES(mu) {
    size_t n = 0;
    while (n < max && AnyExpired(now)) {
      const auto [expires_at, id] = *all_by_expiry.begin();
      Remove(*by_id.at(id).entry, id, expires_at);
      ++n;
    }
    return n;
  }

  SweepProgress SweepSome(int64_t now, size_t max) {
    LockGuard lock(mu);
    const size_t dropped = Reclaim(now, std::max<size_t>(max, 1));
    return {.dropped = dropped, .more = AnyExpired(now)};
  }
};

MemoryConcurrencyStore::MemoryConcurrencyStore() : MemoryConcurrencyStore(Options{}) {}

MemoryConcurrencyStore::MemoryConcurrencyStore(Options options) : impl_(std::make_unique<Impl>()) {
  impl_->opts = options;
  impl_->clock = options.clock != nullptr ? options.clock : &Clock::System();
}

MemoryConcurrencyStore::~MemoryConcurrencyStore() = default;

void MemoryConcurrencyStore::Acquire(const AcquireRequest& request, AcquireCallback done) {
  if (Status s = ValidateAcquire(request, impl_->opts.max_key_length); !s.ok()) return done(s);
  const int64_t now = impl_->clock->NowMicros();
  NextLeaseId& next = next_lease_id;
  if (!next.drawn) {
    NewLeaseIdBytes(next.bytes);
    next.drawn = true;
  }
  AcquireResult r;
  r.max_in_flight = request.max_in_flight;
  {
    LockGuard lock(impl_->mu);
    impl_->Reclaim(now, Impl::kReclaimPerAcquire);
    std::string k = Impl::MapKey(request.key, request.name);
    auto it = impl_->entries.find(k);
    Impl::Entry* e = nullptr;
    if (it != impl_->entries.end() && impl_->DropExpired(it->second, now)) e = &it->second;
    const int64_t held = e != nullptr ? static_cast<int64_t>(e->by_expiry.size()) : 0;
    if (held >= request.max_in_flight) {
      r.in_flight = held;
      r.retry_after = std::chrono::microseconds(e->by_expiry.begin()->first - now);
    } else if (impl_->all_by_expiry.size() >= impl_->opts.max_keys && !request.route_wide) {
      return done(ResourceExhausted(
          "concurrency store full: " + std::to_string(impl_->opts.max_keys) + " leases held"));
    } else {
      if (e == nullptr) e = &impl_->FindOrAdd(std::move(k));
      impl_->Add(*e, Impl::IdOf(next.bytes), now + request.lease_ttl.count());
      next.drawn = false;  // taken
      r.acquired = true;
      r.in_flight = held + 1;
    }
  }
  if (r.acquired) r.lease_id = core::Hex(next.bytes);
  done(std::move(r));
}

void MemoryConcurrencyStore::Release(std::string_view key, std::string_view name,
                                     std::string_view lease_id, ReleaseCallback done) {
  if (Status s = ValidateLeaseId(lease_id); !s.ok()) return done(s);
  const std::optional<Impl::LeaseId> id = Impl::ParseLeaseId(lease_id);
  if (!id) return done(false);  // not an id this store gives out: never held
  const int64_t now = impl_->clock->NowMicros();
  bool released = false;
  {
    LockGuard lock(impl_->mu);
    if (Impl::Held* h = impl_->Find(*id, key, name); h != nullptr) {
      const int64_t expires_at = h->expires_at;
      released = expires_at > now;  // an expired lease was no longer held
      impl_->Remove(*h->entry, *id, expires_at);
    }
  }
  done(released);
}

void MemoryConcurrencyStore::Renew(std::string_view key, std::string_view name,
                                   std::string_view lease_id, std::chrono::microseconds ttl,
                                   RenewCallback done) {
  if (Status s = ValidateLeaseId(lease_id); !s.ok()) return done(s);
  const AcquireRequest as_acquire{.key = key, .name = name, .lease_ttl = ttl};
  if (Status s = ValidateAcquire(as_acquire, impl_->opts.max_key_length); !s.ok()) return done(s);
  const std::optional<Impl::LeaseId> id = Impl::ParseLeaseId(lease_id);
  if (!id) return done(false);  // not an id this store gives out: never held
  const int64_t now = impl_->clock->NowMicros();
  bool renewed = false;
  {
    LockGuard lock(impl_->mu);
    // An expired lease stays expired (its place may have been given out).
    if (Impl::Held* h = impl_->Find(*id, key, name); h != nullptr && h->expires_at > now) {
      impl_->MoveExpiry(*h, *id, now + ttl.count());
      renewed = true;
    }
  }
  done(renewed);
}

int64_t MemoryConcurrencyStore::InFlight(std::string_view key, std::string_view name) {
  const int64_t now = impl_->clock->NowMicros();
  LockGuard lock(impl_->mu);
  auto it = impl_->entries.find(Impl::MapKey(key, name));
  if (it == impl_->entries.end()) return 0;
  // Not dropped here (Acquire and Sweep do): counted, the earliest first.
  const std::set<Impl::Expiry>& leases = it->second.by_expiry;
  int64_t expired = 0;
  for (auto l = leases.begin(); l != leases.end() && l->first <= now; ++l) ++expired;
  return static_cast<int64_t>(leases.size()) - expired;
}

size_t MemoryConcurrencyStore::Sweep() {
  const int64_t now = impl_->clock->NowMicros();
  size_t dropped = 0;
  for (;;) {
    // A chunk per lock hold: acquires and releases get in between.
    const SweepProgress p = impl_->SweepSome(now, Impl::kSweepChunk);
    dropped += p.dropped;
    if (!p.more) return dropped;
  }
}

ConcurrencyStore::SweepProgress MemoryConcurrencyStore::SweepSome(size_t max_leases) {
  return impl_->SweepSome(impl_->clock->NowMicros(), max_leases);
}

}  // namespace ratelimit
