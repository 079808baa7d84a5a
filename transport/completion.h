#pragma once

#include <cstdint>

#include "common/error.h"

namespace gs::transport {

/// Caller-chosen identifier of a posted operation, returned in its completion (ibv wr_id).
using WorkId = uint64_t;

enum class CompletionKind : uint8_t {
  kWrite,        // a postWrite of ours finished: its source memory may be reused
  kSend,         // a postSend of ours finished
  kRecv,         // a postRecv buffer was filled by the peer's send; length says how much
  kRemoteWrite,  // the peer's write-with-immediate landed in our memory; imm and length given
  kError,        // the connection failed (peer died, reset, invalid data); status says how
};

/// One completion. status is kOk or the error (kRemote for a peer failure, kSystem for a local
/// one); after an error Connection::errorMessage() explains it. Plain data, no allocation.
struct Completion {
  WorkId id = 0;
  CompletionKind kind = CompletionKind::kWrite;
  Errc status = Errc::kOk;
  uint32_t imm = 0;
  uint32_t length = 0;
};

/// Result of posting: accepted, or refused for now because a bounded queue is full (try again
/// after polling), or refused because the connection has failed (see errorMessage()).
enum class PostResult : uint8_t { kOk, kWouldBlock, kError };

}  // namespace gs::transport
