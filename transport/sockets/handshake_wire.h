#pragma once

// Byte layouts of the authenticated socket handshake that the tcp backend (its data sockets)
// and the verbs backend (its side channel) share: the address blob and the hello/ack exchange.
// Fields are in the hosts' native byte order, which must be little-endian (checked below); all
// structs are packed by construction (no implicit padding).
//
// The magics and the authentication domains still say "tcp": they came from that backend and
// are part of the bytes on the wire (the domains are mixed into every mac), so renaming them
// would make peers built before and after disagree.

#include <bit>
#include <cstddef>
#include <cstdint>

namespace gs::transport::sockets {

static_assert(std::endian::native == std::endian::little,
              "the socket handshake wire format assumes little-endian hosts");

inline constexpr uint16_t kWireVersion = 1;

// Address blob published through the rendezvous (32 bytes):
//   0 magic "GSTA"  4 version  6 family (4 or 6)  7 reserved  8 port  10 reserved
//   12 rank  16 address (4 bytes for IPv4, 16 for IPv6)
inline constexpr uint32_t kAddressMagic = 0x41545347;
struct AddressBlob {
  uint32_t magic;
  uint16_t version;
  uint8_t family;
  uint8_t reserved0;
  uint16_t port;
  uint16_t reserved1;
  int32_t rank;
  uint8_t address[16];
};
static_assert(sizeof(AddressBlob) == 32);

// Hello: the first bytes the dialer (higher rank) writes on every socket (40 bytes):
//   0 magic "GSHL"  4 version  6 socket index  8 dialer rank  12 target rank
//   16 socket count  18 reserved  20 reserved  24 mac = authTag(secret, kHelloDomain, bytes 0..23)
inline constexpr uint32_t kHelloMagic = 0x4c485347;
inline constexpr const char* kHelloDomain = "gs-tcp-hello";
struct Hello {
  uint32_t magic;
  uint16_t version;
  uint16_t socketIndex;
  int32_t dialerRank;
  int32_t targetRank;
  uint16_t socketCount;
  uint16_t reserved0;
  uint32_t reserved1;
  uint8_t mac[16];
};
static_assert(sizeof(Hello) == 40);
inline constexpr size_t kHelloSignedBytes = 24;

// Ack: the acceptor's reply (32 bytes):
//   0 magic "GSAK"  4 version  6 socket index  8 acceptor rank  12 dialer rank
//   16 mac = authTag(secret, kAckDomain, bytes 0..15 followed by the hello's mac), so an ack
//   cannot be replayed for another hello.
inline constexpr uint32_t kAckMagic = 0x4b415347;
inline constexpr const char* kAckDomain = "gs-tcp-ack";
struct Ack {
  uint32_t magic;
  uint16_t version;
  uint16_t socketIndex;
  int32_t acceptorRank;
  int32_t dialerRank;
  uint8_t mac[16];
};
static_assert(sizeof(Ack) == 32);
inline constexpr size_t kAckSignedBytes = 16;

}  // namespace gs::transport::sockets
