#include "redis/cluster_slots.h"

#include <charconv>
#include <string>

#include "redis/slot.h"

namespace ratelimit::redis {
namespace {

Status Malformed(std::string_view what) {
  return Internal("redis cluster: malformed slot map: " + std::string(what));
}

bool ToInt(std::string_view s, int64_t* out) {
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && end == s.data() + s.size() && !s.empty();
}

// An integer reply, or a string holding one.
bool IntOf(const Reply& r, int64_t* out) {
  if (r.IsInteger()) {
    *out = r.integer;
    return true;
  }
  return (r.IsString() || r.IsStatus()) && ToInt(r.str, out);
}

bool IsText(const Reply& r) { return r.IsString() || r.IsStatus(); }

Status AddRange(int64_t first, int64_t last, NodeAddress master, std::vector<SlotRange>* out) {
  if (first < 0 || last >= kClusterSlots || first > last) {
    return Malformed("slot range " + std::to_string(first) + "-" + std::to_string(last));
  }
  if (master.host.empty() || master.port == 0) return Malformed("a master without an address");
  out->push_back(
      SlotRange{static_cast<uint16_t>(first), static_cast<uint16_t>(last), std::move(master)});
  return Status::Ok();
}

bool ValidPort(int64_t p) { return p > 0 && p <= 65535; }

}  // namespace

StatusOr<std::vector<SlotRange>> ParseClusterShards(const Reply& reply, bool tls,
                                                    std::string_view asked_host) {
  if (!reply.IsArray()) return Malformed("CLUSTER SHARDS did not return an array");
  std::vector<SlotRange> out;
  for (const Reply& shard : reply.elements) {
    if (!shard.IsArray() || shard.elements.size() % 2 != 0) return Malformed("a shard entry");
    const Reply* slots = nullptr;
    const Reply* nodes = nullptr;
    for (size_t i = 0; i < shard.elements.size(); i += 2) {
      if (!IsText(shard.elements[i])) return Malformed("a shard field name");
      if (shard.elements[i].str == "slots") slots = &shard.elements[i + 1];
      if (shard.elements[i].str == "nodes") nodes = &shard.elements[i + 1];
    }
    if (slots == nullptr || nodes == nullptr || !slots->IsArray() || !nodes->IsArray() ||
        slots->elements.size() % 2 != 0) {
      return Malformed("a shard without slots and nodes");
    }
    if (slots->elements.empty()) continue;  // a shard with no slots (e.g. a new empty master)
    NodeAddress master;
    bool found = false;
    for (const Reply& node : nodes->elements) {
      if (!node.IsArray() || node.elements.size() % 2 != 0) return Malformed("a node entry");
      std::string_view role, ip, endpoint, health = "online";
      int64_t port = 0, tls_port = 0;
      for (size_t i = 0; i < node.elements.size(); i += 2) {
        const Reply& k = node.elements[i];
        const Reply& v = node.elements[i + 1];
        if (!IsText(k)) return Malformed("a node field name");
        if (k.str == "role" && IsText(v)) role = v.str;
        if (k.str == "ip" && IsText(v)) ip = v.str;
        if (k.str == "endpoint" && IsText(v)) endpoint = v.str;
        if (k.str == "health" && IsText(v)) health = v.str;
        if (k.str == "port" && !IntOf(v, &port)) return Malformed("a node port");
        if (k.str == "tls-port" && !IntOf(v, &tls_port)) return Malformed("a node tls-port");
      }
      // Redis >= 7.2 keeps a failed old master in its shard, with role
      // "master", ahead of the promoted one until it comes back
      // (redis/redis#13414): only an online master serves the slots.
      if (role != "master" || health != "online") continue;
      const int64_t p = tls && tls_port != 0 ? tls_port : port;
      if (!ValidPort(p)) return Malformed("master port " + std::to_string(p));
      std::string_view host = !endpoint.empty() && endpoint != "?" ? endpoint : ip;
      if (host.empty()) host = asked_host;
      master = NodeAddress{std::string(host), static_cast<uint16_t>(p)};
      found = true;
      break;
    }
    // No online master (a failover under way): the slots stay unmapped, so a
    // call for them fails at once and asks for a new map.
    if (!found) continue;
    for (size_t i = 0; i < slots->elements.size(); i += 2) {
      int64_t first = 0, last = 0;
      if (!IntOf(slots->elements[i], &first) || !IntOf(slots->elements[i + 1], &last)) {
        return Malformed("a slot number");
      }
      if (Status s = AddRange(first, last, master, &out); !s.ok()) return s;
    }
  }
  if (out.empty()) return Malformed("no slot is served");
  return out;
}

StatusOr<std::vector<SlotRange>> ParseClusterSlots(const Reply& reply,
                                                   std::string_view asked_host) {
  if (!reply.IsArray()) return Malformed("CLUSTER SLOTS did not return an array");
  std::vector<SlotRange> out;
  for (const Reply& range : reply.elements) {
    if (!range.IsArray() || range.elements.size() < 3) return Malformed("a slot range entry");
    int64_t first = 0, last = 0, port = 0;
    if (!IntOf(range.elements[0], &first) || !IntOf(range.elements[1], &last)) {
      return Malformed("a slot number");
    }
    const Reply& m = range.elements[2];
    if (!m.IsArray() || m.elements.size() < 2 || !IsText(m.elements[0]) ||
        !IntOf(m.elements[1], &port) || !ValidPort(port)) {
      return Malformed("a master address");
    }
    std::string host = m.elements[0].str.empty() || m.elements[0].str == "?"
                           ? std::string(asked_host)
                           : m.elements[0].str;
    if (Status s = AddRange(first, last, NodeAddress{host, static_cast<uint16_t>(port)}, &out);
        !s.ok()) {
      return s;
    }
  }
  if (out.empty()) return Malformed("no slot is served");
  return out;
}

StatusOr<Redirect> ParseRedirect(std::string_view error, std::string_view asked_host) {
  auto bad = [&] {
    return Internal("redis cluster: malformed redirection '" + std::string(error) + "'");
  };
  Redirect r;
  if (error.starts_with("MOVED ")) {
    r.kind = Redirect::kMoved;
    error.remove_prefix(6);
  } else if (error.starts_with("ASK ")) {
    r.kind = Redirect::kAsk;
    error.remove_prefix(4);
  } else {
    return bad();
  }
  const size_t space = error.find(' ');
  if (space == std::string_view::npos) return bad();
  int64_t slot = 0, port = 0;
  if (!ToInt(error.substr(0, space), &slot) || slot < 0 || slot >= kClusterSlots) return bad();
  std::string_view addr = error.substr(space + 1);
  const size_t colon = addr.rfind(':');
  if (colon == std::string_view::npos || !ToInt(addr.substr(colon + 1), &port) ||
      !ValidPort(port)) {
    return bad();
  }
  std::string_view host = addr.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host.empty() || host == "?") host = asked_host;
  if (host.empty()) return bad();
  r.slot = static_cast<uint16_t>(slot);
  r.to = NodeAddress{std::string(host), static_cast<uint16_t>(port)};
  return r;
}

}  // namespace ratelimit::redis
