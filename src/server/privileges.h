// Privileges: ratelimitd started as root (to bind port 80, say) switches to an
// unprivileged user once its listeners are bound (`--user`/`--group`,
// server.user/server.group).
//
//   StatusOr<RunAs> who = ResolveRunAs("ratelimit", "");   // before binding: typos fail fast
//   ... bind the listeners ...
//   if (Status s = DropPrivileges(*who); !s.ok()) exit(1);  // never run on as root
//
// Thread-safety: DropPrivileges changes the whole process (glibc applies
// setuid/setgid to every thread); call it before serving requests.
#pragma once

#include <sys/types.h>

#include <string>
#include <string_view>

#include "ratelimit/status.h"

namespace ratelimit::server {

struct RunAs {
  std::string user, group;
  uid_t uid = 0;
  gid_t gid = 0;
};

// Looks the user (and the group, default the user's primary group) up.
// Errors: unknown user or group (kInvalidArgument), or the process cannot
// switch to them (not root and not already that user; kInvalidArgument too).
StatusOr<RunAs> ResolveRunAs(std::string_view user, std::string_view group);
// The lookups alone (the same errors for an unknown user or group), without
// asking whether this process could switch: what --check-config checks.
StatusOr<RunAs> LookUpRunAs(std::string_view user, std::string_view group);

// Sets the supplementary groups to just `gid`, then gid, then uid, and checks
// that root cannot be regained. Any failure is an error: the caller must stop
// rather than run on with privileges it was asked to give up.
Status DropPrivileges(const RunAs& who);

}  // namespace ratelimit::server
