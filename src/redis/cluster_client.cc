#include "redis/cluster_client.h"

#include <algorithm>

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>

#include "core/steady_clock.h"
#include "ratelimit/thread_annotations.h"
#include "redis/cluster_slots.h"
#include "redis/earliest_timer.h"
#include "redis/slot.h"

namespace ratelimit::redis {

namespace asio = boost::asio;
using Clock = core::SteadyClock;
using std::chrono::milliseconds;

namespace {

// One call on its way through redirections and retries.
struct Call {
  const Script* script = nullptr;  // nullptr: a plain command
  std::vector<std::string> words;  // the command, or (script) the keys then the args
  size_t num_keys = 0;             // script only
  std::vector<std::string> undo;   // script only: EvalScriptWithUndo's
  uint16_t slot = 0;
  Clock::time_point deadline;
  int redirects = 0;
  int retries = 0;
  Callback cb;
};
using CallPtr = std::unique_ptr<Call>;

milliseconds Remaining(Clock::time_point deadline, Clock::time_point now) {
  return std::max(milliseconds(1), std::chrono::ceil<milliseconds>(deadline - now));
}

}  // namespace

struct ClusterClient::State : std::enable_shared_from_this<State> {
  struct Node {
    NodeAddress address;
    // Created on first use. Guarded by State::mu, which the analysis cannot
    // name from here: every Node is reached through `nodes` (RL_GUARDED_BY).
    // Shared with the calls on it, so that dropping it cannot pull it from
    // under one.
    std::shared_ptr<Client> client;
    bool seed = false;  // never dropped: the refresh's last resort
    int absent = 0;     // consecutive slot maps without it (nor a call sent to it)
    bool gone = false;  // dropped (a tombstone); its address again revives it
  };
  // A node absent from this many consecutive slot maps, and sent no call
  // meanwhile, is dropped: its Client is closed.
  static constexpr int kDropAfterMaps = 3;

  State(asio::any_io_executor ex, ClusterOptions o)
      : options(std::move(o)),
        executor(std::move(ex)),
        strand(asio::make_strand(executor)),
        refresh_timer(strand),
        park_timer(strand) {}

  const ClusterOptions options;
  Status init_status;
  asio::any_io_executor executor;
  asio::strand<asio::any_io_executor> strand;

  mutable Mutex mu;
  bool closed RL_GUARDED_BY(mu) = false;
  // Append-only, ids are indexes.
  std::vector<std::unique_ptr<Node>> nodes RL_GUARDED_BY(mu);
  std::vector<int> slot_node RL_GUARDED_BY(mu) = std::vector<int>(kClusterSlots, -1);
  bool has_map RL_GUARDED_BY(mu) = false;
  bool refreshing RL_GUARDED_BY(mu) = false;
  bool refresh_again RL_GUARDED_BY(mu) = false;
  bool refresh_pending RL_GUARDED_BY(mu) = false;  // a requested refresh is scheduled
  Clock::time_point last_refresh RL_GUARDED_BY(mu);
  uint64_t refresh_count RL_GUARDED_BY(mu) = 0;
  uint32_t refresh_rotation RL_GUARDED_BY(mu) = 0;
  std::vector<CallPtr> parked RL_GUARDED_BY(mu);  // calls waiting for the first map
  Mutex dropped_mu;  // held while the handler runs, so Close() can take it away
  std::function<void(int)> on_dropped RL_GUARDED_BY(dropped_mu);

  // Strand-only.
  EarliestTimer refresh_timer;
  EarliestTimer park_timer;

  // ---- nodes ----

  // The id of `a`: its own, also when it was dropped (it is revived), or a new one.
  int NodeIndexLocked(const NodeAddress& a) RL_REQUIRES(mu) {
    for (size_t i = 0; i < nodes.size(); ++i) {
      if (nodes[i]->address == a) {
        nodes[i]->gone = false;
        nodes[i]->absent = 0;
        return static_cast<int>(i);
      }
    }
    nodes.push_back(std::make_unique<Node>(Node{.address = a}));
    return static_cast<int>(nodes.size() - 1);
  }

