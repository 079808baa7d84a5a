// The collectives, blocking and not: each entry point checks its arguments into one
// stream::CollectiveArgs (the *Args builders), then runs it here (runBlocking) or hands it to
// the progress thread (issue). A builder is shared by a call and its non-blocking twin, so
// both accept and refuse exactly the same arguments.
#include <cstdint>
#include <memory>

#include "capi/collective_calls.h"
#include "capi/handles.h"
#include "capi/status.h"

namespace {

using gs::Errc;
using gs::capi::bytesOf;
using gs::capi::callArgs;
using gs::capi::checkOverlap;
using gs::capi::checkTypes;
using gs::capi::communicator;
using gs::capi::guard;
using gs::capi::issue;
using gs::capi::runBlocking;

// Reduce-scatter (the send buffer holds N blocks) and allgather (the recv buffer does): NULL
// checks, size overflow, and overlap other than NCCL's in-place layout (block `rank`).
void checkBlockBuffers(const gs::control::Communicator& c,
                       const void* send,
                       void* recv,
                       size_t count,
                       gs_dtype_t dtype,
                       const char* countName,
                       bool sendIsBlocks) {
  const size_t n = static_cast<size_t>(c.size());
  const size_t block = bytesOf(count, dtype, 1, countName);
  const size_t blocks = bytesOf(count, dtype, n, countName);
  GS_ARG(count == 0 || send != nullptr, "sendbuff is NULL");
  GS_ARG(count == 0 || recv != nullptr, "recvbuff is NULL");
  const size_t own = block * static_cast<size_t>(c.rank());
  if (sendIsBlocks) {
    checkOverlap(send, blocks, recv, block, static_cast<const uint8_t*>(recv) - own);
  } else {
    checkOverlap(send, block, recv, blocks, static_cast<const uint8_t*>(recv) + own);
  }
}

// The builders take dtype and op by reference: a C caller may pass any integer, and copying an
// enum outside its range is undefined before checkTypes has looked at it through memcpy.
gs::stream::CollectiveArgs allreduceArgs(const void* send,
                                         void* recv,
                                         size_t count,
                                         const gs_dtype_t& dtype,
                                         const gs_redop_t& op,
                                         gs_comm_t comm) {
  communicator(comm);
  checkTypes(dtype, op);
  const size_t bytes = bytesOf(count, dtype, 1, "count");
  GS_ARG(count == 0 || send != nullptr, "sendbuff is NULL");
  GS_ARG(count == 0 || recv != nullptr, "recvbuff is NULL");
  checkOverlap(send, bytes, recv, bytes, recv);
  return callArgs(gs::stream::CollectiveKind::kAllReduce, send, recv, count, dtype, op);
}

gs::stream::CollectiveArgs reduceScatterArgs(const void* send,
                                             void* recv,
                                             size_t recvcount,
                                             const gs_dtype_t& dtype,
                                             const gs_redop_t& op,
                                             gs_comm_t comm) {
  auto& c = communicator(comm);
  checkTypes(dtype, op);
  checkBlockBuffers(c, send, recv, recvcount, dtype, "recvcount", true);
  return callArgs(gs::stream::CollectiveKind::kReduceScatter, send, recv, recvcount, dtype, op);
}

gs::stream::CollectiveArgs allgatherArgs(
    const void* send, void* recv, size_t sendcount, const gs_dtype_t& dtype, gs_comm_t comm) {
  auto& c = communicator(comm);
  checkTypes(dtype, GS_SUM);
  checkBlockBuffers(c, send, recv, sendcount, dtype, "sendcount", false);
  return callArgs(gs::stream::CollectiveKind::kAllGather, send, recv, sendcount, dtype, GS_SUM);
}

gs::stream::CollectiveArgs broadcastArgs(
    const void* send, void* recv, size_t count, const gs_dtype_t& dtype, int root, gs_comm_t comm) {
  auto& c = communicator(comm);
  checkTypes(dtype, GS_SUM);
  GS_ARG(root >= 0 && root < c.size(), "root %d is out of range [0, %d)", root, c.size());
  const size_t bytes = bytesOf(count, dtype, 1, "count");
  GS_ARG(count == 0 || c.rank() != root || send != nullptr, "sendbuff is NULL on the root");
  GS_ARG(count == 0 || recv != nullptr, "recvbuff is NULL");
  if (c.rank() == root)
    checkOverlap(send, bytes, recv, bytes, recv);
  auto args = callArgs(gs::stream::CollectiveKind::kBroadcast, send, recv, count, dtype, GS_SUM);
  args.root = root;
  return args;
}

}  // namespace

