// ConcurrencyStore's shared functions and MemoryConcurrencyStore.
#include <openssl/rand.h>

#include <algorithm>
#include <atomic>
#include <future>
#include <random>
#include <unordered_map>
#include <vector>

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

std::string NewLeaseId() {
  unsigned char bytes[16];
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
  return core::Hex(bytes);
}

struct MemoryConcurrencyStore::Impl {
  struct Lease {
    std::string id;
    int64_t expires_at;  // micros
  };
  Options opts;
  const Clock* clock;
  Mutex mu;
  // key + '\0' + name -> held leases (few per key: a linear scan is fastest).
  std::unordered_map<std::string, std::vector<Lease>> leases RL_GUARDED_BY(mu);

  static std::string MapKey(std::string_view key, std::string_view name) {
    std::string k;
    k.reserve(key.size() + name.size() + 1);
    k.append(key);
    k.push_back('\0');
    k.append(name);
    return k;
  }
  static size_t DropExpired(std::vector<Lease>& v, int64_t now) {
    const size_t before = v.size();
    std::erase_if(v, [now](const Lease& l) { return l.expires_at <= now; });
    return before - v.size();
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
  AcquireResult r;
  r.max_in_flight = request.max_in_flight;
  {
    LockGuard lock(impl_->mu);
    std::string k = Impl::MapKey(request.key, request.name);
    auto it = impl_->leases.find(k);
    if (it == impl_->leases.end()) {
      if (impl_->leases.size() >= impl_->opts.max_keys) {
        // Full: make room from expired leases before refusing.
        for (auto i = impl_->leases.begin(); i != impl_->leases.end();) {
          Impl::DropExpired(i->second, now);
          i = i->second.empty() ? impl_->leases.erase(i) : std::next(i);
        }
        if (impl_->leases.size() >= impl_->opts.max_keys) {
          return done(
              ResourceExhausted("concurrency store full: " + std::to_string(impl_->opts.max_keys) +
                                " keys hold leases"));
        }
      }
      it = impl_->leases.emplace(std::move(k), std::vector<Impl::Lease>{}).first;
    }
    std::vector<Impl::Lease>& v = it->second;
    Impl::DropExpired(v, now);
    if (static_cast<int64_t>(v.size()) < request.max_in_flight) {
      r.acquired = true;
      r.lease_id = NewLeaseId();
      v.push_back({r.lease_id, now + request.lease_ttl.count()});
    } else {
      int64_t first = v.front().expires_at;
      for (const Impl::Lease& l : v) first = std::min(first, l.expires_at);
      r.retry_after = std::chrono::microseconds(first - now);
    }
    r.in_flight = static_cast<int64_t>(v.size());
    if (v.empty()) impl_->leases.erase(it);
  }
  done(std::move(r));
}

void MemoryConcurrencyStore::Release(std::string_view key, std::string_view name,
                                     std::string_view lease_id, ReleaseCallback done) {
  if (Status s = ValidateLeaseId(lease_id); !s.ok()) return done(s);
  const int64_t now = impl_->clock->NowMicros();
  bool released = false;
  {
    LockGuard lock(impl_->mu);
    auto it = impl_->leases.find(Impl::MapKey(key, name));
    if (it != impl_->leases.end()) {
      std::vector<Impl::Lease>& v = it->second;
      auto l =
          std::find_if(v.begin(), v.end(), [&](const Impl::Lease& x) { return x.id == lease_id; });
      if (l != v.end()) {
        released = l->expires_at > now;  // an expired lease was no longer held
        v.erase(l);
      }
      if (v.empty()) impl_->leases.erase(it);
    }
  }
  done(released);
}

int64_t MemoryConcurrencyStore::InFlight(std::string_view key, std::string_view name) {
  const int64_t now = impl_->clock->NowMicros();
  LockGuard lock(impl_->mu);
  auto it = impl_->leases.find(Impl::MapKey(key, name));
  if (it == impl_->leases.end()) return 0;
  return std::count_if(it->second.begin(), it->second.end(),
                       [now](const Impl::Lease& l) { return l.expires_at > now; });
}

size_t MemoryConcurrencyStore::Sweep() {
  const int64_t now = impl_->clock->NowMicros();
  size_t dropped = 0;
  LockGuard lock(impl_->mu);
  for (auto it = impl_->leases.begin(); it != impl_->leases.end();) {
    dropped += Impl::DropExpired(it->second, now);
    it = it->second.empty() ? impl_->leases.erase(it) : std::next(it);
  }
  return dropped;
}

}  // namespace ratelimit
