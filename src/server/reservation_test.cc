// Reservation ids: what one signs, another instance with the same secret
// verifies; anything altered, or signed under another secret, is refused.
#include "server/reservation.h"

#include <gtest/gtest.h>

namespace ratelimit::server {
namespace {

Reservation Sample() {
  return {
      .key = "user:ada",
      .cost = 1000,
      .expires_unix_ms = 1'800'000'000'000,
      .nonce = NewReservationNonce(),
      .limits = nlohmann::json::array(
          {"tokens", {{"algorithm", "token_bucket"}, {"capacity", 10}, {"refill_per_second", 1}}})};
}

TEST(Reservation, RoundTripsUnderTheSameSecret) {
  const Reservation r = Sample();
  const std::string id = SignReservation(r, "secret-a");
  EXPECT_TRUE(id.starts_with("r1."));
  EXPECT_EQ(id.size(), ReservationIdLength(r));
  StatusOr<Reservation> back = VerifyReservation(id, "secret-a", 65536);
  EXPECT_FALSE(VerifyReservation(id, "secret-a", id.size() - 1).ok());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->key, r.key);
  EXPECT_EQ(back->cost, 1000);
  EXPECT_EQ(back->expires_unix_ms, r.expires_unix_ms);
  EXPECT_EQ(back->nonce, r.nonce);
  EXPECT_EQ(back->limits, r.limits);
  EXPECT_EQ(r.nonce.size(), 32u);
  EXPECT_NE(NewReservationNonce(), NewReservationNonce());
}

TEST(Reservation, AnythingAlteredOrForeignIsRefused) {
  const std::string id = SignReservation(Sample(), "secret-a");
  EXPECT_FALSE(VerifyReservation(id, "secret-b", 65536).ok());
  for (size_t at : {size_t{3}, id.size() / 2, id.size() - 1}) {
    std::string bad = id;
    bad[at] = bad[at] == 'A' ? 'B' : 'A';
    EXPECT_FALSE(VerifyReservation(bad, "secret-a", 65536).ok()) << at;
  }
  // The MAC's last character carries 2 unused bits: setting them spells
  // another id for the same bytes, which is refused too (it was accepted
  // while the test above flipped 'A' <-> 'B' at a random id's end).
  {
    std::string padded = id;
    const std::string_view alphabet =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    const size_t v = alphabet.find(padded.back());
    ASSERT_NE(v, std::string_view::npos);
    padded.back() = alphabet[v ^ 1];
    EXPECT_FALSE(VerifyReservation(padded, "secret-a", 65536).ok()) << padded;
  }
  // A cheaper reservation made by the caller: signed by nobody.
  Reservation cheap = Sample();
  cheap.cost = 1;
  const std::string forged = SignReservation(cheap, "guess");
  const std::string body_forged = forged.substr(0, forged.rfind('.'));
  const std::string mac_real = id.substr(id.rfind('.'));
  EXPECT_FALSE(VerifyReservation(body_forged + mac_real, "secret-a", 65536).ok());
  EXPECT_FALSE(VerifyReservation("", "secret-a", 65536).ok());
  EXPECT_FALSE(VerifyReservation("r1.", "secret-a", 65536).ok());
  StatusOr<Reservation> r = VerifyReservation("r1.x.y", "secret-a", 65536);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("not a reservation this deployment issued"),
            std::string::npos);
}

}  // namespace
}  // namespace ratelimit::server
