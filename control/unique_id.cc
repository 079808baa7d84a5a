#include "control/unique_id.h"

#include <cstring>

#include "common/error.h"

namespace gs::control {
namespace {

// Serialized layout (all multi-byte integers little-endian except the port, which is in
// network order like the address next to it):
//
//   offset size  field
//        0    4  magic "GSID"
//        4    1  version (1)
//        5    1  address family: 4 or 6
//        6    2  port (big-endian, nonzero)
//        8   16  address (IPv4 in the first 4 bytes, the other 12 zero)
//       24   32  communicator secret
//       56    8  checksum: SipHash-2-4 of bytes [0, 56) under a fixed public key
//       64   64  reserved, zero
//
// The checksum is not a security measure (the secret is what is secret); it turns a corrupted
// or truncated-and-padded id into a clear error here instead of a confusing rendezvous failure.
constexpr uint8_t kMagic[4] = {'G', 'S', 'I', 'D'};
constexpr uint8_t kVersion = 1;
constexpr size_t kOffVersion = 4, kOffFamily = 5, kOffPort = 6, kOffAddress = 8, kOffSecret = 24,
                 kOffChecksum = 56, kOffReserved = 64;
static_assert(kOffSecret + sizeof(Secret) == kOffChecksum);
static_assert(kOffChecksum + 8 == kOffReserved);
static_assert(kOffReserved + 64 == UniqueId::kBytes, "a unique id is exactly 128 bytes");

uint64_t checksum(const uint8_t* bytes) {
  static const uint8_t kKey[16] = {'g', 's', '-', 'u', 'n', 'i', 'q', 'u',
                                   'e', '-', 'i', 'd', '-', 'v', '1', 0};
  return sipHash24(kKey, bytes, kOffChecksum);
}

}  // namespace

std::array<uint8_t, UniqueId::kBytes> UniqueId::serialize() const {
  std::array<uint8_t, kBytes> out{};
  memcpy(out.data(), kMagic, sizeof(kMagic));
  out[kOffVersion] = kVersion;
  out[kOffFamily] = static_cast<uint8_t>(address.family);
  out[kOffPort] = static_cast<uint8_t>(port >> 8);
  out[kOffPort + 1] = static_cast<uint8_t>(port & 0xff);
  size_t addrLen = address.family == IpAddress::Family::kV4 ? 4 : 16;
  memcpy(out.data() + kOffAddress, address.bytes.data(), addrLen);
  memcpy(out.data() + kOffSecret, secret.data(), secret.size());
  writeChecksum(out);
  return out;
}

void UniqueId::writeChecksum(std::array<uint8_t, kBytes>& bytes) {
  const uint64_t sum = checksum(bytes.data());
  for (int i = 0; i < 8; ++i)
    bytes[kOffChecksum + i] = static_cast<uint8_t>(sum >> (8 * i));
}

UniqueId UniqueId::parse(std::span<const uint8_t> bytes) {
  GS_CHECK(bytes.size() == kBytes, Errc::kInvalidArgument,
           "unique id is invalid: %zu bytes instead of %zu", bytes.size(), kBytes);
  const uint8_t* p = bytes.data();
  GS_CHECK(memcmp(p, kMagic, sizeof(kMagic)) == 0, Errc::kInvalidArgument,
           "unique id is invalid: bad magic (not made by gs_get_unique_id, or corrupted)");
  GS_CHECK(p[kOffVersion] == kVersion, Errc::kInvalidArgument,
           "unique id is invalid: version %u, this library understands version %u "
           "(are all ranks running the same gradstream?)",
           p[kOffVersion], kVersion);
  uint64_t sum = 0;
  for (int i = 7; i >= 0; --i)
    sum = (sum << 8) | p[kOffChecksum + i];
  GS_CHECK(sum == checksum(p), Errc::kInvalidArgument,
           "unique id is invalid: checksum mismatch (corrupted in transit?)");
  for (size_t i = kOffReserved; i < kBytes; ++i) {
    GS_CHECK(p[i] == 0, Errc::kInvalidArgument, "unique id is invalid: reserved byte %zu is set",
             i);
  }

  UniqueId id;
  uint8_t family = p[kOffFamily];
  GS_CHECK(family == 4 || family == 6, Errc::kInvalidArgument,
           "unique id is invalid: address family %u (expected 4 or 6)", family);
  id.address.family = static_cast<IpAddress::Family>(family);
  size_t addrLen = family == 4 ? 4 : 16;
  memcpy(id.address.bytes.data(), p + kOffAddress, addrLen);
  for (size_t i = addrLen; i < 16; ++i) {
    GS_CHECK(p[kOffAddress + i] == 0, Errc::kInvalidArgument,
             "unique id is invalid: IPv4 address with trailing bytes set");
  }
  GS_CHECK(!id.address.isUnspecified(), Errc::kInvalidArgument,
           "unique id is invalid: unspecified rendezvous address");
  id.port = static_cast<uint16_t>((p[kOffPort] << 8) | p[kOffPort + 1]);
  GS_CHECK(id.port != 0, Errc::kInvalidArgument, "unique id is invalid: port 0");
  memcpy(id.secret.data(), p + kOffSecret, id.secret.size());
  return id;
}

}  // namespace gs::control
