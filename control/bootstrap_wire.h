#pragma once

// The rendezvous wire format, shared by the server (bootstrap_server.cc) and the client
// (bootstrap_client.cc) and by the tests. Private to control/: nothing outside those two files
// and their tests includes it.
//
// Every message is a 12-byte header and a body (integers little-endian):
//
//   offset size  field
//        0    4  magic "GSRV"
//        4    2  version (1)
//        6    2  type (MsgType)
//        8    4  body length in bytes, bounded per type (maxBodyBytes) before any allocation
//
// Exchange (C = client, S = server):
// clang-format off
//   C->S Hello      client nonce[16]
//   S->C Challenge  server nonce[16], tag(secret, kServerDomain, client nonce || server nonce)[16]
//   C->S Register   rank i32, nranks i32, tag(secret, kClientDomain, server nonce||rank||nranks)[16]
//   S->C Status     code i32 (gs::Errc), message (<= kMaxStatusText bytes): ok or why refused
//   C->S Payload    this rank's bytes (<= kMaxRendezvousPayload)
//   S->C Result     nranks u32, then per rank: length u32, bytes   (or a Status with the error)
// clang-format on
// Both sides prove they hold the secret without sending it, over nonces the other side chose,
// so a recorded exchange cannot be replayed.

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/auth.h"
#include "common/error.h"
#include "control/bootstrap.h"

