#include "redis/sentinel_client.h"

#include <algorithm>
#include <atomic>
#include <functional>
#include <optional>
#include <sstream>
#include <utility>
#include <vector>

#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>

#include "core/steady_clock.h"
#include "ratelimit/thread_annotations.h"
#include "redis/earliest_timer.h"

namespace ratelimit::redis {

namespace asio = boost::asio;
using Clock = core::SteadyClock;
using std::chrono::milliseconds;

namespace {

constexpr std::string_view kSwitchMaster = "+switch-master";

// How long a discovery step (a sentinel's answer, a node's ROLE) may take.
milliseconds Patience(const Options& o) { return std::max(o.connect_timeout, o.command_timeout); }

// [ip, port] from SENTINEL get-master-addr-by-name (nil: the name is unknown).
StatusOr<NodeAddress> ParseMasterAddress(const Reply& r, const std::string& name) {
  if (r.IsNil()) return Unavailable("does not know the master name '" + name + "'");
  if (r.IsError()) return Unavailable(r.str);
  if (!r.IsArray() || r.elements.size() != 2 || !r.elements[0].IsString() ||
      !r.elements[1].IsString()) {
    return Internal("malformed answer " + r.DebugString());
  }
  const int port = std::atoi(r.elements[1].str.c_str());
  if (port < 1 || port > 65535) return Internal("malformed port in " + r.DebugString());
  return NodeAddress{r.elements[0].str, static_cast<uint16_t>(port)};
}

}  // namespace

struct SentinelClient::State : std::enable_shared_from_this<State> {
  // A master confirmed by ROLE (or, where ROLE is not permitted, named by a
  // sentinel: `verified` false), and the Client that asked it.
  struct Found {
    NodeAddress address;
    std::shared_ptr<Client> client;
    bool verified = true;
  };
  using FoundFn = std::function<void(StatusOr<Found>)>;

  State(asio::any_io_executor ex, SentinelOptions o)
      : options(std::move(o)),
        executor(std::move(ex)),
        strand(asio::make_strand(executor)),
        discover_timer(strand),
        check_timer(strand) {}

  const SentinelOptions options;
  Status init_status;
  asio::any_io_executor executor;
  asio::strand<asio::any_io_executor> strand;

  mutable Mutex mu;
  bool closed RL_GUARDED_BY(mu) = false;
  std::shared_ptr<Client> data RL_GUARDED_BY(mu);    // the master's, or null
  int node RL_GUARDED_BY(mu) = -1;                   // its id
  std::atomic<int> current_node{-1};                 // `node`, read without the lock
  std::vector<NodeAddress> nodes RL_GUARDED_BY(mu);  // address of each id
  std::vector<std::shared_ptr<Client>> sentinels RL_GUARDED_BY(mu);  // one per sentinel
  size_t preferred RL_GUARDED_BY(mu) = 0;                            // the sentinel asked first
  bool discovering RL_GUARDED_BY(mu) = false;
  bool again RL_GUARDED_BY(mu) = false;              // another discovery was asked for meanwhile
  bool again_now RL_GUARDED_BY(mu) = false;          // ... at once (an announcement)
  bool discovery_pending RL_GUARDED_BY(mu) = false;  // one is scheduled
  Clock::time_point last_discovery RL_GUARDED_BY(mu);
  uint64_t discovery_count RL_GUARDED_BY(mu) = 0;
  std::shared_ptr<Client> subscription RL_GUARDED_BY(mu);  // on one sentinel
  // The new master a +switch-master named, not yet tried: the next discovery
  // verifies it first (the sentinels asked may not have caught up).
  std::optional<NodeAddress> announced RL_GUARDED_BY(mu);
  // The last +switch-master: for switch_hold after it, a sentinel that names
  // its old master has not caught up (Verify passes over that answer).
  struct Switch {
    NodeAddress from, to;
    Clock::time_point at;
  };
  std::optional<Switch> last_switch RL_GUARDED_BY(mu);
  size_t next_subscription RL_GUARDED_BY(mu) = 0;
  // Why the last discovery found no master ("" after one that did).
  std::string last_error RL_GUARDED_BY(mu);
  bool role_warned RL_GUARDED_BY(mu) = false;  // the NOPERM warning was given
  Mutex hooks_mu;  // held while a handler runs, so Close() can take it away
  std::function<void(int)> on_dropped RL_GUARDED_BY(hooks_mu);
  std::function<void(const EndpointEvent&)> on_event RL_GUARDED_BY(hooks_mu);

