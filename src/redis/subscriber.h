// Subscriber: one connection kept SUBSCRIBEd to a channel, for a store that
// must hear what other instances announce (the overrides' changes). Any
// Endpoint makes one (Endpoint::Subscribe): it asks the endpoint which node
// to listen on each time it (re)subscribes, so a Cluster (where PUBLISH
// reaches every node) or a Sentinel-managed master after a failover works
// the same way as one node.
//
//   auto sub = endpoint->Subscribe("rl:overrides", [](Subscriber::Event e, std::string_view m) {
//     if (e == Subscriber::Event::kSubscribed) ReReadEverything();  // may have missed some
//     if (e == Subscriber::Event::kMessage) Apply(m);
//   });
//   ...
//   sub->Close();
//
// Events: kSubscribed each time the subscription (re)starts (whatever was
// published meanwhile was missed: re-read), kMessage per message on the
// channel, kLost when the connection drops or a PING (every ping_interval)
// goes unanswered; it then subscribes again after retry_interval, on the node
// the endpoint names then.
//
// Ownership: held by std::shared_ptr (its own timer and callbacks keep it
// alive until Close()). Thread-safety: Close may be called from any thread;
// the handler runs on the executor, one event at a time.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>

#include "ratelimit/thread_annotations.h"
#include "redis/client.h"
#include "redis/url.h"

namespace ratelimit::redis {

class Subscriber : public std::enable_shared_from_this<Subscriber> {
 public:
  enum class Event { kSubscribed, kMessage, kLost };
  using Handler = std::function<void(Event, std::string_view payload)>;
  // The node to listen on for the `attempt`th subscription (0, 1, ...), or
  // nullopt while none is known (tried again after retry_interval).
  using NodePicker = std::function<std::optional<Options>(int attempt)>;

  struct Timing {
    std::chrono::milliseconds retry_interval{200};
    std::chrono::milliseconds ping_interval{1000};
  };

  static std::shared_ptr<Subscriber> Start(boost::asio::any_io_executor executor,
                                           std::string channel, NodePicker pick, Handler handler,
                                           Timing timing);
  static std::shared_ptr<Subscriber> Start(boost::asio::any_io_executor executor,
                                           std::string channel, NodePicker pick, Handler handler) {
    return Start(std::move(executor), std::move(channel), std::move(pick), std::move(handler),
                 Timing{});
  }
  // Unsubscribes for good: no event after Close returns... except one already
  // running on another thread. Idempotent.
  void Close();
  // Subscriptions started so far (for tests).
  int subscriptions() const;

  Subscriber(boost::asio::any_io_executor executor, std::string channel, NodePicker pick,
             Handler handler, Timing timing);

 private:
  void Subscribe();
  void OnPush(const Client* from, StatusOr<Reply> r);
  void Drop(const Client* from);
  void Tick();
  void Emit(Event e, std::string_view payload);

  const std::string channel_;
  const NodePicker pick_;
  const Handler handler_;
  const Timing timing_;
  boost::asio::strand<boost::asio::any_io_executor> strand_;
  boost::asio::steady_timer timer_;
  mutable Mutex mu_;
  std::shared_ptr<Client> client_ RL_GUARDED_BY(mu_);  // the subscribed connection, if any
  bool subscribed_ RL_GUARDED_BY(mu_) = false;
  bool closed_ RL_GUARDED_BY(mu_) = false;
  int attempts_ RL_GUARDED_BY(mu_) = 0;
  int subscriptions_ RL_GUARDED_BY(mu_) = 0;
  Mutex emit_mu_ RL_ACQUIRED_BEFORE(mu_);  // one event at a time
};

}  // namespace ratelimit::redis
