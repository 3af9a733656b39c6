// KeySlot: the Redis Cluster hash slot of a key (CRC16-XMODEM mod 16384).
//
//   KeySlot("123456789") == 12739
//   KeySlot("{user1000}.following") == KeySlot("{user1000}.followers")
//
// Hash tags: if the key holds '{' followed later by '}' with at least one byte
// between them, only the bytes between the first '{' and the next '}' are hashed.
// A caller building keys from untrusted input must neutralise braces itself.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string_view>

namespace ratelimit::redis {

inline constexpr uint16_t kClusterSlots = 16384;

// CRC16-XMODEM (poly 0x1021, init 0, no reflection). Crc16("123456789") == 0x31C3.
uint16_t Crc16(std::string_view data);

// The cluster slot, in [0, 16383], with the hash-tag rule applied.
uint16_t KeySlot(std::string_view key);

}  // namespace ratelimit::redis