  // 0 <= id < nodes.size().
  std::shared_ptr<Client> ClientLocked(int id) RL_REQUIRES(mu) {
    Node& n = *nodes[static_cast<size_t>(id)];
    if (!n.client) {
      Options o = options.node;
      o.host = n.address.host;
      o.port = n.address.port;
      n.client = std::make_shared<Client>(executor, std::move(o));
    }
    return n.client;
  }

  void FailSoon(CallPtr call, Status status) {
    asio::post(executor, [call = std::move(call), status = std::move(status)]() mutable {
      call->cb(std::move(status));
    });
  }

  // ---- calls ----

  // A new call from the API: to the slot's owner, or failed (soon) when the
  // client never started.
  void Start(CallPtr call) {
    if (!init_status.ok()) return FailSoon(std::move(call), init_status);
    Send(std::move(call), -1, false);
  }

  // Sends `call` to `node` (with ASKING first when `asking`), or to the slot's
  // owner when node < 0.
  void Send(CallPtr call, int node, bool asking) {
    const Clock::time_point now = Clock::now();
    if (now >= call->deadline) {
      return FailSoon(std::move(call),
                      DeadlineExceeded("redis cluster: deadline passed while following "
                                       "redirections (the command did not run)"));
    }
    std::shared_ptr<Client> client;
    std::string node_name;
    {
      UniqueLock lock(mu);
      if (closed) {
        lock.unlock();
        return FailSoon(std::move(call), Unavailable("redis cluster client closed"));
      }
      if (node < 0) {
        if (!has_map) {
          const Clock::time_point deadline = call->deadline;
          parked.push_back(std::move(call));
          lock.unlock();
          WatchParked(deadline);
          RequestRefresh();
          return;
        }
        node = slot_node[call->slot];
      }
      if (node >= 0) {
        // A node a call goes to (a MOVED or ASK target too) is not dropped.
        Node& n = *nodes[static_cast<size_t>(node)];
        n.gone = false;
        n.absent = 0;
        client = ClientLocked(node);
      }
    }
    if (client == nullptr) {
      RequestRefresh();
      const uint16_t slot = call->slot;
      return FailSoon(std::move(call), Unavailable("redis cluster: no master serves slot " +
                                                   std::to_string(slot) + " in the slot map"));
    }
    const milliseconds timeout = Remaining(call->deadline, now);
    std::vector<std::string_view> views(call->words.begin(), call->words.end());
    Call& c = *call;
    Callback done = [self = shared_from_this(), call = std::move(call),
                     node](StatusOr<Reply> r) mutable {
      self->OnReply(std::move(call), node, std::move(r));
    };
    if (c.script != nullptr) {
      std::span<const std::string_view> all(views);
      auto keys = all.first(c.num_keys);
      auto args = all.subspan(c.num_keys);
      // The undo goes with the call to the node it is sent to: there, after it.
      const std::vector<std::string_view> undo(c.undo.begin(), c.undo.end());
      if (asking) {
        client->EvalScriptAsking(*c.script, keys, args, std::move(done), timeout, undo);
      } else {
        client->EvalScriptWithUndo(*c.script, keys, args, undo, std::move(done), timeout);
      }
    } else if (asking) {
      client->ExecuteAsking(views, std::move(done), timeout);
    } else {
      client->Execute(views, std::move(done), timeout);
    }
  }

