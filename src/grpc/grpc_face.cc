#include "grpc/grpc_face.h"

#include <sys/inotify.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "envoy/config.h"
#include "envoy/describe.h"
#include "grpc/h2_server.h"
#include "grpc/health/v1/health.pb.h"
#include "grpc/should_rate_limit.h"
#include "ratelimit/thread_annotations.h"
#include "server/enforcer.h"
#include "server/json_log.h"
#include "server/listen_address.h"
#include "server/metrics.h"

namespace ratelimit::grpcface {

namespace hpb = ::grpc::health::v1;
namespace net = boost::asio;
using server::Level;
using server::Log;

namespace {

// A call's request message; false (and the call answered INTERNAL) when it
// does not parse.
template <class Message>
bool ParseRequest(const GrpcCall& call, Message& m) {
  const std::string_view bytes = call.request();
  if (m.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) return true;
  call.Finish(GrpcCode::kInternal, "cannot parse the " + m.GetDescriptor()->name());
  return false;
}

}  // namespace

constexpr char kRateLimitService[] = "envoy.service.ratelimit.v3.RateLimitService";

struct GrpcFace::Impl {
  explicit Impl(net::io_context& io) : ioc(io), signals(io, SIGHUP), debounce(io) {}

  GrpcOptions options;
  std::shared_ptr<Store> store;
  std::unique_ptr<server::Enforcer> enforcer;
  int port = 0;
  // One reload at a time: SIGHUP and the directory watch may fire together
  // on two threads, and the load that read the files last must publish last.
  Mutex reload_mu;
  mutable Mutex config_mu;
  std::shared_ptr<const envoy::Config> current RL_GUARDED_BY(config_mu);
  // Why the last reload failed ("" when it did not), and when (Unix ms).
  std::string reload_error RL_GUARDED_BY(config_mu);
  int64_t reload_error_at_ms RL_GUARDED_BY(config_mu) = 0;

  // Health: SERVING until the shutdown starts; Watch calls hear of the change.
  // Shared with the Watch streams' OnClosed, which may run after the face
  // is gone (a connection closed by the io_context's end).
  struct Health {
    Mutex mu;
    bool serving RL_GUARDED_BY(mu) = true;
    // The open Watch calls, until their stream closes (the client cancels or
    // goes): each holds its connection.
    std::unordered_map<uint64_t, GrpcCall> watchers RL_GUARDED_BY(mu);
    uint64_t last_watcher RL_GUARDED_BY(mu) = 0;
  };
  std::shared_ptr<Health> health = std::make_shared<Health>();

  // The calls, SIGHUP and inotify, on the owner's io_context.
  net::io_context& ioc;
  std::unique_ptr<H2Server> server;
  net::signal_set signals;
  std::unique_ptr<net::posix::stream_descriptor> watch;
  net::steady_timer debounce;
  alignas(inotify_event) char watch_buf[4096];
  // The inotify watches (touched by the watch's read handler only, one at a
  // time): per watch, the names of the path's components it watches ("" for
  // the config directory itself: any change in it).
  std::unordered_map<int, std::vector<std::string>> watches;

  std::shared_ptr<const envoy::Config> Config() const {
    LockGuard lock(config_mu);
    return current;
  }
  void SetConfig(std::shared_ptr<const envoy::Config> c) {
    LockGuard lock(config_mu);
    current = std::move(c);
    reload_error.clear();
    reload_error_at_ms = 0;
  }

  // The loaded domains, for /metrics (the admin listener).
  static void Publish(const envoy::Config& c) {
    std::vector<std::pair<std::string, int64_t>> domains;
    for (const auto& [name, d] : c.domains) domains.emplace_back(name, CountRules(d.root));
    server::Metrics::Global().SetEnvoyDomains(std::move(domains));
  }
  static int64_t CountRules(const envoy::Node& n) {
    int64_t count = n.rules.empty() ? 0 : 1;
    for (const auto& [k, child] : n.children) count += CountRules(child);
    return count;
  }

