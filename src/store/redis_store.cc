// RedisStore: start-up, shutdown and the wiring of its parts.
//
//   Check/Peek --> CheckAdmission ------------------> answer (cached denial,
//                  (store/check_admission.h)           prefetched token, waiter)
//                      | needs a call
//                      v
//                  RedisBackend::Admit (the node's breaker, store/redis_backend.h)
//                      v
//                  CheckBatcher (queue, hold_back, calls per slot or per
//                      |         Cluster node; store/check_batcher.h)
//                      v
//                  lua::Encode --> RedisBackend::Eval --> lua::Decode
//                  (store/lua/check_codec.h)                 v
//                                     CheckAdmission::Settle --> answer
#include "ratelimit/redis_store.h"

#include <algorithm>
#include <memory>
#include <random>
#include <vector>

#include "core/steady_clock.h"
#include "ratelimit/thread_annotations.h"
#include "store/check_admission.h"
#include "store/check_batcher.h"
#include "store/lua/check_codec.h"
#include "store/lua/scripts.h"
#include "store/pending_check.h"
#include "store/redis_backend.h"
#include "store/redis_keys.h"

namespace ratelimit {

using store::PendingCheck;

struct RedisStore::Impl {
  Options opts;
  const Clock* clock;   // decisions (time_source local) and calendar windows
  const Clock* steady;  // how long cached denials and prefetched tokens last
  store::RedisKeys keys;
  store::PendingBound bound;
  std::atomic<uint64_t> stat_checks{0}, stat_calls{0}, stat_failures{0}, stat_resent{0};
  // Node calls (Options::node_calls, a Cluster only): off for good once a
  // node cannot run the node script (Redis before 7.0).
  std::atomic<bool> node_calls{false};
  store::StageRecorder stat_call_time;  // send to reply, per script call
  // The reservation secret (SharedSecret): the one Redis held when this
  // instance last asked, and the one that replaced, still accepted until
  // `previous_until` (steady micros).
  Mutex secret_mu;
  std::string secret RL_GUARDED_BY(secret_mu);  // "" until fetched
  std::string previous_secret RL_GUARDED_BY(secret_mu);
  int64_t previous_until RL_GUARDED_BY(secret_mu) = 0;
  int64_t secret_asked_at RL_GUARDED_BY(secret_mu) = 0;  // steady micros of the last answer
  bool secret_asking RL_GUARDED_BY(secret_mu) = false;
  store::CheckAdmission admission;
  std::unique_ptr<store::CheckBatcher> batcher;
  const store::CheckAdmission::Dispatch dispatch = [this](PendingCheck p) {
    Dispatch(std::move(p));
  };
  // Last: destroyed first, so that its thread (if its own) has stopped before
  // the parts its callbacks use go away.
  std::unique_ptr<store::RedisBackend> backend;

  Impl(Options o, std::unique_ptr<store::RedisBackend> b)
      : opts(std::move(o)),
        clock(opts.clock != nullptr ? opts.clock : &Clock::System()),
        steady(opts.steady_clock != nullptr ? opts.steady_clock : &Clock::Steady()),
        keys(opts.key_prefix),
        bound(opts.max_pending),
        admission({.cache_entries = opts.over_limit_cache_entries,
                   .cache_min_retry = opts.over_limit_cache_min_retry,
                   .clock = steady,
                   .bound = &bound}),
        backend(std::move(b)) {
    node_calls.store(opts.node_calls && backend->sharded(), std::memory_order_relaxed);
    batcher = std::make_unique<store::CheckBatcher>(
        store::CheckBatcher::Options{.max_batch = opts.max_batch,
                                     .max_calls_in_flight = opts.max_calls_in_flight,
                                     .hold_back = opts.hold_back,
                                     .sharded = backend->sharded() && !node_calls.load()},
        backend->executor(),
        [this](std::vector<PendingCheck> group, std::chrono::milliseconds timeout) {
          Send(std::move(group), timeout);
        },
        [this](PendingCheck& p) {
          Fail(p, DeadlineExceeded("redis store: no reply slot within the deadline (overloaded)"));
        });
  }

  bool Idle() const { return batcher->Idle(); }