  void OnReply(CallPtr call, int node, StatusOr<Reply> r) {
    if (!r.ok()) {
      // Outcome unknown (or the node is unreachable): never replayed. The map
      // may be stale (a failover): look again.
      if (r.status().code() != StatusCode::kResourceExhausted) RequestRefresh();
      return call->cb(std::move(r));
    }
    if (!r->IsError()) return call->cb(std::move(r));
    const std::string& e = r->str;
    if (e.starts_with("MOVED ") || e.starts_with("ASK ")) {
      std::string asked_host;
      {
        LockGuard lock(mu);
        asked_host = nodes[static_cast<size_t>(node)]->address.host;
      }
      StatusOr<Redirect> redirect = ParseRedirect(e, asked_host);
      if (!redirect.ok()) return call->cb(redirect.status());
      if (++call->redirects > options.max_redirects) {
        return call->cb(Unavailable(
            "redis cluster: more than " + std::to_string(options.max_redirects) +
            " redirections for slot " + std::to_string(call->slot) + " (last: " + e + ")"));
      }
      int to = 0;
      {
        LockGuard lock(mu);
        to = NodeIndexLocked(redirect->to);
        if (redirect->kind == Redirect::kMoved) slot_node[redirect->slot] = to;
      }
      if (redirect->kind == Redirect::kMoved) RequestRefresh();
      return Send(std::move(call), to, /*asking=*/redirect->kind == Redirect::kAsk);
    }
    const bool tryagain = e.starts_with("TRYAGAIN");
    if (tryagain || e.starts_with("CLUSTERDOWN")) {
      if (!tryagain) RequestRefresh();
      const milliseconds base = tryagain ? milliseconds(5) : milliseconds(25);
      const milliseconds backoff =
          std::min(milliseconds(100), base * (1 << std::min(call->retries, 5)));
      ++call->retries;
      if (Clock::now() + backoff >= call->deadline) {
        return call->cb(Unavailable("redis cluster: " + e));
      }
      auto timer = std::make_shared<asio::steady_timer>(executor, backoff);
      timer->async_wait([self = shared_from_this(), timer,
                         call = std::move(call)](boost::system::error_code) mutable {
        self->Send(std::move(call), -1, false);
      });
      return;
    }
    call->cb(std::move(r));  // any other error reply is the caller's answer
  }

  // ---- calls parked until the first map ----

  void WatchParked(Clock::time_point deadline) {
    asio::post(strand, [self = shared_from_this(), deadline] {
      self->park_timer.ArmBy(deadline, [self] { self->ExpireParked(); });
    });
  }

  // On the strand: fails parked calls whose deadline passed, watches the next.
  void ExpireParked() {
    const Clock::time_point now = Clock::now();
    std::vector<CallPtr> expired;
    Clock::time_point next = Clock::time_point::max();
    {
      LockGuard lock(mu);
      auto keep = std::partition(parked.begin(), parked.end(),
                                 [&](const CallPtr& c) { return c->deadline > now; });
      for (auto it = keep; it != parked.end(); ++it) expired.push_back(std::move(*it));
      parked.erase(keep, parked.end());
      for (const CallPtr& c : parked) next = std::min(next, c->deadline);
    }
    for (CallPtr& c : expired) {
      FailSoon(std::move(c), DeadlineExceeded("redis cluster: no slot map within the deadline"));
    }
    if (next != Clock::time_point::max()) WatchParked(next);
  }

  // ---- slot map refresh ----

  void RequestRefresh() {
    Clock::duration delay{0};
    {
      LockGuard lock(mu);
      if (closed) return;
      if (refreshing) {
        refresh_again = true;
        return;
      }
      if (refresh_pending) return;  // cheap when called on every failed call
      refresh_pending = true;
      const Clock::time_point earliest = last_refresh + options.min_refresh_interval;
      const Clock::time_point now = Clock::now();
      if (earliest > now) delay = earliest - now;
    }
    ScheduleRefresh(delay);
  }

  // Makes sure a refresh starts within `delay`.
  void ScheduleRefresh(Clock::duration delay) {
    const Clock::time_point at = Clock::now() + delay;
    asio::post(strand, [self = shared_from_this(), at] {
      self->refresh_timer.ArmBy(at, [self] { self->StartRefresh(); });
    });
  }