namespace gs::capi {

namespace {
// Count 0 moves nothing on any rank (every rank passes the same count); an alltoallv's pairs
// and a point-to-point message carry their own counts, so they always run (a rank sending
// nothing still tells its peer, which may expect something).
bool movesData(const stream::CollectiveArgs& args) {
  return args.count > 0 || args.layout != nullptr ||
         args.kind == stream::CollectiveKind::kPointToPoint;
}
}  // namespace

stream::CollectiveArgs callArgs(stream::CollectiveKind kind,
                                const void* send,
                                void* recv,
                                size_t count,
                                gs_dtype_t dtype,
                                gs_redop_t op) {
  stream::CollectiveArgs a;
  a.kind = kind;
  a.send = send;
  a.recv = recv;
  a.count = count;
  a.dtype = static_cast<DataType>(dtype);
  a.op = static_cast<ReduceOp>(op);
  return a;
}

void checkOverlap(const void* send,
                  size_t sendBytes,
                  const void* recv,
                  size_t recvBytes,
                  const void* inPlaceSend) {
  if (send == nullptr || recv == nullptr || sendBytes == 0 || recvBytes == 0)
    return;
  auto s = reinterpret_cast<uintptr_t>(send), r = reinterpret_cast<uintptr_t>(recv);
  const bool overlap = s < r + recvBytes && r < s + sendBytes;
  GS_ARG(!overlap || send == inPlaceSend,
         "sendbuff and recvbuff overlap without being in place (in place means sendbuff == %p)",
         inPlaceSend);
}

void runBlocking(gs_comm_t comm, const stream::CollectiveArgs& args, CUstream_st* stream) {
  if (movesData(args))
    communicator(comm).run(args, stream);
}

void issue(gs_comm_t comm,
           const stream::CollectiveArgs& args,
           CUstream_st* stream,
           gs_request_t* out_request) {
  GS_ARG(out_request != nullptr, "out_request is NULL");
  auto& c = communicator(comm);
  auto handle = std::make_unique<gs_request_s>();
  handle->timeoutMs = c.config().timeoutMs;
  if (movesData(args)) {
    handle->request = c.submit(args, stream);
    handle->comm = &c;
  } else {
    handle->request = std::make_shared<control::Request>(args);
    handle->request->complete(Errc::kOk, "");
  }
  *out_request = handle.release();
}

}  // namespace gs::capi

extern "C" {

gs_status_t gs_allreduce(const void* sendbuff,
                         void* recvbuff,
                         size_t count,
                         gs_dtype_t dtype,
                         gs_redop_t op,
                         gs_comm_t comm,
                         struct CUstream_st* cuda_stream) {
  return guard([&] {
    runBlocking(comm, allreduceArgs(sendbuff, recvbuff, count, dtype, op, comm), cuda_stream);
  });
}

gs_status_t gs_reduce_scatter(const void* sendbuff,
                              void* recvbuff,
                              size_t recvcount,
                              gs_dtype_t dtype,
                              gs_redop_t op,
                              gs_comm_t comm,
                              struct CUstream_st* cuda_stream) {
  return guard([&] {
    runBlocking(comm, reduceScatterArgs(sendbuff, recvbuff, recvcount, dtype, op, comm),
                cuda_stream);
  });
}

gs_status_t gs_allgather(const void* sendbuff,
                         void* recvbuff,
                         size_t sendcount,
                         gs_dtype_t dtype,
                         gs_comm_t comm,
                         struct CUstream_st* cuda_stream) {
  return guard([&] {
    runBlocking(comm, allgatherArgs(sendbuff, recvbuff, sendcount, dtype, comm), cuda_stream);
  });
}

gs_status_t gs_broadcast(const void* sendbuff,
                         void* recvbuff,
                         size_t count,
                         gs_dtype_t dtype,
                         int root,
                         gs_comm_t comm,
                         struct CUstream_st* cuda_stream) {
  return guard([&] {
    runBlocking(comm, broadcastArgs(sendbuff, recvbuff, count, dtype, root, comm), cuda_stream);
  });
}

gs_status_t gs_iallreduce(const void* sendbuff,
                          void* recvbuff,
                          size_t count,
                          gs_dtype_t dtype,
                          gs_redop_t op,
                          gs_comm_t comm,
                          struct CUstream_st* cuda_stream,
                          gs_request_t* out_request) {
  return guard([&] {
    issue(comm, allreduceArgs(sendbuff, recvbuff, count, dtype, op, comm), cuda_stream,
          out_request);
  });
}

gs_status_t gs_ireduce_scatter(const void* sendbuff,
                               void* recvbuff,
                               size_t recvcount,
                               gs_dtype_t dtype,
                               gs_redop_t op,
                               gs_comm_t comm,
                               struct CUstream_st* cuda_stream,
                               gs_request_t* out_request) {
  return guard([&] {
    issue(comm, reduceScatterArgs(sendbuff, recvbuff, recvcount, dtype, op, comm), cuda_stream,
          out_request);
  });
}

gs_status_t gs_iallgather(const void* sendbuff,
                          void* recvbuff,
                          size_t sendcount,
                          gs_dtype_t dtype,
                          gs_comm_t comm,
                          struct CUstream_st* cuda_stream,
                          gs_request_t* out_request) {
  return guard([&] {
    issue(comm, allgatherArgs(sendbuff, recvbuff, sendcount, dtype, comm), cuda_stream,
          out_request);
  });
}

gs_status_t gs_ibroadcast(const void* sendbuff,
                          void* recvbuff,
                          size_t count,
                          gs_dtype_t dtype,
                          int root,
                          gs_comm_t comm,
                          struct CUstream_st* cuda_stream,
                          gs_request_t* out_request) {
  return guard([&] {
    issue(comm, broadcastArgs(sendbuff, recvbuff, count, dtype, root, comm), cuda_stream,
          out_request);
  });
}

}  // extern "C"
