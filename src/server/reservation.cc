#include "server/reservation.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <array>

#include "core/hex.h"

namespace ratelimit::server {
namespace {

constexpr std::string_view kAlphabet =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
constexpr std::string_view kVersion = "r1.";

std::string Base64Url(std::string_view in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  uint32_t acc = 0;
  int bits = 0;
  for (unsigned char c : in) {
    acc = (acc << 8) | c;
    bits += 8;
    while (bits >= 6) {
      bits -= 6;
      out.push_back(kAlphabet[(acc >> bits) & 63]);
    }
  }
  if (bits > 0) out.push_back(kAlphabet[(acc << (6 - bits)) & 63]);
  return out;
}

bool FromBase64Url(std::string_view in, std::string& out) {
  uint32_t acc = 0;
  int bits = 0;
  for (char c : in) {
    const size_t v = kAlphabet.find(c);
    if (v == std::string_view::npos) return false;
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xFF));
    }
  }
  // Only the canonical spelling: a last character carrying 6 bits of no byte,
  // or unused bits set, would let several ids decode to one (the MAC's last
  // character has 2 unused bits: 'A' and 'B' both decoded to the same MAC).
  return bits < 6 && (acc & ((1u << bits) - 1)) == 0;
}

std::string Mac(std::string_view payload, std::string_view secret) {
  std::array<unsigned char, EVP_MAX_MD_SIZE> mac{};
  unsigned int n = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
       reinterpret_cast<const unsigned char*>(payload.data()), payload.size(), mac.data(), &n);
  return std::string(reinterpret_cast<const char*>(mac.data()), n);
}

Status Invalid() {
  return InvalidArgument(
      "field 'reservation' is not a reservation this deployment issued (altered, or signed "
      "with another store's secret)");
}

nlohmann::json Payload(const Reservation& r) {
  return {{"k", r.key}, {"c", r.cost}, {"x", r.expires_unix_ms}, {"n", r.nonce}, {"l", r.limits}};
}

}  // namespace

std::string NewReservationNonce() {
  std::array<unsigned char, 16> bytes{};
  if (RAND_bytes(bytes.data(), static_cast<int>(bytes.size())) != 1) std::abort();
  return core::Hex(bytes);
}

std::string SignReservation(const Reservation& r, std::string_view secret) {
  const std::string body = Base64Url(Payload(r).dump());
  return std::string(kVersion) + body + "." + Base64Url(Mac(body, secret));
}

size_t ReservationIdLength(const Reservation& r) {
  const size_t payload = Payload(r).dump().size();
  auto base64 = [](size_t n) { return (n * 8 + 5) / 6; };
  return kVersion.size() + base64(payload) + 1 + base64(32);  // HMAC-SHA256: 32 bytes
}

size_t MaxReservationIdLength(size_t max_body_bytes) {
  constexpr size_t kFrame = std::string_view(R"({"reservation":"","cost":2147483647})").size();
  return max_body_bytes > kFrame ? max_body_bytes - kFrame : 0;
}

StatusOr<Reservation> VerifyReservation(std::string_view id, std::string_view secret,
                                        size_t max_length) {
  if (!id.starts_with(kVersion) || id.size() > max_length) return Invalid();
  id.remove_prefix(kVersion.size());
  const size_t dot = id.find('.');
  if (dot == std::string_view::npos) return Invalid();
  const std::string_view body = id.substr(0, dot);
  std::string mac;
  if (!FromBase64Url(id.substr(dot + 1), mac)) return Invalid();
  const std::string want = Mac(body, secret);
  if (mac.size() != want.size() || CRYPTO_memcmp(mac.data(), want.data(), want.size()) != 0) {
    return Invalid();
  }
  std::string text;
  if (!FromBase64Url(body, text)) return Invalid();
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  // Signed by us, so well formed; checked all the same.
  if (!j.is_object() || !j.contains("k") || !j["k"].is_string() || !j.contains("c") ||
      !j["c"].is_number_integer() || !j.contains("x") || !j["x"].is_number_integer() ||
      !j.contains("n") || !j["n"].is_string() || !j.contains("l") || !j["l"].is_array()) {
    return Invalid();
  }
  return Reservation{.key = j["k"].get<std::string>(),
                     .cost = j["c"].get<int64_t>(),
                     .expires_unix_ms = j["x"].get<int64_t>(),
                     .nonce = j["n"].get<std::string>(),
                     .limits = j["l"]};
}

}  // namespace ratelimit::server