  void StartRefresh() {
    auto candidates = std::make_shared<std::vector<int>>();
    {
      LockGuard lock(mu);
      if (closed) return;
      refresh_pending = false;
      if (refreshing) {
        refresh_again = true;
        return;
      }
      refreshing = true;
      refresh_again = false;
      // Masters of the current map first, then every other node (the seeds).
      std::vector<bool> is_master(nodes.size(), false);
      for (int n : slot_node) {
        if (n >= 0) is_master[static_cast<size_t>(n)] = true;
      }
      for (int pass = 0; pass < 2; ++pass) {
        std::vector<int> group;
        for (size_t i = 0; i < nodes.size(); ++i) {
          if (is_master[i] == (pass == 0) && !nodes[i]->gone) group.push_back(static_cast<int>(i));
        }
        if (!group.empty()) {
          std::rotate(group.begin(),
                      group.begin() + static_cast<ptrdiff_t>(refresh_rotation % group.size()),
                      group.end());
        }
        candidates->insert(candidates->end(), group.begin(), group.end());
      }
      ++refresh_rotation;
    }
    TryRefresh(std::move(candidates), 0, "");
  }

  void TryRefresh(std::shared_ptr<std::vector<int>> candidates, size_t i, std::string errors) {
    if (i == candidates->size()) {
      return FinishRefresh(Unavailable("redis cluster: no node gave a slot map (" + errors + ")"));
    }
    std::shared_ptr<Client> client;
    NodeAddress address;
    {
      LockGuard lock(mu);
      if (closed) return FinishRefresh(Unavailable("redis cluster client closed"));
      client = ClientLocked((*candidates)[i]);
      address = nodes[static_cast<size_t>((*candidates)[i])]->address;
    }
    const milliseconds timeout =
        std::max(options.node.connect_timeout, options.node.command_timeout);
    std::string_view shards[] = {"CLUSTER", "SHARDS"};
    client->Execute(
        shards,
        [self = shared_from_this(), candidates, i, errors = std::move(errors), client, address,
         timeout](StatusOr<Reply> r) mutable {
          auto next = [&](const std::string& why) {
            if (!errors.empty()) errors += "; ";
            errors += address.ToString() + ": " + why;
            self->TryRefresh(std::move(candidates), i + 1, std::move(errors));
          };
          if (!r.ok()) return next(r.status().message());
          if (!r->IsError()) {
            auto map = ParseClusterShards(*r, self->options.node.tls, address.host);
            if (map.ok()) return self->FinishRefresh(*std::move(map));
            return next(map.status().message());
          }
          // No CLUSTER SHARDS (before Redis 7.0): CLUSTER SLOTS on the same node.
          std::string_view slots[] = {"CLUSTER", "SLOTS"};
          client->Execute(
              slots,
              [self, candidates = std::move(candidates), i, errors = std::move(errors),
               address](StatusOr<Reply> r) mutable {
                std::string why;
                if (!r.ok()) {
                  why = r.status().message();
                } else if (r->IsError()) {
                  why = r->str;
                } else {
                  auto map = ParseClusterSlots(*r, address.host);
                  if (map.ok()) return self->FinishRefresh(*std::move(map));
                  why = map.status().message();
                }
                if (!errors.empty()) errors += "; ";
                errors += address.ToString() + ": " + why;
                self->TryRefresh(std::move(candidates), i + 1, std::move(errors));
              },
              timeout);
        },
        timeout);
  }

  void FinishRefresh(StatusOr<std::vector<SlotRange>> map) {
    std::vector<CallPtr> waiting;
    std::vector<std::pair<int, std::shared_ptr<Client>>> dropped;
    bool again = false;
    {
      LockGuard lock(mu);
      refreshing = false;
      last_refresh = Clock::now();
      again = refresh_again || !map.ok();
      refresh_again = false;
      if (map.ok()) {
        std::vector<int> fresh(kClusterSlots, -1);
        for (const SlotRange& r : *map) {
          const int id = NodeIndexLocked(r.master);
          std::fill(fresh.begin() + r.first, fresh.begin() + r.last + 1, id);
        }
        slot_node.swap(fresh);
        has_map = true;
        ++refresh_count;
        // Nodes the map no longer names (pod churn, a failed-over master
        // gone for good) are dropped after kDropAfterMaps maps, so that
        // every address ever seen does not keep sockets reconnecting.
        std::vector<bool> named(nodes.size(), false);
        for (int n : slot_node) {
          if (n >= 0) named[static_cast<size_t>(n)] = true;
        }
        for (size_t i = 0; i < nodes.size(); ++i) {
          Node& n = *nodes[i];
          if (named[i] || n.seed) {
            n.absent = 0;
          } else if (!n.gone && ++n.absent >= kDropAfterMaps) {
            n.gone = true;
            dropped.emplace_back(static_cast<int>(i), std::move(n.client));
          }
        }
      }
      if (closed) return;  // Close() failed the parked calls
      if (map.ok() || !has_map) waiting.swap(parked);
    }
    for (auto& [id, client] : dropped) {
      if (client) client->Close();  // calls still on it fail; the last holder frees it
      LockGuard lock(dropped_mu);
      if (on_dropped) on_dropped(id);
    }
    for (CallPtr& c : waiting) {
      if (map.ok()) {
        Send(std::move(c), -1, false);
      } else {
        FailSoon(std::move(c), map.status());
      }
    }
    ScheduleRefresh(options.refresh_interval);
    if (again) RequestRefresh();
  }

