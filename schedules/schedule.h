#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/types.h"
#include "schedules/topology.h"

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
  // The general form of sendForwardsPrevious: forwards what step `forwardStep` (an earlier step
  // of this rank with a receive) received. A receive may be forwarded by several later steps
  // (a tree node passes its parent's chunk to both children); its slot is held until all left.
  int forwardStep = -1;
  BufferRange send;  // when not forwarding
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
  // This step's send and kReduceToSlot stay in the buffer's dtype even when the collective has
  // a codec (hops inside a host, where encoding costs more than the bytes it saves, and phases
  // whose data must reach every replica exactly).
  bool raw = false;
  // This step's chunks go into the link queues all at once instead of in groups interleaved
  // with other steps' (stream/plan.h). For steps outside forwarding chains that reuse a link
  // later over other elements (halving-doubling's); set alike on both ends of every link.
  bool whole = false;
  // A send or receive of zero elements still moves one header-only chunk, so a pair whose two
  // ends disagree about the count (one says 0) is found on both ends instead of leaving a
  // chunk nobody expects or a receive that waits for nothing (all-to-all's pairs).
  bool announceEmpty = false;

  /// The step whose receive this step's send forwards, or -1 (k: this step's index).
  int forwardedStep(int k) const { return sendForwardsPrevious ? k - 1 : forwardStep; }
  bool forwards() const { return sendForwardsPrevious || forwardStep >= 0; }
};

/// The chunk header carries the value: new kinds go at the end.
enum class CollectiveKind : uint8_t {
  kAllReduce,
  kReduceScatter,
  kAllGather,
  kBroadcast,
  kReduce,
  kAllToAll,
  kPointToPoint,  // gs_send / gs_recv messages (Engine::runPointToPoint), not a schedule
};
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
/// Uncompressed 2-rank ring allreduces up to this size run as one exchange (the 2-rank
/// recursiveDoublingAllReduce: both ranks send the whole buffer and reduce locally, one round
/// of messages instead of the ring's two). Measured (gradstream-perf --ranks 2 --inplace, every
/// GS_ALGO, docs/PERFORMANCE.md): the exchange is 8-15 % faster than the two-round schedules at
/// 128-256 KiB over tcp and shm, level at 512 KiB, 5-20 % slower from 1 MiB (where the
/// gathering half moves fewer bytes than the exchange's extra reduction). The cost model prices
/// the ring so.
inline constexpr size_t kExchangeMaxBytes = 256 << 10;
/// Ring reduce-scatter of N blocks of `count` elements each; rank r ends with block r.
Schedule ringReduceScatter(int rank, int nranks, size_t count);
/// Ring allgather of one block of `count` elements per rank.
Schedule ringAllGather(int rank, int nranks, size_t count);
/// Pipelined chain broadcast from root along the ring order.
Schedule chainBroadcast(int rank, int nranks, int root, size_t count);

/// Reduce to `root` (NCCL's ncclReduce): only the root's recv buffer holds the result.
/// Pipelined chain toward the root along the ring order: every link carries the buffer once,
/// the root receives it once (bandwidth-bound sizes). Inner ranks reduce into the receive slot
/// and forward it; recvCount is 0 off the root.
Schedule chainReduce(int rank, int nranks, int root, size_t count);
/// Binomial tree toward `root`: ceil(log2 N) rounds (latency-bound sizes). Ranks with
/// children accumulate in their recv buffer, so every rank has recvCount = count (off the
/// root the caller supplies scratch, never the user's buffer).
Schedule treeReduce(int rank, int nranks, int root, size_t count);
/// Linear: every other rank sends its buffer straight to `root`, which reduces them in rank
/// order from its own (one round: the fewest hops for tiny messages, where each hop may wait
/// for a rank to be scheduled). recvCount is 0 off the root.
Schedule linearReduce(int rank, int nranks, int root, size_t count);
enum class ReduceAlgorithm : uint8_t { kChain, kTree, kLinear };
const char* reduceAlgorithmName(ReduceAlgorithm algo);  // "chain", "tree", "linear"
Schedule buildReduce(ReduceAlgorithm algo, int rank, int nranks, int root, size_t count);
/// "chain", "tree" or "linear" (reduceAlgorithmName's); false for anything else.
bool parseReduceAlgorithm(const std::string& name, ReduceAlgorithm* out);
/// The chunk a reduce cuts its buffer into: a few pieces rather than the communicator's chunk
/// (`chunkBytes`, its receive slot), so that a hop's copy into the next rank's slot and that
/// rank's reduction overlap: a 2-rank 1 MiB reduce over shm took 200 us as one 1 MiB chunk
/// (the copy, then the reduction) and 85 as eight of 128 KiB. Buffers from kReducePipelineMin
/// bytes take eight chunks, of at least `minPieceBytes` (the link's LinkCost::reducePieceBytes:
/// 128 KiB over shm, 256 KiB over tcp); where a host's ranks outnumber its cores every chunk is
/// a hand-off between ranks waiting for a core (4 ranks on 2: 0.2 -> 2-4 ms), so there the
/// chunk stays whole. The same on every rank: it depends on the call, the topology and the
/// transports, which every rank knows alike.
size_t reduceChunkBytes(const Topology& topology,
                        size_t bytes,
                        size_t chunkBytes,
                        size_t minPieceBytes);
