// Options for a Redis client and the `redis://` URL form that fills them.
//
//   StatusOr<Options> o =
//   ParseRedisUrl("rediss://rl:s%40cret@[::1]:6380/2?tls_ca_file=/etc/ca.pem"); if (!o.ok()) return
//   o.status();           // kInvalidArgument naming the bad part LOG(INFO) << RedactedUrl(*o); //
//   "rediss://rl:***@[::1]:6380/2", never the password
//
// URL grammar: `redis[s]://[[user]:password@]host[:port][/db][?key=value&...]`.
// `rediss` turns TLS on. user and password are percent-decoded; host may be an
// IPv6 literal in brackets; port defaults to 6379, db to 0. Query keys:
// insecure=1 (TLS without certificate verification), tls_ca_file, tls_cert_file,
// tls_key_file, connect_timeout_ms, command_timeout_ms, connections, max_pending.
//
// Redis Cluster: `redis+cluster://[[user]:password@]host:port,host:port[?key=value&...]`
// (`rediss+cluster://` for TLS) lists seed nodes; user, password, TLS and the
// query keys above apply to every node of the cluster. No /db (a cluster has only db 0).
//
//   StatusOr<ClusterOptions> c = ParseClusterUrl("redis+cluster://10.0.0.1:7000,10.0.0.2:7000");
//
// Redis Sentinel:
// `redis+sentinel://[[user]:password@]host:port,host:port/<master-name>[?key=value&...]`
// (`rediss+sentinel://` for TLS) lists the sentinels (port defaults to 26379) and names the
// master they watch. user and password are the data nodes'; the sentinels' own are the query
// keys sentinel_user and sentinel_password (percent-decoded); db=N selects the data nodes'
// database. TLS and the other query keys apply to sentinels and data nodes alike.
//
//   StatusOr<SentinelOptions> s =
//       ParseSentinelUrl("redis+sentinel://:pw@10.0.0.1:26379,10.0.0.2:26379/main?db=2");
//
// Thread-safety: value type and pure functions.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ratelimit/status.h"

namespace ratelimit::redis {

struct Options {
  std::string host = "127.0.0.1";
  uint16_t port = 6379;
  std::string user;      // empty: AUTH with password only (the "default" user)
  std::string password;  // empty: no AUTH
  int db = 0;            // SELECT db after connecting when != 0

  bool tls = false;
  std::string tls_ca_file;    // empty: the system's default trust store
  std::string tls_cert_file;  // client certificate (mutual TLS), optional
  std::string tls_key_file;
  bool tls_verify = true;  // verify the server certificate and host name

  std::chrono::milliseconds connect_timeout{250};  // TCP connect + TLS handshake
  std::chrono::milliseconds command_timeout{100};  // default per-call deadline
  int connections = 2;                             // per node
  int max_pending = 10000;  // queued + in-flight calls per client; beyond: kResourceExhausted
  std::chrono::milliseconds reconnect_min_backoff{10};
  std::chrono::milliseconds reconnect_max_backoff{1000};
  // A connection answered -READONLY (the node is a replica now) closes and
  // connects again, resolving the host anew, at most once per
  // reconnect_max_backoff: the name may lead to the new master by now (a
  // DNS name or a virtual IP moved by a failover, the old master kept as
  // a replica). For a standalone node (OpenEndpoint sets it for redis://
  // and rediss://); a Cluster and Sentinel find the new master themselves.
  bool reconnect_on_readonly = false;
  // Which of command_timeout, connections and max_pending the URL's query
  // set: a value given in the URL wins over a store's own setting
  // (OpenEndpoint's EndpointTuning).
  struct FromUrl {
    bool command_timeout = false;
    bool connections = false;
    bool max_pending = false;
  };
  FromUrl from_url;
};

// Parses a redis:// or rediss:// URL; fields absent from the URL keep the
// defaults of Options. Returns kInvalidArgument with a precise message on error.
StatusOr<Options> ParseRedisUrl(std::string_view url);

// The URL for logs: scheme, user, host, port and db; the password is shown as ***.
std::string RedactedUrl(const Options& options);

struct NodeAddress {
  std::string host;
  uint16_t port = 0;
  std::string ToString() const;  // "host:port", IPv6 hosts in brackets
  friend bool operator==(const NodeAddress&, const NodeAddress&) = default;
};

struct ClusterOptions {
  Options node;  // for every node; node.host/port are those of the first seed
  std::vector<NodeAddress> seeds;
  std::chrono::milliseconds refresh_interval{10'000};   // periodic slot map refresh
  std::chrono::milliseconds min_refresh_interval{100};  // between refreshes on errors
  int max_redirects = 5;  // MOVED/ASK per call before failing with kUnavailable
};

// True iff `url` starts with redis+cluster:// or rediss+cluster://.
bool IsClusterUrl(std::string_view url);

// Parses a redis+cluster:// or rediss+cluster:// URL (kInvalidArgument on error).
StatusOr<ClusterOptions> ParseClusterUrl(std::string_view url);
// "redis+cluster://user:***@h1:p1,h2:p2": the seeds, never the password.
std::string RedactedUrl(const ClusterOptions& options);

struct SentinelOptions {
  Options node;      // the data nodes: user, password, db, TLS, timeouts (host/port: unused)
  Options sentinel;  // the sentinels: sentinel_user/sentinel_password, the same TLS, db 0
  std::vector<NodeAddress> sentinels;
  std::string master_name;
  std::chrono::milliseconds min_discovery_interval{100};  // between discoveries on errors
  std::chrono::milliseconds check_interval{1000};         // ping the subscription, retry discovery
  // After a +switch-master, how long a sentinel's answer that names the old
  // master is taken as not caught up (and passed over). Long enough for a
  // planned failover to demote the old master; a second failover back to
  // it whose announcement was missed is followed only after it.
  std::chrono::milliseconds switch_hold{30'000};
};

// True iff `url` starts with redis+sentinel:// or rediss+sentinel://.
bool IsSentinelUrl(std::string_view url);
// Parses a redis+sentinel:// or rediss+sentinel:// URL (kInvalidArgument on error).
StatusOr<SentinelOptions> ParseSentinelUrl(std::string_view url);
// "redis+sentinel://user:***@h1:p1,h2:p2/name?db=2": never a password.
std::string RedactedUrl(const SentinelOptions& options);

}  // namespace ratelimit::redis
