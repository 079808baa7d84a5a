#pragma once

// Byte layout of the tcp backend's data path: the frame header that precedes every message on
// an established socket. (The address blob and the hello/ack that set the sockets up are shared
// with verbs: transport/sockets/handshake_wire.h.) Fields are in the hosts' native byte order,
// which must be little-endian (checked below); the header is packed by construction (no
// implicit padding).

#include <bit>
#include <cstdint>

namespace gs::transport::tcp {

static_assert(std::endian::native == std::endian::little,
              "the tcp wire format assumes little-endian hosts");

// Frame header in front of every message on an established socket (24 bytes):
//   0 type (FrameType)  1..3 reserved (zero)  4 imm  8 region id (write only)
//   12 payload length  16 offset in the target region (write only)
// The payload follows immediately. The receiver validates every field before using any.
enum class FrameType : uint8_t { kWrite = 1, kSend = 2 };
struct FrameHeader {
  uint8_t type;
  uint8_t reserved[3];
  uint32_t imm;
  uint32_t regionId;
  uint32_t length;
  uint64_t offset;
};
static_assert(sizeof(FrameHeader) == 24);

// Largest payload of one frame. Bounded so a hostile length cannot pin a socket for long, and
// well below the 32-bit completion length.
inline constexpr uint32_t kMaxFrameBytes = 1u << 30;

}  // namespace gs::transport::tcp