  // Strand-only.
  EarliestTimer discover_timer;
  asio::steady_timer check_timer;

  void FailSoon(Callback cb, Status status) {
    asio::post(executor, [cb = std::move(cb), status = std::move(status)]() mutable {
      cb(std::move(status));
    });
  }

  std::string DescribeLocked(int id) const RL_REQUIRES(mu) {
    if (id < 0 || static_cast<size_t>(id) >= nodes.size())
      return "redis " + redis::RedactedUrl(options);
    return "redis master " + options.master_name + " at " +
           nodes[static_cast<size_t>(id)].ToString();
  }

  // ---- calls ----

  // The master's Client (null while none is known) and its node id.
  std::shared_ptr<Client> Current(int* id) {
    LockGuard lock(mu);
    *id = node;
    return closed ? nullptr : data;
  }

  // Fails the call at once when no master is known; else `send` on its Client,
  // with a callback that starts a discovery when the node failed the call.
  template <typename Send>
  void Call(Callback cb, Send&& send) {
    if (!init_status.ok()) return FailSoon(std::move(cb), init_status);
    int id = -1;
    std::shared_ptr<Client> client = Current(&id);
    if (!client) {
      RequestDiscovery(false);
      return FailSoon(std::move(cb), NoMasterStatus());
    }
    send(*client, [self = shared_from_this(), cb = std::move(cb), id](StatusOr<Reply> r) mutable {
      if (r.ok() && r->IsErrorWithPrefix("READONLY")) {
        // Demoted: the call did not run. Find the master; this call fails.
        self->RequestDiscovery(false);
        std::string what;
        {
          LockGuard lock(self->mu);
          what = self->DescribeLocked(id);
        }
        return cb(Unavailable(what + " is a replica now (READONLY); asking the sentinels"));
      }
      if (!r.ok() && r.status().code() != StatusCode::kResourceExhausted) {
        self->RequestDiscovery(false);
      }
      cb(std::move(r));
    });
  }

  // Why calls fail while no master is known: the last discovery's failure.
  Status NoMasterStatus() {
    std::string why;
    {
      LockGuard lock(mu);
      why = last_error;
    }
    return Unavailable("redis sentinel: no master of '" + options.master_name + "' known yet" +
                       (why.empty() ? " (the first discovery is under way)" : ": " + why));
  }

  void Report(EndpointEvent::Kind kind, std::string message) {
    LockGuard lock(hooks_mu);
    if (on_event) on_event(EndpointEvent{kind, std::move(message)});
  }

  // ---- discovery ----

  // `now`: skip the rate limit (a sentinel announced a new master).
  void RequestDiscovery(bool now) {
    Clock::duration delay{0};
    {
      LockGuard lock(mu);
      if (closed) return;
      if (discovering) {
        again = true;
        again_now = again_now || now;
        return;
      }
      if (discovery_pending && !now) return;
      discovery_pending = true;
      const Clock::time_point earliest = last_discovery + options.min_discovery_interval;
      const Clock::time_point t = Clock::now();
      if (!now && earliest > t) delay = earliest - t;
    }
    const Clock::time_point at = Clock::now() + delay;
    asio::post(strand, [self = shared_from_this(), at] {
      self->discover_timer.ArmBy(at, [self] { self->StartDiscovery(); });
    });
  }

