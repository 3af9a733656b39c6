#include "redis/endpoint.h"

#include <algorithm>

#include "redis/client.h"
#include "redis/cluster_client.h"
#include "redis/sentinel_client.h"
#include "redis/url.h"

namespace ratelimit::redis {
namespace {

// The store's tuning, but for what the URL's query gave: that wins.
void Tune(const EndpointTuning& t, Options* o) {
  if (!o->from_url.command_timeout) o->command_timeout = t.command_timeout;
  if (!o->from_url.connections) o->connections = std::max(1, t.connections);
  if (!o->from_url.max_pending) o->max_pending = t.max_pending;
  o->reconnect_max_backoff = t.reconnect_max_backoff;
}

}  // namespace

StatusOr<std::unique_ptr<Endpoint>> OpenEndpoint(boost::asio::any_io_executor executor,
                                                 std::string_view url,
                                                 const EndpointTuning& tuning) {
  if (IsClusterUrl(url)) {
    StatusOr<ClusterOptions> o = ParseClusterUrl(url);
    if (!o.ok()) return o.status();
    Tune(tuning, &o->node);
    StatusOr<std::unique_ptr<ClusterClient>> c =
        ClusterClient::Create(std::move(executor), *std::move(o));
    if (!c.ok()) return c.status();
    return std::unique_ptr<Endpoint>(*std::move(c));
  }
  if (IsSentinelUrl(url)) {
    StatusOr<SentinelOptions> o = ParseSentinelUrl(url);
    if (!o.ok()) return o.status();
    Tune(tuning, &o->node);
    o->sentinel.reconnect_max_backoff = o->node.reconnect_max_backoff;
    StatusOr<std::unique_ptr<SentinelClient>> c =
        SentinelClient::Create(std::move(executor), *std::move(o));
    if (!c.ok()) return c.status();
    return std::unique_ptr<Endpoint>(*std::move(c));
  }
  StatusOr<Options> o = ParseRedisUrl(url);
  if (!o.ok()) return o.status();
  Tune(tuning, &*o);
  o->reconnect_on_readonly = true;
  StatusOr<std::unique_ptr<Client>> c = Client::Create(std::move(executor), *std::move(o));
  if (!c.ok()) return c.status();
  return std::unique_ptr<Endpoint>(*std::move(c));
}

}  // namespace ratelimit::redis
