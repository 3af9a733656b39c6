#include "store/redis_backend.h"

#include <algorithm>
#include <thread>

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>

#include "redis/slot.h"

namespace ratelimit::store {

namespace {

// A probe lapses (CircuitBreaker::Options::probe_timeout) only once its call
// has surely ended: a call fails by its deadline, and the executor may run
// its callback a little late. The breakers run on the store's monotonic clock.
RedisConnectionOptions WithBreakerDefaults(RedisConnectionOptions o) {
  o.breaker.probe_timeout = std::max(o.breaker.probe_timeout, 2 * o.deadline);
  if (o.breaker.clock == nullptr) o.breaker.clock = o.steady_clock;
  return o;
}

}  // namespace

RedisBackend::RedisBackend(const RedisConnectionOptions& options)
    : opts_(WithBreakerDefaults(options)),
      unknown_node_breaker_(std::make_unique<CircuitBreaker>(opts_.breaker)) {}

StatusOr<std::unique_ptr<RedisBackend>> RedisBackend::Create(const RedisConnectionOptions& options,
                                                             std::string_view script_source) {
  std::unique_ptr<RedisBackend> b(new RedisBackend(options));
  b->script_ = redis::Script::Create(std::string(script_source));
  b->node_script_ =
      redis::Script::Create("#!lua flags=allow-cross-slot-keys\n" + std::string(script_source));
  if (options.io_context != nullptr) {
    b->exec_ = options.io_context->get_executor();
  } else {
    b->own_io_ = std::make_unique<redis::IoThread>();
    b->exec_ = b->own_io_->executor();
  }
  StatusOr<std::unique_ptr<redis::Endpoint>> endpoint =
      redis::OpenEndpoint(b->exec_, options.url,
                          {.command_timeout = options.deadline,
                           .connections = options.connections,
                           .max_pending = static_cast<int>(options.max_pending),
                           .reconnect_max_backoff = options.reconnect_max_backoff});
  if (!endpoint.ok()) return endpoint.status();
  b->endpoint_ = *std::move(endpoint);
  b->url_for_logs_ = b->endpoint_->RedactedUrl();
  // A node the endpoint dropped (a Cluster node absent from the maps, a
  // master Sentinel replaced): its breaker no longer counts, and starts
  // afresh if the id comes back.
  b->endpoint_->OnNodeDropped([raw = b.get()](int node) { raw->ForgetNode(node); });
  if (b->opts_.on_redis_event) {
    b->endpoint_->OnEvent(
        [raw = b.get()](const redis::EndpointEvent& e) { raw->OnEndpointEvent(e); });
  }
  return b;
}

RedisBackend::~RedisBackend() {
  if (endpoint_ != nullptr) CloseAndWait(nullptr);
}

uint16_t RedisBackend::SlotOf(std::string_view key) const {
  // One node serves every slot: no need to hash the key.
  return endpoint_->sharded() ? redis::KeySlot(key) : uint16_t{0};
}

CircuitBreaker* RedisBackend::BreakerFor(uint16_t slot) {
  const int node = endpoint_->NodeForSlot(slot);
  if (node < 0) {
    unknown_slot_.store(slot, std::memory_order_relaxed);
    return unknown_node_breaker_.get();
  }
  const auto at = static_cast<size_t>(node);
  if (at < std::size(known_)) {  // the common case: no lock
    if (CircuitBreaker* b = known_[at].load(std::memory_order_acquire)) return b;
  }
  LockGuard lock(breakers_mu_);
  if (node_breakers_.size() <= at) node_breakers_.resize(at + 1);
  auto& b = node_breakers_[at];
  if (!b) {
    b = std::make_unique<CircuitBreaker>(opts_.breaker);
    if (at < std::size(known_)) known_[at].store(b.get(), std::memory_order_release);
  }
  return b.get();
}

void RedisBackend::ForgetNode(int node) {
  LockGuard lock(breakers_mu_);
  const auto at = static_cast<size_t>(node);
  if (node < 0 || at >= node_breakers_.size() || !node_breakers_[at]) return;
  // Closed (its log says so), then retired: calls still out on the node may
  // hold it, and their failures, reported there, must not read as an open
  // store. A fresh one stands for the id, should it come back.
  node_breakers_[at]->OnSuccess();
  retired_breakers_.push_back(std::move(node_breakers_[at]));
  node_breakers_[at] = std::make_unique<CircuitBreaker>(opts_.breaker);
  if (at < std::size(known_)) known_[at].store(node_breakers_[at].get(), std::memory_order_release);
}

void RedisBackend::OnEndpointEvent(const redis::EndpointEvent& event) {
  using Kind = redis::EndpointEvent::Kind;
  constexpr int64_t kRepeatMicros = 10'000'000;
  std::string message = event.message;
  {
    LockGuard lock(events_mu_);
    if (event.kind != Kind::kDiscoveryFailed) {
      last_failure_.clear();  // a failure after a success is news
    } else {
      const Clock& clock = opts_.steady_clock != nullptr ? *opts_.steady_clock : Clock::Steady();
      const int64_t now = clock.NowMicros();
      if (message == last_failure_ && now - last_failure_at_ < kRepeatMicros) {
        ++failures_dropped_;
        return;
      }
      if (failures_dropped_ > 0) {
        message += " (" + std::to_string(failures_dropped_) + " failures not logged before)";
      }
      last_failure_ = event.message;
      last_failure_at_ = now;
      failures_dropped_ = 0;
    }
  }
  opts_.on_redis_event(event.kind != Kind::kMasterAdopted, message);
}

StatusOr<RedisBackend::Pass> RedisBackend::Admit(uint16_t slot) {
  Pass pass{.breaker = BreakerFor(slot)};
  if (pass.breaker->Allow(&pass.probe)) return pass;
  // The node may be gone for good (failover): look for a new owner meanwhile.
  endpoint_->RequestRefresh();
  return BreakerOpenStatus(endpoint_->Describe(endpoint_->NodeForSlot(slot)));
}

void RedisBackend::Report(const Pass& pass, const StatusOr<redis::Reply>& reply) {
  if (reply.ok() && !reply->IsUnavailableError()) {
    pass.breaker->OnSuccess();
  } else if (reply.ok() || reply.status().code() != StatusCode::kResourceExhausted) {
    pass.breaker->OnFailure();
  } else {
    GiveBack(pass);  // no verdict on the node: a probe kept would wedge the breaker
  }
}

StatusOr<redis::Reply> RedisBackend::Judged(StatusOr<redis::Reply> reply) {
  if (reply.ok() && reply->IsUnavailableError()) {
    return Unavailable("redis node cannot serve now: " + reply->str);
  }
  return reply;
}

redis::Callback RedisBackend::Counted(redis::Callback done) {
  calls_out_.fetch_add(1, std::memory_order_relaxed);
  return [this, done = std::move(done)](StatusOr<redis::Reply> r) mutable {
    done(std::move(r));
    calls_out_.fetch_sub(1, std::memory_order_release);
  };
}

void RedisBackend::Eval(std::span<const std::string_view> keys,
                        std::span<const std::string_view> args, redis::Callback done,
                        std::chrono::milliseconds timeout) {
  endpoint_->EvalScript(script_, keys, args, Counted(std::move(done)), timeout);
}

void RedisBackend::EvalOnNode(uint16_t slot, std::span<const std::string_view> args,
                              redis::Callback done, std::chrono::milliseconds timeout) {
  endpoint_->EvalScriptOnNode(node_script_, slot, args, Counted(std::move(done)), timeout);
}

void RedisBackend::Execute(std::span<const std::string_view> args, redis::Callback done) {
  endpoint_->Execute(args, Counted(std::move(done)), opts_.deadline);
}

void RedisBackend::GuardedEval(std::span<const std::string_view> keys,
                               std::span<const std::string_view> args, redis::Callback done,
                               std::span<const std::string_view> undo) {
  StatusOr<Pass> b = Admit(SlotOf(keys[0]));
  if (!b.ok()) return done(b.status());
  redis::Callback reported =
      Counted([b = *b, done = std::move(done)](StatusOr<redis::Reply> r) mutable {
        Report(b, r);
        done(Judged(std::move(r)));
      });
  if (undo.empty()) {
    return endpoint_->EvalScript(script_, keys, args, std::move(reported), opts_.deadline);
  }
  endpoint_->EvalScriptWithUndo(script_, keys, args, undo, std::move(reported), opts_.deadline);
}

void RedisBackend::GuardedExecute(std::span<const std::string_view> args, redis::Callback done) {
  StatusOr<Pass> b = Admit(SlotOf(args[1]));
  if (!b.ok()) return done(b.status());
  Execute(args, [b = *b, done = std::move(done)](StatusOr<redis::Reply> r) mutable {
    Report(b, r);
    done(Judged(std::move(r)));
  });
}

CircuitBreaker::State RedisBackend::breaker_state() const {
  // The stand-in counts while the slot it last stood in for has no node.
  // Once the map (or the master) names one, nothing asks it again, and an
  // open it kept from before would read "open" for good while every check
  // succeeds.
  CircuitBreaker::State worst = CircuitBreaker::State::kClosed;
  const int unknown = unknown_slot_.load(std::memory_order_relaxed);
  if (unknown >= 0 && endpoint_->NodeForSlot(static_cast<uint16_t>(unknown)) < 0) {
    worst = unknown_node_breaker_->state();
  }
  auto rank = [](CircuitBreaker::State s) {
    return s == CircuitBreaker::State::kOpen ? 2 : s == CircuitBreaker::State::kHalfOpen ? 1 : 0;
  };
  LockGuard lock(breakers_mu_);
  for (const auto& b : node_breakers_) {
    if (b && rank(b->state()) > rank(worst)) worst = b->state();
  }
  return worst;
}

std::shared_ptr<redis::Subscriber> RedisBackend::Subscribe(std::string channel,
                                                           redis::Subscriber::Handler handler,
                                                           redis::Subscriber::Timing timing) {
  // The endpoint outlives the subscriber's use of it: Close() closes every
  // subscriber before the endpoint, and a closed one asks no more.
  redis::Endpoint* endpoint = endpoint_.get();
  auto sub = redis::Subscriber::Start(
      exec_, std::move(channel),
      [endpoint](int attempt) { return endpoint->SubscriptionNode(attempt); }, std::move(handler),
      timing);
  LockGuard lock(subscribers_mu_);
  subscribers_.push_back(sub);
  return sub;
}

void RedisBackend::Close() {
  std::vector<std::shared_ptr<redis::Subscriber>> subs;
  {
    LockGuard lock(subscribers_mu_);
    subs.swap(subscribers_);
  }
  for (auto& s : subs) s->Close();
  endpoint_->Close();
}

void RedisBackend::CloseAndWait(const std::function<bool()>& idle) {
  Close();
  // Closing fails the calls in flight on the executor; their callbacks use
  // the caller's state, so wait for them (bounded) before it goes away.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < give_up && !(calls_out() == 0 && (!idle || idle()))) {
    if (opts_.io_context != nullptr && opts_.io_context->stopped()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void RedisBackend::Shutdown(std::function<bool()> idle, std::function<void()> done) {
  Close();
  struct Poll {
    RedisBackend* backend;
    std::function<bool()> idle;
    boost::asio::steady_timer timer;
    std::chrono::steady_clock::time_point give_up;
    std::function<void()> done;
    static void Run(std::shared_ptr<Poll> p) {
      const bool quiet = p->backend->calls_out() == 0 && (!p->idle || p->idle());
      if (quiet || std::chrono::steady_clock::now() >= p->give_up) return p->done();
      p->timer.expires_after(std::chrono::milliseconds(1));
      p->timer.async_wait([p](boost::system::error_code) { Run(p); });
    }
  };
  auto p = std::make_shared<Poll>(Poll{this, std::move(idle), boost::asio::steady_timer(exec_),
                                       std::chrono::steady_clock::now() + std::chrono::seconds(1),
                                       std::move(done)});
  boost::asio::post(exec_, [p] { Poll::Run(p); });
}

}  // namespace ratelimit::store
