// CheckConfig: what the start needs of a loaded config beyond the loader's
// own checks, done before anything is bound or connected, and by
// `ratelimitd --check-config` (so that "OK" means the start will not stop on
// the config).
//
//   StatusOr<std::vector<std::string>> warnings = CheckConfig(config);
//   if (!warnings.ok()) ...  // "server.admin_token_file '/etc/rl/token': No such file or
//   directory" for (const std::string& w : *warnings) ...  // log them; the start goes on
//
// Errors (the start would stop):
// - a file the config names that cannot be read or used, with its setting,
//   path and why: server.admin_token_file (also: empty), api_keys_file, and
//   the Redis URL's tls_ca_file, tls_cert_file, tls_key_file (loaded as the
//   Redis client loads them);
// - a Redis URL the store cannot parse.
// Warnings (the start goes on):
// - a secret file (admin token, API keys, TLS key) that every user of the
//   host may read or write (mode & 0007): chmod 600 (or 640 for a group);
// - server.upstream with no limit that could apply to any request: every
//   request is forwarded unlimited.
//
// Thread-safety: a pure function of the config and the files it names.
#pragma once

#include <string>
#include <vector>

#include "policy/config.h"
#include "ratelimit/status.h"

namespace ratelimit::server {

StatusOr<std::vector<std::string>> CheckConfig(const policy::Config& config);

// What the start checks against the machine it runs on, before it binds
// anything: server.user and server.group name a user and a group of this
// machine (the start's "--user: unknown user 'x'", "--group: unknown group
// 'x'"), server.listen, admin_listen and grpc_listen are addresses whose host
// resolves here ("cannot resolve listen address '...': ..."; whether the port
// is free is not asked), and server.upstream is an address the gateway takes whose host
// resolves here ("cannot resolve upstream '...': ..."). `ratelimitd
// --check-config` runs it as well as CheckConfig: its answer holds for the
// machine it runs on (another host may have other users and names). Whether
// this process could switch to the user (root) is not asked.
Status CheckOnThisMachine(const policy::Config& config);

// A line per route with a metered cost (cost: {settle_from: ...}): what it
// reserves and where its actual cost is read ("route 'chat' reserves 1000
// and settles from the sse_last_event usage.total_tokens, at most 8000").
std::vector<std::string> DescribeMeteredCosts(const policy::Config& config);

}  // namespace ratelimit::server
