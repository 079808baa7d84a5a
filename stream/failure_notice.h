#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "common/error.h"

namespace gs::stream {

/// Why a collective failed, as it travels from the rank that found out to every other rank: an
/// abort message's write carries it into the peer's notice page (SlotLayout::noticeOffset), and
/// each rank that learns of it passes it on unchanged, so every rank reports the same cause,
/// origin and detector rather than "rank X failed".
struct FailureNotice {
  Errc code = Errc::kRemote;
  int origin = -1;    // the rank at fault (the one all waits lead back to)
  int detector = -1;  // the rank that found out
  std::string cause;  // without the rank's own context: "count differs between ranks: ..."
  // Not part of the cause: how many collectives the rank that sent this notice completed before
  // it gave up (Engine::notifyPeers sets it per sender). A peer still running a collective that
  // the sender completed may finish it with what the sender sent (Engine::Run::onRemoteWrite);
  // one the sender had not completed fails, as on the sender.
  uint32_t senderCompleted = 0;
};

/// Largest cause text a notice carries (longer ones are cut).
inline constexpr size_t kMaxNoticeCause = 1024;

/// Writes the notice into buf (at least capacity bytes); returns the bytes used.
size_t encodeNotice(const FailureNotice& notice, uint8_t* buf, size_t capacity);

/// Reads a notice from bytes a peer wrote: untrusted, so anything malformed (magic, version,
/// sizes, a code that is not a failure, ranks outside [0, nranks)) gives nullopt, and bytes
/// outside printable ASCII in the cause become '?'.
std::optional<FailureNotice> decodeNotice(const uint8_t* buf, size_t length, int nranks);

}  // namespace gs::stream
