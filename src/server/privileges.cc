#include "server/privileges.h"

#include <grp.h>
#include <pwd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

namespace ratelimit::server {
namespace {

// strerror is not thread-safe, but this runs only while ratelimitd drops its
// privileges at start-up, before any other thread exists.
// NOLINTNEXTLINE(concurrency-mt-unsafe)
std::string Errno(int e) { return std::strerror(e); }

}  // namespace

StatusOr<RunAs> LookUpRunAs(std::string_view user, std::string_view group) {
  RunAs who;
  who.user = std::string(user);
  std::vector<char> buf(16384);
  passwd pw{};
  passwd* pw_found = nullptr;
  int e = getpwnam_r(who.user.c_str(), &pw, buf.data(), buf.size(), &pw_found);
  if (pw_found == nullptr) {
    return InvalidArgument("--user: unknown user '" + who.user + "'" +
                           (e != 0 ? " (" + Errno(e) + ")" : ""));
  }
  who.uid = pw.pw_uid;
  who.gid = pw.pw_gid;
  if (!group.empty()) {
    who.group = std::string(group);
    ::group gr{};
    ::group* gr_found = nullptr;
    e = getgrnam_r(who.group.c_str(), &gr, buf.data(), buf.size(), &gr_found);
    if (gr_found == nullptr) {
      return InvalidArgument("--group: unknown group '" + who.group + "'" +
                             (e != 0 ? " (" + Errno(e) + ")" : ""));
    }
    who.gid = gr.gr_gid;
  } else {
    ::group gr{};
    ::group* gr_found = nullptr;
    getgrgid_r(who.gid, &gr, buf.data(), buf.size(), &gr_found);
    who.group = gr_found != nullptr ? gr.gr_name : std::to_string(who.gid);
  }
  return who;
}

StatusOr<RunAs> ResolveRunAs(std::string_view user, std::string_view group) {
  StatusOr<RunAs> found = LookUpRunAs(user, group);
  if (!found.ok()) return found.status();
  RunAs& who = *found;
  if (geteuid() != 0 && (geteuid() != who.uid || getegid() != who.gid)) {
    return InvalidArgument("--user " + who.user + ": cannot switch user or group without root " +
                           "(running as uid " + std::to_string(geteuid()) + ")");
  }
  return found;
}

Status DropPrivileges(const RunAs& who) {
  if (geteuid() != 0) return Status::Ok();  // already that user (ResolveRunAs checked)
  if (setgroups(1, &who.gid) != 0) return Internal("setgroups: " + Errno(errno));
  if (setgid(who.gid) != 0)
    return Internal("setgid(" + std::to_string(who.gid) + "): " + Errno(errno));
  if (setuid(who.uid) != 0)
    return Internal("setuid(" + std::to_string(who.uid) + "): " + Errno(errno));
  if (getuid() != who.uid || geteuid() != who.uid || getgid() != who.gid || getegid() != who.gid) {
    return Internal("the user or group did not change");
  }
  // Root must be gone for good (a saved set-user-ID of 0 would allow this).
  if (who.uid != 0 && setuid(0) == 0) return Internal("root could be regained after setuid");
  return Status::Ok();
}

}  // namespace ratelimit::server