namespace gs::control::wire {

enum class MsgType : uint16_t {
  kHello = 1,
  kChallenge = 2,
  kRegister = 3,
  kStatus = 4,
  kPayload = 5,
  kResult = 6,
};

constexpr uint8_t kMagic[4] = {'G', 'S', 'R', 'V'};
constexpr uint16_t kVersion = 1;
constexpr size_t kHeaderBytes = 12;
constexpr size_t kNonceBytes = 16;
constexpr size_t kMaxStatusText = 1024;
constexpr const char* kClientDomain = "gs-rendezvous";
constexpr const char* kServerDomain = "gs-rendezvous-server";

using Nonce = std::array<uint8_t, kNonceBytes>;

/// A fresh nonce for one handshake (each side picks its own, so neither can replay the other).
inline Nonce randomNonce() {
  Secret bytes = randomSecret();
  Nonce n{};
  std::copy_n(bytes.begin(), n.size(), n.begin());
  return n;
}

struct Header {
  MsgType type;
  uint32_t bodyLen;
};

inline void putU32(std::vector<uint8_t>& out, uint32_t v) {
  for (int i = 0; i < 4; ++i)
    out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
inline uint32_t getU32(const uint8_t* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}

/// Largest body a receiver accepts for `type`; `nranks` sizes the Result.
inline uint64_t maxBodyBytes(MsgType type, int nranks) {
  switch (type) {
    case MsgType::kHello:
      return kNonceBytes;
    case MsgType::kChallenge:
      return 2 * kNonceBytes;
    case MsgType::kRegister:
      return 8 + sizeof(AuthTag);
    case MsgType::kStatus:
      return 4 + kMaxStatusText;
    case MsgType::kPayload:
      return kMaxRendezvousPayload;
    case MsgType::kResult:
      return 4 + uint64_t(nranks) * (4 + kMaxRendezvousPayload);
  }
  return 0;
}

inline std::vector<uint8_t> frame(MsgType type, std::span<const uint8_t> body) {
  std::vector<uint8_t> out(kMagic, kMagic + 4);
  out.push_back(static_cast<uint8_t>(kVersion & 0xff));
  out.push_back(static_cast<uint8_t>(kVersion >> 8));
  out.push_back(static_cast<uint8_t>(static_cast<uint16_t>(type) & 0xff));
  out.push_back(static_cast<uint8_t>(static_cast<uint16_t>(type) >> 8));
  putU32(out, static_cast<uint32_t>(body.size()));
  out.insert(out.end(), body.begin(), body.end());
  return out;
}

/// Validates a header against the types the receiver expects now. Throws kRemote
/// "malformed rendezvous message: ..." on anything else.
inline Header decodeHeader(const uint8_t* h, std::span<const MsgType> allowed, int nranks) {
  GS_CHECK(memcmp(h, kMagic, 4) == 0, Errc::kRemote,
           "malformed rendezvous message: bad magic (not a gradstream rendezvous peer?)");
  uint16_t version = uint16_t(h[4] | h[5] << 8);
  GS_CHECK(version == kVersion, Errc::kRemote,
           "rendezvous protocol version %u, this library speaks %u (mixed gradstream versions?)",
           version, kVersion);
  Header out{static_cast<MsgType>(uint16_t(h[6] | h[7] << 8)), getU32(h + 8)};
  bool expected = false;
  for (MsgType t : allowed)
    expected = expected || t == out.type;
  GS_CHECK(expected, Errc::kRemote, "malformed rendezvous message: unexpected type %u",
           static_cast<unsigned>(out.type));
  uint64_t limit = maxBodyBytes(out.type, nranks);
  GS_CHECK(out.bodyLen <= limit, Errc::kRemote,
           "malformed rendezvous message: type %u with a %u-byte body (at most %llu allowed)",
           static_cast<unsigned>(out.type), out.bodyLen, static_cast<unsigned long long>(limit));
  bool fixed = out.type == MsgType::kHello || out.type == MsgType::kChallenge ||
               out.type == MsgType::kRegister;
  GS_CHECK(!fixed || out.bodyLen == limit, Errc::kRemote,
           "malformed rendezvous message: type %u with a %u-byte body (expected %llu)",
           static_cast<unsigned>(out.type), out.bodyLen, static_cast<unsigned long long>(limit));
  GS_CHECK(out.type != MsgType::kStatus || out.bodyLen >= 4, Errc::kRemote,
           "malformed rendezvous message: status without a code");
  return out;
}

inline Header decodeHeader(const uint8_t* h, std::initializer_list<MsgType> allowed, int nranks) {
  return decodeHeader(h, std::span<const MsgType>(allowed.begin(), allowed.size()), nranks);
}

struct Registration {
  int32_t rank;
  int32_t nranks;
  AuthTag tag;
};

/// What the client's tag covers: the server's nonce, then rank and nranks.
inline std::vector<uint8_t> registrationTagInput(const Nonce& serverNonce,
                                                 int32_t rank,
                                                 int32_t nranks) {
  std::vector<uint8_t> in(serverNonce.begin(), serverNonce.end());
  putU32(in, static_cast<uint32_t>(rank));
  putU32(in, static_cast<uint32_t>(nranks));
  return in;
}

inline std::vector<uint8_t> encodeRegistration(const Registration& r) {
  std::vector<uint8_t> body;
  putU32(body, static_cast<uint32_t>(r.rank));
  putU32(body, static_cast<uint32_t>(r.nranks));
  body.insert(body.end(), r.tag.begin(), r.tag.end());
  return body;
}

inline Registration decodeRegistration(std::span<const uint8_t> body) {
  GS_CHECK(body.size() == 8 + sizeof(AuthTag), Errc::kRemote,
           "malformed rendezvous message: registration of %zu bytes", body.size());
  Registration r{};
  r.rank = static_cast<int32_t>(getU32(body.data()));
  r.nranks = static_cast<int32_t>(getU32(body.data() + 4));
  memcpy(r.tag.data(), body.data() + 8, r.tag.size());
  return r;
}

inline std::vector<uint8_t> encodeStatus(Errc code, const std::string& message) {
  std::vector<uint8_t> body;
  putU32(body, static_cast<uint32_t>(static_cast<int32_t>(code)));
  size_t len = std::min(message.size(), kMaxStatusText);
  body.insert(body.end(), message.begin(), message.begin() + static_cast<ptrdiff_t>(len));
  return body;
}

/// Decodes a Status; an unknown code becomes kRemote, and the text is made printable.
inline std::pair<Errc, std::string> decodeStatus(std::span<const uint8_t> body) {
  GS_CHECK(body.size() >= 4 && body.size() <= 4 + kMaxStatusText, Errc::kRemote,
           "malformed rendezvous message: status of %zu bytes", body.size());
  int32_t raw = static_cast<int32_t>(getU32(body.data()));
  Errc code = raw >= static_cast<int32_t>(Errc::kInternal) && raw <= 1 ? static_cast<Errc>(raw)
                                                                       : Errc::kRemote;
  std::string text(body.begin() + 4, body.end());
  for (char& c : text) {
    if (c < 0x20 || c > 0x7e)
      c = '?';
  }
  return {code, text};
}

inline std::vector<uint8_t> encodeResult(const std::vector<std::span<const uint8_t>>& payloads) {
  std::vector<uint8_t> body;
  putU32(body, static_cast<uint32_t>(payloads.size()));
  for (auto p : payloads) {
    putU32(body, static_cast<uint32_t>(p.size()));
    body.insert(body.end(), p.begin(), p.end());
  }
  return body;
}

/// Decodes a Result for a communicator of `nranks`; throws kRemote unless it holds exactly
/// nranks payloads of at most kMaxRendezvousPayload bytes each, filling the body exactly.
inline std::vector<std::vector<uint8_t>> decodeResult(std::span<const uint8_t> body, int nranks) {
  GS_CHECK(body.size() >= 4, Errc::kRemote, "malformed rendezvous result: %zu bytes", body.size());
  uint32_t count = getU32(body.data());
  GS_CHECK(count == static_cast<uint32_t>(nranks), Errc::kRemote,
           "malformed rendezvous result: %u payloads for %d ranks", count, nranks);
  std::vector<std::vector<uint8_t>> out(count);
  size_t pos = 4;
  for (uint32_t i = 0; i < count; ++i) {
    GS_CHECK(body.size() - pos >= 4, Errc::kRemote,
             "malformed rendezvous result: truncated at rank %u", i);
    uint32_t len = getU32(body.data() + pos);
    pos += 4;
    GS_CHECK(len <= kMaxRendezvousPayload && len <= body.size() - pos, Errc::kRemote,
             "malformed rendezvous result: rank %u has a %u-byte payload, %zu bytes left", i, len,
             body.size() - pos);
    out[i].assign(body.begin() + static_cast<ptrdiff_t>(pos),
                  body.begin() + static_cast<ptrdiff_t>(pos + len));
    pos += len;
  }
  GS_CHECK(pos == body.size(), Errc::kRemote, "malformed rendezvous result: %zu trailing bytes",
           body.size() - pos);
  return out;
}

}  // namespace gs::control::wire