  void StartDiscovery() {
    size_t first = 0;
    std::optional<NodeAddress> named;
    {
      LockGuard lock(mu);
      if (closed) return;
      discovery_pending = false;
      if (discovering) {
        again = true;  // its time has come: no further wait after this one
        again_now = true;
        return;
      }
      discovering = true;
      again = false;
      again_now = false;
      first = preferred;
      named = std::exchange(announced, std::nullopt);
    }
    if (!named) return Ask(first, 0, "");
    // The sentinel that announced a switch knows the new master; the one we
    // would ask first may still name the old one, which, if it still takes
    // writes (a partition, a manual failover not yet applied to it), would
    // keep us writing where the counts are about to be lost. ROLE decides,
    // as for any sentinel's answer; if it fails, the sentinels are asked.
    Verify(*named, 0, [self = shared_from_this(), first, at = *named](StatusOr<Found> found) {
      if (found.ok()) return self->Finish(*std::move(found), first);
      self->Ask(first, 0, "announced master " + at.ToString() + ": " + found.status().message());
    });
  }

  // Asks sentinel (first + i) % n, and the next ones while they fail.
  void Ask(size_t first, size_t i, const std::string& errors) {
    const size_t n = options.sentinels.size();
    if (i == n) {
      return Finish(
          Unavailable("no sentinel named a master of it that answers as one (" + errors + ")"), 0);
    }
    const size_t at = (first + i) % n;
    std::shared_ptr<Client> sentinel;
    {
      LockGuard lock(mu);
      if (closed) return;
      sentinel = sentinels[at];
    }
    auto next = [self = shared_from_this(), first, i, at, errors](const std::string& why) {
      self->Ask(first, i + 1,
                errors + (errors.empty() ? "" : "; ") + self->options.sentinels[at].ToString() +
                    ": " + why);
    };
    std::string_view args[] = {"SENTINEL", "get-master-addr-by-name", options.master_name};
    sentinel->Execute(
        args,
        [self = shared_from_this(), next, at](StatusOr<Reply> r) {
          if (!r.ok()) return next(r.status().message());
          StatusOr<NodeAddress> named = ParseMasterAddress(*r, self->options.master_name);
          if (!named.ok()) return next(named.status().message());
          self->Verify(*named, 0, [self, next, at](StatusOr<Found> found) {
            if (!found.ok()) return next(found.status().message());
            self->Finish(*std::move(found), at);
          });
        },
        Patience(options.sentinel));
  }

  // ROLE on `address`: a master is found; a replica is followed to the master
  // it names, once (a master demoted by hand before the sentinels noticed).
  void Verify(const NodeAddress& address, int hops, FoundFn done) {
    std::shared_ptr<Client> client;
    bool replaced = false;
    {
      LockGuard lock(mu);
      if (closed) return;
      if (data && nodes[static_cast<size_t>(node)] == address) client = data;
      replaced = last_switch && last_switch->from == address && last_switch->to != address &&
                 Clock::now() - last_switch->at < options.switch_hold;
    }
    if (replaced) {
      // During a planned failover the old master answers ROLE `master` for a
      // while, and the sentinels that have not heard of the switch (they learn
      // it within a hello period, 2 s) still name it: writing there again
      // would lose the counts. The next sentinel is asked; if none names
      // another master, the current one is kept.
      // (No age in the text: a repeated failure is logged once, word for word.)
      return done(Unavailable(address.ToString() +
                              " is the master the last +switch-master replaced (this answer "
                              "has not caught up)"));
    }
    const bool fresh = !client;
    if (fresh) {
      Options o = options.node;
      o.host = address.host;
      o.port = address.port;
      client = std::make_shared<Client>(executor, std::move(o));
    }
    std::string_view role[] = {"ROLE"};
    client->Execute(
        role,
        [self = shared_from_this(), address, hops, client, fresh,
         done = std::move(done)](StatusOr<Reply> r) mutable {
          std::string why;
          if (!r.ok()) {
            why = r.status().message();
          } else if (r->IsArray() && !r->elements.empty() && r->elements[0].str == "master") {
            return done(Found{address, std::move(client)});
          } else if (r->IsErrorWithPrefix("NOPERM")) {
            // A least-privilege ACL user (-@dangerous takes ROLE away): the
            // sentinel's word (or the announcement's) is taken unverified, and
            // a demoted master is noticed by its -READONLY only. Finish warns.
            return done(Found{address, std::move(client), /*verified=*/false});
          } else if (r->IsArray() && r->elements.size() >= 3 && r->elements[0].str == "slave" &&
                     r->elements[2].IsInteger() && hops == 0) {
            if (fresh) client->Close();
            const NodeAddress master{r->elements[1].str,
                                     static_cast<uint16_t>(r->elements[2].integer)};
            return self->Verify(master, hops + 1, std::move(done));
          } else {
            why = "ROLE answered " + r->DebugString();
          }
          if (fresh) client->Close();
          done(Unavailable(address.ToString() + ": " + why));
        },
        Patience(options.node));
  }

