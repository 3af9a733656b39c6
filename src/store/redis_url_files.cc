// RedisUrlFiles, CheckRedisTlsFiles (include/ratelimit/redis_store.h): what
// `--check-config` and the start need of a Redis URL, without connecting.
#include "ratelimit/redis_store.h"
#include "redis/client.h"
#include "redis/url.h"

namespace ratelimit {
namespace {

// The node options of any URL the stores accept (a cluster's seed nodes
// share them).
StatusOr<redis::Options> NodeOptions(std::string_view url) {
  if (redis::IsClusterUrl(url)) {
    StatusOr<redis::ClusterOptions> c = redis::ParseClusterUrl(url);
    if (!c.ok()) return c.status();
    return c->node;
  }
  if (redis::IsSentinelUrl(url)) {
    StatusOr<redis::SentinelOptions> s = redis::ParseSentinelUrl(url);
    if (!s.ok()) return s.status();
    return s->node;
  }
  return redis::ParseRedisUrl(url);
}

}  // namespace

StatusOr<std::vector<RedisUrlFile>> RedisUrlFiles(std::string_view url) {
  StatusOr<redis::Options> o = NodeOptions(url);
  if (!o.ok()) return o.status();
  std::vector<RedisUrlFile> files;
  if (!o->tls_ca_file.empty()) files.push_back({"store.url tls_ca_file", o->tls_ca_file, false});
  if (!o->tls_cert_file.empty()) {
    files.push_back({"store.url tls_cert_file", o->tls_cert_file, false});
  }
  if (!o->tls_key_file.empty()) files.push_back({"store.url tls_key_file", o->tls_key_file, true});
  return files;
}

Status CheckRedisTlsFiles(std::string_view url) {
  StatusOr<redis::Options> o = NodeOptions(url);
  if (!o.ok()) return o.status();
  return redis::CheckTlsFiles(*o);
}

}  // namespace ratelimit
