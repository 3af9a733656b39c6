#include "store/redis_keys.h"

#include <openssl/sha.h>

#include "core/hex.h"
#include "ratelimit/redis_store.h"

namespace ratelimit {

std::string EncodeClientKey(std::string_view key) {
  std::string out;
  out.reserve(key.size());
  for (unsigned char c : key) {
    if (c > 0x20 && c < 0x7f && c != '%' && c != '{' && c != '}' && c != '#') {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      core::AppendHexByte(out, c);
    }
  }
  if (out.size() <= kMaxPlainClientKey) return out;
  // 96 bits of SHA-256 in base64url: 16 characters.
  static constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(key.data()), key.size(), digest);
  std::string hashed = "#";
  for (int i = 0; i < 12; i += 3) {
    const uint32_t v = (uint32_t{digest[i]} << 16) | (uint32_t{digest[i + 1]} << 8) | digest[i + 2];
    for (int shift = 18; shift >= 0; shift -= 6) hashed.push_back(kB64[(v >> shift) & 63]);
  }
  return hashed;
}

namespace store {

std::string RedisKeys::StateName(const Limit& limit) {
  if (limit.algorithm() != Algorithm::kFixedWindow &&
      limit.algorithm() != Algorithm::kSlidingWindow) {
    return limit.name();
  }
  std::string s = limit.name() + ":" + WindowText(limit);
  if (const Calendar* c = limit.calendar()) s += ":" + c->zone().name();
  return s;
}

std::string RedisKeys::Make(std::string_view client_key, std::string_view kind,
                            std::string_view name) const {
  std::string k;
  k.reserve(prefix_.size() + client_key.size() + kind.size() + name.size() + 2);
  k += prefix_;
  k += '{';
  k += EncodeClientKey(client_key);
  k += '}';
  k += kind;
  k += name;
  return k;
}

}  // namespace store
}  // namespace ratelimit
