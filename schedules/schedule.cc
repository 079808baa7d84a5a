#include "schedules/schedule.h"

#include "common/error.h"
#include "schedules/schedule_build.h"

namespace gs::stream {

using build::appendAllGather;
using build::appendReduceScatter;
using build::base;
using build::Group;
using build::mod;

namespace build {

Schedule base(CollectiveKind kind, int rank, int nranks, int root, size_t count) {
  GS_CHECK(nranks >= 1 && rank >= 0 && rank < nranks, Errc::kInvalidArgument,
           "rank %d out of range for %d ranks", rank, nranks);
  Schedule s;
  s.kind = kind;
  s.rank = rank;
  s.nranks = nranks;
  s.root = root;
  s.count = count;
  return s;
}

}  // namespace build

const char* collectiveName(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllReduce:
      return "allreduce";
    case CollectiveKind::kReduceScatter:
      return "reduce_scatter";
    case CollectiveKind::kAllGather:
      return "allgather";
    case CollectiveKind::kBroadcast:
      return "broadcast";
    case CollectiveKind::kReduce:
      return "reduce";
    case CollectiveKind::kAllToAll:
      return "alltoall";
    case CollectiveKind::kPointToPoint:
      return "sendrecv";
  }
  return "unknown";
}

BufferRange ringSegment(BufferId buffer, size_t count, int n, int j) {
  const size_t base = count / static_cast<size_t>(n), extra = count % static_cast<size_t>(n);
  const size_t uj = static_cast<size_t>(j);
  BufferRange range;
  range.buffer = buffer;
  range.offset = uj * base + (uj < extra ? uj : extra);
  range.count = base + (uj < extra ? 1 : 0);
  return range;
}

Schedule ringAllReduce(int rank, int nranks, size_t count) {
  Schedule s = base(CollectiveKind::kAllReduce, rank, nranks, 0, count);
  s.sendCount = s.recvCount = count;
  auto segment = [&](BufferId b, int j) { return ringSegment(b, count, nranks, j); };
  if (nranks == 1) {
    s.localCopies.push_back({segment(BufferId::kSend, 0), segment(BufferId::kRecv, 0)});
    return s;
  }
  const Group g = Group::all(rank, nranks);
  appendReduceScatter(s, g, segment, BufferId::kSend, segment(BufferId::kRecv, rank), true, false);
  appendAllGather(s, g, segment, segment(BufferId::kRecv, rank), segment(BufferId::kRecv, rank),
                  false);
  return s;
}

Schedule ringReduceScatter(int rank, int nranks, size_t count) {
  Schedule s = base(CollectiveKind::kReduceScatter, rank, nranks, 0, count);
  s.sendCount = count * static_cast<size_t>(nranks);
  s.recvCount = count;
  auto block = [&](BufferId b, int j) {
    return BufferRange{b, b == BufferId::kSend ? static_cast<size_t>(j) * count : 0, count};
  };
  if (nranks == 1) {
    s.localCopies.push_back({block(BufferId::kSend, 0), block(BufferId::kRecv, 0)});
    return s;
  }
  appendReduceScatter(s, Group::all(rank, nranks), block, BufferId::kSend,
                      BufferRange{BufferId::kRecv, 0, count}, true, false);
  return s;
}

Schedule ringAllGather(int rank, int nranks, size_t count) {
  Schedule s = base(CollectiveKind::kAllGather, rank, nranks, 0, count);
  s.sendCount = count;
  s.recvCount = count * static_cast<size_t>(nranks);
  auto block = [&](BufferId b, int j) {
    return BufferRange{b, b == BufferId::kRecv ? static_cast<size_t>(j) * count : 0, count};
  };
  BufferRange own{BufferId::kSend, 0, count};
  s.localCopies.push_back({own, block(BufferId::kRecv, rank)});
  if (nranks > 1)
    appendAllGather(s, Group::all(rank, nranks), block, own, block(BufferId::kRecv, rank), false);
  return s;
}

