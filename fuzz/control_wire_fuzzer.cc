// libFuzzer targets for the control plane's parsers of bytes from other processes: the
// rendezvous messages (bootstrap_wire.h: header, registration, status, result), the record each
// rank publishes through the rendezvous (PeerInfo::parse), the failure notice a peer writes into
// our notice page (decodeNotice) and the unique id a launcher hands every rank
// (UniqueId::parse). One source, one target per parser (GS_FUZZ_WIRE selects it), so libFuzzer's
// coverage guidance works on one format at a time.
//
// What must hold for any input: the parser returns or throws gs::Error (the clear error the
// caller reports); anything else escaping (std::length_error, bad_alloc from a length taken on
// trust), a sanitizer report or an over-read is a finding. Whatever a parser accepts must obey
// the bounds the callers rely on and encode back to the very bytes it came from (or, for the
// notice, to a notice that decodes the same), so no field is silently dropped or invented.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <span>
#include <vector>

#include "common/error.h"
#include "control/bootstrap_wire.h"
#include "control/peer_info.h"
#include "control/unique_id.h"
#include "stream/failure_notice.h"

#ifndef GS_FUZZ_WIRE
#error "define GS_FUZZ_WIRE: 0 rendezvous, 1 peer info, 2 failure notice, 3 unique id"
#endif

using namespace gs;

namespace {

// The communicator size a parser is told, from the input's first byte: 1-64 ranks.
int ranksFrom(const uint8_t*& data, size_t& size) {
  const int nranks = 1 + data[0] % 64;
  ++data;
  --size;
  return nranks;
}

[[noreturn]] void finding(const char* what) {
  fprintf(stderr, "control wire fuzzer: %s\n", what);
  std::abort();
}

bool printable(const std::string& s) {
  for (char c : s) {
    if (c < 0x20 || c > 0x7e)
      return false;
  }
  return true;
}

void rendezvous(const uint8_t* data, size_t size) {
  using namespace gs::control::wire;
  if (size < 1 + kHeaderBytes)
    return;
  const int nranks = ranksFrom(data, size);
  static constexpr MsgType kAll[] = {MsgType::kHello,  MsgType::kChallenge, MsgType::kRegister,
                                     MsgType::kStatus, MsgType::kPayload,   MsgType::kResult};
  const Header h = decodeHeader(data, std::span<const MsgType>(kAll), nranks);
  if (h.bodyLen > maxBodyBytes(h.type, nranks))
    finding("a header accepted a body above its type's bound");
  // The body is what follows the header, cut to the length the header announced (a reader
  // takes exactly that many bytes off the socket).
  const std::span<const uint8_t> body(data + kHeaderBytes,
                                      std::min<size_t>(h.bodyLen, size - kHeaderBytes));
  switch (h.type) {
    case MsgType::kRegister: {
      const Registration r = decodeRegistration(body);
      if (encodeRegistration(r) != std::vector<uint8_t>(body.begin(), body.end()))
        finding("a registration does not encode back to its bytes");
      break;
    }
    case MsgType::kStatus: {
      const auto [code, text] = decodeStatus(body);
      if (static_cast<int>(code) > 1 || static_cast<int>(code) < static_cast<int>(Errc::kInternal))
        finding("a status decoded to a code outside gs::Errc");
      if (text.size() != body.size() - 4 || !printable(text))
        finding("a status text is not the body's length in printable bytes");
      break;
    }
    case MsgType::kResult: {
      const auto payloads = decodeResult(body, nranks);
      if (payloads.size() != static_cast<size_t>(nranks))
        finding("a result holds another number of payloads than ranks");
      std::vector<std::span<const uint8_t>> views;
      for (const auto& p : payloads) {
        if (p.size() > control::kMaxRendezvousPayload)
          finding("a result payload above kMaxRendezvousPayload");
        views.emplace_back(p);
      }
      if (encodeResult(views) != std::vector<uint8_t>(body.begin(), body.end()))
        finding("a result does not encode back to its bytes");
      break;
    }
    default:
      break;  // nonces and a payload are opaque bytes of a bounded length
  }
}

void peerInfo(const uint8_t* data, size_t size) {
  const control::PeerInfo p = control::PeerInfo::parse({data, size}, 3);
  if (p.shmFreeBytes < 0 || p.slotKeys.size() > 64)
    finding("a record outside the parser's bounds was accepted");
  for (const auto& [peer, key] : p.slotKeys) {
    if (key.length > transport::RemoteKey::kMaxBytes)
      finding("a memory key longer than its array was accepted");
  }
  if (p.serialize() != std::vector<uint8_t>(data, data + size))
    finding("a record does not serialize back to its bytes");
}

void failureNotice(const uint8_t* data, size_t size) {
  if (size < 1)
    return;
  const int nranks = ranksFrom(data, size);
  const auto n = stream::decodeNotice(data, size, nranks);
  if (!n)
    return;
  if (n->origin < 0 || n->origin >= nranks || n->detector < 0 || n->detector >= nranks ||
      n->code == Errc::kOk)
    finding("a notice naming a rank outside the communicator, or no failure, was accepted");
  if (n->cause.size() > stream::kMaxNoticeCause || !printable(n->cause))
    finding("a notice's cause is too long or not printable");
  std::vector<uint8_t> again(64 + stream::kMaxNoticeCause);
  const size_t used = stream::encodeNotice(*n, again.data(), again.size());
  const auto back = stream::decodeNotice(again.data(), used, nranks);
  if (!back || back->code != n->code || back->origin != n->origin ||
      back->detector != n->detector || back->cause != n->cause ||
      back->senderCompleted != n->senderCompleted)
    finding("a notice does not survive encoding and decoding again");
}

// The id's checksum stops almost every mutation at the door, so an input with a set low bit in
// its first byte gets the checksum gs_get_unique_id would have written
// (UniqueId::writeChecksum): mutations then reach the fields behind it.
void uniqueId(const uint8_t* data, size_t size) {
  using control::UniqueId;
  if (size < 1 + UniqueId::kBytes)
    return;
  const bool sign = (data[0] & 1) != 0;
  std::array<uint8_t, UniqueId::kBytes> id;
  std::memcpy(id.data(), data + 1, id.size());
  if (sign)
    UniqueId::writeChecksum(id);
  const UniqueId parsed = UniqueId::parse(id);
  if (parsed.port == 0 || parsed.address.isUnspecified())
    finding("a unique id without a rendezvous endpoint was accepted");
  if (parsed.serialize() != id)
    finding("a unique id does not serialize back to its bytes");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
#if GS_FUZZ_WIRE == 0
    rendezvous(data, size);
#elif GS_FUZZ_WIRE == 1
    peerInfo(data, size);
#elif GS_FUZZ_WIRE == 2
    failureNotice(data, size);
#else
    uniqueId(data, size);
#endif
  } catch (const gs::Error&) {
    // Refused with the error the caller reports: what a malformed input must get.
  } catch (const std::exception& e) {
    fprintf(stderr, "control wire fuzzer: %s escaped as another exception\n", e.what());
    std::abort();
  }
  return 0;
}
