// Reduce to a root: the pipelined chain (bandwidth), the binomial tree and the linear
// (latency: log2 N rounds, or one round the root takes N-1 messages in).
#include <algorithm>

#include "common/error.h"
#include "schedules/schedule.h"
#include "schedules/schedule_build.h"

namespace gs::stream {

using build::base;
using build::mod;

namespace {

Schedule rootedBase(int rank, int nranks, int root, size_t count) {
  GS_CHECK(root >= 0 && root < nranks, Errc::kInvalidArgument, "root %d out of range for %d ranks",
           root, nranks);
  Schedule s = base(CollectiveKind::kReduce, rank, nranks, root, count);
  s.sendCount = count;
  if (nranks == 1) {
    s.recvCount = count;
    s.localCopies.push_back(
        {BufferRange{BufferId::kSend, 0, count}, BufferRange{BufferId::kRecv, 0, count}});
  }
  return s;
}

}  // namespace

Schedule chainReduce(int rank, int nranks, int root, size_t count) {
  Schedule s = rootedBase(rank, nranks, root, count);
  if (nranks == 1)
    return s;
  // Position along the chain: the root is 0, data flows from position N-1 down to it.
  const int pos = mod(rank - root, nranks);
  const int toward = mod(rank - 1, nranks), from = mod(rank + 1, nranks);
  const BufferRange own{BufferId::kSend, 0, count};
  if (pos == nranks - 1) {
    Step st;
    st.sendPeer = toward;
    st.send = own;
    s.steps.push_back(st);
    return s;
  }
  Step in;
  in.recvPeer = from;
  in.recvCount = count;
  in.operand = own;
  if (pos == 0) {
    s.recvCount = count;
    in.action = RecvAction::kReduceWith;
    in.dst = BufferRange{BufferId::kRecv, 0, count};
    in.finalize = true;
    s.steps.push_back(in);
    return s;
  }
  in.action = RecvAction::kReduceToSlot;  // the partial sum stays in the slot, forwarded on
  s.steps.push_back(in);
  Step fwd;
  fwd.sendPeer = toward;
  fwd.sendForwardsPrevious = true;
  s.steps.push_back(fwd);
  return s;
}

Schedule treeReduce(int rank, int nranks, int root, size_t count) {
  Schedule s = rootedBase(rank, nranks, root, count);
  if (nranks == 1)
    return s;
  s.recvCount = count;
  const int v = mod(rank - root, nranks);  // rank relative to the root
  const BufferRange own{BufferId::kSend, 0, count}, acc{BufferId::kRecv, 0, count};
  bool accumulated = false;
  // Round j: a rank whose bit j is set sends what it holds to v - 2^j and is done; the others
  // receive from v + 2^j when that rank exists.
  for (int mask = 1; mask < nranks; mask <<= 1) {
    if (v & mask) {
      Step up;
      up.sendPeer = mod(v - mask + root, nranks);
      up.send = accumulated ? acc : own;
      s.steps.push_back(up);
      return s;
    }
    if (v + mask >= nranks)
      continue;
    Step in;
    in.recvPeer = mod(v + mask + root, nranks);
    in.recvCount = count;
    in.dst = acc;
    in.action = accumulated ? RecvAction::kReduce : RecvAction::kReduceWith;
    in.operand = own;
    accumulated = true;
    s.steps.push_back(in);
  }
  // Only the root gets here: its last receive completes every element.
  s.steps.back().finalize = true;
  return s;
}

Schedule linearReduce(int rank, int nranks, int root, size_t count) {
  Schedule s = rootedBase(rank, nranks, root, count);
  if (nranks == 1)
    return s;
  const BufferRange own{BufferId::kSend, 0, count};
  if (rank != root) {
    Step up;
    up.sendPeer = root;
    up.send = own;
    s.steps.push_back(up);
    return s;
  }
  // Every other rank's buffer arrives at once; the root reduces them in rank order from its
  // own (root + 1, root + 2, ...), whatever order they land in, so the result never depends
  // on timing.
  s.recvCount = count;
  for (int k = 1; k < nranks; ++k) {
    Step in;
    in.recvPeer = mod(root + k, nranks);
    in.recvCount = count;
    in.dst = BufferRange{BufferId::kRecv, 0, count};
    in.action = k == 1 ? RecvAction::kReduceWith : RecvAction::kReduce;
    in.operand = own;
    s.steps.push_back(in);
  }
  s.steps.back().finalize = true;
  return s;
}

const char* reduceAlgorithmName(ReduceAlgorithm algo) {
  switch (algo) {
    case ReduceAlgorithm::kTree:
      return "tree";
    case ReduceAlgorithm::kLinear:
      return "linear";
    case ReduceAlgorithm::kChain:
      break;
  }
  return "chain";
}

bool parseReduceAlgorithm(const std::string& name, ReduceAlgorithm* out) {
  for (ReduceAlgorithm a :
       {ReduceAlgorithm::kChain, ReduceAlgorithm::kTree, ReduceAlgorithm::kLinear}) {
    if (name == reduceAlgorithmName(a)) {
      *out = a;
      return true;
    }
  }
  return false;
}

Schedule buildReduce(ReduceAlgorithm algo, int rank, int nranks, int root, size_t count) {
  switch (algo) {
    case ReduceAlgorithm::kTree:
      return treeReduce(rank, nranks, root, count);
    case ReduceAlgorithm::kLinear:
      return linearReduce(rank, nranks, root, count);
    case ReduceAlgorithm::kChain:
      break;
  }
  return chainReduce(rank, nranks, root, count);
}

size_t reduceChunkBytes(const Topology& topology,
                        size_t bytes,
                        size_t chunkBytes,
                        size_t minPieceBytes) {
  constexpr size_t kPieces = 8, kGranule = 64 << 10;
  if (bytes < kReducePipelineMin || topology.crowded())
    return chunkBytes;
  const size_t piece = std::max(bytes / kPieces / kGranule * kGranule, minPieceBytes);
  return std::min(piece, chunkBytes);
}

}  // namespace gs::stream
