#pragma once

// Building blocks the schedule builders share (private to stream/): a group of ranks that a
// phase runs over, and the ring phases parametrized by group, so the flat ring and the
// hierarchical schedule's intra-host phases are the same code.

#include <vector>

#include "schedules/schedule.h"

namespace gs::stream::build {

inline int mod(int a, int n) {
  return ((a % n) + n) % n;
}

/// Ranks taking part in one phase, in phase order; `index` is this rank's position.
struct Group {
  std::vector<int> members;
  int index = 0;
  int size() const { return static_cast<int>(members.size()); }
  int at(int i) const { return members[mod(i, size())]; }
  static Group all(int rank, int nranks) {
    Group g;
    for (int r = 0; r < nranks; ++r)
      g.members.push_back(r);
    g.index = rank;
    return g;
  }
};

/// The range covering blocks [first, last) of a segment function (blocks are contiguous).
template <class SegmentFn>
BufferRange span(SegmentFn segment, BufferId b, int first, int last) {
  const BufferRange a = segment(b, first);
  const BufferRange z = segment(b, last - 1);
  return BufferRange{b, a.offset, z.offset + z.count - a.offset};
}

// Reduce-scatter over blocks segment(j), j = group position, ending with block `index` reduced
// into finalDst. Step k (0..G-2): send block (i-k-1) (from operandBuffer at k = 0, else
// forwarded), receive block (i-k-2) and reduce it with our own contribution (operandBuffer);
// the last step lands in finalDst.
template <class SegmentFn>
void appendReduceScatter(Schedule& s,
                         const Group& g,
                         SegmentFn segment,
                         BufferId operandBuffer,
                         BufferRange finalDst,
                         bool finalize,
                         bool raw) {
  const int i = g.index, n = g.size();
  for (int k = 0; k + 1 < n; ++k) {
    Step st;
    st.raw = raw;
    st.sendPeer = g.at(i + 1);
    if (k == 0) {
      st.send = segment(operandBuffer, mod(i - 1, n));
    } else {
      st.sendForwardsPrevious = true;
    }
    st.recvPeer = g.at(i - 1);
    st.operand = segment(operandBuffer, mod(i - k - 2, n));
    st.recvCount = st.operand.count;
    if (k + 2 == n) {
      st.action = RecvAction::kReduceWith;
      st.dst = finalDst;
      st.finalize = finalize;
    } else {
      st.action = RecvAction::kReduceToSlot;
    }
    s.steps.push_back(st);
  }
}

// Allgather over blocks segment(j) of the recv buffer; our own block must already be in place
// (or is sent from ownSource). Step k: send block (i-k), receive block (i-k-1) and keep it
// for forwarding unless it is the last step.
template <class SegmentFn>
void appendAllGather(Schedule& s,
                     const Group& g,
                     SegmentFn segment,
                     BufferRange ownSource,
                     BufferRange ownReplica,
                     bool raw) {
  const int i = g.index, n = g.size();
  for (int k = 0; k + 1 < n; ++k) {
    Step st;
    st.raw = raw;
    st.sendPeer = g.at(i + 1);
    if (k == 0) {
      st.send = ownSource;
      st.hasReplica = true;
      st.replica = ownReplica;
    } else {
      st.sendForwardsPrevious = true;
    }
    st.recvPeer = g.at(i - 1);
    st.action = RecvAction::kCopy;
    st.dst = segment(BufferId::kRecv, mod(i - k - 1, n));
    st.recvCount = st.dst.count;
    s.steps.push_back(st);
  }
}

/// Recursive halving-doubling allreduce of `range` among the group (any size: the first
/// 2 * (G - P) members, P the largest power of two <= G, fold pairwise into P first and get the
/// result back at the end). The data starts in `source` (same offsets as range, in
/// source.buffer) and ends in range (recv buffer). Halving hops may use the codec; the doubling
/// and the unfolding send raw, so every replica receives the one full-precision value its
/// owner computed (bit-identical by construction). Its steps are Step::whole.
/// recursiveDoubling: instead of halving and doubling, log2(P) rounds in which partners
/// exchange the whole range raw and both reduce it (half the rounds, log2(P) times the bytes).
void appendHalvingDoubling(Schedule& s,
                           const Group& g,
                           BufferRange range,
                           BufferId source,
                           bool recursiveDoubling = false);

/// Schedule skeleton with the arguments checked.
Schedule base(CollectiveKind kind, int rank, int nranks, int root, size_t count);

}  // namespace gs::stream::build