  Status Reload() {
    if (options.envoy_config_dir.empty()) return Status::Ok();
    LockGuard reloading(reload_mu);
    StatusOr<std::shared_ptr<const envoy::Config>> c =
        envoy::LoadDirectory(options.envoy_config_dir);
    if (!c.ok()) {
      Log(Level::kError, "envoy config not reloaded: the old one stays",
          {{"error", c.status().message()}});
      LockGuard lock(config_mu);
      reload_error = c.status().message();
      reload_error_at_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                               std::chrono::system_clock::now().time_since_epoch())
                               .count();
      return c.status();
    }
    const size_t domains = (*c)->domains.size();
    Publish(**c);
    SetConfig(std::move(*c));
    Log(Level::kInfo, "envoy config loaded",
        {{"dir", options.envoy_config_dir}, {"domains", static_cast<int64_t>(domains)}});
    return Status::Ok();
  }

  void ShouldRateLimit(GrpcCall call) {
    // A reload's store.failure_mode and expected_instances apply to the next
    // call, as on the HTTP faces (the rest of the store section is
    // restart-bound: the policy keeps the running values).
    RlsContext c{.config = Config(), .enforcer = enforcer.get(), .headers = options.headers};
    if (std::shared_ptr<const policy::Policy> policy =
            options.current_policy ? options.current_policy() : nullptr) {
      c.failure_mode =
          options.own_failure_mode ? options.failure_mode : policy->config().store.failure_mode;
      c.store = std::shared_ptr<const policy::StoreConfig>(policy, &policy->config().store);
    } else {
      c.failure_mode = options.failure_mode;
      c.store = std::shared_ptr<const policy::StoreConfig>(std::shared_ptr<void>(), &options.store);
    }
    const std::string_view request = call.request();  // before `call` moves into the answer
    grpcface::ShouldRateLimit(request, std::move(c), [call = std::move(call)](RlsAnswer a) {
      if (a.code == GrpcCode::kOk) return call.Reply(std::move(a.message));
      call.Finish(a.code, std::move(a.message));
    });
  }

  // grpc.health.v1: "" is the server, kRateLimitService its one service.
  static bool Known(const std::string& service) {
    return service.empty() || service == kRateLimitService;
  }
  static std::string HealthAnswer(hpb::HealthCheckResponse::ServingStatus status) {
    hpb::HealthCheckResponse r;
    r.set_status(status);
    return r.SerializeAsString();
  }
  hpb::HealthCheckResponse::ServingStatus Serving() const RL_REQUIRES(health->mu) {
    return health->serving ? hpb::HealthCheckResponse::SERVING
                           : hpb::HealthCheckResponse::NOT_SERVING;
  }
  void Check(const GrpcCall& call) {
    hpb::HealthCheckRequest req;
    if (!ParseRequest(call, req)) return;
    if (!Known(req.service())) return call.Finish(GrpcCode::kNotFound, "unknown service");
    LockGuard lock(health->mu);
    call.Reply(HealthAnswer(Serving()));
  }
  void Watch(const GrpcCall& call) {
    hpb::HealthCheckRequest req;
    if (!ParseRequest(call, req)) return;
    // An unknown service is SERVICE_UNKNOWN and the stream stays open (the
    // protocol's rule: the service may appear later). Here it never does.
    uint64_t id = 0;
    {
      LockGuard lock(health->mu);
      call.Write(HealthAnswer(Known(req.service()) ? Serving()
                                                   : hpb::HealthCheckResponse::SERVICE_UNKNOWN));
      if (!health->serving) return call.Finish(GrpcCode::kOk);
      id = ++health->last_watcher;
      health->watchers.emplace(id, call);
    }
    // Outside the lock: it runs at once on a stream already closed.
    call.OnClosed([weak = std::weak_ptr<Health>(health), id] {
      const std::shared_ptr<Health> h = weak.lock();
      if (!h) return;
      decltype(h->watchers)::node_type gone;  // dropped after the lock
      LockGuard lock(h->mu);
      gone = h->watchers.extract(id);
    });
  }

  // SIGHUP (the owner's drain, not a signal of ours, starts the shutdown).
  void WaitForSignal() {
    signals.async_wait([this](const boost::system::error_code& ec, int) {
      if (ec) return;
      (void)Reload();
      WaitForSignal();
    });
  }

