// Double binary tree allreduce (see treeAllReduce in schedule.h).
#include "common/error.h"
#include "schedules/schedule.h"
#include "schedules/schedule_build.h"

namespace gs::stream {
namespace {

// A node of a binary tree over positions 0..n-1. Position 0 is the root, with one child; the
// positions 1..n-1 form a tree ordered like a binary search tree in which a position's level is
// its lowest set bit b: its children are x - b/2 and the largest x + s (s a power of two below
// b) that is still < n. So odd positions are exactly the leaves and even ones the inner nodes,
// which is what makes the shifted second tree complementary, and depth is about log2(n).
struct TreeNode {
  int parent = -1;
  int children[2] = {-1, -1};
};

int lowestBit(int x) {
  return x & -x;
}

TreeNode childrenOf(int x, int n) {
  TreeNode t;
  const int b = lowestBit(x);
  if (b < 2)
    return t;
  t.children[0] = x - b / 2;
  for (int step = b / 2; step >= 1; step /= 2) {
    if (x + step < n) {
      t.children[1] = x + step;
      break;
    }
  }
  return t;
}

TreeNode treeNode(int pos, int n) {
  int top = 1;
  while (top * 2 <= n - 1)
    top *= 2;
  if (pos == 0) {
    TreeNode t;
    if (n > 1)
      t.children[0] = top;
    return t;
  }
  int parent = 0, x = top;
  while (x != pos) {
    const TreeNode c = childrenOf(x, n);
    parent = x;
    x = pos < x ? c.children[0] : c.children[1];
  }
  TreeNode t = childrenOf(pos, n);
  t.parent = parent;
  return t;
}

// Steps of one tree over the element range `half`. Tree 0 places rank r at position r, tree 1
// at position r + 1 (mod n): the inner (even) positions of one are leaves (odd) in the other,
// and the roots differ (rank 0 and rank n-1).
void appendTree(Schedule& s, int tree, BufferRange sendHalf, BufferRange recvHalf) {
  const int n = s.nranks;
  const int pos = build::mod(s.rank + tree, n);
  auto rankAt = [&](int p) { return build::mod(p - tree, n); };
  const TreeNode node = treeNode(pos, n);
  const int nchildren = (node.children[0] >= 0 ? 1 : 0) + (node.children[1] >= 0 ? 1 : 0);
  const size_t count = recvHalf.count;

  // Up: reduce the children's partial sums with our own value and pass the result to the
  // parent straight from the receive slot.
  if (node.parent < 0) {
    Step st;
    st.recvPeer = rankAt(node.children[0]);
    st.action = RecvAction::kReduceWith;
    st.operand = sendHalf;
    st.dst = recvHalf;
    st.recvCount = count;
    st.finalize = true;
    s.steps.push_back(st);
  } else if (nchildren == 0) {
    Step st;
    st.sendPeer = rankAt(node.parent);
    st.send = sendHalf;
    s.steps.push_back(st);
  } else {
    BufferRange operand = sendHalf;
    if (nchildren == 2) {
      Step first;
      first.recvPeer = rankAt(node.children[0]);
      first.action = RecvAction::kReduceWith;
      first.operand = sendHalf;
      first.dst = recvHalf;
      first.recvCount = count;
      s.steps.push_back(first);
      operand = recvHalf;
    }
    Step last;
    last.recvPeer = rankAt(node.children[nchildren - 1]);
    last.action = RecvAction::kReduceToSlot;
    last.operand = operand;
    last.recvCount = count;
    s.steps.push_back(last);
    Step up;
    up.sendPeer = rankAt(node.parent);
    up.sendForwardsPrevious = true;
    s.steps.push_back(up);
  }

  // Down: the root sends its result once (encoding it once: its own copy becomes what everyone
  // decodes); every other node keeps a copy and forwards the same bytes to its children.
  if (node.parent < 0) {
    Step st;
    st.sendPeer = rankAt(node.children[0]);
    st.send = recvHalf;
    st.hasReplica = true;
    st.replica = recvHalf;
    s.steps.push_back(st);
    return;
  }
  Step down;
  down.recvPeer = rankAt(node.parent);
  down.action = RecvAction::kCopy;
  down.dst = recvHalf;
  down.recvCount = count;
  const int received = static_cast<int>(s.steps.size());
  s.steps.push_back(down);
  for (int c = 0; c < nchildren; ++c) {
    Step fwd;
    fwd.sendPeer = rankAt(node.children[c]);
    fwd.forwardStep = received;
    s.steps.push_back(fwd);
  }
}

}  // namespace

Schedule treeAllReduce(int rank, int nranks, size_t count) {
  Schedule s = build::base(CollectiveKind::kAllReduce, rank, nranks, 0, count);
  s.sendCount = s.recvCount = count;
  const BufferRange all{BufferId::kSend, 0, count};
  if (nranks == 1) {
    s.localCopies.push_back({all, BufferRange{BufferId::kRecv, 0, count}});
    return s;
  }
  for (int tree = 0; tree < 2; ++tree) {
    const BufferRange sendHalf = ringSegment(BufferId::kSend, count, 2, tree);
    const BufferRange recvHalf = ringSegment(BufferId::kRecv, count, 2, tree);
    if (sendHalf.count > 0)
      appendTree(s, tree, sendHalf, recvHalf);
  }
  return s;
}

}  // namespace gs::stream