  // The end of a discovery: a confirmed master (asked of sentinel `at`), or
  // the failure (the current master, if any, is kept).
  void Finish(StatusOr<Found> found, size_t at) {
    std::shared_ptr<Client> old;
    int replaced = -1;  // the old master's id
    bool adopted = false;
    bool retry = false;
    bool retry_now = false;
    bool warn_role = false;
    std::string was;  // the master before, "" if none
    {
      LockGuard lock(mu);
      discovering = false;
      last_discovery = Clock::now();
      retry = again || node < 0;
      retry_now = again_now;
      again = false;
      again_now = false;
      if (node >= 0) was = nodes[static_cast<size_t>(node)].ToString();
      if (found.ok()) {
        ++discovery_count;
        preferred = at;
        last_error.clear();
        warn_role = !found->verified && !role_warned;
        role_warned = role_warned || warn_role;
        if (closed) {
          old = found->client;
        } else if (found->client != data) {
          old = std::exchange(data, found->client);
          replaced = node;
          adopted = true;
          node = static_cast<int>(nodes.size());
          nodes.push_back(found->address);
          current_node.store(node, std::memory_order_release);
        }
      } else {
        last_error = found.status().message();
      }
    }
    if (old) old->Close();
    if (replaced >= 0) {
      // Its id is never used again: per-node state kept for it (a breaker
      // opened by the failover) must not outlive it.
      LockGuard lock(hooks_mu);
      if (on_dropped) on_dropped(replaced);
    }
    const std::string name = "redis sentinel: master '" + options.master_name + "'";
    if (adopted) {
      Report(EndpointEvent::Kind::kMasterAdopted,
             name + " is " + found->address.ToString() +
                 (was.empty() ? " (found)" : " (was " + was + ")"));
    } else if (!found.ok()) {
      Report(EndpointEvent::Kind::kDiscoveryFailed,
             name + " not found: " + std::string(found.status().message()) +
                 (was.empty() ? "" : "; still using " + was));
    }
    if (warn_role) {
      Report(EndpointEvent::Kind::kWarning,
             "redis sentinel: ROLE is not permitted on " + found->address.ToString() +
                 " (NOPERM): the sentinels' answer is taken unchecked, and a demoted master "
                 "is noticed only by its READONLY replies; grant the data nodes' user +role");
    }
    if (retry) RequestDiscovery(retry_now);
  }

  // ---- the +switch-master subscription ----