  // SET <prefix>reservation-secret <ours> NX GET: what Redis holds after it,
  // taken as the secret (SharedSecret).
  void AskSecret(std::function<void(StatusOr<std::string>)> done);

  void Submit(const CheckRequest& req, bool peek, CheckCallback done) {
    if (Status s = ValidateRequest(req, opts.max_key_length); !s.ok()) return done(s);
    // Calendar windows are the wall clock's; how long what CheckAdmission
    // keeps lasts is the monotonic clock's.
    const int64_t now_local = clock->NowMicros();
    const int64_t now_steady = steady->NowMicros();
    PendingCheck p;
    if (std::optional<CheckResult> a = admission.Answer(req, peek, now_steady, p)) {
      return done(*std::move(a));
    }
    stat_checks.fetch_add(1, std::memory_order_relaxed);
    const Limit& first = *req.checks.front().limit;
    p.deadline = core::SteadyClock::now() + opts.deadline;
    p.submitted_at = now_steady;
    p.algorithm = first.algorithm();
    p.window_micros = first.window_micros();
    p.interval_micros = first.interval_micros();
    p.call.peek = peek;
    p.call.keys.reserve(req.checks.size());
    p.call.limits.reserve(req.checks.size());
    for (const LimitCheck& c : req.checks) {
      if (c.limit->calendar() != nullptr) {
        AddCalendar(p.call, req.key, *c.limit, c.cost, now_local);
      } else {
        p.call.keys.push_back(keys.State(req.key, *c.limit));
        p.call.limits.push_back({.spec = store::lua::WireOf(*c.limit), .cost = c.cost});
      }
      // Declared like the state's key: check.lua touches no other key
      // (store::lua::KeysPerLimit).
      if (c.limit->block_for().count() > 0) {
        p.call.keys.push_back(keys.Block(req.key, *c.limit));
      }
    }
    if (p.want > 1) p.call.SetPrefetch(p.want);
    p.slot = backend->SlotOf(p.call.keys.front());
    p.done = std::move(done);
    StatusOr<CheckResult> answer = CheckResult{};
    switch (admission.Join(p, now_steady, &answer)) {
      case store::CheckAdmission::Turn::kWaiting: return;
      case store::CheckAdmission::Turn::kAnswered: return p.done(std::move(answer));
      case store::CheckAdmission::Turn::kLead: break;
    }
    Dispatch(std::move(p));
  }

  // A calendar quota: its two windows as this instance's clock sees them,
  // and their keys (check.lua picks one by the script's clock).
  void AddCalendar(store::lua::CheckCall& call, std::string_view client, const Limit& limit,
                   int64_t cost, int64_t now) const {
    const store::lua::CalendarCall cal = store::lua::CalendarCallOf(limit, now, cost);
    call.keys.push_back(keys.Window(client, limit, cal.start));
    call.keys.push_back(keys.Window(client, limit, cal.next_start));
    call.limits.push_back(cal.call);
  }

  // The keys that hold `limit`'s state for `client`: a calendar quota's
  // current and next windows', by the store's clock.
  std::vector<std::string> KeysOf(std::string_view client, const Limit& limit) const {
    if (limit.calendar() == nullptr) return {keys.State(client, limit)};
    store::lua::CheckCall call;
    AddCalendar(call, client, limit, 0, clock->NowMicros());
    return std::move(call.keys);
  }

  // A check that will not be sent: it fails, and so do its waiters' hopes.
  // The node gave no verdict on it: a probe it carries goes back.
  void Fail(PendingCheck& p, const Status& why) {
    store::RedisBackend::GiveBack({p.breaker, p.probe});
    bound.Sub(1);
    stat_failures.fetch_add(1, std::memory_order_relaxed);
    admission.Release(p, nullptr, dispatch);
    p.done(why);
  }

