#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/types.h"

namespace gs::stream {

/// The user buffers a schedule addresses. They may alias (in-place collectives); the engine
/// resolves dependencies on real addresses, so aliasing is safe.
enum class BufferId : uint8_t { kSend, kRecv };

/// A range of elements of one buffer.
struct BufferRange {
  BufferId buffer = BufferId::kRecv;
  size_t offset = 0;
  size_t count = 0;
};

/// What a rank does with the chunks a step receives.
enum class RecvAction : uint8_t {
  kCopy,          // dst = incoming
  kReduce,        // dst = op(dst, incoming)
  kReduceWith,    // dst = op(operand, incoming)
  kReduceToSlot,  // incoming = op(operand, incoming), kept in the receive slot to be forwarded
};

/// One step of one rank: at most one send and one receive, running concurrently. A send either
/// reads a buffer range or forwards, chunk by chunk, exactly what the previous step received
/// (the bytes stay in the receive slot: no copy). Steps are a program order, not a barrier: a
/// chunk moves as soon as the chunks it depends on have.
struct Step {
  int sendPeer = -1;  // -1: this step sends nothing
  bool sendForwardsPrevious = false;
  BufferRange send;  // when !sendForwardsPrevious
  // This send carries final data every rank keeps (allgather phase, broadcast root). With a
  // lossy codec the sender overwrites its own copy, `replica`, with decode(encode(data)), so
  // all replicas end bit-identical.
  bool hasReplica = false;
  BufferRange replica;
  int recvPeer = -1;  // -1: this step receives nothing
  RecvAction action = RecvAction::kCopy;
  BufferRange dst;             // kCopy, kReduce, kReduceWith
  BufferRange operand;         // kReduceWith, kReduceToSlot
  size_t recvCount = 0;        // elements received
  bool finalize = false;       // the reduction is complete here: apply kAvg's division
  bool incomingFirst = false;  // kReduceWith computes op(incoming, operand): the lower rank's
                               // value goes first on both ranks, so results match bit for bit
};

enum class CollectiveKind : uint8_t { kAllReduce, kReduceScatter, kAllGather, kBroadcast };
const char* collectiveName(CollectiveKind kind);

/// Per-rank plan of a collective. count is in elements: for allreduce and broadcast the buffer
/// length, for reduce-scatter the per-rank output (recvcount), for allgather the per-rank
/// input (sendcount).
struct Schedule {
  CollectiveKind kind = CollectiveKind::kAllReduce;
  int rank = 0;
  int nranks = 1;
  int root = 0;
  size_t count = 0;
  std::vector<Step> steps;
  /// Copies the engine performs locally before the steps (e.g. own block, N = 1): {src, dst}.
  std::vector<std::pair<BufferRange, BufferRange>> localCopies;
  /// Element counts of the send and recv buffers.
  size_t sendCount = 0;
  size_t recvCount = 0;
};

/// Segment j of `count` elements split into n nearly equal parts (the first count % n parts
/// are one element longer).
BufferRange ringSegment(BufferId buffer, size_t count, int n, int j);

/// Ring allreduce: reduce-scatter then allgather, 2(N-1) steps, forwarding through slots.
Schedule ringAllReduce(int rank, int nranks, size_t count);
/// Two ranks exchange whole buffers and both reduce locally: one round of messages instead of
/// the ring's two, for latency-bound (small) allreduces.
Schedule exchangeAllReduce(int rank, int nranks, size_t count);
/// Ring reduce-scatter of N blocks of `count` elements each; rank r ends with block r.
Schedule ringReduceScatter(int rank, int nranks, size_t count);
/// Ring allgather of one block of `count` elements per rank.
Schedule ringAllGather(int rank, int nranks, size_t count);
/// Pipelined chain broadcast from root along the ring order.
Schedule chainBroadcast(int rank, int nranks, int root, size_t count);

/// Builds the schedule of any collective kind. latencyBound selects the one-round exchange for
/// a 2-rank allreduce (ignored elsewhere).
Schedule buildSchedule(
    CollectiveKind kind, int rank, int nranks, int root, size_t count, bool latencyBound = false);

/// Symbolic check: runs the schedules of all ranks with no network, values represented as the
/// set of (rank, element) contributions, and verifies every rank's final buffer is exactly the
/// collective's result (each contribution once, averages finalized once, no deadlock, matching
/// sizes between sender and receiver). Reductions must mark the step that completes each
/// element (where kAvg divides) exactly once, averaging or not; `averaging` only documents the
/// caller's op. Returns "" on success, else what went wrong.
std::string checkSchedules(CollectiveKind kind,
                           int nranks,
                           int root,
                           size_t count,
                           bool averaging,
                           bool latencyBound = false);

}  // namespace gs::stream