  void Subscribe() {
    std::shared_ptr<Client> sub;
    {
      LockGuard lock(mu);
      if (closed || subscription) return;
      const NodeAddress& a = options.sentinels[next_subscription++ % options.sentinels.size()];
      Options o = options.sentinel;
      o.host = a.host;
      o.port = a.port;
      o.connections = 1;
      subscription = sub = std::make_shared<Client>(executor, std::move(o));
    }
    std::weak_ptr<State> weak = shared_from_this();
    const Client* raw = sub.get();
    sub->OnPush([weak, raw](StatusOr<Reply> r) {
      if (auto self = weak.lock()) self->OnPush(raw, std::move(r));
    });
    std::string_view args[] = {"SUBSCRIBE", kSwitchMaster};
    sub->Execute(
        args,
        [weak, raw](StatusOr<Reply> r) {
          auto self = weak.lock();
          if (!self) return;
          if (!r.ok() || r->IsError()) return self->DropSubscription(raw);
          // A switch announced before we listened is missed: ask once more.
          self->RequestDiscovery(false);
        },
        Patience(options.sentinel));
  }

  // A message on the subscription, or (failed) the loss of its connection.
  void OnPush(const Client* from, StatusOr<Reply> r) {
    if (!r.ok()) return DropSubscription(from);
    // ["message", "+switch-master", "<name> <old-ip> <old-port> <new-ip> <new-port>"]
    if (r->elements.size() != 3 || r->elements[1].str != kSwitchMaster) return;
    std::istringstream words(r->elements[2].str);
    std::string name, old_host, new_host;
    int old_port = 0, new_port = 0;
    words >> name >> old_host >> old_port >> new_host >> new_port;
    if (name != options.master_name) return;
    if (words && new_port > 0 && new_port <= 65535 && old_port > 0 && old_port <= 65535) {
      LockGuard lock(mu);
      announced = NodeAddress{new_host, static_cast<uint16_t>(new_port)};
      last_switch =
          Switch{NodeAddress{old_host, static_cast<uint16_t>(old_port)}, *announced, Clock::now()};
    }
    RequestDiscovery(true);
  }

  void DropSubscription(const Client* from) {
    std::shared_ptr<Client> gone;
    {
      LockGuard lock(mu);
      if (subscription.get() != from) return;
      gone = std::move(subscription);
    }
    gone->Close();  // the next check subscribes to the next sentinel
    RequestDiscovery(false);
  }

  // Every check_interval: subscribe if we are not, PING the subscription (a
  // frozen sentinel), look for a master while none is known.
  void Check() {
    std::shared_ptr<Client> sub;
    bool known = false;
    {
      LockGuard lock(mu);
      if (closed) return;
      sub = subscription;
      known = node >= 0;
    }
    if (!sub) {
      Subscribe();
    } else {
      std::string_view ping[] = {"PING"};
      std::weak_ptr<State> weak = shared_from_this();
      const Client* raw = sub.get();
      sub->Execute(
          ping,
          [weak, raw](StatusOr<Reply> r) {
            auto self = weak.lock();
            if (self && (!r.ok() || r->IsError())) self->DropSubscription(raw);
          },
          Patience(options.sentinel));
    }
    if (!known) RequestDiscovery(false);
    check_timer.expires_after(options.check_interval);
    check_timer.async_wait([self = shared_from_this()](boost::system::error_code ec) {
      if (!ec) self->Check();
    });
  }

  void Start() {
    {
      LockGuard lock(mu);
      for (const NodeAddress& a : options.sentinels) {
        Options o = options.sentinel;
        o.host = a.host;
        o.port = a.port;
        o.connections = 1;
        sentinels.push_back(std::make_shared<Client>(executor, std::move(o)));
      }
      // (The data nodes use the same TLS files: this reads them for both.)
      init_status = sentinels.front()->init_status();
      if (!init_status.ok()) return;
    }
    RequestDiscovery(true);
    asio::post(strand, [self = shared_from_this()] { self->Check(); });
  }

