#include "redis/subscriber.h"

#include <algorithm>
#include <utility>

#include <boost/asio/post.hpp>

namespace ratelimit::redis {

namespace asio = boost::asio;

std::shared_ptr<Subscriber> Subscriber::Start(asio::any_io_executor executor, std::string channel,
                                              NodePicker pick, Handler handler, Timing timing) {
  auto s = std::make_shared<Subscriber>(std::move(executor), std::move(channel), std::move(pick),
                                        std::move(handler), timing);
  asio::post(s->strand_, [s] { s->Tick(); });
  return s;
}

Subscriber::Subscriber(asio::any_io_executor executor, std::string channel, NodePicker pick,
                       Handler handler, Timing timing)
    : channel_(std::move(channel)),
      pick_(std::move(pick)),
      handler_(std::move(handler)),
      timing_(timing),
      strand_(asio::make_strand(executor)),
      timer_(strand_) {}

int Subscriber::subscriptions() const {
  LockGuard lock(mu_);
  return subscriptions_;
}

void Subscriber::Close() {
  std::shared_ptr<Client> gone;
  {
    LockGuard lock(mu_);
    if (closed_) return;
    closed_ = true;
    gone = std::move(client_);
  }
  if (gone) gone->Close();
  asio::post(strand_, [self = shared_from_this()] { self->timer_.cancel(); });
}

void Subscriber::Emit(Event e, std::string_view payload) {
  LockGuard emit(emit_mu_);
  {
    LockGuard lock(mu_);
    if (closed_) return;
  }
  handler_(e, payload);
}

void Subscriber::Subscribe() {
  std::shared_ptr<Client> client;
  std::chrono::milliseconds patience{0};
  {
    LockGuard lock(mu_);
    if (closed_ || client_) return;
    std::optional<Options> node = pick_(attempts_++);
    if (!node) return;  // Tick tries again
    node->connections = 1;
    patience = node->connect_timeout + node->command_timeout;
    client = client_ = std::make_shared<Client>(strand_.get_inner_executor(), std::move(*node));
    subscribed_ = false;
  }
  std::weak_ptr<Subscriber> weak = weak_from_this();
  const Client* raw = client.get();
  client->OnPush([weak, raw](StatusOr<Reply> r) {
    if (auto self = weak.lock()) self->OnPush(raw, std::move(r));
  });
  std::string_view args[] = {"SUBSCRIBE", channel_};
  client->Execute(
      args,
      [weak, raw](StatusOr<Reply> r) {
        auto self = weak.lock();
        if (!self) return;
        // ["subscribe", channel, count]
        if (!r.ok() || !r->IsArray() || r->elements.empty() || r->elements[0].str != "subscribe") {
          return self->Drop(raw);
        }
        {
          LockGuard lock(self->mu_);
          if (self->client_.get() != raw) return;
          self->subscribed_ = true;
          ++self->subscriptions_;
        }
        self->Emit(Event::kSubscribed, {});
      },
      patience);
}

void Subscriber::OnPush(const Client* from, StatusOr<Reply> r) {
  if (!r.ok()) return Drop(from);
  // ["message", channel, payload]
  if (r->elements.size() != 3 || r->elements[1].str != channel_) return;
  {
    LockGuard lock(mu_);
    if (client_.get() != from) return;
  }
  Emit(Event::kMessage, r->elements[2].str);
}

void Subscriber::Drop(const Client* from) {
  std::shared_ptr<Client> gone;
  bool was_subscribed = false;
  {
    LockGuard lock(mu_);
    if (client_.get() != from) return;
    gone = std::move(client_);
    was_subscribed = std::exchange(subscribed_, false);
  }
  gone->Close();
  if (was_subscribed) Emit(Event::kLost, {});
}

void Subscriber::Tick() {
  std::shared_ptr<Client> client;
  bool subscribed = false;
  {
    LockGuard lock(mu_);
    if (closed_) return;
    client = client_;
    subscribed = subscribed_;
  }
  if (!client) {
    Subscribe();
  } else if (subscribed) {
    // A frozen node or a silently broken path: no pong within the deadline.
    std::weak_ptr<Subscriber> weak = weak_from_this();
    const Client* raw = client.get();
    std::string_view ping[] = {"PING"};
    client->Execute(
        ping,
        [weak, raw](StatusOr<Reply> r) {
          auto self = weak.lock();
          if (self && (!r.ok() || r->IsError())) self->Drop(raw);
        },
        std::max(timing_.ping_interval, client->options().command_timeout));
  }
  timer_.expires_after(client && subscribed ? timing_.ping_interval : timing_.retry_interval);
  timer_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
    if (!ec) self->Tick();
  });
}

}  // namespace ratelimit::redis