  // Through the slot's breaker and the pending bound into the batcher.
  void Dispatch(PendingCheck p) {
    StatusOr<store::RedisBackend::Pass> pass = backend->Admit(p.slot);
    Status refused = pass.status();
    if (pass.ok() && !bound.TryAdd()) {
      refused = bound.Overloaded();
      store::RedisBackend::GiveBack(*pass);  // never sent: no verdict on the node
    }
    if (!refused.ok()) {
      stat_failures.fetch_add(1, std::memory_order_relaxed);
      admission.Release(p, nullptr, dispatch);
      return p.done(refused);
    }
    p.breaker = pass->breaker;
    p.probe = pass->probe;
    // Node calls (check.lua's node mode) read every key, block keys too,
    // before they write: any check may share one.
    p.node = node_calls.load(std::memory_order_relaxed) ? backend->NodeOf(p.slot) : -1;
    batcher->Add(std::move(p));
  }

  // On the executor: one script call for a group of one slot, or (a node
  // call) of several slots that one Cluster node serves.
  void Send(std::vector<PendingCheck> group, std::chrono::milliseconds timeout) {
    std::vector<const store::lua::CheckCall*> calls;
    calls.reserve(group.size());
    bool one_slot = true;
    for (const PendingCheck& p : group) {
      calls.push_back(&p.call);
      one_slot = one_slot && p.slot == group.front().slot;
    }
    const std::optional<int64_t> now = opts.time_source == TimeSource::kLocal
                                           ? std::optional<int64_t>(clock->NowMicros())
                                           : std::nullopt;
    store::lua::EncodedCall call = store::lua::Encode(now, calls);
    stat_calls.fetch_add(1, std::memory_order_relaxed);
    const uint16_t slot = group.front().slot;
    auto shared = std::make_shared<std::vector<PendingCheck>>(std::move(group));
    auto on_reply = [this, shared, node_call = !one_slot,
                     sent = core::SteadyClock::now()](StatusOr<redis::Reply> reply) {
      stat_call_time.Observe(core::SteadyClock::now() - sent);
      batcher->Returned();
      if (node_call && reply.ok() && reply->IsError() && Resend(*shared, reply->str)) return;
      // LOADING, BUSY, READONLY, ...: a failed call, as a timeout is.
      Complete(*shared, store::RedisBackend::Judged(std::move(reply)));
    };
    if (one_slot) return backend->Eval(call.keys, call.args, std::move(on_reply), timeout);
    // Node mode: "N", the number of keys, the keys, then the arguments.
    std::vector<std::string_view> args;
    args.reserve(2 + call.keys.size() + call.args.size());
    const std::string n = std::to_string(call.keys.size());
    args.push_back("N");
    args.push_back(n);
    args.insert(args.end(), call.keys.begin(), call.keys.end());
    args.insert(args.end(), call.args.begin(), call.args.end());
    backend->EvalOnNode(slot, args, std::move(on_reply), timeout);
  }

  // A node call that Redis refused before the script changed anything: the
  // node no longer serves one of its keys (RLNOTLOCAL: the map is stale, a
  // slot moved or is moving), it is a replica now (READONLY: a failover
  // demoted it; a call with KEYS would have been redirected by MOVED), the
  // cluster is down for now, or the node cannot run the node script (before
  // Redis 7.0: node calls stop). Its checks go back to the batcher one slot
  // per call, where MOVED and ASK are followed; they keep their place in the
  // pending bound and their deadline.
  // False for any other reply: the call's outcome stands.
  bool Resend(std::vector<PendingCheck>& group, std::string_view error) {
    const bool not_local = error.starts_with("RLNOTLOCAL") || error.starts_with("READONLY");
    const bool unusable = error.find("shebang") != std::string_view::npos ||
                          error.find("compiling") != std::string_view::npos;
    if (!not_local && !unusable && !error.starts_with("CLUSTERDOWN")) return false;
    if (unusable) node_calls.store(false, std::memory_order_relaxed);
    if (not_local) backend->RequestRefresh();
    stat_resent.fetch_add(group.size(), std::memory_order_relaxed);
    for (PendingCheck& p : group) {
      p.node = -1;
      batcher->Add(std::move(p));
    }
    return true;
  }

