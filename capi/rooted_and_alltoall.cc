// gs_reduce, gs_alltoall, gs_alltoallv (blocking and not) and gs_barrier: the collectives
// NCCL and MPI users reach for beside the four of collectives.cc, with the same argument
// checks, issue order and error handling (capi/collective_calls.h).
#include <algorithm>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "capi/collective_calls.h"
#include "capi/handles.h"
#include "capi/status.h"

namespace {

using gs::capi::bytesOf;
using gs::capi::callArgs;
using gs::capi::checkOverlap;
using gs::capi::checkTypes;
using gs::capi::communicator;
using gs::capi::guard;
using gs::capi::issue;
using gs::capi::runBlocking;
using gs::stream::AllToAllLayout;
using gs::stream::CollectiveArgs;
using gs::stream::CollectiveKind;

// dtype and op by reference: see collectives.cc (a C caller may pass any integer).
CollectiveArgs reduceArgs(const void* send,
                          void* recv,
                          size_t count,
                          const gs_dtype_t& dtype,
                          const gs_redop_t& op,
                          int root,
                          gs_comm_t comm) {
  auto& c = communicator(comm);
  checkTypes(dtype, op);
  GS_ARG(root >= 0 && root < c.size(), "root %d is out of range [0, %d)", root, c.size());
  const size_t bytes = bytesOf(count, dtype, 1, "count");
  GS_ARG(count == 0 || send != nullptr, "sendbuff is NULL");
  GS_ARG(count == 0 || c.rank() != root || recv != nullptr, "recvbuff is NULL on the root");
  // Off the root recvbuff is not touched (it may be NULL, or any memory).
  if (c.rank() == root)
    checkOverlap(send, bytes, recv, bytes, recv);
  CollectiveArgs a =
      callArgs(CollectiveKind::kReduce, send, c.rank() == root ? recv : nullptr, count, dtype, op);
  a.root = root;
  return a;
}

CollectiveArgs alltoallArgs(
    const void* send, void* recv, size_t count, const gs_dtype_t& dtype, gs_comm_t comm) {
  auto& c = communicator(comm);
  checkTypes(dtype, GS_SUM);
  const size_t bytes = bytesOf(count, dtype, static_cast<size_t>(c.size()), "count");
  GS_ARG(count == 0 || send != nullptr, "sendbuff is NULL");
  GS_ARG(count == 0 || recv != nullptr, "recvbuff is NULL");
  checkOverlap(send, bytes, recv, bytes, recv);
  return callArgs(CollectiveKind::kAllToAll, send, recv, count, dtype, GS_SUM);
}

// One buffer's side of an alltoallv: every block inside size_t, no two blocks sharing an
// element (a receive would race with itself; a send side may share, it is only read).
// Returns the extent in elements.
size_t checkBlocks(const char* side,
                   const size_t* counts,
                   const size_t* displs,
                   int n,
                   size_t elementBytes,
                   bool disjoint) {
  std::vector<std::pair<size_t, int>> starts;  // (displacement, peer) of non-empty blocks
  size_t extent = 0;
  for (int j = 0; j < n; ++j) {
    if (counts[j] == 0)
      continue;
    GS_ARG(displs[j] <= SIZE_MAX - counts[j] &&
               displs[j] + counts[j] <= SIZE_MAX / std::max<size_t>(elementBytes, 1),
           "%scounts[%d] = %zu at %sdispls[%d] = %zu overflows", side, j, counts[j], side, j,
           displs[j]);
    extent = std::max(extent, displs[j] + counts[j]);
    starts.emplace_back(displs[j], j);
  }
  if (disjoint) {
    std::sort(starts.begin(), starts.end());
    for (size_t k = 1; k < starts.size(); ++k) {
      const auto [prevAt, prev] = starts[k - 1];
      GS_ARG(prevAt + counts[prev] <= starts[k].first,
             "%s blocks of ranks %d and %d overlap (%sdispls %zu and %zu, %scounts[%d] = %zu)",
             side, prev, starts[k].second, side, prevAt, starts[k].first, side, prev, counts[prev]);
    }
  }
  return extent;
}

CollectiveArgs alltoallvArgs(const void* send,
                             const size_t* sendcounts,
                             const size_t* sdispls,
                             void* recv,
                             const size_t* recvcounts,
                             const size_t* rdispls,
                             const gs_dtype_t& dtype,
                             gs_comm_t comm) {
  auto& c = communicator(comm);
  checkTypes(dtype, GS_SUM);
  GS_ARG(sendcounts != nullptr && sdispls != nullptr, "sendcounts or sdispls is NULL");
  GS_ARG(recvcounts != nullptr && rdispls != nullptr, "recvcounts or rdispls is NULL");
  const int n = c.size();
  const size_t esize = bytesOf(1, dtype, 1, "dtype");
  GS_ARG(sendcounts[c.rank()] == recvcounts[c.rank()],
         "sendcounts[%d] = %zu but recvcounts[%d] = %zu: this rank's block to itself is one "
         "size",
         c.rank(), sendcounts[c.rank()], c.rank(), recvcounts[c.rank()]);
  const size_t sendExtent = checkBlocks("send", sendcounts, sdispls, n, esize, false);
  const size_t recvExtent = checkBlocks("recv", recvcounts, rdispls, n, esize, true);
  GS_ARG(sendExtent == 0 || send != nullptr, "sendbuff is NULL");
  GS_ARG(recvExtent == 0 || recv != nullptr, "recvbuff is NULL");
  auto layout = std::make_shared<AllToAllLayout>();
  layout->sendCounts.assign(sendcounts, sendcounts + n);
  layout->sendDispls.assign(sdispls, sdispls + n);
  layout->recvCounts.assign(recvcounts, recvcounts + n);
  layout->recvDispls.assign(rdispls, rdispls + n);
  // In place only with one layout for both sides (each block read, then overwritten by the
  // same peer's); any other overlap would race.
  const bool sameLayout =
      layout->sendCounts == layout->recvCounts && layout->sendDispls == layout->recvDispls;
  checkOverlap(send, sendExtent * esize, recv, recvExtent * esize, sameLayout ? recv : nullptr);
  CollectiveArgs a = callArgs(CollectiveKind::kAllToAll, send, recv, sendExtent, dtype, GS_SUM);
  a.layout = std::move(layout);
  return a;
}

}  // namespace

