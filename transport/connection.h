#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "transport/completion.h"
#include "transport/memory.h"

namespace gs::transport {

/// A reliable, connected channel to one peer with RDMA-like semantics (NCCL net plugin
/// contract). Non-blocking: post*() queue work and return at once, poll() reports completions.
/// The data path never throws and never allocates.
///
/// Ordering: writes and sends posted on one connection may land at the peer in any order
/// (several sockets or queue pairs carry them); each lands whole. A completion of kind
/// kRemoteWrite means the whole payload is visible in the target region.
///
/// Thread safety: not thread-safe; one thread (the communicator's progress thread at a time)
/// posts and polls. Owned by the caller; must be destroyed before its Device.
class Connection {
 public:
  static constexpr size_t kMaxSegments = 4;

  virtual ~Connection() = default;

  virtual int peer() const = 0;

  /// One-sided write with immediate: the concatenated segments (at most kMaxSegments, total may
  /// be zero) land in the peer's region named by dst, at dstOffset; the peer then gets a
  /// kRemoteWrite completion carrying imm and the byte count. The segments must stay untouched
  /// until our kWrite completion with this id.
  virtual PostResult postWrite(std::span<const LocalSegment> segments,
                               const RemoteKey& dst,
                               uint64_t dstOffset,
                               uint32_t imm,
                               WorkId id) = 0;

  /// Two-sided send into the next buffer the peer posted with postRecv (FIFO). A send longer
  /// than that buffer fails the connection.
  virtual PostResult postSend(const LocalSegment& segment, WorkId id) = 0;
  virtual PostResult postRecv(const LocalSegment& segment, WorkId id) = 0;

  /// Drives the connection and returns up to out.size() completions. Never blocks.
  virtual size_t poll(std::span<Completion> out) = 0;

  /// Why the connection failed; empty while it is healthy.
  virtual std::string errorMessage() const = 0;
};

}  // namespace gs::transport