  void Complete(std::vector<PendingCheck>& group, const StatusOr<redis::Reply>& reply) {
    bound.Sub(group.size());
    // Each breaker that let a check of this call through hears the outcome
    // once (one call is one failure), and by the probe's check if it carries
    // one: a probe's breaker must hear, or get it back.
    CircuitBreaker* reported[4] = {};
    size_t n_reported = 0;
    for (const PendingCheck& p : group) {
      if (p.probe == 0 &&
          std::find(reported, reported + n_reported, p.breaker) != reported + n_reported) {
        continue;
      }
      store::RedisBackend::Report({p.breaker, p.probe}, reply);
      if (n_reported < std::size(reported)) reported[n_reported++] = p.breaker;
    }
    std::vector<const store::lua::CheckCall*> calls;
    calls.reserve(group.size());
    for (const PendingCheck& p : group) calls.push_back(&p.call);
    StatusOr<std::vector<store::lua::CheckAnswer>> answers = store::lua::Decode(reply, calls);
    if (!answers.ok()) {
      stat_failures.fetch_add(group.size(), std::memory_order_relaxed);
      for (PendingCheck& p : group) {
        admission.Release(p, nullptr, dispatch);
        p.done(answers.status());
      }
      return;
    }
    for (size_t i = 0; i < group.size(); ++i) {
      PendingCheck& p = group[i];
      p.done(admission.Settle(p, std::move((*answers)[i]), dispatch));
    }
  }
};

StatusOr<std::unique_ptr<RedisStore>> RedisStore::Create(Options options) {
  StatusOr<std::unique_ptr<store::RedisBackend>> backend =
      store::RedisBackend::Create(options, store::kCheckScript);
  if (!backend.ok()) return backend.status();
  return std::unique_ptr<RedisStore>(
      new RedisStore(std::make_unique<Impl>(std::move(options), *std::move(backend))));
}

RedisStore::RedisStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

RedisStore::~RedisStore() {
  // Closing fails the calls in flight on the I/O thread; their callbacks use
  // this store, so wait for them (bounded) before the members go away.
  impl_->backend->CloseAndWait([impl = impl_.get()] { return impl->Idle(); });
}

void RedisStore::Shutdown(std::function<void()> done) {
  impl_->backend->Shutdown([impl = impl_.get()] { return impl->Idle(); }, std::move(done));
}

void RedisStore::Check(const CheckRequest& request, CheckCallback done) {
  impl_->Submit(request, /*peek=*/false, std::move(done));
}

void RedisStore::Peek(const CheckRequest& request, CheckCallback done) {
  impl_->Submit(request, /*peek=*/true, std::move(done));
}

void RedisStore::Reset(std::string_view key, std::span<const Limit* const> limits,
                       ResetCallback done) {
  if (limits.empty()) return done(Status::Ok());
  impl_->admission.Clear();
  std::vector<std::string> owned;
  owned.reserve(3 * limits.size());
  for (const Limit* l : limits) {
    for (std::string& k : impl_->KeysOf(key, *l)) owned.push_back(std::move(k));
  }
  for (const Limit* l : limits) owned.push_back(impl_->keys.Block(key, *l));
  std::vector<std::string_view> args = {"DEL"};
  args.insert(args.end(), owned.begin(), owned.end());  // the keys share one slot
  // Cleared again once the keys are gone: a check sent before the DEL may
  // have been answered since the first Clear, and cached a denial (or kept a
  // prefetched token) of the state the reset removed.
  impl_->backend->Execute(args,
                          [impl = impl_.get(), done = std::move(done)](StatusOr<redis::Reply> r) {
                            r = store::RedisBackend::Judged(std::move(r));
                            if (!r.ok()) return done(r.status());
                            if (r->type == redis::Reply::Type::kError)
                              return done(Internal("redis: " + r->str));
                            impl->admission.Clear();
                            done(Status::Ok());
                          });
}

void RedisStore::ForgetCached() { impl_->admission.Clear(); }

// Blocks are read with one MGET (the keys share the client's slot) and
// measured against this instance's clock: with time_source redis, as close
// as the clocks agree (an admin's view, not a decision).
void RedisStore::Blocks(std::string_view key, std::span<const Limit* const> limits,
                        BlocksCallback done) {
  if (limits.empty()) return done(std::vector<std::chrono::microseconds>());
  std::vector<std::string> owned;
  for (const Limit* l : limits) owned.push_back(impl_->keys.Block(key, *l));
  std::vector<std::string_view> args = {"MGET"};
  args.insert(args.end(), owned.begin(), owned.end());
  const size_t n = limits.size();
  impl_->backend->GuardedExecute(args, [this, n, done = std::move(done)](StatusOr<redis::Reply> r) {
    if (!r.ok()) return done(r.status());
    if (r->type != redis::Reply::Type::kArray || r->elements.size() != n) {
      return done(Internal("redis: unexpected reply to MGET of the blocks"));
    }
    const int64_t now = impl_->clock->NowMicros();
    std::vector<std::chrono::microseconds> out;
    for (const redis::Reply& e : r->elements) {
      int64_t ends = 0;
      if (e.type == redis::Reply::Type::kString) ends = std::strtoll(e.str.c_str(), nullptr, 10);
      out.emplace_back(std::max<int64_t>(0, ends - now));
    }
    done(std::move(out));
  });
}

void RedisStore::Unblock(std::string_view key, std::span<const Limit* const> limits,
                         ResetCallback done) {
  if (limits.empty()) return done(Status::Ok());
  impl_->admission.Clear();  // a cached denial may be the block's
  std::vector<std::string> owned;
  for (const Limit* l : limits) owned.push_back(impl_->keys.Block(key, *l));
  std::vector<std::string_view> args = {"DEL"};
  args.insert(args.end(), owned.begin(), owned.end());
  impl_->backend->GuardedExecute(args, [done = std::move(done)](StatusOr<redis::Reply> r) {
    if (!r.ok()) return done(r.status());
    if (r->type == redis::Reply::Type::kError) return done(Internal("redis: " + r->str));
    done(Status::Ok());
  });
}

// The secret: one key, set by whichever instance asks first (SET NX GET).
// An instance that has one offers it, so that after Redis lost the key
// (restarted empty, FLUSHALL) the first instance to ask sets the secret the
// others hold, and takes what Redis answers. Anyone who can read it can also
// change every limit's state in this Redis directly.
void RedisStore::Impl::AskSecret(std::function<void(StatusOr<std::string>)> done) {
  std::string offered;
  {
    LockGuard lock(secret_mu);
    offered = secret;
    secret_asking = true;
  }
  if (offered.empty()) {
    std::random_device rd;
    for (int i = 0; i < 64; ++i) offered += "0123456789abcdef"[rd() % 16];
  }
  const std::string key = opts.key_prefix + "reservation-secret";
  const std::string_view args[] = {"SET", key, offered, "NX", "GET"};
  backend->GuardedExecute(args, [this, offered, done = std::move(done)](StatusOr<redis::Reply> r) {
    if (r.ok() && r->type == redis::Reply::Type::kError) r = Internal("redis: " + r->str);
    if (r.ok() && r->type != redis::Reply::Type::kString && !r->IsNil()) {
      r = Internal("redis: unexpected reply to SET NX GET of the reservation secret");
    }
    std::string now_held;
    {
      LockGuard lock(secret_mu);
      secret_asking = false;
      if (r.ok()) {
        // nil: ours is set; a string: another instance's was there first.
        const std::string& held = r->type == redis::Reply::Type::kString ? r->str : offered;
        const int64_t now = steady->NowMicros();
        if (held != secret) {
          if (!secret.empty()) {
            previous_secret = std::move(secret);
            previous_until =
                now +
                std::chrono::duration_cast<std::chrono::microseconds>(kSharedSecretOverlap).count();
          }
          secret = held;
        }
        secret_asked_at = now;
        now_held = secret;
      }
    }
    if (!r.ok()) return done(r.status());
    done(std::move(now_held));
  });
}

void RedisStore::SharedSecret(std::function<void(StatusOr<std::string>)> done) {
  std::string known;
  {
    LockGuard lock(impl_->secret_mu);
    const int64_t age = impl_->steady->NowMicros() - impl_->secret_asked_at;
    if (!impl_->secret.empty() &&
        (impl_->secret_asking ||
         age < std::chrono::duration_cast<std::chrono::microseconds>(kSecretRecheck).count())) {
      known = impl_->secret;
    }
  }
  if (!known.empty()) return done(std::move(known));
  impl_->AskSecret([this, done = std::move(done)](StatusOr<std::string> s) {
    if (s.ok()) return done(std::move(s));
    // Redis did not answer: sign with the one held, if any (it verifies
    // wherever it is known; the check itself reached Redis just now).
    std::string held;
    {
      LockGuard lock(impl_->secret_mu);
      held = impl_->secret;
    }
    if (held.empty()) return done(s.status());
    done(std::move(held));
  });
}

void RedisStore::SecretAccepting(std::function<bool(std::string_view)> accepts,
                                 std::function<void(StatusOr<std::string>)> done) {
  auto held = [this] {
    std::vector<std::string> out;
    LockGuard lock(impl_->secret_mu);
    if (!impl_->secret.empty()) out.push_back(impl_->secret);
    if (!impl_->previous_secret.empty() && impl_->steady->NowMicros() < impl_->previous_until) {
      out.push_back(impl_->previous_secret);
    }
    return out;
  };
  for (std::string& s : held()) {
    if (accepts(s)) return done(std::move(s));
  }
  // None of ours: Redis may hold another instance's since we last asked.
  impl_->AskSecret(
      [held, accepts = std::move(accepts), done = std::move(done)](StatusOr<std::string> current) {
        if (!current.ok()) return done(current.status());
        for (std::string& s : held()) {
          if (accepts(s)) return done(std::move(s));
        }
        done(std::move(current));
      });
}

// A settlement is its own script call (check.lua's "S"), not batched: it is
// rare next to checks (one per reserved request), and it must never wait
// behind or be answered by the over-limit cache. A denial cached before a
// refund stands until its retry time (conservative: the cache only holds
// cost-1 denials, for at most their retry_after).
void RedisStore::Settle(const SettleRequest& request, CheckCallback done) {
  Impl& m = *impl_;
  if (Status s = ValidateSettle(request, m.opts.max_key_length); !s.ok()) return done(s);
  auto call = std::make_shared<store::lua::SettleCall>();
  for (const LimitSettle& l : request.settlements) {
    call->keys.push_back(m.keys.State(request.key, *l.limit));
    call->limits.push_back({.spec = store::lua::WireOf(*l.limit), .cost = l.delta});
  }
  if (!request.once.empty()) {
    call->once_key = m.keys.Settled(request.key, request.once);
    call->once_ttl_ms = (request.once_ttl.count() + 999) / 1000;
  }
  const std::optional<int64_t> now = m.opts.time_source == TimeSource::kLocal
                                         ? std::optional<int64_t>(m.clock->NowMicros())
                                         : std::nullopt;
  store::lua::EncodedCall e = store::lua::EncodeSettle(now, *call);
  m.stat_calls.fetch_add(1, std::memory_order_relaxed);
  m.backend->GuardedEval(e.keys, e.args,
                         [&m, call, done = std::move(done)](StatusOr<redis::Reply> reply) {
                           StatusOr<CheckResult> r = store::lua::DecodeSettle(reply, *call);
                           if (!r.ok()) m.stat_failures.fetch_add(1, std::memory_order_relaxed);
                           done(std::move(r));
                         });
}

std::string RedisStore::KeyFor(std::string_view client_key, const Limit& limit) const {
  return impl_->KeysOf(client_key, limit).front();
}

size_t RedisStore::pending() const { return impl_->bound.count(); }

CircuitBreaker::State RedisStore::breaker_state() const { return impl_->backend->breaker_state(); }

RedisStore::Stats RedisStore::stats() const {
  return {.checks = impl_->stat_checks.load(std::memory_order_relaxed),
          .script_calls = impl_->stat_calls.load(std::memory_order_relaxed),
          .cache_hits = impl_->admission.cache_hits(),
          .prefetch_hits = impl_->admission.prefetch_hits(),
          .failures = impl_->stat_failures.load(std::memory_order_relaxed),
          .resent = impl_->stat_resent.load(std::memory_order_relaxed),
          .queued = impl_->batcher->queued(),
          .call = impl_->stat_call_time.Snapshot()};
}

}  // namespace ratelimit
