// gs_send, gs_recv, gs_isend, gs_irecv: point-to-point messages with the collectives' argument
// checks, issue order and error handling (capi/collective_calls.h); the communicator runs
// consecutive messages together (control/communicator_messages.cc).
#include "capi/collective_calls.h"
#include "capi/handles.h"
#include "capi/status.h"

namespace {

using gs::capi::bytesOf;
using gs::capi::callArgs;
using gs::capi::checkTypes;
using gs::capi::communicator;
using gs::capi::guard;
using gs::capi::issue;
using gs::capi::runBlocking;
using gs::stream::CollectiveArgs;
using gs::stream::CollectiveKind;

// dtype by reference: see collectives.cc (a C caller may pass any integer).
CollectiveArgs messageArgs(
    bool sending, void* buff, size_t count, const gs_dtype_t& dtype, int peer, gs_comm_t comm) {
  auto& c = communicator(comm);
  checkTypes(dtype, GS_SUM);
  GS_ARG(peer >= 0 && peer < c.size() && peer != c.rank(),
         "peer %d is not another rank of the communicator (this is rank %d of %d)", peer, c.rank(),
         c.size());
  (void)bytesOf(count, dtype, 1, "count");
  GS_ARG(count == 0 || buff != nullptr, "buff is NULL");
  CollectiveArgs a = callArgs(CollectiveKind::kPointToPoint, sending ? buff : nullptr,
                              sending ? nullptr : buff, count, dtype, GS_SUM);
  a.peer = peer;
  a.sending = sending;
  return a;
}

}  // namespace

extern "C" {

gs_status_t gs_send(const void* buff,
                    size_t count,
                    gs_dtype_t dtype,
                    int peer,
                    gs_comm_t comm,
                    struct CUstream_st* stream) {
  return guard([&] {
    runBlocking(comm, messageArgs(true, const_cast<void*>(buff), count, dtype, peer, comm), stream);
  });
}

gs_status_t gs_recv(void* buff,
                    size_t count,
                    gs_dtype_t dtype,
                    int peer,
                    gs_comm_t comm,
                    struct CUstream_st* stream) {
  return guard(
      [&] { runBlocking(comm, messageArgs(false, buff, count, dtype, peer, comm), stream); });
}

gs_status_t gs_isend(const void* buff,
                     size_t count,
                     gs_dtype_t dtype,
                     int peer,
                     gs_comm_t comm,
                     struct CUstream_st* stream,
                     gs_request_t* out_request) {
  return guard([&] {
    issue(comm, messageArgs(true, const_cast<void*>(buff), count, dtype, peer, comm), stream,
          out_request);
  });
}

gs_status_t gs_irecv(void* buff,
                     size_t count,
                     gs_dtype_t dtype,
                     int peer,
                     gs_comm_t comm,
                     struct CUstream_st* stream,
                     gs_request_t* out_request) {
  return guard([&] {
    issue(comm, messageArgs(false, buff, count, dtype, peer, comm), stream, out_request);
  });
}

}  // extern "C"
