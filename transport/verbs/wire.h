#pragma once

#include <cstdint>

#include "transport/sockets/handshake_wire.h"

namespace gs::transport::verbs {

// Everything the verbs backend puts on a wire: the address blob it publishes through the
// rendezvous, and the queue-pair exchange on the side channel. Little-endian host order (the
// library runs on x86-64 and aarch64); every field is validated on receipt.

inline constexpr uint32_t kDeviceBlobMagic = 0x42565347;  // "GSVB"
inline constexpr uint32_t kQpExchangeMagic = 0x50515347;  // "GSQP"
inline constexpr uint16_t kVerbsWireVersion = 1;
inline constexpr int kMaxQpsPerConnection = 17;  // one for two-sided messages + up to 16 data QPs

// Address blob (48 bytes):
//   0 magic "GSVB"  4 version  6 reserved  8 reserved (8 bytes)
//  16 the side channel's sockets::AddressBlob (32 bytes): where peers dial to set up queue pairs
struct DeviceBlob {
  uint32_t magic;
  uint16_t version;
  uint16_t reserved0;
  uint64_t reserved1;
  sockets::AddressBlob side;
};
static_assert(sizeof(DeviceBlob) == 48);

// Queue-pair exchange (112 bytes), each side sends one on the authenticated side channel:
//   0 magic "GSQP"  4 version  6 QP count  7 path MTU (enum ibv_mtu)  8 sender rank
//  12 receiver rank  16 GID (16 bytes)  32 LID  34 link layer (1 IB, 2 Ethernet)  35 reserved
//  36 first PSN  40 QP numbers (17 x 4 bytes; QP 0 carries two-sided messages)  108 reserved
struct QpExchange {
  uint32_t magic;
  uint16_t version;
  uint8_t qpCount;
  uint8_t mtu;
  int32_t rank;
  int32_t peer;
  uint8_t gid[16];
  uint16_t lid;
  uint8_t linkLayer;
  uint8_t reserved0;
  uint32_t psn;
  uint32_t qpn[kMaxQpsPerConnection];
  uint32_t reserved1;
};
static_assert(sizeof(QpExchange) == 112);

// Sent by both sides once their queue pairs are ready to receive: after it, writes may flow.
inline constexpr uint8_t kReadyByte = 'R';

}  // namespace gs::transport::verbs