extern "C" {

gs_status_t gs_reduce(const void* sendbuff,
                      void* recvbuff,
                      size_t count,
                      gs_dtype_t dtype,
                      gs_redop_t op,
                      int root,
                      gs_comm_t comm,
                      struct CUstream_st* stream) {
  return guard([&] {
    runBlocking(comm, reduceArgs(sendbuff, recvbuff, count, dtype, op, root, comm), stream);
  });
}

gs_status_t gs_ireduce(const void* sendbuff,
                       void* recvbuff,
                       size_t count,
                       gs_dtype_t dtype,
                       gs_redop_t op,
                       int root,
                       gs_comm_t comm,
                       struct CUstream_st* stream,
                       gs_request_t* out_request) {
  return guard([&] {
    issue(comm, reduceArgs(sendbuff, recvbuff, count, dtype, op, root, comm), stream, out_request);
  });
}

gs_status_t gs_alltoall(const void* sendbuff,
                        void* recvbuff,
                        size_t count,
                        gs_dtype_t dtype,
                        gs_comm_t comm,
                        struct CUstream_st* stream) {
  return guard(
      [&] { runBlocking(comm, alltoallArgs(sendbuff, recvbuff, count, dtype, comm), stream); });
}

gs_status_t gs_ialltoall(const void* sendbuff,
                         void* recvbuff,
                         size_t count,
                         gs_dtype_t dtype,
                         gs_comm_t comm,
                         struct CUstream_st* stream,
                         gs_request_t* out_request) {
  return guard([&] {
    issue(comm, alltoallArgs(sendbuff, recvbuff, count, dtype, comm), stream, out_request);
  });
}

gs_status_t gs_alltoallv(const void* sendbuff,
                         const size_t* sendcounts,
                         const size_t* sdispls,
                         void* recvbuff,
                         const size_t* recvcounts,
                         const size_t* rdispls,
                         gs_dtype_t dtype,
                         gs_comm_t comm,
                         struct CUstream_st* stream) {
  return guard([&] {
    runBlocking(
        comm,
        alltoallvArgs(sendbuff, sendcounts, sdispls, recvbuff, recvcounts, rdispls, dtype, comm),
        stream);
  });
}

gs_status_t gs_ialltoallv(const void* sendbuff,
                          const size_t* sendcounts,
                          const size_t* sdispls,
                          void* recvbuff,
                          const size_t* recvcounts,
                          const size_t* rdispls,
                          gs_dtype_t dtype,
                          gs_comm_t comm,
                          struct CUstream_st* stream,
                          gs_request_t* out_request) {
  return guard([&] {
    issue(comm,
          alltoallvArgs(sendbuff, sendcounts, sdispls, recvbuff, recvcounts, rdispls, dtype, comm),
          stream, out_request);
  });
}

gs_status_t gs_barrier(gs_comm_t comm) {
  return guard([&] {
    auto& c = communicator(comm);
    // Every rank's 1 in every element: an element's sum needs every rank's contribution, so no
    // rank gets it before all have called (a single element would leave most ring segments
    // empty, and empty segments move nothing). Integers travel raw, whatever the codec.
    const auto n = static_cast<size_t>(c.size());
    std::vector<int32_t> ones(n, 1), sums(n, 0);
    CollectiveArgs a =
        callArgs(CollectiveKind::kAllReduce, ones.data(), sums.data(), n, GS_INT32, GS_SUM);
    c.run(a, nullptr);
    for (int32_t s : sums) {
      GS_CHECK(s == static_cast<int32_t>(n), gs::Errc::kInternal,
               "barrier: the ranks' count came back as %d of %zu", s, n);
    }
  });
}

}  // extern "C"
