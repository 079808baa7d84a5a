// Recursive halving-doubling allreduce and its latency-bound form, recursive doubling (see
// halvingDoublingAllReduce and recursiveDoublingAllReduce in schedule.h).
#include <algorithm>

#include "common/error.h"
#include "schedules/schedule.h"
#include "schedules/schedule_build.h"

namespace gs::stream {
namespace build {

// With G = P + R members (P a power of two, R < P), members 2j and 2j+1 for j < R fold: the
// even one sends its whole range to the odd one and waits for the result. The P remaining
// "virtual ranks" v run log2(P) halving rounds (at distance d = P/2 .. 1 the partner v ^ d gets
// the half of the current block range on its side of d and reduces it) so v ends owning block v,
// reduced and finalized; then log2(P) doubling rounds (d = 1 .. P/2) exchange the blocks held so
// far, raw. Blocks are ringSegment pieces of the range, so any count works (empty blocks send
// nothing). Recursive doubling replaces both phases with log2(P) rounds of the whole range.
namespace {

void appendSteps(
    Schedule& s, const Group& g, BufferRange range, BufferId source, bool recursiveDoubling) {
  const int n = g.size(), i = g.index;
  const BufferRange src{source, range.offset, range.count};
  const BufferRange dst{BufferId::kRecv, range.offset, range.count};
  if (n == 1) {
    if (source != BufferId::kRecv)
      s.localCopies.push_back({src, dst});
    return;
  }
  int p = 1;
  while (p * 2 <= n)
    p *= 2;
  const int rem = n - p;
  if (i < 2 * rem && i % 2 == 0) {
    Step out;
    out.sendPeer = g.at(i + 1);
    out.send = src;
    s.steps.push_back(out);
    Step back;
    back.recvPeer = g.at(i + 1);
    back.action = RecvAction::kCopy;
    back.dst = dst;
    back.recvCount = range.count;
    s.steps.push_back(back);
    return;
  }
  BufferId acc = source;
  int v = i - rem;
  if (i < 2 * rem) {
    Step in;
    in.recvPeer = g.at(i - 1);
    in.action = RecvAction::kReduceWith;
    in.operand = src;
    in.dst = dst;
    in.recvCount = range.count;
    s.steps.push_back(in);
    acc = BufferId::kRecv;
    v = i / 2;
  }
  auto member = [&](int u) { return g.at(u < rem ? 2 * u + 1 : u + rem); };
  auto block = [&](BufferId b, int j) {
    BufferRange r = ringSegment(b, range.count, p, j);
    r.offset += range.offset;
    return r;
  };
  if (recursiveDoubling) {
    // Whole-buffer rounds at distance d = 1 .. P/2: both partners send what they hold and
    // reduce what arrives into it, the lower half's value first on both, so after log2(P)
    // rounds every member holds the same bits. The send is a step of its own so that the
    // reduction into the buffer it reads waits for it (dependencies order different steps).
    for (int d = 1; d < p; d *= 2) {
      const BufferRange held{acc, range.offset, range.count};
      Step out;
      out.raw = true;
      out.sendPeer = member(v ^ d);
      out.send = held;
      s.steps.push_back(out);
      Step in;
      in.recvPeer = member(v ^ d);
      in.action = RecvAction::kReduceWith;
      in.operand = held;
      in.dst = dst;
      in.recvCount = range.count;
      in.incomingFirst = (v & d) != 0;
      in.finalize = 2 * d >= p;
      s.steps.push_back(in);
      acc = BufferId::kRecv;
    }
  } else {
    int lo = 0, hi = p;
    for (int d = p / 2; d >= 1; d /= 2) {
      const int mid = lo + (hi - lo) / 2;
      const bool upper = (v & d) != 0;
      const int keepLo = upper ? mid : lo, keepHi = upper ? hi : mid;
      Step st;
      st.sendPeer = st.recvPeer = member(v ^ d);
      st.send = span(block, acc, upper ? lo : mid, upper ? mid : hi);
      st.operand = span(block, acc, keepLo, keepHi);
      st.recvCount = st.operand.count;
      st.action = RecvAction::kReduceWith;
      st.dst = span(block, BufferId::kRecv, keepLo, keepHi);
      st.finalize = d == 1;
      s.steps.push_back(st);
      acc = BufferId::kRecv;
      lo = keepLo;
      hi = keepHi;
    }
    for (int d = 1; d < p; d *= 2) {
      const bool upper = (v & d) != 0;
      const int otherLo = upper ? lo - d : hi, otherHi = upper ? lo : hi + d;
      Step st;
      st.raw = true;
      st.sendPeer = st.recvPeer = member(v ^ d);
      st.send = span(block, BufferId::kRecv, lo, hi);
      st.action = RecvAction::kCopy;
      st.dst = span(block, BufferId::kRecv, otherLo, otherHi);
      st.recvCount = st.dst.count;
      s.steps.push_back(st);
      lo = std::min(lo, otherLo);
      hi = std::max(hi, otherHi);
    }
  }
  if (i < 2 * rem) {
    Step back;
    back.raw = true;
    back.sendPeer = g.at(i - 1);
    back.send = dst;
    s.steps.push_back(back);
  }
}

}  // namespace

void appendHalvingDoubling(
    Schedule& s, const Group& g, BufferRange range, BufferId source, bool recursiveDoubling) {
  const size_t first = s.steps.size();
  appendSteps(s, g, range, source, recursiveDoubling);
  // No step forwards another here, and a pair meets again in later rounds over other blocks.
  for (size_t k = first; k < s.steps.size(); ++k)
    s.steps[k].whole = true;
}

}  // namespace build

Schedule halvingDoublingAllReduce(int rank, int nranks, size_t count) {
  Schedule s = build::base(CollectiveKind::kAllReduce, rank, nranks, 0, count);
  s.sendCount = s.recvCount = count;
  build::appendHalvingDoubling(s, build::Group::all(rank, nranks),
                               BufferRange{BufferId::kRecv, 0, count}, BufferId::kSend);
  return s;
}

Schedule recursiveDoublingAllReduce(int rank, int nranks, size_t count) {
  Schedule s = build::base(CollectiveKind::kAllReduce, rank, nranks, 0, count);
  s.sendCount = s.recvCount = count;
  build::appendHalvingDoubling(s, build::Group::all(rank, nranks),
                               BufferRange{BufferId::kRecv, 0, count}, BufferId::kSend, true);
  return s;
}

}  // namespace gs::stream