  // Watches the config directory by its path, not the directory first
  // found there: the directory itself, and each directory on the way to it
  // for the name of the next step. So a symlink on the way swapped for
  // another (envoyproxy/ratelimit's RUNTIME_ROOT deployment with
  // RUNTIME_WATCH_ROOT: `current -> v2` renamed over `current -> v1`), or
  // the directory renamed or replaced, moves the watch to what the path
  // names now, and reloads. Watches nothing that is gone.
  void Rewatch() {
    namespace fs = std::filesystem;
    const int fd = watch->native_handle();
    std::error_code ec;
    fs::path dir = fs::absolute(options.envoy_config_dir, ec).lexically_normal();
    if (!dir.has_filename()) dir = dir.parent_path();  // "conf/" (and "/")
    constexpr uint32_t kSteps = IN_CREATE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE |
                                IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR | IN_MASK_ADD;
    constexpr uint32_t kDir = kSteps | IN_CLOSE_WRITE;
    std::unordered_map<int, std::vector<std::string>> now;
    if (const int wd = inotify_add_watch(fd, dir.c_str(), kDir); wd >= 0) now[wd].emplace_back();
    fs::path step = dir;
    for (fs::path up = dir.parent_path(); !step.filename().empty(); up = up.parent_path()) {
      if (const int wd = inotify_add_watch(fd, up.c_str(), kSteps); wd >= 0)
        now[wd].push_back(step.filename().string());
      if (up == up.parent_path()) break;  // the root
      step = up;
    }
    for (const auto& [wd, names] : watches) {
      if (!now.contains(wd)) inotify_rm_watch(fd, wd);  // its IN_IGNORED is not ours
    }
    watches = std::move(now);
  }

  // What the events read say: reload (a change in the directory), and
  // whether the path now names another directory (a step of it changed, or
  // a watch ended).
  struct Seen {
    bool reload = false, rewatch = false;
  };
  Seen Events(size_t n) const {
    Seen seen;
    for (size_t at = 0; at + sizeof(inotify_event) <= n;) {
      inotify_event e;
      std::memcpy(&e, watch_buf + at, sizeof e);
      const std::string_view name(watch_buf + at + sizeof e,
                                  e.len == 0 ? 0 : strnlen(watch_buf + at + sizeof e, e.len));
      at += sizeof e + e.len;
      if ((e.mask & IN_Q_OVERFLOW) != 0) {
        seen.reload = seen.rewatch = true;
        continue;
      }
      const auto it = watches.find(e.wd);
      if (it == watches.end()) continue;
      const bool ended = (e.mask & (IN_IGNORED | IN_DELETE_SELF | IN_MOVE_SELF)) != 0;
      for (const std::string& step : it->second) {
        if (ended || (!step.empty() && step == name)) {
          seen.reload = seen.rewatch = true;
        } else if (step.empty()) {
          seen.reload = true;  // a file of the directory
        }
      }
    }
    return seen;
  }

  void WatchDir() {
    watch->async_read_some(net::buffer(watch_buf),
                           [this](const boost::system::error_code& ec, size_t n) {
                             if (ec) return;
                             const Seen seen = Events(n);
                             if (seen.rewatch) Rewatch();
                             if (seen.reload) {
                               debounce.expires_after(std::chrono::milliseconds(100));
                               debounce.async_wait([this](const boost::system::error_code& e) {
                                 if (!e) (void)Reload();
                               });
                             }
                             WatchDir();
                           });
  }

  // Health turns NOT_SERVING (Watch calls hear it and end), the listener
  // closes, and every connection gets GOAWAY: calls in flight finish.
  // Non-blocking; any thread; idempotent.
  void BeginShutdown() {
    std::unordered_map<uint64_t, GrpcCall> ending;
    {
      LockGuard lock(health->mu);
      if (!health->serving) return;
      health->serving = false;
      ending.swap(health->watchers);
    }
    for (const auto& [id, w] : ending) {
      w.Write(HealthAnswer(hpb::HealthCheckResponse::NOT_SERVING));
      w.Finish(GrpcCode::kOk);
    }
    server->Drain();
  }
};