inline constexpr size_t kReducePipelineMin = 512 << 10;

/// Element counts and displacements of an all-to-all on one rank, one entry per peer
/// (gs_alltoallv's arguments): block j of the send buffer (sendDispls[j], sendCounts[j]) goes
/// to rank j, block i of the recv buffer comes from rank i.
struct AllToAllLayout {
  std::vector<size_t> sendCounts, sendDispls, recvCounts, recvDispls;
  /// gs_alltoall: `count` elements per peer, blocks back to back.
  static AllToAllLayout uniform(int nranks, size_t count);
  /// Elements the buffers must hold: the largest displacement + count.
  size_t sendExtent() const;
  size_t recvExtent() const;
  bool operator==(const AllToAllLayout&) const = default;
};
/// Pairwise exchange: N-1 send steps (to rank r+k, k = 1..N-1), then N-1 receive steps (from
/// rank r-k), every pair's message one header-only chunk at least (announceEmpty). Out of
/// place no step depends on another, so every peer's chunks are in flight at once; in place a
/// block's incoming chunks wait for its outgoing ones. The own block is a local copy.
Schedule pairwiseAllToAll(int rank, int nranks, const AllToAllLayout& layout);

/// Builds the schedule of any collective kind. twoRankExchange selects the one-round exchange for
/// a 2-rank allreduce (ignored elsewhere).
Schedule buildSchedule(CollectiveKind kind,
                       int rank,
                       int nranks,
                       int root,
                       size_t count,
                       bool twoRankExchange = false);

/// Allreduce algorithms. Reduce-scatter, allgather and broadcast always run as ring / chain.
enum class Algorithm : uint8_t {
  kRing,
  kTree,
  kHalvingDoubling,
  kHierarchical,
  kRecursiveDoubling,
};
inline constexpr Algorithm kAlgorithms[] = {Algorithm::kRing, Algorithm::kTree,
                                            Algorithm::kHalvingDoubling, Algorithm::kHierarchical,
                                            Algorithm::kRecursiveDoubling};
/// "ring", "tree", "halving_doubling", "hierarchical", "recursive_doubling" (the GS_ALGO
/// values).
const char* algorithmName(Algorithm algo);
bool parseAlgorithm(const std::string& name, Algorithm* out);

/// Pipelined double binary tree (NCCL-style): half the buffer reduces up and broadcasts down
/// one tree, the other half the complementary tree (leaves of one are inner nodes of the
/// other), so every rank sends and receives about the buffer once each way. Each tree's root
/// has one child; inner nodes reduce their two children's chunks into the slot (decode, reduce,
/// re-encode) and pass it up; the root finalizes, encodes once and the exact bytes travel down.
/// Latency grows with log2(N).
Schedule treeAllReduce(int rank, int nranks, size_t count);
/// Recursive halving (reduce-scatter) then recursive doubling (allgather) among all ranks,
/// pairwise folding for any N (see build::appendHalvingDoubling). 2 log2(N) rounds.
Schedule halvingDoublingAllReduce(int rank, int nranks, size_t count);
/// Recursive doubling: log2(P) rounds (+2 where N is not a power of two: the same pairwise
/// fold) in which partners exchange the whole buffer and both reduce it, the lower half's value
/// first, so every replica ends bit-identical. Half halving-doubling's rounds for log2(P) times
/// its bytes: the latency-bound allreduce (what MPI runs for small messages). Its rounds travel
/// raw whatever the codec (a lossy one would make the replicas differ). For N = 2 it is the
/// one-round exchange.
Schedule recursiveDoublingAllReduce(int rank, int nranks, size_t count);
/// Two-level: ring reduce-scatter among the ranks of each host, halving-doubling allreduce of
/// each shard among the ranks with the same local rank on every host, ring allgather inside
/// each host. Intra-host hops travel raw. Needs the same number of ranks on every host
/// (kInvalidArgument otherwise).
Schedule hierarchicalAllReduce(int rank, const Topology& topology, size_t count);
/// The allreduce schedule of an algorithm (twoRankExchange as in buildSchedule, ring only).
Schedule buildAllReduce(
    Algorithm algo, int rank, const Topology& topology, size_t count, bool twoRankExchange = false);

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
                           bool twoRankExchange = false);
/// The same check over any set of schedules: factory(rank) builds rank's (tests mutate them).
std::string checkScheduleSet(CollectiveKind kind,
                             int nranks,
                             int root,
                             size_t count,
                             const std::function<Schedule(int rank)>& factory);
/// The same check for a reduce algorithm (only the root's result is checked).
std::string checkReduceSchedules(ReduceAlgorithm algo, int nranks, int root, size_t count);
/// The same check for an all-to-all: layouts[r] is rank r's (sizes must pair up); factory
/// (default pairwiseAllToAll) builds the schedules (tests mutate them).
std::string checkAllToAllSchedules(const std::vector<AllToAllLayout>& layouts,
                                   const std::function<Schedule(int rank)>& factory = {});
/// The same check for an allreduce algorithm on a topology.
std::string checkAllReduceSchedules(Algorithm algo, const Topology& topology, size_t count);

}  // namespace gs::stream
