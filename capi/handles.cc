#include "capi/handles.h"

#include <string>

#include "capi/status.h"
#include "common/types.h"

namespace gs::capi {

control::Communicator& communicator(gs_comm_t comm) {
  GS_ARG(comm != nullptr && comm->comm != nullptr, "comm is NULL");
  return *comm->comm;
}

void checkTypes(const gs_dtype_t& dtype, const gs_redop_t& op) {
  GS_ARG(enumValue(dtype) >= 0 && enumValue(dtype) < kNumDataTypes, "dtype %d is not a gs_dtype_t",
         enumValue(dtype));
  GS_ARG(enumValue(op) >= 0 && enumValue(op) < kNumReduceOps, "op %d is not a gs_redop_t",
         enumValue(op));
}

size_t bytesOf(size_t count, gs_dtype_t dtype, size_t times, const char* what) {
  const size_t esize = elementSize(static_cast<DataType>(dtype));
  GS_ARG(count <= SIZE_MAX / esize / times, "%s %zu overflows the address space", what, count);
  return count * esize * times;
}

control::Request::Callback completionCallback(gs_completion_fn fn, void* user) {
  return [fn, user](Errc code, const std::string& message) {
    fn(static_cast<gs_status_t>(code), message.c_str(), user);
  };
}

}  // namespace gs::capi
