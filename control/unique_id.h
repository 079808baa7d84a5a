#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>

#include "common/auth.h"
#include "control/net.h"

namespace gs::control {

/// What a rank needs to join a communicator: where rank 0's rendezvous server listens and the
/// communicator secret that proves membership. Travels inside gs_unique_id_t (128 opaque bytes)
/// from rank 0 through the user's launcher to every rank, so parse() treats its input as
/// untrusted. A plain value type; serialize/parse are thread-safe.
struct UniqueId {
  static constexpr size_t kBytes = 128;  // == GS_UNIQUE_ID_BYTES

  IpAddress address;
  uint16_t port = 0;
  Secret secret{};

  /// Exactly kBytes bytes (layout in unique_id.cc); reserved bytes are zero.
  std::array<uint8_t, kBytes> serialize() const;
  /// Writes the checksum of the layout's leading fields into `bytes`, as serialize() does (the
  /// fuzzer signs its mutated ids with it, so they reach the fields behind the checksum).
  static void writeChecksum(std::array<uint8_t, kBytes>& bytes);
  /// Validates magic, version, family, port, checksum and reserved bytes. Throws
  /// kInvalidArgument "unique id is invalid: <what is wrong>" on anything else (a unique id
  /// that was not made by gs_get_unique_id, was truncated, or was corrupted in transit).
  static UniqueId parse(std::span<const uint8_t> bytes);

  /// "addr:port" of the rendezvous server, for messages.
  std::string endpoint() const { return formatEndpoint(address, port); }
};

}  // namespace gs::control
