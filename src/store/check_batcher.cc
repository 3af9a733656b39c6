#include "store/check_batcher.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <utility>

#include <boost/asio/post.hpp>

#include "core/steady_clock.h"

namespace ratelimit::store {

CheckBatcher::CheckBatcher(Options options, boost::asio::any_io_executor executor, Send send,
                           Expire expire)
    : opts_{.max_batch = std::max<size_t>(options.max_batch, 1),
            .max_calls_in_flight = std::max<size_t>(options.max_calls_in_flight, 1),
            .hold_back = options.hold_back,
            .sharded = options.sharded},
      exec_(std::move(executor)),
      send_(std::move(send)),
      expire_(std::move(expire)) {}

bool CheckBatcher::PartialMayLeave(std::chrono::steady_clock::time_point now) const {
  return calls_in_flight_ == 0 || opts_.sharded || now - last_send_ >= opts_.hold_back;
}

bool CheckBatcher::ReadyToSend(std::chrono::steady_clock::time_point now) const {
  if (calls_in_flight_ >= opts_.max_calls_in_flight) return false;  // a reply flushes
  return queue_.size() >= opts_.max_batch || PartialMayLeave(now);
}

bool CheckBatcher::TakeHoldTimer(std::chrono::steady_clock::time_point now) {
  if (queue_.empty() || flush_scheduled_ || hold_armed_) return false;
  if (calls_in_flight_ >= opts_.max_calls_in_flight || ReadyToSend(now)) return false;
  hold_armed_ = true;
  return true;
}

void CheckBatcher::Add(PendingCheck check) {
  bool schedule = false, hold = false;
  std::chrono::steady_clock::time_point hold_until;
  {
    const auto now = core::SteadyClock::now();
    check.queued_at = now;
    LockGuard lock(mu_);
    queue_.push_back(std::move(check));
    if (!flush_scheduled_ && ReadyToSend(now)) {
      schedule = flush_scheduled_ = true;
    } else if (TakeHoldTimer(now)) {
      hold = true;
      hold_until = last_send_ + opts_.hold_back;
    }
  }
  if (schedule) {
    boost::asio::post(exec_, [this] { Flush(); });
  } else if (hold) {
    boost::asio::post(exec_, [this, hold_until] { ArmHold(hold_until); });
  }
}

void CheckBatcher::ArmHold(std::chrono::steady_clock::time_point at) {
  {
    LockGuard lock(mu_);
    // A reply took the queue meanwhile (only the executor empties it): a
    // timer now would only keep the batcher from being idle.
    if (queue_.empty()) {
      hold_armed_ = false;
      return;
    }
  }
  auto timer = std::make_shared<boost::asio::steady_timer>(exec_, at);
  timer->async_wait([this, timer](boost::system::error_code) { OnHoldTimer(); });
}

// Fired (the queue may have emptied since: then there is nothing to do):
// what is queued now is looked at again, and held on if a younger call is out.
void CheckBatcher::OnHoldTimer() {
  bool flush;
  {
    LockGuard lock(mu_);
    hold_armed_ = false;
    flush = !queue_.empty() && !flush_scheduled_;
    if (flush) flush_scheduled_ = true;
  }
  if (flush) Flush();
}

void CheckBatcher::Returned() {
  bool more;
  {
    LockGuard lock(mu_);
    --calls_in_flight_;
    more = !queue_.empty();
    if (more) flush_scheduled_ = true;
  }
  if (more) Flush();
}

bool CheckBatcher::Idle() const {
  LockGuard lock(mu_);
  return !flush_scheduled_ && queue_.empty() && !hold_armed_;
}

// On the executor. While a young call is out only whole batches leave
// (ReadyToSend); the rest wait for a reply. Calls start only while fewer than
// max_calls_in_flight are out: once that many are, what is left of the
// batch goes back to the queue's front and waits for a reply.
void CheckBatcher::Flush() {
  std::vector<PendingCheck> batch;
  const size_t per_call = opts_.max_batch;
  const auto now = core::SteadyClock::now();
  std::optional<std::chrono::steady_clock::time_point> hold;
  {
    LockGuard lock(mu_);
    flush_scheduled_ = false;
    if (!ReadyToSend(now)) {
      if (TakeHoldTimer(now)) hold = last_send_ + opts_.hold_back;
    } else if (PartialMayLeave(now)) {
      batch.swap(queue_);
    } else {  // whole batches only; the remainder waits for a reply
      const auto whole = static_cast<ptrdiff_t>(queue_.size() / per_call * per_call);
      batch.assign(std::make_move_iterator(queue_.begin()),
                   std::make_move_iterator(queue_.begin() + whole));
      queue_.erase(queue_.begin(), queue_.begin() + whole);
    }
  }
  if (batch.empty()) {
    if (hold) ArmHold(*hold);
    return;
  }
  // A call holds the checks of one node (PendingCheck::node >= 0: check.lua's
  // node mode) or else of one slot (a script's keys share a slot).
  auto order = [](const PendingCheck& a, const PendingCheck& b) {
    return a.node != b.node ? a.node < b.node : a.slot < b.slot;
  };
  if (!std::is_sorted(batch.begin(), batch.end(), order)) {
    std::stable_sort(batch.begin(), batch.end(), order);
  }
  auto joins = [](const PendingCheck& first, const PendingCheck& p) {
    return first.node == p.node && (p.node >= 0 || first.slot == p.slot);
  };
  std::vector<PendingCheck> group;
  bool at_cap = false;  // max_calls_in_flight calls are out: the rest waits
  auto send = [&] {
    // The call may take only what is left of the earliest deadline in it.
    auto deadline = group.front().deadline;
    for (const PendingCheck& p : group) deadline = std::min(deadline, p.deadline);
    const auto timeout = std::max(std::chrono::milliseconds(1),
                                  std::chrono::ceil<std::chrono::milliseconds>(deadline - now));
    {
      LockGuard lock(mu_);
      ++calls_in_flight_;
      last_send_ = now;
      at_cap = calls_in_flight_ >= opts_.max_calls_in_flight;
    }
    send_(std::exchange(group, {}), timeout);
  };
  size_t next = 0;
  for (; next < batch.size(); ++next) {
    PendingCheck& p = batch[next];
    if (p.deadline <= now) {  // waited its whole deadline in the queue: never sent
      expire_(p);
      continue;
    }
    if (!group.empty() && !joins(group.front(), p)) send();
    if (group.empty() && at_cap) break;  // no call may start: p and the rest stay
    queued_.Observe(now - p.queued_at);
    group.push_back(std::move(p));
    if (group.size() == per_call) send();
  }
  if (!group.empty()) send();
  if (next < batch.size()) {
    // Back to the front of the queue, in order, ahead of checks added
    // meanwhile: they leave as replies free calls, or fail at their
    // deadline there as any queued check does.
    LockGuard lock(mu_);
    queue_.insert(queue_.begin(),
                  std::make_move_iterator(batch.begin() + static_cast<std::ptrdiff_t>(next)),
                  std::make_move_iterator(batch.end()));
  }
  // What stayed (a remainder held back by the call just sent, or checks
  // added meanwhile) needs the hold timer. A timer set while the queue has
  // since emptied is left to fire and find nothing: cancelling it at every
  // reply would cost a timer-queue update and a completion per call under
  // load, where it fires at most once per hold_back.
  {
    LockGuard lock(mu_);
    if (!queue_.empty() && TakeHoldTimer(now)) hold = last_send_ + opts_.hold_back;
  }
  if (hold) ArmHold(*hold);
}

}  // namespace ratelimit::store
