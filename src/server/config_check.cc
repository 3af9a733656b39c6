#include "server/config_check.h"

#include <sys/stat.h>

#include <cstdio>

#include "ratelimit/redis_store.h"
#include "server/admin.h"
#include "server/gateway.h"
#include "server/listen_address.h"
#include "server/privileges.h"

namespace ratelimit::server {
namespace {

// "is readable by every user of this host (mode 0644)", or "" when it is not.
std::string OpenToEveryone(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || (st.st_mode & 0007) == 0) return "";
  char mode[8];
  std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
  return std::string((st.st_mode & 0002) ? "is writable" : "is readable") +
         " by every user of this host (mode " + mode + "): chmod 600 it (640 for a group)";
}

// A file the start reads: readable (else an error naming the setting), and,
// for a secret, a warning when every user may read it.
Status CheckFile(std::string_view setting, const std::string& path, bool secret,
                 std::vector<std::string>& warnings) {
  StatusOr<std::string> text = policy::ReadTextFile(path);
  if (!text.ok()) {
    return InvalidArgument(std::string(setting) + " '" + path + "': " + text.status().message());
  }
  if (secret) {
    if (std::string open = OpenToEveryone(path); !open.empty()) {
      warnings.push_back(std::string(setting) + " '" + path + "' " + open);
    }
  }
  return Status::Ok();
}

Status CheckRedis(const policy::StoreConfig& store, std::vector<std::string>& warnings) {
  if (store.type != policy::StoreConfig::Type::kRedis) return Status::Ok();
  StatusOr<std::vector<RedisUrlFile>> files = RedisUrlFiles(store.url);
  if (!files.ok()) return InvalidArgument("store.url: " + files.status().message());
  for (const RedisUrlFile& f : *files) {
    if (Status s = CheckFile(f.setting, f.path, f.secret, warnings); !s.ok()) return s;
  }
  return CheckRedisTlsFiles(store.url);
}

// True iff some request could meet a limit (rate or concurrency).
bool AnyLimit(const policy::Config& c) {
  if (!c.global_limits.empty()) return true;
  for (const auto& [name, plan] : c.plans) {
    if (!plan.limits.empty()) return true;
  }
  for (const policy::RouteClass& r : c.routes) {
    if (!r.limits.empty() || r.concurrency) return true;
  }
  return false;
}

}  // namespace

StatusOr<std::vector<std::string>> CheckConfig(const policy::Config& c) {
  std::vector<std::string> warnings;
  if (const std::string& token = c.server.admin_token_file; !token.empty()) {
    if (Status s = CheckFile("server.admin_token_file", token, true, warnings); !s.ok()) return s;
    // As the start reads it: an empty token is refused there.
    if (StatusOr<std::string> t = AdminApi::ReadTokenFile(token); !t.ok()) return t.status();
  }
  if (!c.api_keys_file.empty()) {
    // The loader has read and parsed it; only its permissions are left.
    const std::string path = policy::RelativeTo(policy::FolderOf(c.source), c.api_keys_file);
    if (Status s = CheckFile("api_keys_file", path, true, warnings); !s.ok()) return s;
  }
  if (Status s = CheckRedis(c.store, warnings); !s.ok()) return s;
  if (!c.server.upstream.empty() && !AnyLimit(c)) {
    warnings.push_back(
        "server.upstream is set but no limit applies to any request (no global, plan or route "
        "limits): every request is forwarded unlimited");
  }
  for (const policy::RouteClass& r : c.routes) {
    if (!r.metered) continue;
    if (c.server.upstream.empty()) {
      warnings.push_back("route '" + r.name +
                         "' has a metered cost (settle_from), which only the gateway settles, "
                         "but server.upstream is not set: /v1/auth checks it at its reservation");
    }
  }
  return warnings;
}

Status CheckOnThisMachine(const policy::Config& c) {
  if (!c.server.user.empty()) {
    // The start's lookup (ResolveRunAs), without its question whether this
    // process may switch: --check-config need not run as the start does.
    if (StatusOr<RunAs> who = LookUpRunAs(c.server.user, c.server.group); !who.ok()) {
      return who.status();
    }
  }
  boost::asio::io_context ioc;
  // Every address a listener binds, read as the start reads it (nothing is
  // bound here): "cannot resolve listen address '...': ...".
  for (const std::string* listen :
       {&c.server.listen, &c.server.admin_listen, &c.server.grpc_listen}) {
    if (listen->empty()) continue;
    if (StatusOr<boost::asio::ip::tcp::endpoint> ep = ResolveListenAddress(ioc, *listen);
        !ep.ok()) {
      return ep.status();
    }
  }
  if (!c.server.upstream.empty()) {
    // The start's parse and resolution of the address; the gateway made
    // here holds no connection and is dropped at once.
    StatusOr<std::unique_ptr<Gateway>> g = Gateway::Create(ioc, c.server.upstream, {});
    if (!g.ok()) return g.status();
  }
  return Status::Ok();
}

std::vector<std::string> DescribeMeteredCosts(const policy::Config& c) {
  std::vector<std::string> out;
  for (const policy::RouteClass& r : c.routes) {
    const std::optional<policy::MeteredCost>& m = r.metered;
    if (!m) continue;
    std::string line = "route '" + r.name + "' reserves ";
    if (m->source == policy::MeteredCost::Source::kReserve) {
      line += std::to_string(*m->reserve);
    } else {
      line += std::string(m->source == policy::MeteredCost::Source::kRequestHeader
                              ? "the request header "
                              : "the request JSON's ") +
              m->request_field;
      line += m->reserve ? " (else " + std::to_string(*m->reserve) + ")" : " (required)";
    }
    line += " and settles from the " + std::string(policy::SettleFromName(m->settle_from)) + " " +
            m->field;
    if (m->max) line += ", at most " + std::to_string(*m->max);
    out.push_back(std::move(line));
  }
  return out;
}

}  // namespace ratelimit::server
