// AdminDenials: this instance's recent denials, for the admin API.
//
//   AdminDenials d;
//   d.Record({.unix_ms = now_ms, .key = "u:ada", .route = "search", .limit = "burst",
//             .path = "/api/search"});
//   std::vector<DenialEntry> mine = d.ForClient("u:ada");      // newest first
//   std::vector<TopEntry> top = d.Top(10, 5, now_ms);          // last 5 minutes
//
// Two bounded structures:
//   - a ring of the last kRingSize denials (all clients); ForClient scans it
//     for an exact key match (never a prefix), newest first;
//   - per-minute counts for the last kMinutes minutes, each minute holding at
//     most kMaxClientsPerMinute distinct clients (more are counted as
//     `others`), for Top.
// Memory is bounded whatever the traffic.
//
// Thread-safety: all methods may be called from any thread (one mutex; a
// denial costs one short critical section).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "ratelimit/thread_annotations.h"

namespace ratelimit::server {

// How the admin API names a decision-API caller's key (/v1/check,
// /v1/acquire), and the store key its state and leases live under: "d:" +
// the key, apart from every key the rules form ("k:", "u:", "ip:", a
// route's "~all", the Envoy face's "envoy:"), so a caller cannot reach
// another client's state by naming its key. Its denials are recorded under
// this name.
inline constexpr std::string_view kDecisionApiPrefix = "d:";
inline std::string DecisionApiClient(std::string_view key) {
  return std::string(kDecisionApiPrefix) + std::string(key);
}

struct DenialEntry {
  int64_t unix_ms = 0;
  // The client: a policy identity, the client part of the store key ("u:ada",
  // "ip:203.0.113.7"), or a decision-API key (DecisionApiClient: "d:user:ada").
  std::string key;
  std::string route;  // route class, "" if none
  std::string limit;  // the limit that denied
  std::string path;   // canonical path (or the decision API's path)
  bool shadow = false;
};

struct TopEntry {
  std::string key;
  uint64_t denials = 0;
};

class AdminDenials {
 public:
  static constexpr size_t kRingSize = 1000;
  static constexpr int kMinutes = 60;
  static constexpr size_t kMaxClientsPerMinute = 1000;

  void Record(DenialEntry e);
  std::vector<DenialEntry> ForClient(std::string_view key) const;
  // The `n` clients with the most (non-shadow) denials in the last `minutes`
  // minutes (1..kMinutes, the current one included), most first. `others`:
  // denials of clients that did not fit in a minute's table.
  std::vector<TopEntry> Top(size_t n, int minutes, int64_t now_ms, uint64_t* others) const;
  // Every client key held now (ring and minute tables), each once.
  std::vector<std::string> Keys() const;

 private:
  struct Minute {
    int64_t minute = -1;
    std::unordered_map<std::string, uint64_t> counts;
    uint64_t others = 0;
  };

  mutable Mutex mu_;
  std::vector<DenialEntry> ring_ RL_GUARDED_BY(mu_);         // grows to kRingSize
  size_t next_ RL_GUARDED_BY(mu_) = 0;                       // where the next entry goes once full
  std::array<Minute, kMinutes> minutes_ RL_GUARDED_BY(mu_);  // indexed by minute % kMinutes
};

}  // namespace ratelimit::server