  void Close() {
    std::vector<CallPtr> waiting;
    {
      LockGuard lock(mu);
      if (closed) return;
      closed = true;
      waiting.swap(parked);
      for (auto& n : nodes) {
        if (n->client) n->client->Close();
      }
    }
    {
      LockGuard lock(dropped_mu);
      on_dropped = nullptr;
    }
    for (CallPtr& c : waiting) FailSoon(std::move(c), Unavailable("redis cluster client closed"));
    asio::post(strand, [self = shared_from_this()] {
      self->refresh_timer.Stop();
      self->park_timer.Stop();
    });
  }
};

ClusterClient::ClusterClient(asio::any_io_executor executor, ClusterOptions options)
    : state_(std::make_shared<State>(std::move(executor), std::move(options))) {
  State& s = *state_;
  if (s.options.seeds.empty()) {
    s.init_status = InvalidArgument("redis cluster: no seed nodes");
    return;
  }
  if (s.options.max_redirects < 0 || s.options.min_refresh_interval.count() < 0 ||
      s.options.refresh_interval.count() <= 0) {
    s.init_status = InvalidArgument(
        "redis cluster options: need max_redirects >= 0, min_refresh_interval >= 0, "
        "refresh_interval > 0");
    return;
  }
  {
    LockGuard lock(s.mu);
    for (const NodeAddress& seed : s.options.seeds) {
      const int id = s.NodeIndexLocked(seed);
      s.nodes[static_cast<size_t>(id)]->seed = true;
      s.ClientLocked(id);
    }
    s.init_status = s.nodes.front()->client->init_status();
  }
  if (!s.init_status.ok()) return;
  s.ScheduleRefresh(Clock::duration::zero());
}

StatusOr<std::unique_ptr<ClusterClient>> ClusterClient::Create(asio::any_io_executor executor,
                                                               ClusterOptions options) {
  auto client = std::make_unique<ClusterClient>(std::move(executor), std::move(options));
  if (!client->init_status().ok()) return client->init_status();
  return client;
}

ClusterClient::~ClusterClient() { Close(); }

void ClusterClient::Close() { state_->Close(); }

void ClusterClient::Execute(std::span<const std::string_view> args, Callback cb,
                            std::chrono::milliseconds timeout) {
  auto call = std::make_unique<Call>();
  call->words.assign(args.begin(), args.end());
  call->slot = args.size() >= 2 ? KeySlot(args[1]) : 0;
  call->deadline = Clock::now() + timeout;
  call->cb = std::move(cb);
  state_->Start(std::move(call));
}

void ClusterClient::Execute(const std::vector<std::string>& args, Callback cb) {
  std::vector<std::string_view> views(args.begin(), args.end());
  Execute(views, std::move(cb), state_->options.node.command_timeout);
}

namespace {

// EVALSHA of `script` on `keys` then `args`, routed by `slot`.
CallPtr ScriptCall(const Script& script, uint16_t slot, std::span<const std::string_view> keys,
                   std::span<const std::string_view> args, Callback cb,
                   std::chrono::milliseconds timeout) {
  auto call = std::make_unique<Call>();
  call->script = &script;
  call->words.reserve(keys.size() + args.size());
  call->words.assign(keys.begin(), keys.end());
  call->words.insert(call->words.end(), args.begin(), args.end());
  call->num_keys = keys.size();
  call->slot = slot;
  call->deadline = Clock::now() + timeout;
  call->cb = std::move(cb);
  return call;
}

}  // namespace

void ClusterClient::EvalScript(const Script& script, std::span<const std::string_view> keys,
                               std::span<const std::string_view> args, Callback cb,
                               std::chrono::milliseconds timeout) {
  const uint16_t slot = keys.empty() ? 0 : KeySlot(keys[0]);
  state_->Start(ScriptCall(script, slot, keys, args, std::move(cb), timeout));
}

void ClusterClient::EvalScriptWithUndo(const Script& script, std::span<const std::string_view> keys,
                                       std::span<const std::string_view> args,
                                       std::span<const std::string_view> undo, Callback cb,
                                       std::chrono::milliseconds timeout) {
  const uint16_t slot = keys.empty() ? 0 : KeySlot(keys[0]);
  CallPtr call = ScriptCall(script, slot, keys, args, std::move(cb), timeout);
  call->undo.assign(undo.begin(), undo.end());
  state_->Start(std::move(call));
}

void ClusterClient::EvalScriptOnNode(const Script& script, uint16_t slot,
                                     std::span<const std::string_view> args, Callback cb,
                                     std::chrono::milliseconds timeout) {
  state_->Start(ScriptCall(script, static_cast<uint16_t>(slot % kClusterSlots), {}, args,
                           std::move(cb), timeout));
}

int ClusterClient::NodeForSlot(uint16_t slot) const {
  LockGuard lock(state_->mu);
  return state_->has_map ? state_->slot_node[slot % kClusterSlots] : -1;
}

std::string ClusterClient::NodeName(int node) const {
  LockGuard lock(state_->mu);
  return state_->nodes.at(static_cast<size_t>(node))->address.ToString();
}

std::string ClusterClient::Describe(int node) const {
  return node < 0 ? "redis " + RedactedUrl() : "redis node " + NodeName(node);
}

std::string ClusterClient::RedactedUrl() const { return redis::RedactedUrl(state_->options); }

int ClusterClient::node_count() const {
  LockGuard lock(state_->mu);
  return static_cast<int>(state_->nodes.size());
}

int ClusterClient::live_node_count() const {
  LockGuard lock(state_->mu);
  return static_cast<int>(std::count_if(state_->nodes.begin(), state_->nodes.end(),
                                        [](const auto& n) { return !n->gone; }));
}

void ClusterClient::OnNodeDropped(std::function<void(int node)> handler) {
  LockGuard lock(state_->dropped_mu);
  state_->on_dropped = std::move(handler);
}

bool ClusterClient::has_slot_map() const {
  LockGuard lock(state_->mu);
  return state_->has_map;
}

void ClusterClient::RequestRefresh() { state_->RequestRefresh(); }

uint64_t ClusterClient::refreshes() const {
  LockGuard lock(state_->mu);
  return state_->refresh_count;
}

const ClusterOptions& ClusterClient::options() const { return state_->options; }
const Status& ClusterClient::init_status() const { return state_->init_status; }

}  // namespace ratelimit::redis

namespace ratelimit::redis {

std::optional<Options> ClusterClient::SubscriptionNode(int attempt) const {
  LockGuard lock(state_->mu);
  Options o = state_->options.node;
  const auto n = static_cast<size_t>(std::max(attempt, 0));
  if (state_->has_map) {
    const int node = state_->slot_node[(n * 5461) % kClusterSlots];
    if (node >= 0) {
      const NodeAddress& a = state_->nodes[static_cast<size_t>(node)]->address;
      o.host = a.host;
      o.port = a.port;
      return o;
    }
  }
  if (state_->options.seeds.empty()) return std::nullopt;
  const NodeAddress& seed = state_->options.seeds[n % state_->options.seeds.size()];
  o.host = seed.host;
  o.port = seed.port;
  return o;
}

}  // namespace ratelimit::redis