Schedule chainBroadcast(int rank, int nranks, int root, size_t count) {
  GS_CHECK(root >= 0 && root < nranks, Errc::kInvalidArgument, "root %d out of range for %d ranks",
           root, nranks);
  Schedule s = base(CollectiveKind::kBroadcast, rank, nranks, root, count);
  s.sendCount = rank == root ? count : 0;
  s.recvCount = count;
  const int pos = mod(rank - root, nranks);  // position along the chain
  const int right = mod(rank + 1, nranks), left = mod(rank - 1, nranks);
  const BufferRange all{BufferId::kRecv, 0, count};
  if (pos == 0) {
    s.localCopies.push_back({BufferRange{BufferId::kSend, 0, count}, all});
    if (nranks > 1) {
      Step st;
      st.sendPeer = right;
      st.send = BufferRange{BufferId::kSend, 0, count};
      st.hasReplica = true;
      st.replica = all;
      s.steps.push_back(st);
    }
    return s;
  }
  Step recv;
  recv.recvPeer = left;
  recv.action = RecvAction::kCopy;
  recv.dst = all;
  recv.recvCount = count;
  s.steps.push_back(recv);
  if (pos + 1 < nranks) {
    Step fwd;
    fwd.sendPeer = right;
    fwd.sendForwardsPrevious = true;
    s.steps.push_back(fwd);
  }
  return s;
}

Schedule buildSchedule(
    CollectiveKind kind, int rank, int nranks, int root, size_t count, bool twoRankExchange) {
  switch (kind) {
    case CollectiveKind::kAllReduce:
      if (twoRankExchange && nranks == 2)
        return recursiveDoublingAllReduce(rank, nranks, count);
      return ringAllReduce(rank, nranks, count);
    case CollectiveKind::kReduceScatter:
      return ringReduceScatter(rank, nranks, count);
    case CollectiveKind::kAllGather:
      return ringAllGather(rank, nranks, count);
    case CollectiveKind::kBroadcast:
      return chainBroadcast(rank, nranks, root, count);
    case CollectiveKind::kReduce:
      return buildReduce(ReduceAlgorithm::kChain, rank, nranks, root, count);
    case CollectiveKind::kAllToAll:
      return pairwiseAllToAll(rank, nranks, AllToAllLayout::uniform(nranks, count));
    case CollectiveKind::kPointToPoint:
      break;  // messages, not a schedule (Engine::runPointToPoint)
  }
  GS_CHECK(false, Errc::kInvalidArgument, "unknown collective kind");
  return {};
}

const char* algorithmName(Algorithm algo) {
  switch (algo) {
    case Algorithm::kRing:
      return "ring";
    case Algorithm::kTree:
      return "tree";
    case Algorithm::kHalvingDoubling:
      return "halving_doubling";
    case Algorithm::kHierarchical:
      return "hierarchical";
    case Algorithm::kRecursiveDoubling:
      return "recursive_doubling";
  }
  return "unknown";
}

bool parseAlgorithm(const std::string& name, Algorithm* out) {
  for (Algorithm a : kAlgorithms) {
    if (name == algorithmName(a)) {
      *out = a;
      return true;
    }
  }
  return false;
}

Schedule buildAllReduce(
    Algorithm algo, int rank, const Topology& topology, size_t count, bool twoRankExchange) {
  const int nranks = topology.nranks();
  switch (algo) {
    case Algorithm::kRing:
      return buildSchedule(CollectiveKind::kAllReduce, rank, nranks, 0, count, twoRankExchange);
    case Algorithm::kTree:
      return treeAllReduce(rank, nranks, count);
    case Algorithm::kHalvingDoubling:
      return halvingDoublingAllReduce(rank, nranks, count);
    case Algorithm::kHierarchical:
      return hierarchicalAllReduce(rank, topology, count);
    case Algorithm::kRecursiveDoubling:
      return recursiveDoublingAllReduce(rank, nranks, count);
  }
  GS_CHECK(false, Errc::kInvalidArgument, "unknown algorithm");
  return {};
}

}  // namespace gs::stream
