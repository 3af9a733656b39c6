// CheckBatcher: RedisStore's scheduler. Checks queue here and leave as script
// calls of up to `max_batch` checks, at most `max_calls_in_flight` calls out
// at once (a bound: a reply that frees one lets one call go, and checks of
// more calls than that stay queued in order); checks that arrive meanwhile
// leave together when a reply comes back.
//
// While a call sent less than `hold_back` ago is out, a batch that is not
// full waits for its reply and leaves with the next one (one node only):
// sending each as it comes costs a call apiece on both sides (on the 2-core
// bench machine, /v1/check over Redis: 21k req/s with batches of 4.7, 28-31k
// when a batch waited for the reply). The age bound keeps a frozen or distant
// Redis from holding checks back: a call out longer than that no longer delays
// the next one, so calls (and the breaker's failures) keep coming as they did.
// When the backend is sharded (a cluster) a batch is split by node for the
// checks that carry one (PendingCheck::node: RedisStore's node calls) and by
// slot for the others; `sharded` (calls per slot only, which rarely fill a
// batch) sends every check at once instead of holding it back.
// At low load every check goes out at once (a batch of one); nothing waits on
// a timer. Invariant: a non-empty queue has a Flush scheduled on the executor
// or a call out whose reply (Returned) will flush it; and if only hold_back
// keeps it (a young call out), also the batcher's one hold timer, set for
// when that call turns hold_back old: then its checks leave without waiting
// for a reply that may take a whole deadline. The timer is set only while
// something is held back and none is set, and never cancelled (a reply that
// empties the queue leaves it to fire idle): under load it costs one firing
// per hold_back, not a set and a cancel per call.
//
//   CheckBatcher b(opts, executor, send, expire);
//   b.Add(std::move(check));       // any thread
//   ... in the reply's callback: b.Returned(); then hand out the answers.
//
// Thread-safety: Add and Idle from any thread; Returned on the executor.
// `send` and `expire` run on the executor, without the batcher's lock.
#pragma once

#include <chrono>
#include <functional>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/steady_timer.hpp>

#include "ratelimit/thread_annotations.h"
#include "store/pending_check.h"
#include "store/stage_recorder.h"

namespace ratelimit::store {

class CheckBatcher {
 public:
  struct Options {
    size_t max_batch = 32;
    size_t max_calls_in_flight = 16;
    std::chrono::microseconds hold_back{1000};
    bool sharded = false;
  };
  // Sends one call of checks of one slot; `timeout` is what is left of the
  // earliest deadline among them. Must call Returned() when its reply comes.
  using Send =
      std::function<void(std::vector<PendingCheck> group, std::chrono::milliseconds timeout)>;
  // A check that waited its whole deadline in the queue: never sent.
  using Expire = std::function<void(PendingCheck& check)>;

  CheckBatcher(Options options, boost::asio::any_io_executor executor, Send send, Expire expire);

  void Add(PendingCheck check);
  // A call's reply came back: what queued meanwhile leaves at once (Redis
  // works on it while this call's answers are handed out).
  void Returned();
  // Nothing queued or about to leave (calls out are the backend's to count).
  bool Idle() const;
  // Each sent check's time in the queue (Add to its call's send).
  StageLatency queued() const { return queued_.Snapshot(); }

 private:
  bool PartialMayLeave(std::chrono::steady_clock::time_point now) const RL_REQUIRES(mu_);
  bool ReadyToSend(std::chrono::steady_clock::time_point now) const RL_REQUIRES(mu_);
  // Whether the queue is held back by hold_back alone with no hold timer set
  // or about to be; if so, marks it about to be (hold_armed_).
  bool TakeHoldTimer(std::chrono::steady_clock::time_point now) RL_REQUIRES(mu_);
  void Flush();
  // On the executor: the hold timer, to fire at `at` (TakeHoldTimer said so).
  void ArmHold(std::chrono::steady_clock::time_point at);
  void OnHoldTimer();

  const Options opts_;
  const boost::asio::any_io_executor exec_;
  const Send send_;
  const Expire expire_;
  mutable Mutex mu_;
  std::vector<PendingCheck> queue_ RL_GUARDED_BY(mu_);
  bool flush_scheduled_ RL_GUARDED_BY(mu_) = false;
  size_t calls_in_flight_ RL_GUARDED_BY(mu_) = 0;
  // The hold timer is set, or an ArmHold is posted: until its handler has
  // run, the batcher is not idle (the handler uses it). The timer is owned
  // by its handler: it must not outlive the io_context, which may go before
  // the batcher.
  bool hold_armed_ RL_GUARDED_BY(mu_) = false;
  std::chrono::steady_clock::time_point last_send_ RL_GUARDED_BY(mu_);  // the newest call's
  StageRecorder queued_;
};

}  // namespace ratelimit::store
