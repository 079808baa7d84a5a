// gs_comm_register / gs_comm_deregister. The handle is the registered address itself: looked
// up, never dereferenced, so a stale or foreign handle is a clear error rather than a crash.
#include "capi/handles.h"
#include "capi/status.h"

using gs::capi::communicator;
using gs::capi::guard;

extern "C" {

gs_status_t gs_comm_register(gs_comm_t comm, void* buff, size_t size, void** out_handle) {
  return guard([&] {
    auto& c = communicator(comm);
    GS_ARG(out_handle != nullptr, "out_handle is NULL");
    GS_ARG(buff != nullptr, "buff is NULL");
    GS_ARG(size > 0, "size is 0");
    c.registerBuffer(buff, size);
    *out_handle = buff;
  });
}

gs_status_t gs_comm_deregister(gs_comm_t comm, void* handle) {
  return guard([&] {
    auto& c = communicator(comm);
    GS_ARG(handle != nullptr, "handle is NULL");
    c.deregisterBuffer(handle);
  });
}

}  // extern "C"