GrpcFace::GrpcFace(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

StatusOr<std::unique_ptr<GrpcFace>> GrpcFace::Start(GrpcOptions options,
                                                    std::shared_ptr<Store> store,
                                                    net::io_context& ioc) {
  LogProtobufThroughJsonLog();
  auto impl = std::make_unique<Impl>(ioc);
  impl->options = std::move(options);
  impl->store = store;
  impl->enforcer = std::make_unique<server::Enforcer>(store, impl->options.store.local_max_keys);
  std::shared_ptr<const envoy::Config> initial = std::make_shared<envoy::Config>();
  if (!impl->options.envoy_config_dir.empty()) {
    StatusOr<std::shared_ptr<const envoy::Config>> c =
        envoy::LoadDirectory(impl->options.envoy_config_dir);
    if (!c.ok()) return c.status();
    initial = std::move(*c);
    Impl::Publish(*initial);
    const int fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (fd >= 0) {
      impl->watch = std::make_unique<net::posix::stream_descriptor>(impl->ioc, fd);
      impl->Rewatch();
      impl->WatchDir();
    }
  }
  impl->SetConfig(initial);  // before the server and the threads start
  impl->server = std::make_unique<H2Server>(impl->ioc, H2ServerOptions{});
  Impl* raw = impl.get();
  impl->server->Handle(std::string("/") + kRateLimitService + "/ShouldRateLimit",
                       [raw](GrpcCall call) { raw->ShouldRateLimit(std::move(call)); });
  impl->server->Handle("/grpc.health.v1.Health/Check",
                       [raw](const GrpcCall& call) { raw->Check(call); });
  impl->server->Handle("/grpc.health.v1.Health/Watch",
                       [raw](const GrpcCall& call) { raw->Watch(call); });
  StatusOr<net::ip::tcp::endpoint> endpoint =
      server::ResolveListenAddress(impl->ioc, impl->options.listen);
  if (!endpoint.ok()) return endpoint.status();
  if (Status s = impl->server->Listen(*endpoint); !s.ok()) return s;
  impl->port = impl->server->port();
  impl->WaitForSignal();
  Log(Level::kInfo, "gRPC listening",
      {{"addr", impl->options.listen},
       {"port", static_cast<int64_t>(impl->port)},
       {"envoy_config", impl->options.envoy_config_dir},
       {"domains", static_cast<int64_t>(initial->domains.size())}});
  return std::unique_ptr<GrpcFace>(new GrpcFace(std::move(impl)));
}

GrpcFace::~GrpcFace() { Shutdown(); }

int GrpcFace::port() const { return impl_->port; }

Status GrpcFace::Reload() { return impl_->Reload(); }

std::shared_ptr<const envoy::Config> GrpcFace::config() const { return impl_->Config(); }

nlohmann::json GrpcFace::Describe() const {
  std::shared_ptr<const envoy::Config> c;
  nlohmann::json reload = {{"ok", true}};
  {
    LockGuard lock(impl_->config_mu);
    c = impl_->current;
    if (!impl_->reload_error.empty()) {
      reload = {{"ok", false},
                {"error", impl_->reload_error},
                {"at_unix_ms", impl_->reload_error_at_ms},
                {"note", "the domains below are the last config that loaded"}};
    }
  }
  nlohmann::json j = envoy::Describe(*c);
  j["config_dir"] = impl_->options.envoy_config_dir;
  j["last_reload"] = std::move(reload);
  return j;
}

void GrpcFace::Drain() { impl_->BeginShutdown(); }

size_t GrpcFace::connections() const { return impl_->server->connections(); }

size_t GrpcFace::watchers() const {
  LockGuard lock(impl_->health->mu);
  return impl_->health->watchers.size();
}

void GrpcFace::Shutdown() {
  if (!impl_) return;
  impl_->BeginShutdown();  // both idempotent
  impl_->server->Stop();
}

Status CheckEnvoyConfig(const std::string& dir) { return envoy::LoadDirectory(dir).status(); }

}  // namespace ratelimit::grpcface