  void Close() {
    std::vector<std::shared_ptr<Client>> clients;
    {
      LockGuard lock(mu);
      if (closed) return;
      closed = true;
      clients = std::move(sentinels);
      if (data) clients.push_back(std::move(data));
      if (subscription) clients.push_back(std::move(subscription));
    }
    for (auto& c : clients) c->Close();
    {
      LockGuard lock(hooks_mu);  // waits for a run under way
      on_dropped = nullptr;
      on_event = nullptr;
    }
    asio::post(strand, [self = shared_from_this()] {
      self->discover_timer.Stop();
      self->check_timer.cancel();
    });
  }
};

SentinelClient::SentinelClient(asio::any_io_executor executor, SentinelOptions options)
    : state_(std::make_shared<State>(std::move(executor), std::move(options))) {
  if (state_->options.sentinels.empty() || state_->options.master_name.empty()) {
    state_->init_status = InvalidArgument("redis sentinel: no sentinels or no master name");
    return;
  }
  state_->Start();
}

StatusOr<std::unique_ptr<SentinelClient>> SentinelClient::Create(asio::any_io_executor executor,
                                                                 SentinelOptions options) {
  auto client = std::make_unique<SentinelClient>(std::move(executor), std::move(options));
  if (!client->init_status().ok()) return client->init_status();
  return client;
}

SentinelClient::~SentinelClient() { Close(); }

void SentinelClient::Close() { state_->Close(); }

void SentinelClient::EvalScript(const Script& script, std::span<const std::string_view> keys,
                                std::span<const std::string_view> args, Callback cb,
                                std::chrono::milliseconds timeout) {
  state_->Call(std::move(cb), [&](Client& c, Callback done) {
    c.EvalScript(script, keys, args, std::move(done), timeout);
  });
}

void SentinelClient::EvalScriptWithUndo(const Script& script,
                                        std::span<const std::string_view> keys,
                                        std::span<const std::string_view> args,
                                        std::span<const std::string_view> undo, Callback cb,
                                        std::chrono::milliseconds timeout) {
  state_->Call(std::move(cb), [&](Client& c, Callback done) {
    c.EvalScriptWithUndo(script, keys, args, undo, std::move(done), timeout);
  });
}

void SentinelClient::Execute(std::span<const std::string_view> args, Callback cb,
                             std::chrono::milliseconds timeout) {
  state_->Call(std::move(cb),
               [&](Client& c, Callback done) { c.Execute(args, std::move(done), timeout); });
}

int SentinelClient::NodeForSlot(uint16_t) const {
  return state_->current_node.load(std::memory_order_acquire);
}

std::string SentinelClient::Describe(int node) const {
  LockGuard lock(state_->mu);
  return state_->DescribeLocked(node);
}

std::string SentinelClient::RedactedUrl() const { return redis::RedactedUrl(state_->options); }

void SentinelClient::RequestRefresh() { state_->RequestDiscovery(false); }

void SentinelClient::OnNodeDropped(std::function<void(int node)> handler) {
  LockGuard lock(state_->hooks_mu);
  state_->on_dropped = std::move(handler);
}

void SentinelClient::OnEvent(std::function<void(const EndpointEvent& event)> handler) {
  LockGuard lock(state_->hooks_mu);
  state_->on_event = std::move(handler);
}

std::string SentinelClient::master() const {
  LockGuard lock(state_->mu);
  return state_->node < 0 ? "" : state_->nodes[static_cast<size_t>(state_->node)].ToString();
}

uint64_t SentinelClient::discoveries() const {
  LockGuard lock(state_->mu);
  return state_->discovery_count;
}

const Status& SentinelClient::init_status() const { return state_->init_status; }

}  // namespace ratelimit::redis

namespace ratelimit::redis {

std::optional<Options> SentinelClient::SubscriptionNode(int) const {
  LockGuard lock(state_->mu);
  if (state_->node < 0) return std::nullopt;
  Options o = state_->options.node;
  const NodeAddress& a = state_->nodes[static_cast<size_t>(state_->node)];
  o.host = a.host;
  o.port = a.port;
  return o;
}

}  // namespace ratelimit::redis
