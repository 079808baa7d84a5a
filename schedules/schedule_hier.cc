// Two-level allreduce (see hierarchicalAllReduce in schedule.h).
#include <algorithm>
#include <vector>

#include "common/error.h"
#include "schedules/schedule.h"
#include "schedules/schedule_build.h"

namespace gs::stream {

Schedule hierarchicalAllReduce(int rank, const Topology& topology, size_t count) {
  const int nranks = topology.nranks();
  Schedule s = build::base(CollectiveKind::kAllReduce, rank, nranks, 0, count);
  s.sendCount = s.recvCount = count;
  GS_CHECK(topology.uniform(), Errc::kInvalidArgument,
           "hierarchical allreduce needs the same number of ranks on every host (%d ranks on "
           "%d hosts, up to %d per host)",
           nranks, topology.hosts(), topology.maxPerHost());
  const int hosts = topology.hosts(), host = topology.hostOf[rank];
  // The ranks of this host, then the rank with the same local rank on every host.
  build::Group local, cross;
  cross.members.assign(hosts, -1);
  cross.index = host;
  std::vector<int> seen(hosts, 0);
  int localRank = -1;
  for (int r = 0; r < nranks; ++r) {
    const int h = topology.hostOf[r];
    const int lr = seen[h]++;
    if (h == host) {
      if (r == rank)
        localRank = lr;
      local.members.push_back(r);
    }
  }
  std::fill(seen.begin(), seen.end(), 0);
  for (int r = 0; r < nranks && localRank >= 0; ++r) {
    const int h = topology.hostOf[r];
    if (seen[h]++ == localRank)
      cross.members[h] = r;
  }
  local.index = localRank;
  const int perHost = local.size();
  auto shard = [&](BufferId b, int j) { return ringSegment(b, count, perHost, j); };
  const BufferRange mine = shard(BufferId::kRecv, localRank);
  if (perHost == 1) {
    build::appendHalvingDoubling(s, cross, mine, BufferId::kSend);
    return s;
  }
  build::appendReduceScatter(s, local, shard, BufferId::kSend, mine, hosts == 1, true);
  if (hosts > 1)
    build::appendHalvingDoubling(s, cross, mine, BufferId::kRecv);
  build::appendAllGather(s, local, shard, mine, mine, true);
  return s;
}

}  // namespace gs::stream
