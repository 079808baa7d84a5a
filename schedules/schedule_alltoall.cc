// All-to-all (gs_alltoall / gs_alltoallv): a pairwise exchange with every peer in flight.
#include <algorithm>

#include "common/error.h"
#include "schedules/schedule.h"
#include "schedules/schedule_build.h"

namespace gs::stream {

using build::base;
using build::mod;

AllToAllLayout AllToAllLayout::uniform(int nranks, size_t count) {
  AllToAllLayout l;
  for (int j = 0; j < nranks; ++j) {
    l.sendCounts.push_back(count);
    l.recvCounts.push_back(count);
    l.sendDispls.push_back(static_cast<size_t>(j) * count);
    l.recvDispls.push_back(static_cast<size_t>(j) * count);
  }
  return l;
}

namespace {
// A block of zero elements may name any displacement (MPI and NCCL users pass whatever the
// running offset was): it addresses nothing, so it is placed at 0, inside every buffer.
BufferRange block(BufferId buffer, size_t displ, size_t count) {
  return BufferRange{buffer, count > 0 ? displ : 0, count};
}

size_t extent(const std::vector<size_t>& counts, const std::vector<size_t>& displs) {
  size_t end = 0;
  for (size_t j = 0; j < counts.size() && j < displs.size(); ++j) {
    if (counts[j] > 0)
      end = std::max(end, displs[j] + counts[j]);
  }
  return end;
}
}  // namespace

size_t AllToAllLayout::sendExtent() const {
  return extent(sendCounts, sendDispls);
}
size_t AllToAllLayout::recvExtent() const {
  return extent(recvCounts, recvDispls);
}

Schedule pairwiseAllToAll(int rank, int nranks, const AllToAllLayout& layout) {
  const auto n = static_cast<size_t>(nranks);
  GS_CHECK(layout.sendCounts.size() == n && layout.sendDispls.size() == n &&
               layout.recvCounts.size() == n && layout.recvDispls.size() == n,
           Errc::kInvalidArgument, "all-to-all needs one count and displacement per rank (%d)",
           nranks);
  // The uniform case keeps the per-peer count as the call's count (it is what the chunk header
  // carries to detect mismatched calls); alltoallv's pairs carry their own (see the engine).
  Schedule s = base(CollectiveKind::kAllToAll, rank, nranks, 0,
                    layout.sendCounts.empty() ? 0 : layout.sendCounts[0]);
  s.sendCount = layout.sendExtent();
  s.recvCount = layout.recvExtent();
  const auto me = static_cast<size_t>(rank);
  GS_CHECK(layout.sendCounts[me] == layout.recvCounts[me], Errc::kInvalidArgument,
           "all-to-all: rank %d sends %zu elements to itself but receives %zu", rank,
           layout.sendCounts[me], layout.recvCounts[me]);
  if (layout.sendCounts[me] > 0) {
    s.localCopies.push_back({block(BufferId::kSend, layout.sendDispls[me], layout.sendCounts[me]),
                             block(BufferId::kRecv, layout.recvDispls[me], layout.recvCounts[me])});
  }
  // Sends first, then the receives, as separate steps: dependencies order only different steps,
  // and in place the block received from rank j is the one sent to rank j, which must leave
  // (chunk by chunk) before the peer's chunks overwrite it. Steps are no barrier: every send and
  // receive is in flight at once when the buffers do not overlap.
  for (int k = 1; k < nranks; ++k) {
    const auto to = static_cast<size_t>(mod(rank + k, nranks));
    Step st;
    st.announceEmpty = true;
    st.sendPeer = static_cast<int>(to);
    st.send = block(BufferId::kSend, layout.sendDispls[to], layout.sendCounts[to]);
    s.steps.push_back(st);
  }
  for (int k = 1; k < nranks; ++k) {
    const auto from = static_cast<size_t>(mod(rank - k, nranks));
    Step st;
    st.announceEmpty = true;
    st.recvPeer = static_cast<int>(from);
    st.action = RecvAction::kCopy;
    st.dst = block(BufferId::kRecv, layout.recvDispls[from], layout.recvCounts[from]);
    st.recvCount = layout.recvCounts[from];
    s.steps.push_back(st);
  }
  return s;
}

}  // namespace gs::stream
