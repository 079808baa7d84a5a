#pragma once

// What every collective entry point shares (capi/collectives.cc): the overlap rule for send and
// receive buffers, running a checked call to completion, and issuing it as a request. The
// entry points of each family (collectives.cc, rooted_and_alltoall.cc) build their
// stream::CollectiveArgs and hand them here.

#include <cstddef>

#include "capi/handles.h"

namespace gs::capi {

/// The call's arguments as the engine takes them (dtype and op already checked).
stream::CollectiveArgs callArgs(stream::CollectiveKind kind,
                                const void* send,
                                void* recv,
                                size_t count,
                                gs_dtype_t dtype,
                                gs_redop_t op);

/// Buffers may be the same memory in NCCL's in-place layouts (send == inPlaceSend); any other
/// overlap is kInvalidArgument (the result would depend on timing).
void checkOverlap(const void* send,
                  size_t sendBytes,
                  const void* recv,
                  size_t recvBytes,
                  const void* inPlaceSend);

/// Blocking call: runs args to completion (a call that moves nothing anywhere, count 0 with no
/// per-peer layout, checks its arguments and returns).
void runBlocking(gs_comm_t comm, const stream::CollectiveArgs& args, CUstream_st* stream);

/// Non-blocking call: a request for the progress thread, or one complete at once when the call
/// moves nothing anywhere.
void issue(gs_comm_t comm,
           const stream::CollectiveArgs& args,
           CUstream_st* stream,
           gs_request_t* out_request);

}  // namespace gs::capi
